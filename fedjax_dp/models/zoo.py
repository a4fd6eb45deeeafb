"""The models of the four papers, registered by name.

Every model maps ``[n, *input_shape]`` to logits ``[n, num_classes]``. The MLPs
flatten any input; parameter counts in their comments are for MNIST-shaped input
(784 features, 10 classes). The CNNs take NHWC images ``[n, H, W, C]`` (or
``[n, H, W]`` for grayscale) and state their counts for the input shape of their
paper.

Every model is built from :class:`fedjax_dp.models.layers.Dense` and
:class:`fedjax_dp.models.layers.Conv` layers, so all have ``ghost=True``:
per-example clipping uses ghost norms, never per-example gradients of the model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, Union

import flax.linen as nn

from fedjax_dp.models.base import Model
from fedjax_dp.models.layers import Conv, Dense, flatten, max_pool

ACTIVATIONS: dict[str, Callable] = {"relu": nn.relu, "linear": lambda x: x, "tanh": nn.tanh}


class MLP(nn.Module):
  """Fully connected network of ghost-clippable :class:`Dense` layers.

  ``hidden=()`` is a linear model (multinomial logistic regression or linear SVM,
  depending on the loss): 784*10+10 = 7,850 parameters.
  ``hidden=(256,)``, ReLU: Wei et al. Sec. 5 MLP 784-256-10, 203,530 parameters.
  ``hidden=(32,)``, linear activation: Yuan et al. MLP 784-32-10, 25,450 parameters.
  """

  hidden: Sequence[int]
  num_classes: int
  activation: str = "relu"

  @nn.compact
  def __call__(self, x):
    act = ACTIVATIONS[self.activation]
    x = flatten(x)
    for width in self.hidden:
      x = act(Dense(width)(x))
    return Dense(self.num_classes)(x)


def _mlp(name, hidden, activation="relu", loss="cross_entropy"):
  def build(input_shape, num_classes):
    return Model(name, MLP(tuple(hidden), num_classes, activation), tuple(input_shape),
                 num_classes, loss, ghost=True)
  return build


# ----------------------------------------------------------------------------
# Convolutional networks.

# PyTorch's default weight init for Conv2d/Linear, U(-1/sqrt(fan_in), 1/sqrt(fan_in)):
# the Wei, Fu and Yuan models come from PyTorch code bases or tutorials (Fu spec
# A10 asks for it explicitly). Biases stay zero (``layers.Dense`` fixes them so),
# where PyTorch draws them from the same uniform law.
TORCH_KERNEL_INIT = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
# Keras' default (Glorot uniform): A-DPFL ran on TensorFlow Federated, and
# pfl-research's simple_cnn sets Glorot uniform in both its TF2 and PyTorch versions.
KERAS_KERNEL_INIT = nn.initializers.glorot_uniform()

Padding = Union[int, str]


class ConvSpec(NamedTuple):
  """One ``conv -> ReLU [-> max-pool]`` block.

  Attributes:
    features: output channels.
    kernel: square kernel size.
    padding: zero padding on each side (an int, as in PyTorch), or ``'SAME'`` /
      ``'VALID'``.
    pool: square max-pool window, equal to its stride; 1 means no pooling.
  """

  features: int
  kernel: int
  padding: Padding = "VALID"
  pool: int = 2


def _conv_out(size: int, kernel: int, padding: Padding) -> int:
  if padding == "SAME":
    return size
  if padding == "VALID":
    return size - kernel + 1
  return size + 2 * int(padding) - kernel + 1


def _pool_out(size: int, window: int, pool_padding: str) -> int:
  # 'VALID' floors like torch.nn.MaxPool2d; 'SAME' rounds up like tf.nn.max_pool.
  return -(-size // window) if pool_padding == "SAME" else size // window


def _try_feature_hw(hw, convs, pool_padding):
  """Spatial size after the conv stack, or ``None`` if some block gets an empty input."""
  hw = tuple(hw)
  for spec in convs:
    hw = tuple(_conv_out(s, spec.kernel, spec.padding) for s in hw)
    if min(hw) < 1:
      return None
    if spec.pool > 1:
      hw = tuple(_pool_out(s, spec.pool, pool_padding) for s in hw)
      if min(hw) < 1:
        return None
  return hw


def feature_hw(hw: Sequence[int], convs: Sequence[ConvSpec], pool_padding: str = "VALID",
               what: str = "this CNN") -> tuple[int, int]:
  """Spatial size ``(H', W')`` of the feature map after all conv blocks.

  Args:
    hw: input spatial size ``(H, W)``.
    convs: the conv blocks.
    pool_padding: ``'VALID'`` (floor) or ``'SAME'`` (ceil) max-pooling.
    what: the model name, for the error message.

  Raises:
    ValueError: the input is too small (some convolution or pooling would get an
      empty map); the message gives the smallest square input that works.
  """
  out = _try_feature_hw(hw, convs, pool_padding)
  if out is None:
    smallest = next((n for n in range(1, 4097)
                     if _try_feature_hw((n, n), convs, pool_padding) is not None), None)
    raise ValueError(f"{what}: input of spatial size {tuple(hw)} is too small for its conv "
                     f"stack {[tuple(c) for c in convs]}; it needs H, W >= {smallest}")
  return out


class ConvNet(nn.Module):
  """``[conv -> ReLU -> max-pool]* -> flatten -> [Dense -> ReLU]* -> Dense``.

  Input ``[n, H, W, C]`` (NHWC) or ``[n, H, W]`` (one channel); output logits
  ``[n, num_classes]``. Convolutions are ghost-clippable
  :class:`~fedjax_dp.models.layers.Conv` (kernel ``[k, k, C_in, C_out]`` plus bias,
  as ``flax.linen.Conv``); dense layers are ghost-clippable
  :class:`~fedjax_dp.models.layers.Dense`. No dropout or normalisation: the
  ``Model`` interface is a pure deterministic ``apply``, and batch statistics
  would mix examples, which per-example clipping forbids.

  Attributes:
    convs: the conv blocks, in order.
    hidden: widths of the hidden dense layers (ReLU).
    num_classes: output width.
    pool_padding: ``'VALID'`` (PyTorch floor) or ``'SAME'`` (TensorFlow ceil) pooling.
    kernel_init: initialiser of every conv and dense kernel (biases start at 0).
    conv_impl: how the convolutions compute (:class:`~fedjax_dp.models.layers.Conv`
      ``impl``); the same function and parameters either way.
  """

  convs: Sequence[ConvSpec]
  hidden: Sequence[int]
  num_classes: int
  pool_padding: str = "VALID"
  kernel_init: nn.initializers.Initializer = TORCH_KERNEL_INIT
  conv_impl: str = "conv"

  @nn.compact
  def __call__(self, x):
    if x.ndim == 3:  # grayscale without a channel axis
      x = x[..., None]
    if x.ndim != 4:
      raise ValueError(f"ConvNet expects [n, H, W, C] or [n, H, W] inputs, got shape {x.shape}")
    # Shapes are static, so this check costs nothing at run time and turns an
    # obscure XLA shape error into a readable one.
    feature_hw(x.shape[1:3], self.convs, self.pool_padding, what="ConvNet")
    for spec in self.convs:
      pad = spec.padding if isinstance(spec.padding, str) else [(spec.padding, spec.padding)] * 2
      x = Conv(spec.features, (spec.kernel, spec.kernel), padding=pad,
               kernel_init=self.kernel_init, impl=self.conv_impl)(x)
      x = nn.relu(x)
      if spec.pool > 1:
        x = max_pool(x, spec.pool, self.pool_padding)
    x = flatten(x)
    for width in self.hidden:
      x = nn.relu(Dense(width, kernel_init=self.kernel_init)(x))
    return Dense(self.num_classes, kernel_init=self.kernel_init)(x)


def _build_cnn(name, input_shape, num_classes, convs, hidden=(), pool_padding="VALID",
               kernel_init=TORCH_KERNEL_INIT) -> Model:
  input_shape = tuple(input_shape)
  if len(input_shape) not in (2, 3):
    raise ValueError(f"{name}: expects an image input_shape (H, W, C) or (H, W), "
                     f"got {input_shape}")
  convs = tuple(ConvSpec(*c) for c in convs)
  feature_hw(input_shape[:2], convs, pool_padding, what=name)  # fail early, clearly
  module = ConvNet(convs, tuple(hidden), num_classes, pool_padding, kernel_init)
  return Model(name, module, input_shape, num_classes, "cross_entropy", ghost=True, conv=True)


def with_conv_impl(model: Model, impl: str) -> Model:
  """``model`` with its convolutions computed by ``impl`` (``'conv'`` or ``'im2col'``).

  The same function of the same parameters; models without convolutions are
  returned unchanged.
  """
  if not model.conv or getattr(model.module, "conv_impl", impl) == impl:
    return model
  return dataclasses.replace(model, module=model.module.clone(conv_impl=impl))


def cnn_wei_cifar10(input_shape: Sequence[int], num_classes: int) -> Model:
  """Wei et al.'s CIFAR-10 CNN (wei_udp_crd.md Sec. 7 item 3 and Sec. 10 item 22).

  ``Conv(C->32, k=5, padding=4) -> ReLU -> MaxPool 2 -> Dense(num_classes)``.

  The paper says only "single convolutional layer with the convolutional kernel
  size 5 and the padding size 4, where ReLU units and softmax of 10 classes are
  applied". **Assumption** (spec Sec. 10 item 22): 32 channels, a 2x2 max-pool,
  and no hidden dense layer. Kernels use PyTorch's default init (the authors'
  code is PyTorch).

  Parameters for ``(32, 32, 3)``, 10 classes: conv 5*5*3*32+32 = 2,432; the map is
  36x36 -> 18x18, so dense 32*18*18*10+10 = 103,690; **106,122** in all.
  (``(28, 28, 1)``: 82,762.) Works down to 1x1 inputs.

  Args:
    input_shape: one image, ``(H, W, C)``.
    num_classes: number of classes.

  Returns:
    The :class:`Model` (cross-entropy, ``ghost=True``).
  """
  return _build_cnn("cnn_wei_cifar10", input_shape, num_classes, [(32, 5, 4, 2)])


def cnn_fu_femnist(input_shape: Sequence[int], num_classes: int) -> Model:
  """Fu et al.'s FEMNIST CNN (fu_practicality.md Sec. 4.2 "CNN", checklist item 1).

  ``Conv(C->32, 7x7, pad 3) -> ReLU -> MaxPool 2 -> Conv(32->64, 3x3, pad 1) ->
  ReLU -> MaxPool 2 -> flatten -> Dense(num_classes)``, exactly as the paper.

  Parameters for ``(28, 28, 1)``, 62 classes: 7*7*32+32 = 1,600;
  3*3*32*64+64 = 18,496; 7*7*64*62+62 = 194,494; **214,590** in all, the paper's
  stated count (which also pins the 28x28 input and the absence of a hidden
  layer). **Assumption** (spec A10): PyTorch-default kernel init. Needs H, W >= 4.

  Args:
    input_shape: one image, ``(H, W, C)``.
    num_classes: number of classes (62 for FEMNIST).

  Returns:
    The :class:`Model` (cross-entropy, ``ghost=True``).
  """
  return _build_cnn("cnn_fu_femnist", input_shape, num_classes,
                    [(32, 7, 3, 2), (64, 3, 1, 2)])


def cnn_adpfl_mnist(input_shape: Sequence[int], num_classes: int) -> Model:
  """The A-DPFL CNN, as reconstructed (adpfl.md Sec. 5.1 "Model", errata item 13).

  ``Conv(C->32, 5x5, SAME) -> ReLU -> MaxPool 2 -> Conv(32->64, 5x5, SAME) -> ReLU
  -> MaxPool 2 -> flatten -> Dense(1024) -> ReLU -> Dense(num_classes)``.

  The paper says "two convolutional layers" but lists one (conv 5x5-32, 2x2
  pool, FC 1024 + ReLU, FC 10). **Assumption** (the spec's recommendation): the
  TensorFlow "Deep MNIST" CNN above, with TF's SAME pooling, no dropout, and
  Keras' default Glorot-uniform kernels (the paper used TensorFlow Federated).
  The same network serves CIFAR-10 (3 input channels). For the literal one-conv
  reading see :func:`cnn_adpfl_literal`.

  Parameters for ``(28, 28, 1)``, 10 classes: 832 + 51,264 + 7*7*64*1024+1024
  (3,212,288) + 10,250 = **3,274,634**. For ``(32, 32, 3)``: **4,259,274**.
  Works down to 1x1 inputs (SAME padding and pooling never empty the map).

  Args:
    input_shape: one image, ``(H, W, C)``.
    num_classes: number of classes.

  Returns:
    The :class:`Model` (cross-entropy, ``ghost=True``).
  """
  return _build_cnn("cnn_adpfl_mnist", input_shape, num_classes,
                    [(32, 5, "SAME", 2), (64, 5, "SAME", 2)], hidden=(1024,),
                    pool_padding="SAME", kernel_init=KERAS_KERNEL_INIT)


def cnn_adpfl_literal(input_shape: Sequence[int], num_classes: int) -> Model:
  """The A-DPFL CNN exactly as the paper lists it (adpfl.md errata item 13, variant).

  ``Conv(C->32, 5x5, SAME) -> ReLU -> MaxPool 2 -> flatten -> Dense(1024) -> ReLU
  -> Dense(num_classes)``; the spec suggests trying it if the reconstruction
  :func:`cnn_adpfl_mnist` does not match the paper's accuracies. Same init and
  padding assumptions as that model.

  Parameters for ``(28, 28, 1)``, 10 classes: 832 + 14*14*32*1024+1024
  (6,423,552) + 10,250 = **6,434,634**. For ``(32, 32, 3)``: **8,402,314**.

  Args:
    input_shape: one image, ``(H, W, C)``.
    num_classes: number of classes.

  Returns:
    The :class:`Model` (cross-entropy, ``ghost=True``).
  """
  return _build_cnn("cnn_adpfl_literal", input_shape, num_classes,
                    [(32, 5, "SAME", 2)], hidden=(1024,),
                    pool_padding="SAME", kernel_init=KERAS_KERNEL_INIT)


def cnn_yuan(input_shape: Sequence[int], num_classes: int) -> Model:
  """Yuan et al.'s CNN for CIFAR-10 and FMNIST (yuan_amplitude_varying.md Sec. 7.1).

  LeNet-5: ``Conv(C->6, 5x5, VALID) -> ReLU -> MaxPool 2 -> Conv(6->16, 5x5,
  VALID) -> ReLU -> MaxPool 2 -> flatten -> Dense(120) -> ReLU -> Dense(84) ->
  ReLU -> Dense(num_classes)``.

  The paper gives "two convolutional layers with a kernel size of five and three
  fully-connected layers", ReLU, softmax over 10 classes. **Assumption** (the
  spec's recommendation): channels 6/16, 2x2 max-pools and widths 120/84 of the
  PyTorch-tutorial LeNet-5, with PyTorch-default kernel init.

  Parameters, 10 classes: ``(32, 32, 3)`` (CIFAR-10): 456 + 2,416 +
  16*5*5*120+120 (48,120) + 10,164 + 850 = **62,006**; ``(28, 28, 1)`` (FMNIST):
  156 + 2,416 + 16*4*4*120+120 (30,840) + 10,164 + 850 = **44,426**. Needs
  H, W >= 16 (valid convolutions shrink the map); smaller inputs raise ValueError.

  Args:
    input_shape: one image, ``(H, W, C)``.
    num_classes: number of classes.

  Returns:
    The :class:`Model` (cross-entropy, ``ghost=True``).
  """
  return _build_cnn("cnn_yuan", input_shape, num_classes,
                    [(6, 5, "VALID", 2), (16, 5, "VALID", 2)], hidden=(120, 84))


def cnn_pfl_cifar10(input_shape: Sequence[int], num_classes: int) -> Model:
  """pfl-research's ``simple_cnn``, the model of its CIFAR-10 speed benchmark.

  ``Conv(C->32, 3x3, VALID) -> ReLU -> Conv(32->64, 3x3, VALID) -> ReLU ->
  MaxPool 2 -> flatten -> Dense(128) -> ReLU -> Dense(num_classes)``.

  Follows ``apple/pfl-research: benchmarks/model/{tf2,pytorch}/cnn.py``
  (``simple_cnn``, "2 convolutional layers and one dense hidden layer"), the model
  of the CIFAR-10 FedAvg benchmark used for the cross-framework timings
  (design/framework_anchors.md). Both convolutions come before the single pool.
  Differences: no dropout (0.25 after the pool and 0.5 after the hidden layer
  there), since ``Model.apply`` is deterministic; dropout changes no shapes or
  FLOPs, so timings stay comparable. Glorot-uniform kernels as there.

  Parameters for ``(32, 32, 3)``, 10 classes: 896 + 18,496 + 14*14*64*128+128
  (1,605,760) + 1,290 = **1,626,442**. Needs H, W >= 6.

  Args:
    input_shape: one image, ``(H, W, C)``.
    num_classes: number of classes.

  Returns:
    The :class:`Model` (cross-entropy, ``ghost=True``).
  """
  return _build_cnn("cnn_pfl_cifar10", input_shape, num_classes,
                    [(32, 3, "VALID", 1), (64, 3, "VALID", 2)], hidden=(128,),
                    kernel_init=KERAS_KERNEL_INIT)



class Linear(nn.Module):
  """``flatten(x) @ w + b`` with one ghost-clippable :class:`Dense`, zero-initialised."""

  features: int = 1

  @nn.compact
  def __call__(self, x):
    return Dense(self.features, kernel_init=nn.initializers.zeros_init())(flatten(x))


def linear_regression(input_shape: Sequence[int], num_classes: int = 1) -> Model:
  """Linear regression ``s = w^T x + b`` with MSE loss (Fu et al., Lending Club).

  One output whatever ``num_classes`` says (a regression dataset has none): for the 10
  PCA features of Fu et al. Sec. V it has the paper's 11 parameters. Zero-initialised,
  as the Fu spec (A10) resolves, so the initial test MSE is the mean squared target.
  """
  del num_classes
  return Model("linear_regression", Linear(1), tuple(input_shape), 1, "mse", ghost=True)


MODELS: dict[str, Callable[[tuple, int], Model]] = {
    # Fu et al. linear regression (MSE; 11 params on 10 features).
    "linear_regression": linear_regression,
    # Multi-class linear SVM (Crammer-Singer hinge); Wei Figs. 4 uses a binary one.
    "linear_svm": _mlp("linear_svm", (), loss="hinge"),
    # Multinomial logistic regression.
    "logistic": _mlp("logistic", ()),
    # Wei et al. Sec. 5: 784-256-10, ReLU. 203,530 params on MNIST.
    "mlp_784_256_10": _mlp("mlp_784_256_10", (256,)),
    # Yuan et al.: 784-32-10 with linear activation. 25,450 params on MNIST.
    "mlp_784_32_10_linear": _mlp("mlp_784_32_10_linear", (32,), activation="linear"),
    # CNNs (ghost Conv + Dense layers); counts for each paper's input shape, see the docstrings.
    # Wei et al. CIFAR-10, one conv (architecture assumed). 106,122 params.
    "cnn_wei_cifar10": cnn_wei_cifar10,
    # Fu et al. FEMNIST, 62 classes, as printed. 214,590 params.
    "cnn_fu_femnist": cnn_fu_femnist,
    # A-DPFL, reconstructed as TF "Deep MNIST". 3,274,634 params on MNIST.
    "cnn_adpfl_mnist": cnn_adpfl_mnist,
    # A-DPFL, the one-conv network literally listed. 6,434,634 params on MNIST.
    "cnn_adpfl_literal": cnn_adpfl_literal,
    # Yuan et al., LeNet-5 (assumed). 62,006 on CIFAR-10; 44,426 on FMNIST.
    "cnn_yuan": cnn_yuan,
    # pfl-research simple_cnn (benchmarks). 1,626,442 params on CIFAR-10.
    "cnn_pfl_cifar10": cnn_pfl_cifar10,
}


def get_model(name: str, input_shape: Sequence[int], num_classes: int) -> Model:
  """Builds a registered model for inputs of ``input_shape`` (one example).

  Raises:
    ValueError: unknown ``name`` (the message lists the known ones).
  """
  if name not in MODELS:
    raise ValueError(f"model.name: unknown model {name!r}; known: {sorted(MODELS)}")
  if math.prod(input_shape) <= 0:
    raise ValueError(f"input_shape must be non-empty, got {tuple(input_shape)}")
  model = MODELS[name](tuple(input_shape), num_classes)
  if not model.is_regression and num_classes < 2:
    raise ValueError(f"model.name={name!r} is a classifier: num_classes must be >= 2, got "
                     f"{num_classes} (0 is a regression dataset: use a regressor such as "
                     "'linear_regression')")
  return model
