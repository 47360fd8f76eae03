"""ROHF-MBPT(2) (issue 37): mp2trn's semicanonical ROHF DF-MP2 against an independent spin-orbital
implementation (``mp2trn.reference.rohf_mbpt2``) on PySCF's own density-fitted ROHF, the closed-shell limit
against RHF, UHF- vs ROHF-based results on a spin-contaminated radical, and the interfaces (CLI, options,
QCSchema, ASE) that choose the reference."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
from pyscf import gto, scf
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.errors import InputError
from mp2trn.reference import rohf_mbpt2

from .conftest import molecule_path

HYDROXYL = "O 0 0 0; H 0 0 0.97"
METHYLENE_TRIPLET = "C 0 0 0.1004; H 0 0.9911 -0.3115; H 0 -0.9911 -0.3115"
#: CN radical at its experimental bond length (1.1718 Å, NIST CCCBDB): UHF is strongly spin-contaminated
CYANO = "C 0 0 0; N 0 0 1.1718"


@functools.lru_cache(maxsize=None)
def pyscf_rohf(atom: str, spin: int, basis: str = "cc-pvdz", ecp=None):
    """PySCF's own density-fitted ROHF (no mp2trn code in the SCF), tightly converged."""
    mol = gto.M(atom=atom, basis=basis, spin=spin, ecp=ecp, verbose=0)
    mf = scf.ROHF(mol).density_fit(auxbasis="def2-universal-jkfit")
    mf.conv_tol = 1e-12
    mf.kernel()
    assert mf.converged
    return mf


def _mp2trn(mf, frozen=None, **kw):
    return mp2trn.DFMP2(mf, auxbasis="cc-pvdz-ri", frozen=frozen, **kw).run().result


@pytest.mark.parametrize("atom, spin, frozen", [(HYDROXYL, 1, None), (HYDROXYL, 1, 1), (METHYLENE_TRIPLET, 2, None),
                                                (METHYLENE_TRIPLET, 2, 1)])
def test_rohf_mbpt2_matches_the_spin_orbital_reference(atom, spin, frozen):
    """Singles, same-spin and opposite-spin parts against the plain spin-orbital formula, same DF integrals."""
    mf = pyscf_rohf(atom, spin)
    result = _mp2trn(mf, frozen)
    ref = rohf_mbpt2(mf, "cc-pvdz-ri", nfrozen=frozen or 0)
    assert result.reference == "ROHF"
    assert ref["singles"] < -1e-4     # a real singles term: ROHF is no eigenfunction of either spin's Fock
    assert abs(result.e_singles - ref["singles"]) < 1e-10
    assert abs(result.e_corr_ss - ref["same_spin"]) < 1e-10
    assert abs(result.e_corr_os - ref["opposite_spin"]) < 1e-10
    assert abs(result.e_corr - ref["corr"]) < 1e-10
    assert result.spin_square == pytest.approx(0.5 * spin * (0.5 * spin + 1), abs=1e-10)


def test_density_fitting_error_against_exact_integrals():
    """The DF error of the doubles (cc-pVDZ-RI) on the same semicanonical orbitals; singles need no integrals."""
    mf = pyscf_rohf(HYDROXYL, 1)
    df_ref, exact = rohf_mbpt2(mf, "cc-pvdz-ri"), rohf_mbpt2(mf, exact=True)
    assert df_ref["singles"] == pytest.approx(exact["singles"], abs=1e-14)
    assert 1e-7 < abs(df_ref["corr"] - exact["corr"]) < 5e-5


def test_closed_shell_rohf_is_rhf():
    """ROHF on a closed shell is RHF: no singles, and the MP2 energy of RHF."""
    mol = gto.M(atom=open(molecule_path("water")).read().split("\n", 2)[2], basis="cc-pvdz", verbose=0)
    rhf = scf.RHF(mol).density_fit(auxbasis="def2-universal-jkfit")
    rohf = scf.ROHF(mol).density_fit(auxbasis="def2-universal-jkfit")
    for mf in (rhf, rohf):
        mf.conv_tol = 1e-12
        mf.kernel()
    r, o = _mp2trn(rhf, "auto"), _mp2trn(rohf, "auto")
    assert o.reference == "ROHF" and o.spin_square == pytest.approx(0.0, abs=1e-12)
    assert abs(o.e_singles) < 1e-12
    assert abs(o.e_corr_os - r.e_corr_os) < 1e-9 and abs(o.e_corr_ss - r.e_corr_ss) < 1e-9
    assert abs(o.e_tot - r.e_tot) < 1e-9


@pytest.mark.slow   # two CN runs, ~14 s on a 2-core VM; docs/accuracy.md quotes the same comparison by CLI
def test_uhf_and_rohf_on_a_spin_contaminated_radical():
    """CN/cc-pVDZ (frozen core): UHF ⟨S²⟩ 1.15 against ROHF's exact 0.75; the totals differ by ~30 mEh."""
    uhf = mp2trn.run(CYANO, multiplicity=2, reference="uhf", frozen="auto", max_memory=2000)
    rohf = mp2trn.run(CYANO, multiplicity=2, reference="rohf", frozen="auto", max_memory=2000)
    assert uhf.reference == "UHF" and rohf.reference == "ROHF"
    assert uhf.spin_square > 1.1 and rohf.spin_square == pytest.approx(0.75, abs=1e-10)
    assert uhf.e_singles == 0.0 and rohf.e_singles < 0
    assert uhf.e_hf < rohf.e_hf                  # UHF's variational freedom lowers the SCF energy ...
    assert 0.02 < uhf.e_tot - rohf.e_tot < 0.04  # ... and its contamination raises UMP2 above ROHF-MBPT(2)


def test_ghost_atom_and_ecp_radical():
    """A ghost atom (its functions, no nucleus or electrons) and an ECP (iodine atom, def2-SVP) against the
    reference formula on the same SCF."""
    ghost = pyscf_rohf("O 0 0 0; H 0 0 0.97; ghost-He 0 0 3.0", 1)
    result = _mp2trn(ghost)
    assert abs(result.e_corr - rohf_mbpt2(ghost, "cc-pvdz-ri")["corr"]) < 1e-10
    iodine = pyscf_rohf("I 0 0 0", 1, basis="def2-svp", ecp="def2-svp")
    result = mp2trn.DFMP2(iodine, auxbasis="def2-svp-rifit", frozen="auto").run().result
    ref = rohf_mbpt2(iodine, "def2-svp-rifit", nfrozen=int(result.what_ran["frozen_orbitals"][0][-1]) + 1)
    assert abs(result.e_corr - ref["corr"]) < 1e-10


@pytest.mark.parametrize("device, precision, tol", [("cpu", "fp32", 1e-6), ("cuda", "fp64", 1e-10),
                                                    ("sim", "fp32x3", 1e-7)])
def test_devices_and_precisions(device, precision, tol):
    if device == "cuda":   # the cuda device's PyTorch code, run on CPU torch as the other torch tests do
        pytest.importorskip("torch")
        from mp2trn.devices.torch_backend import TorchDevice

        device, precision = TorchDevice(precision=precision, torch_device="cpu"), None
    mf = pyscf_rohf(HYDROXYL, 1)
    ref = rohf_mbpt2(mf, "cc-pvdz-ri")
    result = _mp2trn(mf, device=device, precision=precision)
    assert abs(result.e_corr - ref["corr"]) < tol
    assert abs(result.e_singles - ref["singles"]) < 1e-12   # the singles are summed in fp64 on the host


def test_run_json_and_what_ran(tmp_path):
    out = tmp_path / "oh.json"
    res = CliRunner().invoke(app, ["run", str(molecule_path("hydroxyl")), "--reference", "rohf", "--frozen-core",
                                   "auto", "--memory", "1000", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "ROHF (⟨S²⟩ = 0.750000)" in res.output and "MP2 singles (ROHF-MBPT(2))" in res.output
    doc = json.loads(out.read_text())
    props, extras = doc["properties"], doc["extras"]["mp2trn"]
    assert extras["reference"] == "ROHF" and extras["reference_spin_square"] == pytest.approx(0.75)
    assert props["mp2_singles_energy"] < 0
    assert props["mp2_correlation_energy"] == pytest.approx(
        props["mp2_singles_energy"] + props["mp2_same_spin_correlation_energy"]
        + props["mp2_opposite_spin_correlation_energy"], abs=1e-12)
    assert props["mp2_doubles_energy"] == pytest.approx(props["mp2_correlation_energy"] - props["mp2_singles_energy"])


def test_default_references_and_refusals():
    assert mp2trn.run(HYDROXYL, multiplicity=2, max_memory=1000).reference == "UHF"
    assert mp2trn.RunOptions(reference="ROHF").reference == "rohf"
    with pytest.raises(InputError, match="--reference"):
        mp2trn.RunOptions(reference="cuhf")
    assert mp2trn.RunOptions(reference="rohf", gradient=True).gradient      # tests/test_rohf_gradient.py
    with pytest.raises(InputError, match="double hybrid"):
        mp2trn.RunOptions(reference="rohf", method="b2plyp")
    with pytest.raises(InputError, match="closed shell"):
        mp2trn.run(HYDROXYL, multiplicity=2, reference="rhf", max_memory=1000)


def test_scs_and_sos_leave_the_singles_unscaled():
    scs = mp2trn.run(HYDROXYL, multiplicity=2, reference="rohf", method="sos-mp2", max_memory=1000)
    assert scs.e_method_corr == pytest.approx(scs.e_singles + scs.method.c_os * scs.e_corr_os, abs=1e-14)
    assert scs.e_scs_corr == pytest.approx(scs.e_singles + 1.2 * scs.e_corr_os + scs.e_corr_ss / 3, abs=1e-14)


def test_qcschema_keyword_and_ase_parameter():
    qcengine = pytest.importorskip("qcengine")
    from qcelemental.models import v2

    molecule = v2.Molecule.from_data("O 0 0 0\nH 0 0 0.97", molecular_multiplicity=2)
    atomic = v2.AtomicInput(molecule=molecule, specification={
        "driver": "energy", "model": {"method": "mp2", "basis": "cc-pvdz"}, "keywords": {"reference": "ROHF"}})
    out = qcengine.compute(atomic, "mp2trn", raise_error=True)
    assert out.extras["mp2trn"]["reference"] == "ROHF"
    assert out.properties.mp2_singles_energy < 0
    assert out.extras["qcvars"]["MP2 SINGLES ENERGY"] == pytest.approx(out.properties.mp2_singles_energy)
    direct = mp2trn.run(HYDROXYL, multiplicity=2, reference="rohf", max_memory=1000)
    assert abs(out.return_result - direct.e_tot) < 1e-8
    ase = pytest.importorskip("ase")
    from mp2trn.ase import MP2Calculator

    atoms = ase.Atoms("OH", positions=[(0, 0, 0), (0, 0, 0.97)])
    atoms.calc = MP2Calculator(reference="rohf", multiplicity=2, max_memory=1000)
    energy = atoms.get_potential_energy()
    assert atoms.calc.result.reference == "ROHF"
    assert abs(energy / ase.units.Hartree - direct.e_tot) < 1e-8


def test_validate_rohf_rows(tmp_path):
    """`mp2trn validate --set rohf`: ROHF rows against the spin-orbital oracle, UHF rows against PySCF."""
    from mp2trn import validation as v

    mset = v.load_set("rohf")
    assert {e.options.get("reference") for e in mset.entries} == {"rohf", "uhf"}
    assert {"cyano/cc-pvdz/fc-auto/rohf", "cyano/cc-pvdz/fc-auto/uhf"} <= {e.key for e in mset.entries}
    res = CliRunner().invoke(app, ["validate", "--set", "rohf", "--only", "hydroxyl", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "validate_rohf_cpu_fp64.json").read_text())
    rows = {r["key"]: r for r in doc["rows"]}
    assert set(rows) == {"hydroxyl/cc-pvdz/rohf", "hydroxyl/cc-pvdz/fc-auto/rohf"}
    assert all(r["passed"] and r["abs_diff"] < 1e-9 and r["reference"] == "ROHF" for r in rows.values())
    assert rows["hydroxyl/cc-pvdz/fc-auto/rohf"]["frozen"] == 1


#: BH3⁺ (doublet) of the QCEngine/Psi4 "standard suite" (standard_suite_ref.py, system "bh3p": Å, cc-pVDZ);
#: its published ROHF-MBPT(2) values below, computed by Psi4
BH3P = """B     0.10369114     0.00000000     0.00000000
H    -1.13269886     0.00000000     0.00000000
H     3.00000000     0.37149000     0.00000000
H     3.00000000    -0.37149000     0.00000000"""


def test_published_psi4_values_for_bh3_cation():
    """Psi4's DF-ROHF (cc-pVDZ-JKFIT) + DF-MP2 (cc-pVDZ-RI), frozen core: mp2trn end to end; and Psi4's
    conventional all-electron ROHF-MBPT(2): the spin-orbital reference formula on PySCF's conventional ROHF."""
    r = mp2trn.run(BH3P, charge=1, multiplicity=2, reference="rohf", frozen="auto", jkbasis="cc-pvdz-jkfit",
                   auxbasis="cc-pvdz-ri", conv_tol=1e-12, max_memory=1000)
    assert abs(r.e_hf - -25.943606522029) < 1e-9
    assert abs(r.e_singles - -0.000688391888527046) < 1e-9
    assert abs(r.e_corr_ss - -0.0018535174789756292) < 1e-9
    assert abs(r.e_corr - -0.059372748391) < 1e-8
    mol = gto.M(atom=BH3P, charge=1, spin=1, basis="cc-pvdz", verbose=0)
    conventional = scf.ROHF(mol)
    conventional.conv_tol = 1e-12
    conventional.kernel()
    exact = rohf_mbpt2(conventional, exact=True)
    assert abs(conventional.e_tot - -25.943614318546) < 1e-9
    assert abs(exact["singles"] - -0.000694049865) < 1e-9
    assert abs(exact["same_spin"] - -0.002004909679) < 1e-9
    assert abs(exact["corr"] - -0.060478115157) < 1e-8
