"""Shared fixtures: molecules, SCF objects and PySCF references, cached per session."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from pyscf import gto

# the cpu device's cost report measures this machine's GEMM rates once and caches them under the user
# cache directory (mp2trn.roofline): the tests, and the processes they start, keep theirs in a temporary one
_CACHE = tempfile.mkdtemp(prefix="mp2trn-test-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

ROOT = Path(__file__).resolve().parents[1]
MOLECULES = ROOT / "molecules"


def molecule_path(name: str) -> Path:
    return MOLECULES / f"{name}.xyz"


@functools.lru_cache(maxsize=None)
def scf_for(name: str, basis: str, density_fit: bool = True):
    """Converged RHF/UHF for molecules/<name>.xyz (charge/multiplicity from its comment line)."""
    from mp2trn.molecule import build_mole
    from mp2trn.scf import ScfOptions, run_scf

    mol = build_mole(molecule_path(name), basis=basis)
    return run_scf(mol, ScfOptions(density_fit=density_fit))


def pyscf_dfmp2(mf, frozen=None, auxbasis=None):
    """PySCF's DF-MP2 for these options: the project's one PySCF oracle (mp2trn.validation)."""
    from mp2trn.options import RunOptions
    from mp2trn.validation import pyscf_reference

    return pyscf_reference(mf, RunOptions(frozen=frozen, auxbasis=auxbasis))


@pytest.fixture(scope="session")
def water_rhf():
    return scf_for("water", "cc-pvdz")


@pytest.fixture(scope="session")
def hydroxyl_uhf():
    return scf_for("hydroxyl", "cc-pvdz")


@pytest.fixture
def water_mol() -> gto.Mole:
    from mp2trn.molecule import build_mole

    return build_mole(molecule_path("water"), basis="cc-pvdz")


def df_scf_in_field(scf_class, mol: gto.Mole, jkfit: str, field=None, conv_tol_grad: float = 1e-9):
    """A tightly converged density-fitted PySCF SCF (``scf_class``: scf.RHF, scf.ROHF, …) with the JK-fit set
    ``jkfit``, in the uniform electric field ``field`` (au; h + F·r) when one is given."""
    import numpy as np

    mf = scf_class(mol).density_fit(auxbasis=jkfit)
    if field is not None:
        h = mf.get_hcore() + np.einsum("x,xij->ij", field, mol.intor("int1e_r"))
        mf.get_hcore = lambda *args: h
    mf.conv_tol = 1e-12
    mf.conv_tol_grad = conv_tol_grad
    return mf.run()
