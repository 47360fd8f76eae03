"""The GPU comparison's table (scripts/bench_gpu4pyscf.py): energies held to GPU4PySCF's and PySCF's, failed
runs reported rather than dropped, gradient rows against the energy run. No GPU needed: records are made up."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_gpu4pyscf.py"
    spec = importlib.util.spec_from_file_location("bench_gpu4pyscf", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _record(engine, precision, e_corr, run=1, **extra):
    return {"molecule": "inosine", "run": run, "engine": engine, "version": "1", "precision": precision,
            "scf_cycles": 17, "e_scf": -977.0, "e_corr": e_corr, "e_tot": -977.0 + e_corr, "nao": 326,
            "scf_s": 2.0, "mp2_s": 1.0, "wall_s": 9.0, "gpu": "H100", **extra}


def test_table_holds_each_engine_to_both_references(bench):
    records = [_record("pyscf", "fp64", -2.9), _record("gpu4pyscf", "fp64", -2.9 - 1e-7),
               _record("mp2trn", "fp64", -2.9 + 1e-11, run=1), _record("mp2trn", "fp64", -2.9 + 2e-11, run=2),
               {"molecule": "inosine", "run": 1, "engine": "gpu4pyscf", "precision": "fp32",
                "error": "CUDA Error in some_kernel: invalid argument", "wall_s": 3.0}]
    rows = bench.table(records)
    mp2trn = next(r for r in rows if "| mp2trn 1 |" in r)
    cells = [c.strip() for c in mp2trn.split("|")]
    assert cells[-3] == "+1.0e-07" and cells[-2] == "+2.0e-11"          # warm run (run 2) against both
    assert any("gpu4pyscf fp32 on inosine failed: CUDA Error" in r for r in rows)
    assert any("| pyscf 1 on the CPU |" in r for r in rows)


def test_gradient_rows_against_the_energy_run(bench):
    timings = {"scf": 3.0, "mp2": 1.0, "total": 5.0}
    energy = _record("mp2trn", "fp64", -2.9, timings=timings)
    grad = _record("mp2trn", "fp64", -2.9, gradient=True, timings={"scf": 3.0, "mp2": 1.0, "total": 25.0})
    rows = bench.gradient_table([energy, grad])
    assert rows[-1].split("|")[3:7] == [" 25.0 ", " 21.0 ", " 5.00 ", " 5.0x "]
    assert bench.gradient_table([energy]) == []


def test_the_docs_table_is_what_the_committed_records_give(bench):
    import json

    root = Path(__file__).resolve().parents[1]
    records = [json.loads(line) for line in (root / "docs/records/gpu_h100_vs_gpu4pyscf.jsonl").read_text().splitlines()
               if line.strip()]
    docs = (root / "docs/benchmarks.md").read_text()
    block = docs[docs.index(bench.BEGIN):docs.index(bench.END)]
    for row in bench.table(records) + bench.gradient_table(records):
        assert row in block


def test_a_failed_mp2trn_run_is_a_record_not_an_abort(bench, monkeypatch):
    """A run that fails (here: no GPU on this machine, or a bad flag) comes back as an error record with
    mp2trn's one-line message; the tables list it and skip it."""
    monkeypatch.setitem(bench.CONV, "conv_tol", -1.0)         # mp2trn refuses it before any GPU is asked for
    record = {"molecule": "water", "run": 1, **bench.run_mp2trn(bench.MOLECULES["water"], "fp64", gradient=True)}
    assert "--conv-tol must be positive" in record["error"]
    assert any("failed: error: --conv-tol must be positive" in r for r in bench.table([record]))
    assert bench.gradient_table([record]) == []
