"""A user's own model as a :class:`fedjax_dp.models.base.Model`: flax.linen, flax.nnx or
an ``(init, apply)`` pair, with a per-example loss and an optional global-model term.

:func:`user_model` wraps what a researcher has; the run binds it to the data's shapes
(``spec(input_shape, num_classes)``, the signature of the zoo's builders) and
:func:`check_fits` refuses, in one line and before anything compiles, a model whose
output does not fit the labels and a loss that does not return one value per example.

The global-model hook (``global_term(params, global_params) -> scalar``, e.g.
:func:`fedprox`) is added to EVERY example's loss. Privacy: the term is then part of
each per-example gradient, so per-example clipping (and step, update or parameter
clipping, which clip whatever the step computed) bounds it with the rest, and the clip
modes' sensitivity proofs, which use only the clipped quantity's norm bound, hold as
written (per_example_l2.upload_sensitivity: each clipped mean lies in the ball of
radius C whatever the loss). The term's gradient is never added after clipping.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dp.models.base import LOSSES, REGRESSION_LOSSES, Model

# model.name of a run whose model was given from Python (the record names the user's).
PYTHON_MODEL = "python"
KINDS = ("flax.linen", "flax.nnx", "functions")


def fedprox(mu: float) -> Callable:
  """FedProx's proximal term ``(mu / 2) ||w - w_global||_2^2`` (Li et al. 2020, eq. 2),
  a ``global_term`` for :func:`user_model`."""
  mu = float(mu)

  def term(params, global_params):
    sq = jax.tree_util.tree_map(lambda p, g: jnp.sum(jnp.square(p - g)), params, global_params)
    return 0.5 * mu * sum(jax.tree_util.tree_leaves(sq))
  term.__qualname__ = f"fedprox(mu={mu:g})"
  return term


def _kind(model: Any) -> str:
  import flax.linen as nn
  from flax import nnx
  if isinstance(model, nn.Module):
    return "flax.linen"
  if isinstance(model, nnx.Module) or (callable(model) and not isinstance(model, tuple)):
    return "flax.nnx"  # an instance, or a factory ``rngs -> module`` (drawn per seed)
  if isinstance(model, tuple) and len(model) == 2 and all(map(callable, model)):
    return "functions"
  raise TypeError(f"model: expected a flax.linen module, a flax.nnx module (or a function "
                  f"rngs -> module) or an (init, apply) pair, got {type(model).__name__}")


@dataclasses.dataclass(frozen=True)
class UserSpec:
  """A user's model before it meets the data: call it with ``(input_shape,
  num_classes)`` for the :class:`UserModel` (the zoo's builder signature)."""

  model: Any
  loss: Any = None            # a name of LOSSES, or ``(outputs [n, ...], y [n]) -> [n]``
  global_term: Callable | None = None
  name: str = "model"

  def __call__(self, input_shape: tuple[int, ...], num_classes: int) -> UserModel:
    kind = _kind(self.model)
    regression = num_classes == 0
    loss = self.loss or ("mse" if regression else "cross_entropy")
    if isinstance(loss, str) and loss not in LOSSES:
      raise ValueError(f"loss={loss!r}: not a named loss {tuple(LOSSES)}; or pass a function "
                       "(outputs, labels) -> [n]")
    module = self.model
    if kind == "flax.nnx":
      module = _NnxParts.of(self.model)
    return UserModel(self.name, module, tuple(int(s) for s in input_shape),
                     max(int(num_classes), 1), loss if isinstance(loss, str) else "custom",
                     kind=kind, loss_fn=None if isinstance(loss, str) else loss,
                     global_term=self.global_term, regression=regression)


@dataclasses.dataclass(frozen=True)
class _NnxParts:
  """An nnx module split into its graph and a way to get its parameters: an instance's
  own (the same for every seed) or a factory's, drawn from the run's key."""

  graphdef: Any
  factory: Callable | None
  initial: Any = dataclasses.field(compare=False, hash=False, default=None)

  @classmethod
  def of(cls, model):
    from flax import nnx
    if isinstance(model, nnx.Module):
      graphdef, params = nnx.split(model, nnx.Param)
      return cls(graphdef, None, params)
    graphdef, _ = nnx.split(jax.eval_shape(lambda: model(nnx.Rngs(0))), nnx.Param)
    return cls(graphdef, model)

  def init(self, key):
    from flax import nnx
    if self.factory is None:
      return jax.tree_util.tree_map(jnp.asarray, self.initial)
    return nnx.split(self.factory(nnx.Rngs(key)), nnx.Param)[1]

  def apply(self, params, x):
    from flax import nnx
    return nnx.merge(self.graphdef, params)(x)


@dataclasses.dataclass(frozen=True)
class UserModel(Model):
  """A :class:`Model` from a user's module or functions (:class:`UserSpec` builds it).

  ``per_example_loss`` is the named or given loss; :meth:`losses` adds the global term,
  bound to the round's global model by :meth:`anchored` in the client's update. Never
  ghost-clipped (the per-example gradients are taken with ``vmap``), so any layers and
  any loss are clipped exactly.
  """

  kind: str = "flax.linen"
  loss_fn: Callable | None = None
  global_term: Callable | None = None
  regression: bool = False
  anchor: Any = dataclasses.field(default=None, compare=False, hash=False, repr=False)

  @property
  def is_regression(self) -> bool:
    return self.regression

  def init(self, key):
    if self.kind == "flax.linen":
      return super().init(key)
    if self.kind == "flax.nnx":
      return self.module.init(key)
    return self.module[0](key)

  def apply(self, params, x):
    if self.kind == "flax.linen":
      return super().apply(params, x)
    if self.kind == "flax.nnx":
      return self.module.apply(params, x)
    return self.module[1](params, x)

  def per_example_loss(self, logits, labels):
    if self.loss_fn is None:
      return super().per_example_loss(logits, labels)
    return self.loss_fn(logits, labels)

  def anchored(self, global_params) -> UserModel:
    """This model with the round's global model bound for the global term."""
    if self.global_term is None:
      return self
    return dataclasses.replace(self, anchor=global_params)

  def losses(self, params, x, y):
    out = super().losses(params, x, y)
    if self.global_term is None or self.anchor is None:
      return out
    return out + self.global_term(params, self.anchor)

  def describe(self) -> dict[str, Any]:
    """What the run's record says about the model."""
    shapes = jax.eval_shape(self.init, jax.random.PRNGKey(0))
    out = jax.eval_shape(self.apply, shapes, jax.ShapeDtypeStruct((1, *self.input_shape),
                                                                 jnp.float32))
    loss = self.loss_name if self.loss_fn is None else _qualname(self.loss_fn)
    return {"name": self.name, "kind": self.kind, "num_params": self.num_params(),
            "input_shape": list(self.input_shape), "output_shape": list(out.shape[1:]),
            "loss": loss, "global_term": (None if self.global_term is None
                                          else _qualname(self.global_term)),
            "fingerprint": self.fingerprint()}

  def fingerprint(self) -> str:
    """32 hex digits: the model's description, its functions' code and its initial
    parameters at key 0 (so two different models never share a noise stream)."""
    digest = hashlib.sha256(b"fedjax_dp model fingerprint v1\n")
    parts = [self.kind, self.name, repr(self.input_shape), str(self.num_classes),
             self.loss_name, str(self.regression)]
    if self.kind == "flax.linen":
      parts.append(repr(self.module))
    elif self.kind == "flax.nnx":
      parts.append(repr(self.module.graphdef))
    for fn in (*(self.module if self.kind == "functions" else ()), self.loss_fn,
               self.global_term):
      parts.append(code_text(fn))
    digest.update("|".join(parts).encode())
    for leaf in jax.tree_util.tree_leaves(jax.jit(self.init)(jax.random.PRNGKey(0))):
      a = np.ascontiguousarray(np.asarray(leaf))
      digest.update(f"{a.dtype.str}{a.shape};".encode())
      digest.update(memoryview(a).cast("B"))
    return digest.hexdigest()[:32]


def _qualname(fn) -> str:
  return getattr(fn, "__qualname__", None) or type(fn).__name__


def code_text(obj: Any, depth: int = 0) -> str:
  """A deterministic description of a function (its name, compiled code, constants,
  defaults and closure values, recursively), a transformation or a value: the same text
  in every process (no memory addresses), different for different code or constants."""
  if depth > 6:
    return type(obj).__name__
  if obj is None or isinstance(obj, (bool, int, float, str)):
    return repr(obj)
  if isinstance(obj, (np.ndarray, jax.Array)):
    a = np.ascontiguousarray(np.asarray(obj))
    return f"{a.dtype.str}{a.shape}:{hashlib.sha256(memoryview(a).cast('B')).hexdigest()}"
  if isinstance(obj, functools.partial):
    return (f"partial({code_text(obj.func, depth + 1)},{code_text(obj.args, depth + 1)},"
            f"{code_text(obj.keywords, depth + 1)})")
  code = getattr(obj, "__code__", None)
  if code is not None:
    cells = [code_text(c.cell_contents, depth + 1) for c in (obj.__closure__ or ())]
    consts = [code_text(c, depth + 1) if not hasattr(c, "co_code") else c.co_code.hex()
              for c in code.co_consts]
    return (f"{_qualname(obj)}:{code.co_code.hex()}:{consts}:{cells}:"
            f"{code_text(obj.__defaults__, depth + 1)}")
  if isinstance(obj, (tuple, list)):
    return f"{type(obj).__name__}({','.join(code_text(v, depth + 1) for v in obj)})"
  if isinstance(obj, dict):
    return "{" + ",".join(f"{k!r}:{code_text(v, depth + 1)}" for k, v in obj.items()) + "}"
  return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(obj))


def check_fits(model: Model, x: np.ndarray, y: np.ndarray) -> None:
  """Refuses, before compute, a model whose output does not fit the labels and a loss
  that does not return one value per example (shapes only: nothing runs).

  Args:
    model: the bound model.
    x: a few examples ``[n, *input_shape]``.
    y: their labels (int) or targets (float) ``[n]``.

  Raises:
    ValueError: one line naming what the model returns and what the data needs.
  """
  n = len(x)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  try:
    out = jax.eval_shape(model.apply, shapes, jax.ShapeDtypeStruct(x.shape, jnp.float32))
  except Exception as e:
    raise ValueError(f"model {model.name!r} cannot be applied to inputs of shape "
                     f"{list(x.shape[1:])}: {type(e).__name__}: {e}".splitlines()[0]) from e
  per = tuple(out.shape[1:])
  if out.ndim < 1 or out.shape[0] != n:
    raise ValueError(f"model {model.name!r} maps {n} examples to shape {list(out.shape)}; "
                     f"it must return one output row per example [n, ...]")
  if model.is_regression:
    if model.loss_name != "custom" and per != (1,):
      raise ValueError(f"model {model.name!r} outputs {list(per)} per example, but the "
                       f"targets are real numbers (a regression): it must output [1] "
                       f"(one value per example) for loss {model.loss_name!r}")
  elif model.loss_name != "custom" or len(per) == 1:
    width = math.prod(per) if per else 0
    if len(per) != 1 or width != model.num_classes:
      what = ("1 value (a regressor)" if width == 1 else f"{list(per)}")
      raise ValueError(f"model {model.name!r} outputs {what} per example, but the labels "
                       f"have {model.num_classes} classes: it must output "
                       f"[{model.num_classes}] logits per example")
  try:
    loss = jax.eval_shape(model.per_example_loss, out, jax.ShapeDtypeStruct(y.shape, y.dtype))
  except Exception as e:
    raise ValueError(f"loss {_loss_name(model)!r} fails on outputs {list(out.shape)} and "
                     f"labels {list(y.shape)}: {type(e).__name__}: {e}".splitlines()[0]) from e
  if tuple(loss.shape) != (n,):
    raise ValueError(f"loss {_loss_name(model)!r} returns shape {list(loss.shape)} for {n} "
                     f"examples; a per-example loss must return [{n}] (one value per example, "
                     f"not their mean)")
  if model.loss_name in REGRESSION_LOSSES and not model.is_regression:
    raise ValueError(f"loss {model.loss_name!r} is a regression loss, but the labels are "
                     f"integer classes")


def _loss_name(model: Model) -> str:
  return model.loss_name if getattr(model, "loss_fn", None) is None else _qualname(model.loss_fn)
