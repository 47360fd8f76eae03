"""scripts/bench_trainium_whole_run.py: the model of a run on an instance from the committed records, and
the table in docs/benchmarks_trainium.md is what those records give."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "trainium_whole_run.jsonl"


def _script():
    spec = importlib.util.spec_from_file_location("bench_trainium_whole_run",
                                                  ROOT / "scripts" / "bench_trainium_whole_run.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod     # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_amdahl_scaling_of_a_host_stage():
    b = _script()
    # p = 1: perfectly parallel; p = 0: serial; 2 threads measured here
    assert b.at_cores(10.0, 1.0, 4) == pytest.approx(5.0)
    assert b.at_cores(10.0, 0.0, 64) == pytest.approx(10.0)
    assert b.at_cores(10.0, 0.5, 2) == pytest.approx(10.0)


def test_the_doc_table_is_what_the_records_give():
    b = _script()
    recs = b.load(RECORDS)
    text = b.tables(recs)
    doc = (ROOT / "docs" / "benchmarks_trainium.md").read_text()
    assert text in doc, "re-run: python scripts/bench_trainium_whole_run.py table"
    # every reported case on every instance, energy and gradient
    for case in ("Inosine / cc-pVDZ", "Vitamin C / cc-pVTZ", "Taxol / cc-pVDZ"):
        for instance in b.INSTANCES:
            for phase in ("energy", "gradient"):
                assert any(case in line and f"| {instance} | {phase} |" in line for line in text.splitlines())


def test_device_share_is_device_over_the_whole():
    b = _script()
    recs = b.load(RECORDS)
    fractions = b.parallel_fractions(recs)
    rec = b._latest(recs, "inosine-dz")
    m = b.run_model(rec, b._host(rec), fractions, "trn1.2xlarge")
    for phase in ("energy", "gradient"):
        r = m[phase]
        assert r["total_s"] == pytest.approx(r["host_s"] + r["transfer_s"] + r["device_s"] - r["overlap_s"])
        # an overlapped stage counts as the longer of its host and device parts: no more than either is hidden
        assert 0 <= r["overlap_s"] <= min(r["host_s"], r["device_s"] + r["transfer_s"])
        assert 0 < r["device_share"] < 1


def test_scaling_curve_is_a_pair_measured_together():
    """A newer all-thread record without its 1-thread partner (``measure --no-scaling``) does not make a curve
    with an older 1-thread record: p comes from the newest pair measured together."""
    import copy

    b = _script()
    template = b._latest(b.load(RECORDS), "inosine-dz")

    def rec(threads: str, seconds: float) -> dict:
        r = copy.deepcopy(template)
        r["threads"] = threads
        for phase, stages in (("host_energy_s", b.ENERGY_STAGES), ("host_gradient_s", b.GRADIENT_STAGES)):
            r[phase] = {k: seconds for k, _ in stages}
        return r

    def dated(r: dict, date: str) -> dict:
        return {**r, "date": date}

    recs = [dated(rec("1", 10.0), "2026-01-01 10:00"), dated(rec("all", 6.0), "2026-01-01 10:20"),
            dated(rec("all", 3.0), "2026-01-02 09:00")]
    fractions = b.parallel_fractions(recs)
    assert all(p == pytest.approx(0.8) for p in fractions.values())      # 2 (1 − 6/10), not 2 (1 − 3/10)
    # a 1-thread record whose all-thread half is missing pairs with nothing, not with a later run
    orphan = recs + [dated(rec("1", 20.0), "2026-01-03 10:00"), dated(rec("all", 2.0), "2026-01-04 10:00")]
    assert b.scaling_pairs(orphan) == b.scaling_pairs(recs)
