"""``fedjax-dp account``: the acceptance commands and the argparse wiring."""

import argparse
import json

import dp_accounting
import pytest

from fedjax_dp import account_cli


def run_json(capsys, *argv):
  assert account_cli.main([*argv, "--json"]) == 0
  return json.loads(capsys.readouterr().out)


def test_dpsgd_mnist_acceptance(capsys):
  r = run_json(capsys, "--mechanism", "gaussian", "--q", "0.0042667", "--sigma", "1.1",
               "--rounds", "14063", "--delta", "1e-5")
  ref = dp_accounting.rdp.RdpAccountant()
  ref.compose(dp_accounting.PoissonSampledDpEvent(0.0042667, dp_accounting.GaussianDpEvent(1.1)),
              14063)
  assert r["results"]["rdp"]["epsilon"] == pytest.approx(ref.get_epsilon(1e-5), rel=1e-2)
  assert r["results"]["rdp"]["epsilon"] == pytest.approx(2.5967, abs=1e-3)
  assert r["results"]["pld"]["epsilon"] == pytest.approx(2.382, rel=5e-3)
  assert "unavailable" in r["results"]["exact"]  # subsampled: no closed form
  assert r["event"]["sampling"] == "poisson"


def test_text_output(capsys):
  assert account_cli.main(["--q", "0.0042667", "--sigma", "1.1", "--rounds", "14063",
                           "--delta", "1e-5", "--accountants", "rdp"]) == 0
  out = capsys.readouterr().out
  assert "RDP (certified)" in out and "2.5966" in out


def test_calibrate_acceptance(capsys):
  r = run_json(capsys, "--mechanism", "gaussian", "--q", "1", "--rounds", "200", "--delta", "1e-3",
               "--epsilon", "8")
  rdp = r["results"]["rdp"]
  assert r["mode"] == "calibrate"
  assert rdp["noise_multiplier"] == pytest.approx(7.35484, rel=1e-4)
  assert 8 - 1e-3 <= rdp["epsilon"] <= 8
  exact = r["results"]["exact"]
  assert exact["noise_multiplier"] == pytest.approx(r["results"]["pld"]["noise_multiplier"],
                                                    rel=2e-3)
  assert exact["noise_multiplier"] < rdp["noise_multiplier"]
  assert account_cli.main(["--q", "1", "--rounds", "200", "--delta", "1e-3", "--epsilon", "8",
                           "--accountants", "rdp"]) == 0
  assert "noise multiplier  RDP (certified)" in capsys.readouterr().out


def test_formula_claims(capsys):
  r = run_json(capsys, "--q", "1", "--sigma", "6.57065221", "--rounds", "200", "--delta", "1e-3",
               "--formula", "wei10", "--accountants", "rdp,exact")
  assert r["formula"]["epsilon"] == pytest.approx(8.0, rel=1e-6)
  assert r["results"]["rdp"]["epsilon"] == pytest.approx(9.2569, rel=1e-4)
  r = run_json(capsys, "--q", "1", "--rounds", "200", "--delta", "1e-3", "--epsilon", "8",
               "--formula", "wei10", "--accountants", "rdp")
  assert r["formula"]["noise_multiplier"] == pytest.approx(6.5707, rel=1e-4)
  r = run_json(capsys, "--q", "0.1", "--sampling", "selection", "--sigma", "0.6438",
               "--rounds", "30", "--delta", "1e-3", "--formula", "yuan8", "--accountants", "rdp")
  assert r["formula"]["epsilon"] == pytest.approx(10.0, rel=1e-3)
  assert r["results"]["rdp"]["epsilon"] > 19


def test_schedules_and_fixed_size(capsys):
  r = run_json(capsys, "--sigma", "10", "--ratio", "0.98", "--rounds", "100", "--delta", "1e-5",
               "--accountants", "exact")
  assert r["results"]["exact"]["epsilon"] == pytest.approx(21.80939, rel=1e-6)
  r = run_json(capsys, "--sigmas", "1,1,2", "--delta", "1e-5", "--accountants", "rdp,exact")
  assert r["rounds"] == 3
  r = run_json(capsys, "--population", "60000", "--sample-size", "256", "--sigma", "1.1",
               "--rounds", "14063", "--delta", "1e-5")
  assert r["event"]["relation"] == "replace_one"
  assert r["results"]["rdp"]["epsilon"] == pytest.approx(5.2435, rel=1e-4)
  assert "unavailable" in r["results"]["pld"]
  r = run_json(capsys, "--mechanism", "laplace", "--sigma", "10", "--rounds", "100",
               "--delta", "1e-5")
  assert r["results"]["exact"]["epsilon"] == pytest.approx(10.0)
  assert r["results"]["pld"]["epsilon"] == pytest.approx(4.2203, rel=5e-3)


@pytest.mark.parametrize("argv,msg", [
    (["--q", "0.1", "--sigma", "-1", "--rounds", "3", "--delta", "1e-5"], "sigma"),
    (["--q", "1.5", "--sigma", "1", "--rounds", "3", "--delta", "1e-5"], "q"),
    (["--q", "0.1", "--sigma", "1", "--rounds", "3", "--delta", "2"], "delta"),
    (["--q", "0.1", "--rounds", "3", "--delta", "1e-5"], "sigma"),
    (["--q", "0.1", "--rounds", "3", "--delta", "1e-5", "--epsilon", "0"], "target_epsilon"),
    (["--q", "0.1", "--sigma", "1", "--rounds", "3", "--delta", "1e-5", "--accountants", "gdp"],
     "accountants"),
])
def test_errors(capsys, argv, msg):
  assert account_cli.main(argv) == 2
  assert msg in capsys.readouterr().err


def test_register_adds_subcommand(capsys):
  parser = argparse.ArgumentParser(prog="fedjax-dp")
  sub = parser.add_subparsers(dest="command", required=True)
  account_cli.register(sub)
  args = parser.parse_args(["account", "--q", "1", "--sigma", "1", "--rounds", "1", "--delta",
                            "1e-5", "--accountants", "exact"])
  assert args.func is account_cli.run_account
  assert args.func(args) == 0
  assert "4.37718" in capsys.readouterr().out
