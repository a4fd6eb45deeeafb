"""The privacy layer's typed inputs: built by hand they give the plan a config gives,
they are frozen, and nothing under fedjax_dp/privacy/ reads a run config."""

import ast
import dataclasses

import numpy as np
import pytest
from _helpers import QUICKSTART, ROOT

from fedjax_dp import config as config_lib
from fedjax_dp.config import privacy_inputs
from fedjax_dp.errors import ConfigError
from fedjax_dp.privacy import inputs as inputs_lib
from fedjax_dp.privacy import selection
from fedjax_dp.privacy.plan import make_privacy_plan

PRIVACY = ROOT / "fedjax_dp" / "privacy"


def _quickstart_by_hand(counts) -> inputs_lib.PrivacyInputs:
  """The quickstart's privacy inputs written without a config (as the Python API does)."""
  return inputs_lib.PrivacyInputs(
      client=inputs_lib.ClientInputs(clip_mode="per_example_l2", clip=1.0, lrs=(0.5,)),
      server=inputs_lib.ServerInputs(selection="uniform", clients_per_round=10),
      federation=inputs_lib.FederationSizes(num_clients=10, counts=counts, num_params=19210),
      privacy=inputs_lib.PrivacySettings(epsilon=8.0, delta=1e-3, rounds=100))


def test_typed_inputs_built_by_hand_give_the_configs_plan():
  counts = np.arange(130, 140)
  cfg = config_lib.load_config(QUICKSTART)
  want = privacy_inputs.plan_from_config(cfg, counts, num_params=19210)
  got = make_privacy_plan(_quickstart_by_hand(counts))
  np.testing.assert_array_equal(got.sensitivity, want.sensitivity)
  np.testing.assert_array_equal(got.noise_scale(100), want.noise_scale(100))
  assert got.describe() == want.describe()
  assert privacy_inputs.from_config(cfg, counts, 19210).client == _quickstart_by_hand(
      counts).client


def test_inputs_are_frozen_and_checked():
  inputs = _quickstart_by_hand(np.full(10, 5))
  with pytest.raises(dataclasses.FrozenInstanceError):
    inputs.client.clip = 2.0
  assert not inputs.federation.counts.flags.writeable
  with pytest.raises(ValueError, match="client.local_steps"):
    inputs_lib.ClientInputs(lrs=())
  with pytest.raises(ValueError, match="FederationSizes.counts"):
    make_privacy_plan(inputs.replace(federation=inputs_lib.FederationSizes(10)))
  # The owners check the typed inputs, naming the config's field.
  bad = inputs.replace(server=inputs_lib.ServerInputs(clients_per_round=11))
  with pytest.raises(ConfigError, match="server.clients_per_round"):
    selection.check_config(bad)


def _reads_of_a_run_config(tree: ast.AST) -> list[str]:
  """``cfg.<field>`` reads and parameters named ``cfg`` (a run config) in a module."""
  found = [f"cfg.{n.attr}" for n in ast.walk(tree)
           if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
           and n.value.id == "cfg"]
  found += [f"def {n.name}(cfg)" for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
            and any(a.arg in ("cfg", "server_cfg") for a in n.args.args)]
  return found


def test_the_privacy_layer_reads_no_run_config_and_stays_small():
  for path in sorted(PRIVACY.rglob("*.py")):
    text = path.read_text()
    reads = _reads_of_a_run_config(ast.parse(text))
    assert not reads, (path, reads)
    assert len(text.splitlines()) <= 450, (path, len(text.splitlines()))


def test_the_config_builds_the_inputs_once_for_its_owners(monkeypatch):
  """validate() runs the owners' checks on the typed inputs it built (one build)."""
  built = []
  real = privacy_inputs.from_config
  monkeypatch.setattr(privacy_inputs, "from_config",
                      lambda *a, **k: built.append(1) or real(*a, **k))
  config_lib.validate(config_lib.load_config(QUICKSTART))
  assert built == [1]


def test_the_architecture_doc_names_every_privacy_module():
  doc = (ROOT / "docs" / "architecture.md").read_text()
  for path in PRIVACY.glob("*.py"):
    if path.stem != "__init__":
      assert f"`{path.stem}`" in doc, path.stem


def test_the_client_optimizer_reaches_the_bound_through_the_typed_inputs():
  """``ClientInputs.optimizer`` (the config's ``client.optimizer``, or one passed from
  Python) is what the step-weighted bounds read: heavy-ball momentum's step weights
  replace the learning rates, Adam is refused by the mode's check and by the plan."""
  from fedjax_dp import optimizers  # pylint: disable=import-outside-toplevel
  from fedjax_dp.privacy import clip_modes  # pylint: disable=import-outside-toplevel

  counts = np.full(10, 40.0)
  cfg = config_lib.override(config_lib.load_config(QUICKSTART), [
      "client.optimizer=momentum", "client.momentum=0.5", "client.local_steps=3"])
  got = privacy_inputs.from_config(cfg, counts, 19210)
  assert got.client.optimizer == optimizers.MOMENTUM.with_values({"momentum": 0.5})
  by_hand = _quickstart_by_hand(counts)
  by_hand = by_hand.replace(client=dataclasses.replace(
      by_hand.client, lrs=(0.5,) * 3, optimizer=got.client.optimizer))
  a = optimizers.heavy_ball_weights(np.full(3, 0.5), 0.5)
  np.testing.assert_allclose(make_privacy_plan(by_hand).sensitivity,
                             2.0 * (a[0] / counts + a[1:].sum()))
  adam = by_hand.replace(client=dataclasses.replace(by_hand.client,
                                                    optimizer=optimizers.ADAM))
  for refuse in (clip_modes.check_config, make_privacy_plan):
    with pytest.raises(ConfigError, match="client.optimizer='adam' with client.clip_mode="
                       "'per_example_l2' at privacy.placement='upload'"):
      refuse(adam)
