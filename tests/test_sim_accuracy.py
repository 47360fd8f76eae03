"""``--device sim`` / ``DFMP2(mf, device="sim")`` against PySCF DF-MP2 (same SCF, same explicit MP2 aux
basis): ≤ 1 µEh in fp32 and ≤ 0.05 µEh in the compensated fp32x3 mode, for the four required cases.
Each case also runs the CLI (``mp2trn run ... --device sim --json``) once. The benzene wall time (the
< 60 s goal) is measured by ``python scripts/bench_sim_wall.py``, not asserted here (no timed tests)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app

from .conftest import molecule_path, pyscf_dfmp2, scf_for

TOL = {"fp32": 1e-6, "fp32x3": 5e-8}


def _check_api(name, basis):
    mf = scf_for(name, basis)
    ref = pyscf_dfmp2(mf)
    for precision, tol in TOL.items():
        pt = mp2trn.DFMP2(mf, device="sim", precision=precision).run()
        assert abs(pt.e_corr - ref.e_corr) <= tol, (precision, pt.e_corr - ref.e_corr)
        assert abs(pt.e_corr_os - ref.e_corr_os) <= tol, (precision, pt.e_corr_os - ref.e_corr_os)
        assert abs(pt.e_corr_ss - ref.e_corr_ss) <= tol, (precision, pt.e_corr_ss - ref.e_corr_ss)
        w = pt.result.what_ran
        assert w["device"] == "sim" and w["precision"] == precision and w["target"] == "trn1"
        cost = pt.cost
        assert cost["kind"] == "model" and cost["precision"] == precision
        # a launch per block, never per pair: pairs launches = nb(nb+1)/2 per same-spin channel (+ nb² αβ)
        nocc = pt.result.sizes["nocc"]
        nb = [-(-n // w["occ_block"]) for n in (nocc if isinstance(nocc, list) else [nocc])]
        expect = sum(n * (n + 1) // 2 for n in nb) + (nb[0] * nb[1] if len(nb) == 2 else 0)
        assert cost["launches_by_stage"]["pairs"] == expect == w["pair_blocks"]
    return ref


def _check_cli(tmp_path, name, basis, ref, extra=()):
    out = tmp_path / f"{name}.json"
    res = CliRunner().invoke(app, ["run", str(molecule_path(name)), "--basis", basis, "--device", "sim",
                                   "--json", str(out), *extra], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "MODELED Trainium time" in res.output and "trn1 ms" in res.output
    doc = json.loads(out.read_text())
    props, extras = doc["properties"], doc["extras"]["mp2trn"]
    assert abs(props["mp2_correlation_energy"] - ref.e_corr) <= TOL["fp32"]
    # the SCF's last builds are compensated fp32x3 on the device, not host fp64 (issue 33): its documented
    # bound against the fp64 SCF is 1e-8 Eh (docs/precision.md, scripts/scf_schedule_errors.py)
    assert abs(props["scf_total_energy"] - ref.e_hf) <= 1e-8
    cost = extras["cost"]
    assert cost["kind"] == "model" and set(cost["total"]) == {"trn1", "trn2"}
    assert cost["total"]["trn1"]["modeled_time_s"] > 0 and cost["total"]["trn2"]["modeled_time_s"] > 0
    assert extras["nki"].startswith("emulator") and extras["target"] == "trn1"


def test_water_cc_pvdz(tmp_path):
    ref = _check_api("water", "cc-pvdz")
    _check_cli(tmp_path, "water", "cc-pvdz", ref)


def test_ethylene_def2_svp(tmp_path):
    ref = _check_api("ethylene", "def2-svp")
    _check_cli(tmp_path, "ethylene", "def2-svp", ref)


def test_open_shell_uhf_oxygen_triplet(tmp_path):
    """UHF: αα and ββ (same-spin, exchange) and αβ (nocc 9/7, nvir 19/21: different block shapes)."""
    ref = _check_api("oxygen_triplet", "cc-pvdz")
    _check_cli(tmp_path, "oxygen_triplet", "cc-pvdz", ref)


@pytest.mark.slow   # 23 s; water, hydroxyl and the oxygen triplet stay in the default run
def test_benzene_cc_pvdz(tmp_path):
    ref = _check_api("benzene", "cc-pvdz")
    _check_cli(tmp_path, "benzene", "cc-pvdz", ref)
