"""Properties of the MP2 densities: dipole moments and natural orbitals (written as Molden files)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pyscf import gto, scf
from pyscf.data import nist

from ..files import atomic_write


def spin_summed(dm: np.ndarray) -> np.ndarray:
    """The spin-summed AO density of an RHF (nao, nao) or UHF (2, nao, nao) density."""
    dm = np.asarray(dm)
    return dm[0] + dm[1] if dm.ndim == 3 else dm


def dipole(mol: gto.Mole, dm: np.ndarray) -> np.ndarray:
    """Dipole moment (3,) in atomic units (e·bohr) of the density ``dm`` with the nuclear part, about the
    origin of the coordinates (PySCF's convention; origin-dependent for charged molecules)."""
    return np.asarray(scf.hf.dip_moment(mol, spin_summed(dm), unit="AU", verbose=0))


def debye(au: np.ndarray) -> np.ndarray:
    """A dipole in Debye from atomic units."""
    return np.asarray(au) * nist.AU2DEBYE


@dataclass
class NaturalOrbitals:
    """Natural orbitals (nao, nmo) of a spin-summed density, occupations (nmo,) in descending order."""

    coefficients: np.ndarray
    occupations: np.ndarray


def natural_orbitals(mol: gto.Mole, dm: np.ndarray, mo_coeff: np.ndarray) -> NaturalOrbitals:
    """Eigenvectors of the spin-summed density in the orthonormal basis of the SCF orbitals ``mo_coeff``
    (for UHF, the α orbitals): D_MO = Cᵀ S D S C = U n Uᵀ, natural orbitals C U."""
    c = np.asarray(mo_coeff)
    c = c[0] if c.ndim == 3 else c
    s = mol.intor_symmetric("int1e_ovlp")
    d_mo = c.T @ s @ spin_summed(dm) @ s @ c
    occ, u = np.linalg.eigh((d_mo + d_mo.T) / 2)
    order = np.argsort(occ)[::-1]
    return NaturalOrbitals(c @ u[:, order], occ[order])


def write_molden(path: str | Path, mol: gto.Mole, nos: NaturalOrbitals) -> None:
    """Natural orbitals and occupations as a Molden file, written atomically."""
    from pyscf.tools import molden

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            molden.header(mol, fh)
            molden.orbital_coeff(mol, fh, nos.coefficients, occ=nos.occupations)

    atomic_write(path, write)
