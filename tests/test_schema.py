"""Config schemas that evolve (fedjax_dp.config.schema): a run directory written before a
release added a defaulted field resumes under that release, bit for bit."""

import json
import shutil
from pathlib import Path

import pytest
from test_checkpoint import QUICKSTART, SMALL, _same_run

from fedjax_dp import cli, experiment
from fedjax_dp import config as config_lib
from fedjax_dp.config import noise_identity, schema
from fedjax_dp.host import checkpoint

# The schema this release writes, and the one a next release would.
NOW = schema.SCHEMA_VERSION
NEXT = NOW + 1
ARGS = ["run", str(QUICKSTART), *SMALL, "--set", "rounds=4", "--set", "checkpoint.every=2",
        "--set", "server.client_chunk=0"]  # (0: no memory probe, a faster test)


def _next_release(monkeypatch) -> None:
  """A release that adds ``server.future_knob`` (default 0.0: the old behaviour)."""
  base = config_lib.base_config

  def with_knob():
    c = base()
    c.server.future_knob = 0.0
    return c

  monkeypatch.setattr(config_lib, "base_config", with_knob)
  monkeypatch.setattr(schema, "SCHEMA_VERSION", NEXT)
  monkeypatch.setitem(schema.ADDED_FIELDS, "server.future_knob", NEXT)


def test_stored_configs_read_in_the_current_schema(monkeypatch):
  cfg = config_lib.load_config(QUICKSTART).to_dict()
  stored = schema.stamped(cfg)
  assert stored["schema_version"] == schema.SCHEMA_VERSION == NOW
  assert schema.upgraded(stored) == cfg
  assert schema.version(cfg) == 1  # no version: the first schema
  # A run's config.json (with its version) still runs again as a config file.
  assert config_lib.from_dict(stored, "config.json").to_dict() == cfg
  ident = noise_identity.identity(config_lib.load_config(QUICKSTART))
  _next_release(monkeypatch)
  new = config_lib.load_config(QUICKSTART)
  assert new.server.future_knob == 0.0
  assert schema.upgraded(stored)["server"]["future_knob"] == 0.0  # filled: the default
  assert checkpoint.config_diff(stored, new.to_dict()) == []
  # The added field at its default leaves the noise stream as it was; set, it moves it.
  assert noise_identity.identity(new) == ident
  moved = config_lib.override(new, ["server.future_knob=1.0"])
  assert noise_identity.identity(moved) != ident
  assert checkpoint.config_diff(stored, moved.to_dict()) == ["server.future_knob: 0.0 -> 1.0"]
  with pytest.raises(config_lib.ConfigError, match=f"schema version {NEXT + 1}, newer"):
    schema.upgraded({**stored, "schema_version": NEXT + 1})


def test_run_dir_of_the_previous_release_resumes_bit_identically(tmp_path, monkeypatch,
                                                                 capsys):
  old = tmp_path / "old"

  class Killed(Exception):
    pass

  record = experiment.RunLoop.record

  def dying_record(self, *a, **k):
    record(self, *a, **k)
    if self.t == 3:
      raise Killed  # the process dies after round 3: the checkpoint holds round 2

  monkeypatch.setattr(experiment.RunLoop, "record", dying_record)
  with pytest.raises(Killed):
    cli.main([*ARGS, "--out", str(old)])
  monkeypatch.setattr(experiment.RunLoop, "record", record)
  assert json.loads((old / "config.json").read_text())["schema_version"] == NOW
  changed, knob_set = tmp_path / "changed", tmp_path / "knob_set"
  for d in (changed, knob_set):
    shutil.copytree(old, d)

  _next_release(monkeypatch)
  assert cli.main([*ARGS, "--out", str(old)]) == 0  # resumes from round 2
  full = tmp_path / "full"
  assert cli.main([*ARGS, "--out", str(full)]) == 0
  _same_run(full, old)
  stored = json.loads((old / "config.json").read_text())
  assert stored["schema_version"] == NEXT and stored["server"]["future_knob"] == 0.0

  # A field both configs hold that differs is refused, as before; so is the new field
  # set away from the default the old run ran with.
  capsys.readouterr()
  for out, sets in ((changed, ["client.lr=0.1"]), (knob_set, ["server.future_knob=1.0"])):
    code = cli.main([*ARGS, "--out", str(out), *[a for s in sets for a in ("--set", s)]])
    err = capsys.readouterr().err
    assert code != 0 and "holds a run of a different config" in err, err
    assert sets[0].split("=")[0] in err
    assert not (out / "summary.json").exists()
  assert Path(full).is_dir()


def test_a_config_of_schema_1_reads_with_the_correlated_fields_at_their_defaults():
  # Schema 2 added privacy.bands and privacy.tree_restart (correlated noise); a config
  # stored by schema 1 lacks them and ran without them: filled with the defaults, kept
  # out of the noise identity.
  cfg = config_lib.load_config(QUICKSTART).to_dict()
  old = {k: v for k, v in cfg.items()}
  old["privacy"] = {k: v for k, v in cfg["privacy"].items()
                    if k not in ("bands", "tree_restart")}
  up = schema.upgraded({**old, "schema_version": 1})
  assert up["privacy"]["bands"] == 0 and up["privacy"]["tree_restart"] == 0
  assert set(schema.ADDED_FIELDS) >= {"privacy.bands", "privacy.tree_restart"}
  assert set(schema.defaulted_added_fields(cfg)) >= {"privacy.bands", "privacy.tree_restart"}
