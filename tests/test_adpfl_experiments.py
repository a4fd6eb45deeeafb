"""The A-DPFL reproduction (experiments/adpfl2022): method settings, noise units, the
equal-epsilon calibration, the accountant event of every selection rule, and the
notebook's contents (tests/test_notebooks.py executes it)."""

import importlib.util
from pathlib import Path

import nbformat
import numpy as np
import pytest

from fedjax_dp import config as config_lib
from fedjax_dp.config.privacy_inputs import plan_from_config
from fedjax_dp.privacy import accounting

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "adpfl2022.ipynb"


def _common():
  spec = importlib.util.spec_from_file_location(
      "adpfl2022_common", ROOT / "experiments" / "adpfl2022" / "common.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


common = _common()


def test_methods_follow_the_spec():
  base = common.paper_config("mnist", "noniid")
  assert (base.data.num_clients, base.data.samples_per_client) == (1000, 60)
  assert base.data.skew_scheme == "adpfl_uniform" and base.data.skew_remainder == "all"
  # Table 1's B, eta, C; 60 local steps and LeNet-5 from the eps = inf calibration.
  assert (base.client.batch_size, base.client.local_steps, base.client.lr,
          base.client.clip) == (20, 60, 0.05, 4.0)
  assert base.model.name == "cnn_yuan"
  assert common.paper_config("mnist", "noniid", local_steps=0).client.local_steps == 3
  iid = common.paper_config("mnist", "iid")
  assert iid.data.skew_scheme == "constant" and iid.data.skew == 0.0
  dpfl = common.method_config(base, "dpfl")
  adpfl = common.method_config(base, "adpfl")
  nonpriv = common.method_config(base, "nonprivate")
  assert (dpfl.server.selection, dpfl.schedule.name) == ("uniform", "constant")
  assert (adpfl.server.selection, adpfl.schedule.name) == ("wasserstein_topk", "adpfl")
  assert adpfl.schedule.k == 0.7 and adpfl.privacy.placement == "step"
  assert nonpriv.privacy.placement == "none" and nonpriv.client.clip_mode == "none"
  with pytest.raises(config_lib.ConfigError, match="method"):
    common.method_config(base, "bogus")
  with pytest.raises(config_lib.ConfigError, match="partition"):
    common.paper_config("mnist", "skewed")


@pytest.mark.parametrize("method", ["dpfl", "adpfl"])
def test_engine_noise_is_the_papers_sigma_c_on_each_steps_sum(method):
  # Alg. 3 / eq. (17): std sigma C on the summed clipped gradients, whatever
  # sensitivity the accountant proves for a step.
  cfg = common.method_config(common.paper_config("mnist", "noniid"), method, sigma=0.7)
  plan = plan_from_config(cfg, np.full(1000, 60.0))
  std = cfg.privacy.noise_multiplier * plan.sensitivity[0]
  assert std == pytest.approx(0.7 * 4.0)
  assert common.paper_sigma(cfg, np.array([std]))[0] == pytest.approx(0.7)


def test_equal_epsilon_calibration_hits_the_budget_and_topk_spends_more():
  base = common.paper_config("mnist", "noniid", rounds=10)
  dpfl, adpfl = (common.method_config(base, m) for m in ("dpfl", "adpfl"))
  flat = np.ones(10)
  decay = 0.7 ** np.r_[0, 0, 0, 0, 1, 1, 2, 2, 3, 3]
  eps_dpfl = float(common.epsilon_of(dpfl, flat))
  # Top-K charges its cohort every round without amplification, and decay spends more.
  assert float(common.epsilon_of(adpfl, flat)) > eps_dpfl
  assert float(common.epsilon_of(adpfl, decay)) > float(common.epsilon_of(adpfl, flat))
  z = common.calibrate_multiplier(adpfl, decay, eps_dpfl)
  assert z > adpfl.privacy.noise_multiplier
  assert float(common.epsilon_of(adpfl, decay, z)) == pytest.approx(eps_dpfl, rel=1e-3)


@pytest.mark.parametrize("rule,sampling,amplified", [
    ("uniform", "selection", True), ("poisson", "selection", True), ("all", "full", False),
    ("round_robin", "round_robin", False), ("wasserstein_topk", "round_robin", False),
    ("wasserstein_sample", "round_robin", False)])
def test_accountant_event_of_each_selection_rule(rule, sampling, amplified):
  """The event a DP-SGD round of each rule composes: random rules amplify by their
  selection, the deterministic and A-DPFL rules charge the cohort in full (the
  participation flag), and E noised steps compose to z / sqrt(E)."""
  u, k, steps = 20, 5, 3
  cfg = config_lib.override(config_lib.base_config(), [
      f"data.num_clients={u}", f"server.selection={rule}", f"server.clients_per_round={k}",
      "server.q=0.25", "privacy.placement=step", "client.clip_mode=per_example_l2",
      f"client.local_steps={steps}", "client.batch_size=10", "privacy.delta=1e-5"])
  plan = plan_from_config(cfg, np.full(u, 40.0))
  ev = plan.event(np.full(u, 1.0), np.arange(u) < k)
  np.testing.assert_allclose(ev.noise_multiplier, 1.0 / np.sqrt(steps))
  if sampling is not None:
    assert ev.sampling == sampling
  single = accounting.epsilon([ev.replace(count=10)], 1e-5)
  full = accounting.epsilon([accounting.Event(noise_multiplier=1.0 / np.sqrt(steps),
                                              relation="replace_one", count=10)], 1e-5)
  single = np.max(single)
  if amplified:
    assert single < full
  else:
    assert single == pytest.approx(full, rel=1e-9)
  if sampling == "round_robin":  # unselected clients are charged nothing
    np.testing.assert_array_equal(np.asarray(ev.participated), np.arange(u) < k)


def test_notebook_contents():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
  source = "\n".join(c.source for c in nb.cells)
  for needle in ('os.environ.get("SMOKE")', "client_heterogeneity", '"probabilities"',
                 "adpfl_skews", '"sigma"', "calibrate_multiplier", "enforce_budget",
                 "epsilon_certified", '"nonprivate"', '"dpfl"', '"adpfl"', '"clfl"',
                 "none given", "run_configs"):
    assert needle in source, needle
  quick = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
  first = [next(c.source for c in n.cells if c.cell_type == "code") for n in (nb, quick)]
  assert first[0] == first[1]


def test_clfl_is_geyer_median_and_its_certified_variant_is_finite():
  base = common.paper_config("mnist", "noniid")
  clfl = common.method_config(base, "clfl")
  assert (clfl.privacy.placement, clfl.client.clip_mode, clfl.server.clip_rule) == (
      "central", "update_l2", "median")
  # Geyer et al.'s sigma = 1 on the sum of K updates: std S / K on their mean.
  plan = plan_from_config(clfl, np.full(1000, 60.0))
  assert clfl.privacy.noise_multiplier * plan.sensitivity[0] == pytest.approx(4.0 / 10)
  cert = common.certified(common.method_config(base, "clfl"))
  assert cert.server.clip_rule == "private_median"
  eps = float(common.epsilon_of(cert, np.ones(50)))
  assert np.isfinite(eps) and eps > 0


def test_speed_flags_reach_the_config():
  import argparse
  ap = common.add_args(argparse.ArgumentParser())
  args = ap.parse_args(["--model", "cnn_adpfl_mnist", "--test-samples", "2000",
                        "--client-chunk", "5", "--conv-impl", "conv"])
  cfg = common.apply_args(common.paper_config("mnist", "iid", model=args.model), args)
  assert (cfg.data.test_samples, cfg.server.client_chunk, cfg.server.conv_impl) == (2000, 5, "conv")
  cfg = common.apply_args(common.paper_config("mnist", "iid"), ap.parse_args([]))
  assert (cfg.data.test_samples, cfg.server.client_chunk) == (0, 0)  # the committed defaults
