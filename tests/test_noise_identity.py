"""Separate releases never share noise unless asked (fedjax_dp.config.noise_identity).

Each test compares round-1 models: with shared noise n, ``w_a = m + s_a n`` and
``w_b = m + s_b n`` give away the noiseless model ``m``.
"""

import json

import jax
import numpy as np
import pytest
from _helpers import QUICKSTART, small_config

from fedjax_dp import cli, experiment, optimal_t, sweep
from fedjax_dp import config as config_lib
from fedjax_dp.config import noise_identity
from fedjax_dp.privacy import accounting


def _base(**sets):
  # K < U, full batches: the only randomness of a round is the cohort (by seed) and
  # the noise, so the noiseless round-1 model is the same for every run here.
  return small_config({"rounds": "2", "data.num_clients": "5",
                       "data.samples_per_client": "24", "server.clients_per_round": "3",
                       "model.name": "logistic", "client.lr": "0.5",
                       "privacy.epsilon": "4.0", "progress": "false"}, **sets)


class _Stop(Exception):
  pass


def _round1(monkeypatch, tmp_path, cfg, stop=True, cli_args=None):
  """``{run name: flat round-1 model}`` where the run loop checkpoints round 1."""
  got = {}
  original = experiment.RunLoop.save_checkpoint

  def capture(self, params, wall):
    if self.t == 1:
      got[self.cfg.name] = np.concatenate(
          [np.ravel(x) for x in jax.tree_util.tree_leaves(jax.device_get(params))])
      if stop:
        raise _Stop
    return original(self, params, wall)

  monkeypatch.setattr(experiment.RunLoop, "save_checkpoint", capture)
  out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
  try:
    if cli_args is None:
      experiment.run(config_lib.override(cfg, ["checkpoint.every=1"]), str(out))
    else:
      cli.main(["run", str(QUICKSTART), "--out", str(out), "--no-progress", *cli_args,
                "--set", "checkpoint.every=1"])
  except _Stop:
    pass
  monkeypatch.setattr(experiment.RunLoop, "save_checkpoint", original)
  return got, out


def _one(monkeypatch, tmp_path, cfg):
  return next(iter(_round1(monkeypatch, tmp_path, cfg)[0].values()))


def _shared(w_a, w_b, clean):
  """(correlation of the two noises, max error of the best linear recovery of clean)."""
  n_a, n_b = w_a - clean, w_b - clean
  corr = float(np.corrcoef(n_a, n_b)[0, 1])
  ratio = np.std(n_b) / np.std(n_a)  # the scales, as public as the configs
  recovered = (ratio * w_a - w_b) / (ratio - 1.0)
  return corr, float(np.max(np.abs(recovered - clean))), float(np.std(n_a))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
  with pytest.MonkeyPatch.context() as mp:
    return _one(mp, tmp_path_factory.mktemp("clean"), _base(**{"privacy.placement": "none"}))


# ----------------------------------------------------------------------------- P1


def test_optimal_t_candidates_draw_independent_noise_and_certify_their_composition(
    monkeypatch, tmp_path, capsys, clean):
  sets = {"rounds": "2", "data.num_clients": "5", "data.samples_per_client": "24",
          "server.clients_per_round": "3", "model.name": "logistic", "client.lr": "0.5",
          "privacy.epsilon": "4.0", "server.client_chunk": "0",
          "schedule.name": "optimal_t", "schedule.t_grid": "1,2"}
  args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
  models, out = _round1(monkeypatch, tmp_path, None, stop=False, cli_args=args)
  line = capsys.readouterr().out
  w1, w2 = models["quickstart/T=1"], models["quickstart/T=2"]
  corr, err, std = _shared(w1, w2, clean)
  assert abs(corr) < 0.3, corr          # was 1.000000: the same noise at two scales
  assert err > std, (err, std)          # was ~1e-7: the noiseless model came back

  # What the command releases: both candidates' models, and a choice that read both.
  summary = json.loads((out / "summary.json").read_text())
  cands = [json.loads((out / f"T={t}" / "summary.json").read_text()) for t in (1, 2)]
  # Independent oracle: the two candidates' constant schedules composed in one RDP state.
  state = accounting.rdp_init((5,))
  for t in (1, 2):
    cfg = config_lib.override(config_lib.load_config(QUICKSTART),
                              [f"{k}={v}" for k, v in sets.items()] +
                              ["schedule.name=constant", f"rounds={t}"])
    plan = experiment.build(cfg).privacy
    z = plan.noise_scale(t) / plan.sensitivity
    state = accounting.rdp_compose(state, plan.horizon_event(z, t))
  want = float(np.max(accounting.rdp_epsilon(state, 1e-3)))
  assert summary["epsilon_certified"] == pytest.approx(want, rel=1e-6)
  assert want > max(c["epsilon_certified"] for c in cands) + 0.5  # was: the chosen one's 4.0
  assert summary["epsilon_certified_chosen"] == pytest.approx(
      cands[summary["best_rounds"] - 1]["epsilon_certified"])
  assert f"certified epsilon {want:.3f}" in line
  rows = (out / "metrics.csv").read_text().splitlines()
  header = rows[0].split(",")
  assert float(rows[-1].split(",")[header.index("epsilon_certified")]) == pytest.approx(want)


def test_composed_epsilon_is_inf_for_an_uncertified_candidate():
  acct = {"orders": [2.0, 4.0], "rdp_worst_client": [0.1, 0.2],
          "pure_epsilon_worst_client": "inf"}
  ok = {"epsilon_certified": 1.0, "accountant": acct}
  eps, _ = optimal_t.composed_epsilon([ok, ok], 1e-3)
  assert eps == pytest.approx(float(accounting.rdp_epsilon(
      accounting.RdpState(np.array([2.0, 4.0]), np.array([0.2, 0.4])), 1e-3)))
  assert optimal_t.composed_epsilon([ok, dict(ok, epsilon_certified="inf")], 1e-3)[0] == np.inf
  assert optimal_t.composed_epsilon([ok, {"epsilon_certified": 1.0}], 1e-3)[0] == np.inf


# ----------------------------------------------------------------------------- P2


def test_runs_at_different_epsilons_draw_independent_noise(monkeypatch, tmp_path, clean):
  w4 = _one(monkeypatch, tmp_path, _base(**{"privacy.epsilon": "4.0"}))
  w8 = _one(monkeypatch, tmp_path, _base(**{"privacy.epsilon": "8.0"}))
  corr, err, std = _shared(w4, w8, clean)
  assert abs(corr) < 0.3, corr          # was 1.0000
  assert err > std, (err, std)          # was ~1e-7


def test_sweep_point_zero_does_not_share_an_ordinary_runs_noise(monkeypatch, tmp_path, clean):
  point = sweep.expand(_base(), {"privacy.epsilon": [2.0, 4.0]})[0]
  w_point = _one(monkeypatch, tmp_path, point.config)
  w_run = _one(monkeypatch, tmp_path, _base(**{"privacy.epsilon": "4.0"}))
  corr, _, _ = _shared(w_point, w_run, clean)
  assert abs(corr) < 0.3, corr          # was 1.0: point 0 drew the seed's own stream
  # The same config reproduces: the point run alone under another name.
  alone = config_lib.override(point.config, ["name=elsewhere"])
  np.testing.assert_array_equal(_one(monkeypatch, tmp_path, alone), w_point)


def test_common_random_numbers_is_an_explicit_opt_in(monkeypatch, tmp_path, clean):
  crn = _base(**{"privacy.common_random_numbers": "true"})
  a, b = (p.config for p in sweep.expand(crn, {"privacy.epsilon": [2.0, 8.0]}))
  np.testing.assert_array_equal(noise_identity.stream(a), [0, 0])
  corr, err, std = _shared(_one(monkeypatch, tmp_path, a), _one(monkeypatch, tmp_path, b),
                           clean)
  assert corr > 0.999 and err < 1e-3 * std


def test_stream_is_a_hash_of_the_release_fields():
  base = _base()
  s = noise_identity.stream(base)
  assert s.dtype == np.uint32 and s.shape == (2,) and s[0] & 0x80000000
  np.testing.assert_array_equal(noise_identity.stream(config_lib.override(base, [])), s)
  same = ["name=x", "progress=true", "checkpoint.every=3", "server.client_chunk=2",
          "server.conv_impl=conv", "client.chunk_size=8", "eval.batch_size=7"]
  for a in same:
    np.testing.assert_array_equal(noise_identity.stream(config_lib.override(base, [a])), s,
                                  err_msg=a)
  differ = ["privacy.epsilon=8", "seed=1", "rounds=3", "privacy.noise_stream=1",
            "client.lr=0.4", "eval.every=2", "data.dir=/elsewhere",
            f"privacy.noise_seed={'ab' * 16}"]
  streams = {tuple(s)} | {tuple(noise_identity.stream(config_lib.override(base, [a])))
                          for a in differ}
  assert len(streams) == len(differ) + 1
  # Integral floats and ints are one config.
  eps8 = config_lib.override(base, ["privacy.epsilon=8"])
  eps8.privacy.epsilon = 8
  np.testing.assert_array_equal(noise_identity.stream(eps8), noise_identity.stream(
      config_lib.override(base, ["privacy.epsilon=8.0"])))


# ----------------------------------------------------------------------------- OS entropy


def test_os_entropy_is_recorded_and_read_back_on_resume(tmp_path):
  cfg = _base(**{"privacy.noise_seed": "os"})
  a, b = tmp_path / "a", tmp_path / "b"
  first = experiment.run(cfg, str(a)).summary
  seed = json.loads((a / "config.json").read_text())["privacy"]["noise_seed"]
  assert len(seed) == 32 and first["noise_seed"] == seed
  # The same command on the same directory continues that release.
  again = experiment.run(cfg, str(a)).summary
  assert json.loads((a / "config.json").read_text())["privacy"]["noise_seed"] == seed
  assert again["noise_stream_id"] == first["noise_stream_id"]
  assert again["final_test_loss"] == first["final_test_loss"]
  # Another directory: fresh entropy, another stream.
  other = experiment.run(cfg, str(b)).summary
  assert other["noise_seed"] != seed and other["noise_stream_id"] != first["noise_stream_id"]
  # A recorded value reproduces the release anywhere.
  fixed = experiment.run(config_lib.override(cfg, [f"privacy.noise_seed={seed}"])).summary
  assert fixed["final_test_loss"] == first["final_test_loss"]
  with pytest.raises(config_lib.ConfigError, match="noise_seed"):
    noise_identity.stream(cfg)


def test_sweep_draws_one_entropy_and_records_it(tmp_path):
  cfg = _base(**{"privacy.noise_seed": "os", "rounds": "1"})
  grid = {"privacy.epsilon": [2.0, 4.0]}
  sweep.run_sweep(cfg, grid, str(tmp_path))
  seed = json.loads((tmp_path / "sweep.json").read_text())["noise_seed"]
  points = sorted((tmp_path / "points").iterdir())
  assert [json.loads((p / "config.json").read_text())["privacy"]["noise_seed"]
          for p in points] == [seed, seed]
  sweep.run_sweep(cfg, grid, str(tmp_path))  # resumes: the points are finished, same seed
  assert json.loads((tmp_path / "sweep.json").read_text())["noise_seed"] == seed


@pytest.mark.parametrize("bad", ["OS", "abc", "random"])
def test_bad_noise_seed_is_a_config_error(bad):
  with pytest.raises(config_lib.ConfigError, match="privacy.noise_seed"):
    config_lib.validate(_base(**{"privacy.noise_seed": bad}))


# ----------------------------------------------------------------------------- the data


def _loans_config(data_dir, **sets):
  base = {"data.name": "lending_club", "data.dir": str(data_dir), "data.partition": "iid",
          "data.num_clients": "4", "data.samples_per_client": "10",
          "model.name": "linear_regression", "rounds": "2", "client.lr": "0.1",
          "client.clip": "1.0", "server.clients_per_round": "4", "privacy.epsilon": "8",
          "progress": "false", "checkpoint.every": "1"}
  base.update(sets)
  return config_lib.override(config_lib.base_config(), [f"{k}={v}" for k, v in base.items()])


def test_changed_data_at_the_same_path_draws_independent_noise(tmp_path):
  """Issue 47 Q3: the identity hashes the data's content, not only its path."""
  from test_datasets_papers import write_loans  # pylint: disable=import-outside-toplevel
  data = tmp_path / "data"
  data.mkdir()
  cfg = _loans_config(data)
  write_loans(data, n=100, seed=0)
  first = experiment.run(cfg, str(tmp_path / "a")).summary
  write_loans(data, n=100, seed=1)  # other records, same file, same path, same config
  second = experiment.run(cfg, str(tmp_path / "b")).summary
  assert first["noise_stream_id"] != second["noise_stream_id"]
  assert first["data_fingerprint"] != second["data_fingerprint"]
  # Resuming the first run on the changed data is refused, naming the data.
  with pytest.raises(config_lib.ConfigError, match="data's content"):
    experiment.run(cfg, str(tmp_path / "a"))
  # The same content again (rewritten, new modification time) is the same release.
  write_loans(data, n=100, seed=0)
  third = experiment.run(cfg, str(tmp_path / "c")).summary
  assert third["data_fingerprint"] == first["data_fingerprint"]
  assert third["noise_stream_id"] == first["noise_stream_id"]
  assert third["final_test_loss"] == first["final_test_loss"]
  # The fingerprint is of the content: the same files at another path give the same one.
  moved = tmp_path / "moved"
  data.rename(moved)
  assert experiment.build(_loans_config(moved)).data_fingerprint == first["data_fingerprint"]


def test_stream_depends_on_the_data_fingerprint_unless_common_random_numbers():
  cfg = _base()
  assert tuple(noise_identity.stream(cfg, "a" * 32)) != tuple(noise_identity.stream(cfg, "b" * 32))
  crn = _base(**{"privacy.common_random_numbers": "true"})
  np.testing.assert_array_equal(noise_identity.stream(crn, "a" * 32),
                                noise_identity.stream(crn, "b" * 32))


def test_the_quickstart_s_noise_stream_is_stable_across_releases():
  """A config field added at its default must not move any committed run's noise
  (fedjax_dp.config.schema.ADDED_FIELDS): the quickstart's stream since 8cbe5bd."""
  from fedjax_dp import config as config_lib
  from fedjax_dp.config import noise_identity
  cfg = config_lib.load_config("quickstart")
  assert noise_identity.stream_hex(noise_identity.stream(cfg)) == "e6fc43234bf44295"
