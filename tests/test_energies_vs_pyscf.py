"""fp64 DF-MP2 energies equal PySCF's DFMP2/DFUMP2 (same SCF, same explicit aux basis) to 1e-8 Eh,
and SCS-MP2 equals PySCF's dfmp2_native / dfump2_native SCS classes."""

from __future__ import annotations

import pytest
from pyscf.data.elements import chemcore
from pyscf.mp import dfmp2_native, dfump2_native

import mp2trn

from .conftest import pyscf_dfmp2, scf_for

TOL = 1e-8

# (molecule, basis): 12 molecules, RHF and UHF, second- and third-row, ions, three basis families
CASES = [
    ("water", "cc-pvdz"),
    ("water", "cc-pvtz"),
    ("ammonia", "def2-svp"),
    ("methane", "cc-pvdz"),
    ("hydrogen_fluoride", "cc-pvtz"),
    ("formaldehyde", "def2-svp"),
    ("ethylene", "cc-pvdz"),
    ("hydroxide", "cc-pvdz"),
    ("hydronium", "def2-svp"),
    ("hydrogen_sulfide", "cc-pvdz"),
    ("hydroxyl", "cc-pvdz"),
    ("methyl", "def2-svp"),
    ("oxygen_triplet", "cc-pvdz"),
    ("methylene_triplet", "cc-pvtz"),
    ("hydrogen_chloride", "def2-svp"),
]


@pytest.mark.parametrize("name,basis", CASES)
@pytest.mark.parametrize("frozen", [None, "auto"])
def test_energy_components_match_pyscf(name, basis, frozen):
    mf = scf_for(name, basis)
    ncore = chemcore(mf.mol) if frozen == "auto" else None
    ref = pyscf_dfmp2(mf, frozen=ncore or None)
    pt = mp2trn.DFMP2(mf, frozen=frozen).run()
    assert abs(pt.e_corr - ref.e_corr) <= TOL
    assert abs(pt.e_corr_os - ref.e_corr_os) <= TOL
    assert abs(pt.e_corr_ss - ref.e_corr_ss) <= TOL
    assert abs(pt.e_tot - ref.e_tot) <= TOL
    assert pt.result.reference == ("UHF" if mf.mol.spin else "RHF")


@pytest.mark.parametrize(
    "name,basis,frozen",
    [("water", "cc-pvdz", None), ("formaldehyde", "def2-svp", 2), ("hydrogen_sulfide", "cc-pvdz", 5),
     ("hydroxyl", "cc-pvdz", None), ("oxygen_triplet", "cc-pvdz", 2)],
)
def test_scs_matches_pyscf_native(name, basis, frozen):
    mf = scf_for(name, basis)
    native = dfump2_native.SCSUMP2 if mf.mol.spin else dfmp2_native.SCSMP2
    ref = native(mf, frozen=frozen)
    ref.verbose = 0
    ref.kernel()
    pt = mp2trn.DFMP2(mf, frozen=frozen).run()
    assert abs(pt.e_scs_corr - ref.e_corr) <= TOL
    assert abs(pt.e_scs - ref.e_tot) <= TOL


def test_frozen_list_of_orbitals_matches_pyscf(water_rhf):
    ref = pyscf_dfmp2(water_rhf, frozen=[0, 1])
    pt = mp2trn.DFMP2(water_rhf, frozen=[0, 1]).run()
    assert abs(pt.e_corr - ref.e_corr) <= TOL


def test_uhf_per_spin_frozen_lists_match_pyscf(hydroxyl_uhf):
    ref = pyscf_dfmp2(hydroxyl_uhf, frozen=[[0], [0]])
    pt = mp2trn.DFMP2(hydroxyl_uhf, frozen=[[0], [0]]).run()
    assert abs(pt.e_corr - ref.e_corr) <= TOL


def test_conventional_scf_reference(water_rhf):
    mf = scf_for("water", "cc-pvdz", density_fit=False)
    ref = pyscf_dfmp2(mf)
    pt = mp2trn.DFMP2(mf).run()
    assert abs(pt.e_corr - ref.e_corr) <= TOL
    assert pt.result.what_ran["jkbasis"] is None


def test_explicit_auxbasis_is_used_and_reported(water_rhf):
    ref = pyscf_dfmp2(water_rhf, auxbasis="def2-svp-ri")
    pt = mp2trn.DFMP2(water_rhf, auxbasis="def2-svp-ri").run()
    assert abs(pt.e_corr - ref.e_corr) <= TOL
    assert pt.result.what_ran["auxbasis"] == "def2-svp-ri"
    default = mp2trn.DFMP2(water_rhf).run()
    assert default.result.what_ran["auxbasis"] == "cc-pvdz-ri"  # the RI partner, not the JK-fit basis
    assert abs(default.e_corr - pt.e_corr) > 1e-6


def test_fp32_close_to_fp64(water_rhf):
    e64 = mp2trn.DFMP2(water_rhf).run().e_corr
    pt = mp2trn.DFMP2(water_rhf, precision="fp32").run()
    assert pt.result.what_ran["precision"] == "fp32"
    assert abs(pt.e_corr - e64) < 1e-6
