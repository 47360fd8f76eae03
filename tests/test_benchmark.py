"""The whole-run benchmark's plumbing (scripts/bench_end_to_end.py): PySCF's reference run in a process of
its own, the environments the runs get, the table. No timings are asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import mp2trn
from mp2trn import benchmark

ROOT = Path(__file__).resolve().parents[1]
WATER = ROOT / "molecules" / "water.xyz"


def test_pyscf_reference_run_matches_mp2trn():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "pyscf_whole_run.py"), str(WATER), "cc-pvdz"],
                          capture_output=True, text=True, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["converged"] and got["cycles"] > 0
    assert got["seconds"] >= got["scf_seconds"] > 0
    res = mp2trn.run(WATER, basis="cc-pvdz")
    assert abs(got["e_scf"] - res.e_hf) < 1e-9
    assert abs(got["e_tot"] - res.e_tot) < 1e-8


@pytest.mark.parametrize("tuned", [False, True])
def test_runs_get_their_environment(monkeypatch, tuned):
    seen = {}

    def fake_run(cmd, env, capture_output, text):
        seen["cmd"], seen["env"] = cmd, env
        record = {"seconds": 2.0, "scf_seconds": 1.0, "mp2_seconds": 1.0, "cycles": 3, "e_scf": -1.0, "e_tot": -1.1}
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(record) + "\n", stderr="")

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")   # as mp2trn's import leaves it in this process
    monkeypatch.setattr(benchmark.subprocess, "run", fake_run)
    got = benchmark._whole_run_in_child("inosine-dz", "pyscf", tuned, "cpu", 1e-10)
    assert got["cycles"] == 3
    assert seen["cmd"][1].endswith("pyscf_whole_run.py")   # PySCF alone, without mp2trn's import
    for key, value in benchmark.THREAD_ENV.items():
        assert (seen["env"].get(key) == value) if tuned else (key not in seen["env"])


def test_whole_run_table_has_a_cell_per_column():
    row = benchmark.WholeRunRow("case", "mp2trn cpu fp64", "default", 2.0, 1.5, 0.5, 10, "fp64 ×10", 1.5, 1.2,
                                1e-5, 1e-5)
    header, rule, line = benchmark.whole_run_markdown([row]).splitlines()
    assert header.count("|") == rule.count("|") == line.count("|")
    assert "1.50×" in line and "1.20×" in line
