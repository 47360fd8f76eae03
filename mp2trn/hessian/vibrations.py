"""Harmonic vibrational analysis of a Cartesian Hessian: translations and rotations projected out (linear
molecules keep 3N − 5 modes), frequencies (cm⁻¹; imaginary ones as negative numbers), normal modes,
reduced masses, force constants and IR intensities from the dipole derivatives.

    H̃ = M^-½ H M^-½   (Eh/(bohr² amu));  the vibrational space: the complement of the mass-weighted
                       translation and rotation vectors (orthonormalised; a linear molecule's rotation
                       about its axis vanishes and is dropped by its singular value)
    H̃ L = L λ         ν = √λ / 2πc (cm⁻¹), −√|λ| / 2πc for λ < 0
    l = M^-½ L        Cartesian displacement per unit normal coordinate (bohr per bohr·√amu)
    μ_red = 1 / |l|²  (amu);  k = μ_red λ (mdyn/Å);  ∂μ/∂Q = Dᵀ l (e/√amu)
    I = N_A α h / (6 c amu) · |∂μ/∂Q|²  (km/mol; 974.9 km/mol per e²/amu)

(Wilson, Decius & Cross, *Molecular Vibrations* (1955); the intensity is the double-harmonic absorption
coefficient, as Gaussian, Psi4 and ASE report it.) Masses are the isotope-averaged ones PySCF gives
(``Mole.atom_mass_list(isotope_avg=True)``), as its ``pyscf.hessian.thermo`` uses; constants from
``pyscf.data.nist``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from pyscf.data import nist

from ..files import write_text_atomic

#: modes below −IMAGINARY_CUTOFF_CM1 count as imaginary; smaller negative values are finite-difference
#: noise on a soft mode (shown as negative, not counted)
IMAGINARY_CUTOFF_CM1 = 5.0
#: ν (cm⁻¹) per √λ with λ in Eh/(bohr² amu)
AU_TO_CM1 = (nist.HARTREE2J / (nist.ATOMIC_MASS * nist.BOHR_SI ** 2)) ** 0.5 / (2 * np.pi * nist.LIGHT_SPEED_SI) / 100
#: mdyn/Å per Eh/bohr²
EH_BOHR2_TO_MDYN_ANG = nist.HARTREE2J / nist.BOHR_SI ** 2 / 100
#: km/mol per (e²/amu) of |∂μ/∂Q|²: N_A α h / (6 c m_u), i.e. N_A e² / (12 ε₀ c² m_u)
IR_KM_MOL = nist.AVOGADRO * nist.ALPHA * nist.PLANCK / (6 * nist.LIGHT_SPEED_SI * nist.ATOMIC_MASS) / 1000
#: relative singular value below which a translation/rotation vector is linearly dependent (a linear
#: molecule's rotation about its axis, or an atom's rotations)
_TR_RANK_TOL = 1e-6


@dataclass
class Vibrations:
    """The vibrational modes of the atoms analysed, lowest first.

    frequencies_cm1: (nmodes,) cm⁻¹, imaginary modes as negative numbers.
    modes: (nmodes, natm, 3) Cartesian displacements of each mode, normalised to 1 (unitless).
    reduced_masses: (nmodes,) amu; force_constants: (nmodes,) mdyn/Å.
    ir_intensities: (nmodes,) km/mol, or None without dipole derivatives.
    linear: whether the molecule is linear (3N − 5 modes); masses: (natm,) amu; coords: (natm, 3) bohr.
    """

    frequencies_cm1: np.ndarray
    modes: np.ndarray
    reduced_masses: np.ndarray
    force_constants: np.ndarray
    ir_intensities: np.ndarray | None
    linear: bool
    masses: np.ndarray
    coords: np.ndarray

    @property
    def imaginary(self) -> int:
        """The number of imaginary modes (below −:data:`IMAGINARY_CUTOFF_CM1`)."""
        return int(np.count_nonzero(self.frequencies_cm1 < -IMAGINARY_CUTOFF_CM1))

    def record(self) -> dict:
        return {"frequencies_cm1": self.frequencies_cm1.tolist(), "reduced_masses_amu": self.reduced_masses.tolist(),
                "force_constants_mdyn_per_angstrom": self.force_constants.tolist(),
                "ir_intensities_km_per_mol": None if self.ir_intensities is None else self.ir_intensities.tolist(),
                "normal_modes": self.modes.tolist(), "imaginary_modes": self.imaginary, "linear": self.linear,
                "masses_amu": self.masses.tolist(), "imaginary_cutoff_cm1": IMAGINARY_CUTOFF_CM1}


def translations_rotations(masses: np.ndarray, coords: np.ndarray) -> np.ndarray:
    """Orthonormal mass-weighted translation and rotation vectors (3N, r): r = 6, 5 for a linear molecule,
    3 for an atom. masses (N,) amu, coords (N, 3) bohr."""
    masses = np.asarray(masses, dtype=float)
    r = np.asarray(coords, dtype=float) - masses @ coords / masses.sum()
    root = np.sqrt(masses)[:, None]
    vectors = []
    for axis in np.eye(3):
        vectors.append((root * axis).ravel())                    # translation along axis
        vectors.append((root * np.cross(axis, r)).ravel())       # rotation about axis through the centre of mass
    u, s, _ = np.linalg.svd(np.array(vectors).T, full_matrices=False)
    return u[:, s > _TR_RANK_TOL * s.max()]


def analyse(hessian: np.ndarray, masses: Sequence[float], coords: np.ndarray,
            dipole_derivatives: np.ndarray | None = None) -> Vibrations:
    """Harmonic analysis of the Cartesian ``hessian`` (3N, 3N) Eh/bohr² of N atoms with ``masses`` (amu) at
    ``coords`` (N, 3) bohr; ``dipole_derivatives`` (3N, 3) e give the IR intensities."""
    masses = np.asarray(masses, dtype=float)
    coords = np.asarray(coords, dtype=float).reshape(-1, 3)
    n = 3 * len(masses)
    inv_root = np.repeat(masses ** -0.5, 3)
    weighted = hessian * inv_root[:, None] * inv_root[None, :]
    tr = translations_rotations(masses, coords)
    # an orthonormal basis of the vibrational space: the complement of the translations and rotations
    q, _ = np.linalg.qr(np.hstack([tr, np.eye(n)]))
    basis = q[:, tr.shape[1]:n]
    eigenvalues, vectors = np.linalg.eigh(basis.T @ weighted @ basis)
    mass_weighted_modes = basis @ vectors                        # (3N, nmodes), orthonormal
    cartesian = mass_weighted_modes * inv_root[:, None]          # l = M^-½ L
    reduced = 1.0 / np.sum(cartesian ** 2, axis=0)
    frequencies = np.sign(eigenvalues) * np.sqrt(np.abs(eigenvalues)) * AU_TO_CM1
    modes = (cartesian * np.sqrt(reduced)).T.reshape(-1, len(masses), 3)
    intensities = None
    if dipole_derivatives is not None:
        dmu_dq = np.asarray(dipole_derivatives).T @ cartesian    # (3, nmodes) e/√amu
        intensities = IR_KM_MOL * np.sum(dmu_dq ** 2, axis=0)
    return Vibrations(frequencies, modes, reduced, reduced * eigenvalues * EH_BOHR2_TO_MDYN_ANG, intensities,
                      tr.shape[1] == 5, masses, coords)


def write_molden(path: str | Path, symbols: Sequence[str], vib: Vibrations) -> None:
    """The normal modes as a Molden file (``[FREQ]``, ``[FR-COORD]`` in bohr, ``[FR-NORM-COORD]``, ``[INT]``),
    the sections Molden, Jmol and Avogadro read for vibrations; imaginary modes have negative frequencies.
    Written atomically."""
    lines = ["[Molden Format]", "[FREQ]"]
    lines += [f"{f:12.4f}" for f in vib.frequencies_cm1]
    lines.append("[FR-COORD]")
    lines += [f"{s:<3s} {x:16.10f} {y:16.10f} {z:16.10f}" for s, (x, y, z) in zip(symbols, vib.coords)]
    lines.append("[FR-NORM-COORD]")
    for k, mode in enumerate(vib.modes, start=1):
        lines.append(f"vibration {k:6d}")
        lines += [f"{x:14.8f} {y:14.8f} {z:14.8f}" for x, y, z in mode]
    if vib.ir_intensities is not None:
        lines.append("[INT]")
        lines += [f"{i:14.6f}" for i in vib.ir_intensities]
    write_text_atomic(path, "\n".join(lines) + "\n")


__all__ = ["AU_TO_CM1", "IMAGINARY_CUTOFF_CM1", "IR_KM_MOL", "Vibrations", "analyse", "translations_rotations",
           "write_molden"]
