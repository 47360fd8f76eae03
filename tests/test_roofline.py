"""The cpu device's cost report: each stage's achieved GFLOP/s and share of this machine's GEMM rate, the
rates measured once per machine and cached under the user cache directory (mp2trn.roofline)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mp2trn
import mp2trn.roofline as roofline
from mp2trn.costreport import cost_lines, cost_table
from mp2trn.devices import get_device

from .conftest import molecule_path


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def _fake_rates(cache_dir, fp64=100.0, fp32=200.0):
    """A cache file holding known rates for this machine (what a measurement would have written)."""
    path = cache_dir / "mp2trn" / "gemm_rates.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"fp64": fp64, "fp32": fp32, "n": 1536, "measured": "2026-01-01T00:00:00Z", "load_average": 0.5}
    path.write_text(json.dumps({"version": 1, "machines": {roofline.machine_key(): entry}}))
    return path


def test_rates_measured_once_and_cached_per_machine_key(cache_dir, monkeypatch):
    calls = []
    monkeypatch.setattr(roofline, "measure_gemm_rate", lambda dtype: calls.append(np.dtype(dtype).name) or 10.0)
    first = roofline.gemm_rates()
    assert calls == ["float64", "float32"] and first["fp64"] == first["fp32"] == 10.0
    path = cache_dir / "mp2trn" / "gemm_rates.json"
    assert first["cache"] == str(path) and roofline.machine_key() in json.loads(path.read_text())["machines"]
    assert roofline.gemm_rates()["fp64"] == 10.0 and len(calls) == 2          # read back, not measured
    roofline.gemm_rates(refresh=True)
    assert len(calls) == 4
    monkeypatch.setattr(roofline, "blas_threads", lambda: 97)                  # another thread count: another key
    roofline.gemm_rates()
    assert len(calls) == 6 and len(json.loads(path.read_text())["machines"]) == 2
    path.write_text("{not json")                                              # a broken file is measured again
    roofline.gemm_rates()
    assert len(calls) == 8 and json.loads(path.read_text())["version"] == 1


def test_cache_path_respects_xdg_cache_home(cache_dir, monkeypatch):
    assert roofline.cache_path() == cache_dir / "mp2trn" / "gemm_rates.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert roofline.cache_path().parts[-3:] == (".cache", "mp2trn", "gemm_rates.json")


def test_a_real_gemm_is_timed():
    rate = roofline.measure_gemm_rate(np.float64, n=256, repeats=1)
    assert 0.01 < rate < 1e5


def test_cpu_cost_report_counts_each_stage_against_the_cached_rates(cache_dir):
    """Water/cc-pVDZ on the cpu device: every stage's counted GFLOP from the sizes (one pair block, one AO
    block), its rate and its share of the cached DGEMM rate."""
    _fake_rates(cache_dir, fp64=100.0)
    res = mp2trn.run(molecule_path("water"))
    cost = res.cost
    assert cost["kind"] == "roofline" and cost["gemm_rates"]["fp64_gflops"] == 100.0
    stages = cost["stages"]
    assert set(stages) == {"scf_jk:fp64", "ao_to_mo:fp64", "metric:fp64", "pairs:fp64"}
    naux, nocc, nvir, nao = res.sizes["naux"], res.sizes["nocc"], res.sizes["nvir"], res.sizes["nao"]
    assert stages["pairs:fp64"]["gflop"] * 1e9 == pytest.approx(naux * nvir**2 * nocc * (nocc + 1))
    assert stages["metric:fp64"]["gflop"] * 1e9 == pytest.approx(naux**2 * nocc * nvir)
    assert stages["ao_to_mo:fp64"]["gflop"] * 1e9 == pytest.approx(2 * naux * nao * nocc * (nao + nvir))
    builds = res.scf["jk_builds"]
    assert stages["scf_jk:fp64"]["calls"] >= builds
    for entry in stages.values():
        assert entry["seconds"] > 0 and entry["gemm"] == "DGEMM"
        assert entry["gflops_per_s"] == pytest.approx(entry["gflop"] / entry["seconds"])
        assert entry["share_of_gemm"] == pytest.approx(entry["gflops_per_s"] / 100.0)
    json.dumps(cost)   # it goes to extras.mp2trn.cost
    assert res.to_qcschema()["extras"]["mp2trn"]["cost"]["stages"]["pairs:fp64"]["gemm_gflops_per_s"] == 100.0


def test_fp32_stages_are_held_to_sgemm_and_since_counts_later_work(cache_dir):
    """An fp32 run: the SCF's fp32 builds against SGEMM, its fp64 ones against DGEMM; a checkpoint's report
    holds only what ran after it."""
    _fake_rates(cache_dir, fp64=100.0, fp32=200.0)
    dev = get_device("cpu", "fp32")
    res = mp2trn.run(molecule_path("water"), device=dev)
    stages = res.cost["stages"]
    assert stages["scf_jk:fp32"]["gemm"] == "SGEMM" and stages["scf_jk:fp32"]["gemm_gflops_per_s"] == 200.0
    assert stages["scf_jk:fp64"]["gemm"] == "DGEMM"   # the mixed schedule's last builds
    assert stages["pairs:fp32"]["share_of_gemm"] == pytest.approx(stages["pairs:fp32"]["gflops_per_s"] / 200.0)
    mark = dev.cost_checkpoint()
    assert dev.cost_report(since=mark) is None
    b = np.random.default_rng(0).standard_normal((20, 3, 4)).astype(np.float32)
    dev.pair_energies(b, None, -np.ones(3), -np.ones(3), np.ones(4), np.ones(4), True)
    later = dev.cost_report(since=mark)
    assert set(later["stages"]) == {"pairs:fp32"} and later["stages"]["pairs:fp32"]["calls"] == 1
    assert later["stages"]["pairs:fp32"]["gflop"] * 1e9 == pytest.approx(20 * 4 * 4 * 3 * 4)
    dev.close()


def test_roofline_report_is_rendered(cache_dir):
    _fake_rates(cache_dir)
    cost = roofline.roofline_report({("pairs", "fp64"): (2.0, 100e9, 3), ("scf_jk", "fp32"): (1.0, 150e9, 9)},
                                    roofline.gemm_rates())
    lines = cost_lines(cost)
    assert "DGEMM 100, SGEMM 200 GFLOP/s" in lines[0]
    assert any("pairs (fp64)" in line and "50% of DGEMM" in line for line in lines)
    assert any("SCF J/K (fp32)" in line and "75% of SGEMM" in line for line in lines)
    assert cost_table(cost).row_count == 2


def test_a_busy_machines_cached_rate_is_measured_again_and_only_raised(cache_dir, monkeypatch):
    """A cached rate below what a stage achieved (taken while the machine was busy) is measured again before
    the report; a new measurement keeps the higher rate per precision; the report says it re-measured."""
    path = _fake_rates(cache_dir, fp64=10.0, fp32=400.0)
    measured = {"float64": 90.0, "float32": 150.0}
    monkeypatch.setattr(roofline, "measure_gemm_rate", lambda dtype: measured[np.dtype(dtype).name])
    meter = roofline.StageMeter()
    meter.add("pairs", "fp64", 1.0, 50e9)                 # 50 GFLOP/s against a cached DGEMM of 10
    report = meter.report()
    rates = json.loads(path.read_text())["machines"][roofline.machine_key()]
    assert rates["fp64"] == 90.0 and rates["fp32"] == 400.0          # fp32: the old, higher rate stays
    assert report["gemm_rates"]["fp64_gflops"] == 90.0 and "remeasured" in report["gemm_rates"]
    assert report["stages"]["pairs:fp64"]["share_of_gemm"] == pytest.approx(50 / 90)
    slower = roofline.StageMeter()
    slower.add("pairs", "fp64", 1.0, 20e9)                # below the rate: the cache is read, not measured
    monkeypatch.setattr(roofline, "measure_gemm_rate", lambda dtype: pytest.fail("measured again"))
    assert "remeasured" not in slower.report()["gemm_rates"]
    faster = roofline.StageMeter()
    faster.add("pairs", "fp64", 1.0, 120e9)               # beats even the re-measured rate: once per entry
    assert faster.report()["stages"]["pairs:fp64"]["share_of_gemm"] == pytest.approx(120 / 90)


def test_long_inner_form_timed_once_per_machine_and_kept_in_its_cache_entry(cache_dir, monkeypatch):
    """The Z-vector's long-inner product form: timed once per machine and precision (beside the GEMM rates,
    whose entry it makes when there is none), read back from the file by a new process, and the transposed
    form taken only when clearly faster."""
    monkeypatch.setattr(roofline, "_long_inner", {})
    monkeypatch.setattr(roofline, "measure_gemm_rate", lambda dtype: 10.0)
    calls = []
    forms = {"float64": {"plain": 90.0, "transposed": 70.0}, "float32": {"plain": 150.0, "transposed": 180.0}}
    monkeypatch.setattr(roofline, "measure_long_inner",
                        lambda dtype: calls.append(np.dtype(dtype).name) or forms[np.dtype(dtype).name])
    assert roofline.long_inner_transposed("fp64") is False and roofline.long_inner_transposed("fp32") is True
    assert roofline.long_inner_transposed("fp64") is False and calls == ["float64", "float32"]
    entry = json.loads((cache_dir / "mp2trn" / "gemm_rates.json").read_text())["machines"][roofline.machine_key()]
    assert entry["fp64"] == 10.0 and entry["long_inner"] == {"fp64": forms["float64"], "fp32": forms["float32"]}
    monkeypatch.setattr(roofline, "_long_inner", {})                          # a new process reads the file
    assert roofline.long_inner_transposed("fp32") is True and len(calls) == 2
    roofline.gemm_rates(refresh=True)                                         # a refresh keeps the timing
    monkeypatch.setattr(roofline, "_long_inner", {})
    assert roofline.long_inner_transposed("fp32") is True and len(calls) == 2
    monkeypatch.setattr(roofline, "_long_inner", {})
    forms["float64"] = {"plain": 100.0, "transposed": 103.0}                  # within the margin: plain
    monkeypatch.setattr(roofline, "machine_key", lambda: "another machine")
    assert roofline.long_inner_transposed("fp64") is False and len(calls) == 3


def test_long_inner_form_not_timed_inside_a_held_pool(cache_dir, monkeypatch):
    """With NumPy's pool held below its threads (one_thread_each: parts that would time against each other)
    the plain form, and nothing timed or cached."""
    import mp2trn.threads as threads

    monkeypatch.setattr(roofline, "_long_inner", {})
    monkeypatch.setattr(threads, "blas_threads", lambda: 2)
    monkeypatch.setattr(roofline, "blas_threads", lambda: 1)
    monkeypatch.setattr(roofline, "measure_long_inner", lambda dtype: pytest.fail("timed inside a held pool"))
    assert roofline.long_inner_transposed("fp64") is False
    assert not roofline._long_inner and not (cache_dir / "mp2trn" / "gemm_rates.json").exists()


def test_a_real_long_inner_product_is_timed():
    rates = roofline.measure_long_inner(np.float64, shape=(4096, 64, 16), repeats=1)
    assert set(rates) == {"plain", "transposed"} and all(0.01 < r < 1e5 for r in rates.values())


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_cpu_response_gemm_gives_the_same_product_in_either_form(monkeypatch, precision):
    """Whichever long-inner form the machine's timing picks, the product is a_tᵀ b (fp64 out)."""
    import mp2trn.devices.cpu as cpu

    rng = np.random.default_rng(3)
    a_t, b = rng.standard_normal((64 * 40 + 7, 40)), rng.standard_normal((64 * 40 + 7, 9))
    device = get_device("cpu")
    if precision == "fp32":
        device = device.reduced_response()
    expected = a_t.T @ b
    tol = 1e-12 if precision == "fp64" else 1e-5
    monkeypatch.setattr(cpu, "_LONG_INNER_TIMED", 0)            # this small product asks for the timed form too
    for transposed in (False, True):
        monkeypatch.setattr(cpu, "long_inner_transposed", lambda p, t=transposed: t)
        got = device.response_gemm(device.response_operand(a_t), b)
        assert got.dtype == np.float64 and np.max(np.abs(got - expected)) < tol * np.max(np.abs(expected))
