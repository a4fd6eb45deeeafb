"""The audit table's ``--replace``: the chosen mechanisms' rows are re-made in place,
the others kept byte for byte, and the re-run is recorded in the meta file."""

import csv
import json

import pytest

from fedjax_dp.audit import table


def _row(name, variant, lower):
  return {"mechanism": name, "variant": variant, "epsilon_lower": lower,
          "epsilon_gdp": 0.0, "epsilon_certified": 3.0, "epsilon_certified_run": 3.0,
          "caught": "", "trials": 1000, "seconds": 1.0, "relation": "replace_one",
          "level": "client", "settings": "{}", "git_commit": "old"}


def test_replace_puts_the_new_rows_in_place_and_records_the_rerun(tmp_path, monkeypatch):
  base = table.config_lib.override(table.config_lib.load_config(str(table.QUICKSTART)),
                                   list(table.BASE_SETS))
  chosen = [m for m in table.mechanisms_lib.covering(
      list(table.mechanisms_lib.enumerate_mechanisms(base)), table.CORE)][:3]
  names = [table.mechanism_name(m) for m in chosen]
  table._write_csv(tmp_path / "audit_table.csv",
                   [_row(n, v, 0.1) for n in names for v in ("none", "no_clip")])
  (tmp_path / "audit_table_meta.json").write_text(json.dumps({"command": "first"}))
  monkeypatch.setattr(table, "audit_mechanism", lambda b, m, *a, **k: [
      _row(table.mechanism_name(m), "none", 0.2), _row(table.mechanism_name(m), "x", 9.0)])
  only = names[1]
  assert table.main(["--only", only, "--replace", "--out", str(tmp_path)]) == 0
  rows = list(csv.DictReader((tmp_path / "audit_table.csv").read_text().splitlines()))
  assert [(r["mechanism"], r["variant"]) for r in rows] == [
      (names[0], "none"), (names[0], "no_clip"), (only, "none"), (only, "x"),
      (names[2], "none"), (names[2], "no_clip")]
  assert [r["epsilon_lower"] for r in rows] == ["0.1", "0.1", "0.2", "9.0", "0.1", "0.1"]
  meta = json.loads((tmp_path / "audit_table_meta.json").read_text())
  assert meta["command"] == "first" and len(meta["reruns"][0]["rows"]) == 2
  with pytest.raises(SystemExit, match="needs --only"):
    table.main(["--replace", "--out", str(tmp_path)])
