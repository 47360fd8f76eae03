"""The ``sim`` device: defaults, launch planning (a launch per block, never per pair), the cost report
(trn1 and trn2 from one run), targets, and kernel-rule violations surfacing as KernelConstraintError."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.devices import get_device
from mp2trn.devices.nki_device import LaunchPlan
from mp2trn.errors import InputError, KernelConstraintError

from .conftest import molecule_path, scf_for


def test_defaults_describe_and_precisions():
    dev = get_device("sim")
    assert dev.precision == "fp32" and dev.target == "trn1" and not dev.ao_packed
    assert type(dev).supported_precisions == ("fp32", "fp32x3")
    d = dev.describe()
    assert d["device"] == "sim" and d["nki"].startswith("emulator") and d["target"] == "trn1"
    assert get_device("sim", "fp32x3").storage_dtype == np.float64
    with pytest.raises(InputError, match="fp64"):
        get_device("sim", "fp64")
    with pytest.raises(InputError, match="trn9"):
        get_device("sim", target="trn9")


def test_blocked_run_launches_per_block_and_matches_unblocked():
    """Forced 2-orbital pair blocks and a small memory budget (several AO blocks): O(blocks) launches,
    the same energies."""
    mf = scf_for("water", "cc-pvdz")
    one = mp2trn.DFMP2(mf, device="sim").run()
    many = mp2trn.DFMP2(mf, device="sim", device_options={"blocks": {"occ_block": 2}}).run()
    assert one.cost["launches_by_stage"] == {"ao_to_mo": 1, "metric": 1, "pairs": 1}
    assert many.result.what_ran["occ_block"] == 2
    assert many.cost["launches_by_stage"]["pairs"] == 3 * 4 // 2        # 5 orbitals -> 3 blocks
    assert abs(many.e_corr - one.e_corr) < 2e-8          # fp32: other j grouping, other rounding


def test_cost_report_has_both_generations_per_stage():
    pt = mp2trn.DFMP2(scf_for("water", "cc-pvdz"), device="sim").run()
    cost = pt.cost
    assert cost["kind"] == "model" and "not a measurement" in cost["note"]
    assert cost["launches"] == sum(cost["launches_by_stage"].values()) == 3
    for stage, kernel in (("ao_to_mo", "batched_gemm"), ("metric", "trsm"), ("pairs", "mp2_energy")):
        e = cost["stages"][stage]
        assert e["kernels"] == [kernel]
        for t in ("trn1", "trn2"):
            s = e[t]
            assert s["modeled_time_s"] > 0 and s["flops"] > 0 and 0 < s["tensor_peak_pct_fp32"] <= 100
            assert s["bottleneck"] in s["engine_busy_s"]
            assert s["peak_sbuf_bytes_per_partition"] <= {"trn1": 180224, "trn2": 212984}["trn1"]
    tot = cost["total"]["trn1"]
    assert tot["modeled_time_s"] == pytest.approx(sum(cost["stages"][s]["trn1"]["modeled_time_s"] for s in cost["stages"]))
    json.dumps(cost)                                     # JSON-able as it goes to extras.mp2trn.cost


def test_target_trn2_plans_for_trn2():
    pt = mp2trn.DFMP2(scf_for("water", "cc-pvdz"), device="sim", device_options={"target": "trn2"}).run()
    assert pt.result.what_ran["target"] == "trn2" and pt.cost["target"] == "trn2"
    assert LaunchPlan("trn2").budget > LaunchPlan("trn1").budget


def test_kernel_rule_violation_is_a_kernel_constraint_error():
    """An oversize AO group: 112 aux functions x 9 alpha orbitals = 1008 fp32 columns of X; the 57th
    function's 9 columns (504..512) straddle the 2 KiB PSUM bank boundary, which a matmul output cannot."""
    mf = scf_for("oxygen_triplet", "cc-pvdz")
    with pytest.raises(KernelConstraintError, match=r"batched_gemm.*ao_to_mo.*trn1.*rule nc_matmul\.psum_bank"):
        mp2trn.DFMP2(mf, device="sim", device_options={"blocks": {"ao_group": 200}}).run()


def test_kernel_rule_violation_reaches_the_cli_as_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MP2TRN_NKI_BLOCKS", "ao_group=200")
    out = tmp_path / "e.json"
    res = CliRunner().invoke(app, ["run", str(molecule_path("oxygen_triplet")), "--device", "sim", "--json", str(out)])
    assert res.exit_code == KernelConstraintError.exit_code == 6
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    # the first kernel the forced block meets says which rule it broke (the SCF's J/K GEMM: PSUM capacity)
    assert len(lines) == 1 and "broke a rule: [rule " in lines[0], lines
    assert not out.exists()


def test_sbuf_capacity_violation_names_the_rule():
    """Forcing a 2000-orbital-wide resident I block through the device: SBUF capacity of trn1."""
    dev = get_device("sim", blocks={"i_block": 64})
    rng = np.random.default_rng(0)
    b = rng.standard_normal((1024, 64, 200)) * 0.01
    e = -np.linspace(1, 2, 64)
    ev = np.linspace(0.5, 3, 200)
    with pytest.raises(KernelConstraintError, match=r"mp2_energy.*capacity\.sbuf"):
        dev.pair_energies(b, None, e, e, ev, ev, exchange=True)


def test_bad_block_override_is_an_input_error(monkeypatch):
    monkeypatch.setenv("MP2TRN_NKI_BLOCKS", "ao_group=lots")
    with pytest.raises(InputError, match="MP2TRN_NKI_BLOCKS"):
        get_device("sim")


def test_modeled_cost_depends_on_shapes_not_values():
    """The kernels have no data-dependent control flow: two launches of the same shapes with different
    numbers have the same modeled cost (what scripts/bench_trainium_model.py relies on)."""
    rng = np.random.default_rng(2)
    costs = []
    for _ in range(2):
        dev = get_device("sim")
        b = rng.standard_normal((300, 4, 70)) * 0.05
        e = -np.sort(rng.uniform(0.3, 1.0, 4))
        ev = np.sort(rng.uniform(0.1, 4.0, 70))
        dev.pair_energies(b, None, e, e, ev, ev, exchange=True)
        dev.metric_solve(np.linalg.cholesky(np.eye(300) * 2 + 0.1), rng.standard_normal((300, 280)).astype(np.float32))
        c = dev.cost_report()
        costs.append([c["stages"][s][t]["modeled_time_s"] for s in ("metric", "pairs") for t in ("trn1", "trn2")])
    assert costs[0] == costs[1]


def test_broadcast_fallback_switch_on_the_device():
    """MP2TRN_NKI_BLOCKS=broadcast_dma=0 (or blocks={"broadcast_dma": 0}) runs the pair kernel with the
    ones-vector matmul broadcasts: same energies."""
    import mp2trn

    default = mp2trn.run(molecule_path("water"), device="sim")
    fallback = mp2trn.run(molecule_path("water"), device="sim", device_options={"blocks": {"broadcast_dma": 0}})
    assert fallback.e_corr == default.e_corr


def test_transfers_and_cost_since_a_checkpoint():
    """Host<->device bytes per stage as launched (every input array per launch) and with an array passed
    again counted once; a checkpoint prices only the launches after it."""
    dev = get_device("sim", "fp32")
    rng = np.random.default_rng(0)
    l_chol = np.linalg.cholesky(np.eye(40) * 2 + 0.1)
    v = rng.standard_normal((40, 30)).astype(np.float32)
    dev.metric_solve(l_chol, v)
    mark = dev.cost_checkpoint()
    dev.metric_solve(l_chol, v)
    dev.metric_solve(l_chol, v)
    whole, later = dev.transfer_record(), dev.transfer_record(since=mark)
    assert whole["metric"]["to_device"] == 3 * later["metric"]["to_device"] // 2 > 0
    assert later["metric"]["to_host"] > 0
    # the same v (and the device's cached inverse factor) go again: counted once when kept
    assert whole["metric"]["to_device_reusing"] < whole["metric"]["to_device"]
    one, two = dev.cost_report(), dev.cost_report(since=mark)
    assert one["launches_by_stage"]["metric"] == 3 * two["launches_by_stage"]["metric"] // 2
    assert two["host_device_bytes"] == later
    assert two["total"]["trn1"]["modeled_time_s"] == pytest.approx(2 / 3 * one["total"]["trn1"]["modeled_time_s"])
    assert get_device("cpu", "fp64").transfer_record() is None


def test_held_b_is_sent_once_and_sliced_on_the_device(monkeypatch):
    """B held in HBM: the energy's and the gradient's pair launches read blocks sliced from the one copy, so
    B's bytes travel once (as launched = counted once); results equal those of sending every block (the
    kernels see the same numbers), and what-ran says where B was."""
    def run():
        return mp2trn.run(molecule_path("water"), gradient=True, device="sim", precision="fp32")

    monkeypatch.delenv("MP2TRN_HOLD_B", raising=False)
    held = run()
    assert held.what_ran["b_on_device"].startswith("resident in device memory")
    assert held.what_ran["gradient_reused"]["B_on_device"].endswith("held since the energy)")
    monkeypatch.setenv("MP2TRN_HOLD_B", "0")
    sent = run()
    assert sent.what_ran["b_on_device"] == "sent with each launch (MP2TRN_HOLD_B=0)"
    assert held.e_tot == sent.e_tot and np.array_equal(held.gradient, sent.gradient)
    moved, moved_sent = held.cost["host_device_bytes"], sent.cost["host_device_bytes"]
    nb = held.sizes["naux"] * held.sizes["nocc"] * held.sizes["nvir"] * 4       # B in fp32, bytes
    pairs = moved["pairs"]["to_device"] + moved["grad_pairs"]["to_device"]
    assert pairs - moved_sent["pairs"]["to_device"] - moved_sent["grad_pairs"]["to_device"] < -nb // 2
    # what the held path sends for the pair stages: B once plus the small energy vectors per launch
    assert nb <= pairs < nb * 1.2


def test_hold_follows_the_budget_and_the_precision(monkeypatch):
    """Nothing new is held when told not to add, beyond the HBM share, or in fp32x3 (planes split on the
    host); held arrays are dropped by release and with their host arrays."""
    monkeypatch.delenv("MP2TRN_HOLD_B", raising=False)
    dev = get_device("sim", "fp32")
    b = np.ones((8, 12), np.float32)
    assert dev.hold([b], add=False) == "sent with each launch (not held by the energy)"
    assert dev.hold([b]).endswith("sent once)") and dev.held_mb() == b.nbytes / 1e6
    assert dev.hold([b], add=False).endswith("held since the energy)")
    monkeypatch.setattr(type(dev), "hbm_mb", lambda self: 1e-4)
    assert dev.hold([np.ones((8, 12), np.float32)]).startswith("sent with each launch: holding B would take")
    dev.release()
    assert dev.held_mb() == 0.0 and not dev.launcher._kept
    assert get_device("sim", "fp32x3").hold([b]).startswith("sent with each launch (the fp32x3")
    dev.hold([b])
    del b
    assert dev.held_mb() == 0.0
