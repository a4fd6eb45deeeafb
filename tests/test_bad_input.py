"""Bad input as a user meets it: every wrong invocation of the CLI exits non-zero with
ONE line on stderr that names the field and the value, and no traceback.

The table is the test: add a row ``(argv, [substrings the line must contain])``.
``{quick}`` in an argv stands for the quickstart config, ``{tmp}`` for a directory
with broken config files, ``{out}`` for an empty output directory. Rows run
in-process through ``cli.main`` (no subprocess start-up).
"""

import contextlib
import io
from pathlib import Path

import pytest

from fedjax_dp import cli

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "experiments" / "configs" / "quickstart.py")

RUN = ["run", "{quick}", "--out", "{out}/run", "--no-progress", "--set", "rounds=1"]
SWEEP = ["sweep", "{quick}", "--out", "{out}/sweep", "--no-progress", "--set", "rounds=1"]
ACCOUNT = ["account", "--delta", "1e-5", "--q", "1"]

BAD_INPUT = [
    # --- fedjax-dp (no or unknown subcommand)
    ([], ["command"]),
    (["train"], ["train"]),
    # --- run: the command line
    (["run", "{quick}"], ["--out"]),
    ([*RUN, "--frobnicate"], ["--frobnicate"]),
    (["run", "{tmp}/missing.py", "--out", "{out}/run"], ["config file not found", "missing.py"]),
    (["run", "{tmp}/no_get_config.py", "--out", "{out}/run"], ["no_get_config.py",
                                                                 "get_config"]),
    (["run", "{tmp}/syntax_error.py", "--out", "{out}/run"], ["syntax_error.py"]),
    ([*RUN, "--set", "noequals"], ["key=value", "noequals"]),
    ([*RUN, "--set", "privacy.epsilonn=3"], ["privacy.epsilonn", "privacy.epsilon"]),
    ([*RUN, "--set", "rounds=abc"], ["rounds", "abc"]),
    ([*RUN, "--set", "rounds=2.5"], ["rounds", "2.5"]),
    ([*RUN, "--set", "privacy.enforce_budget=maybe"], ["privacy.enforce_budget", "maybe"]),
    ([*RUN, "--set", "data.group_sizes=(1,"], ["data.group_sizes", "(1,"]),
    # --- run: values out of range
    ([*RUN, "--set", "rounds=0"], ["rounds", "0"]),
    ([*RUN, "--set", "rounds=-5"], ["rounds", "-5"]),
    ([*RUN, "--set", "privacy.epsilon=0"], ["privacy.epsilon", "0"]),
    ([*RUN, "--set", "privacy.epsilon=-1"], ["privacy.epsilon", "-1"]),
    ([*RUN, "--set", "privacy.epsilon=nan"], ["privacy.epsilon", "nan"]),
    ([*RUN, "--set", "privacy.delta=1.5"], ["privacy.delta", "1.5"]),
    ([*RUN, "--set", "privacy.delta=0"], ["privacy.delta", "0"]),
    ([*RUN, "--set", "privacy.client_epsilons=(1,-2)"], ["privacy.client_epsilons", "-2"]),
    ([*RUN, "--set", "privacy.formula=noise_multiplier", "--set",
      "privacy.noise_multiplier=-1"], ["privacy.noise_multiplier", "-1"]),
    ([*RUN, "--set", "data.num_clients=0"], ["data.num_clients", "0"]),
    ([*RUN, "--set", "data.samples_per_client=-1"], ["data.samples_per_client", "-1"]),
    ([*RUN, "--set", "server.clients_per_round=0"], ["server.clients_per_round", "0"]),
    ([*RUN, "--set", "server.clients_per_round=11"], ["server.clients_per_round", "11"]),
    ([*RUN, "--set", "server.selection=poisson", "--set", "server.q=1.5"],
     ["server.q", "1.5"]),
    ([*RUN, "--set", "client.clip=0"], ["client.clip", "0"]),
    ([*RUN, "--set", "client.lr=-0.1"], ["client.lr", "-0.1"]),
    ([*RUN, "--set", "client.local_steps=0"], ["client.local_steps", "0"]),
    ([*RUN, "--set", "eval.every=0"], ["eval.every", "0"]),
    ([*RUN, "--set", "checkpoint.every=-1"], ["checkpoint.every", "-1"]),
    ([*RUN, "--set", "server.client_chunk=-3"], ["server.client_chunk", "-3"]),
    ([*RUN, "--set", "schedule.name=crd", "--set", "eval.every=2"],
     ["schedule.name", "crd", "eval.every=2"]),
    # --- run: unknown names
    ([*RUN, "--set", "data.name=nosuchdata"], ["data.name", "nosuchdata"]),
    ([*RUN, "--set", "data.name=mnist", "--set", "data.dir={tmp}/nothing"],
     ["mnist", "nothing"]),
    ([*RUN, "--set", "data.partition=zigzag"], ["data.partition", "zigzag"]),
    ([*RUN, "--set", "model.name=transformer_xxl"], ["model.name", "transformer_xxl"]),
    ([*RUN, "--set", "privacy.mechanism=cauchy"], ["privacy.mechanism", "cauchy"]),
    ([*RUN, "--set", "privacy.placement=nowhere"], ["privacy.placement", "nowhere"]),
    ([*RUN, "--set", "privacy.formula=folklore"], ["privacy.formula", "folklore"]),
    ([*RUN, "--set", "privacy.noise_sampling=sometimes"], ["privacy.noise_sampling",
                                                           "sometimes"]),
    ([*RUN, "--set", "schedule.name=sawtooth"], ["schedule.name", "sawtooth"]),
    ([*RUN, "--set", "server.selection=lottery"], ["server.selection", "lottery"]),
    ([*RUN, "--set", "server.aggregation=median_of_means"], ["server.aggregation",
                                                             "median_of_means"]),
    ([*RUN, "--set", "client.clip_mode=l7"], ["client.clip_mode", "l7"]),
    # --- sweep
    (["sweep", "{quick}", "--out", "{out}/sweep"], ["--grid"]),
    ([*SWEEP, "--grid", "seed"], ["--grid", "seed"]),
    ([*SWEEP, "--grid", "seed="], ["seed"]),
    ([*SWEEP, "--grid", "seed=1,2", "--grid", "seed=3"], ["seed", "twice"]),
    ([*SWEEP, "--grid", "sed=1,2"], ["sed", "seed"]),
    ([*SWEEP, "--grid", "rounds=1,x"], ["rounds", "x"]),
    ([*SWEEP, "--grid", "privacy.epsilon=1,-1"], ["privacy.epsilon", "-1"]),
    ([*SWEEP, "--grid", "seed=1", "--set", "privacy.delta=2"], ["privacy.delta", "2"]),
    # --- account
    (["account", "--q", "1", "--sigma", "1", "--rounds", "3"], ["--delta"]),
    ([*ACCOUNT[:2], "2", "--sigma", "1", "--rounds", "3"], ["--delta", "2"]),
    ([*ACCOUNT, "--sigma", "0", "--rounds", "3"], ["--sigma", "0"]),
    ([*ACCOUNT, "--sigma", "abc", "--rounds", "3"], ["--sigma", "abc"]),
    ([*ACCOUNT, "--sigma", "1", "--rounds", "0"], ["--rounds", "0"]),
    ([*ACCOUNT, "--sigma", "1"], ["--rounds", "required"]),
    ([*ACCOUNT, "--rounds", "3"], ["--sigma", "--epsilon"]),
    ([*ACCOUNT, "--rounds", "3", "--epsilon", "-1"], ["--epsilon", "-1"]),
    ([*ACCOUNT, "--sigmas", "1,x"], ["--sigmas", "1,x"]),
    ([*ACCOUNT, "--sigma", "1", "--rounds", "3", "--mechanism", "cauchy"],
     ["--mechanism", "cauchy"]),
    ([*ACCOUNT, "--sigma", "1", "--rounds", "3", "--accountants", "rdp,magic"],
     ["--accountants", "magic"]),
    (["account", "--delta", "1e-5", "--q", "1.5", "--sigma", "1", "--rounds", "3"],
     ["--q", "1.5"]),
    (["account", "--delta", "1e-5", "--q", "0.5", "--sampling", "full", "--sigma", "1",
      "--rounds", "3"], ["--q", "full"]),
]
BAD_INPUT += [
    # --- audit
    (["audit"], ["config"]),
    (["audit", "{tmp}/missing.py"], ["config file not found", "missing.py"]),
    (["audit", "{quick}", "--set", "privacy.epsilonn=1"], ["privacy.epsilonn"]),
    (["audit", "{quick}", "--trials", "3"], ["audit.trials", "3"]),
    (["audit", "{quick}", "--trials", "many"], ["audit.trials", "many"]),
    (["audit", "{quick}", "--significance", "0.9"], ["audit.significance", "0.9"]),
    (["audit", "{quick}", "--variant", "nope"], ["variant", "nope"]),
    (["audit", "{quick}", "--set", "privacy.epsilon=inf"], ["privacy.epsilon", "inf"]),
]


def _fill(argv, tmp, out):
  return [a.replace("{quick}", QUICKSTART).replace("{tmp}", str(tmp)).replace("{out}", str(out))
          for a in argv]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("bad_input")
  (tmp / "no_get_config.py").write_text("X = 1\n")
  (tmp / "syntax_error.py").write_text("def get_config(:\n")
  return tmp


def test_table_is_big_enough():
  assert len(BAD_INPUT) >= 30
  assert {argv[0] for argv, _ in BAD_INPUT if argv} >= {"run", "sweep", "account", "audit"}


@pytest.mark.parametrize("argv,expected", BAD_INPUT, ids=[
    f"{i:02d}-{a[0] if a else 'none'}" for i, (a, _) in enumerate(BAD_INPUT)])
def test_bad_input_gives_one_line_naming_field_and_value(argv, expected, scratch, tmp_path):
  err, out = io.StringIO(), io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
    try:
      code = cli.main(_fill(argv, scratch, tmp_path))
    except SystemExit as e:  # argparse
      code = e.code
  text = err.getvalue()
  lines = [line for line in text.splitlines() if line.strip()]
  assert code not in (0, None), (argv, text)
  assert "Traceback" not in text
  assert len(lines) == 1, text
  print(lines[0])
  for s in expected:
    assert _fill([s], scratch, tmp_path)[0] in lines[0], (s, lines[0])
