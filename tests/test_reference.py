"""mp2trn.reference (the textbook DF-MP2) as a second oracle: it, PySCF and the production path agree."""

from __future__ import annotations

import pytest
from pyscf.data.elements import chemcore

import mp2trn
from mp2trn.reference import rhf_dfmp2

from .conftest import pyscf_dfmp2, scf_for


@pytest.mark.parametrize("name,basis,frozen", [("water", "cc-pvdz", False), ("ammonia", "cc-pvdz", True),
                                               ("water", "def2-svp", False)])
def test_textbook_dfmp2_agrees_with_pyscf_and_mp2trn(name, basis, frozen):
    mf = scf_for(name, basis)
    nfrozen = chemcore(mf.mol) if frozen else 0
    e_os, e_ss, e_corr = rhf_dfmp2(mf, nfrozen=nfrozen)
    ref = pyscf_dfmp2(mf, frozen=nfrozen or None)
    ours = mp2trn.DFMP2(mf, frozen=nfrozen or None).run()
    assert abs(e_corr - ref.e_corr) < 1e-10
    assert abs(e_os - ref.e_corr_os) < 1e-10 and abs(e_ss - ref.e_corr_ss) < 1e-10
    assert abs(ours.e_corr_os - e_os) < 1e-10 and abs(ours.e_corr_ss - e_ss) < 1e-10
    assert e_corr < -0.1  # a real correlation energy, not an empty sum
