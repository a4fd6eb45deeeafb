"""The shipped configs: loadable by name from any directory, never a silent fallback."""

from pathlib import Path

import pytest

from fedjax_dp import cli, configs
from fedjax_dp import config as config_lib

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("adpfl_clfl_mnist", "adpfl_mnist_cnn", "fu_femnist_gaussian", "fu_lr_laplace",
           "quickstart", "wei_mnist_mlp", "yuan_mnist_mlp")


def test_shipped_names_load_from_any_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # no experiments/ here
  assert tuple(configs.names()) == SHIPPED
  for name in SHIPPED:
    assert config_lib.load_config(name).name == name
  quick = config_lib.load_config("quickstart")
  assert (quick.privacy.epsilon, quick.data.name, quick.rounds) == (8.0, "digits", 100)


def test_repository_paths_are_the_shipped_configs():
  # experiments/configs/<name>.py re-exports the package's config: one source, no copy.
  paths = sorted(p.stem for p in (ROOT / "experiments" / "configs").glob("*.py"))
  assert tuple(paths) == SHIPPED
  for name in SHIPPED:
    by_path = config_lib.load_config(ROOT / "experiments" / "configs" / f"{name}.py")
    assert by_path.to_dict() == config_lib.load_config(name).to_dict()
    assert len((ROOT / "experiments" / "configs" / f"{name}.py").read_text().splitlines()) < 6


@pytest.mark.parametrize("bad,match", [
    (None, "no config given"), ("", "no config given"),
    ("quickstrat", "config file not found: .*, nor a shipped config"),
    ("experiments/configs/quickstart.py", "config file not found: .*, nor a shipped config"),
])
def test_missing_config_is_an_error_listing_the_names(bad, match, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(config_lib.ConfigError, match=match) as err:
    config_lib.load_config(bad)
  assert all(name in str(err.value) for name in SHIPPED)


def test_a_file_wins_over_a_shipped_name(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "quickstart").write_text(
      "from fedjax_dp.config import base_config\n"
      "def get_config():\n  c = base_config()\n  c.name = 'mine'\n  return c\n")
  assert config_lib.load_config("quickstart").name == "mine"


def test_cli_names_the_shipped_configs_for_a_missing_one(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert cli.main(["run", "nope", "--out", "runs/n"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "shipped: adpfl_clfl_mnist" in err
  assert not (tmp_path / "runs").exists()
