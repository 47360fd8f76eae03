"""Thermochemistry of an ideal gas of rigid rotors and harmonic oscillators, computed by PySCF's
``pyscf.hessian.thermo.thermo``.

Why PySCF's: it is already mp2trn's integral and SCF library (no new dependency), works in Hartree and
reports every part (electronic, translational, rotational, vibrational) of U, H, S, G and Cv with the
constants of ``pyscf.data.nist`` that the rest of mp2trn uses; geomeTRIC's version prints rather than
returns its parts, and ASE's ``IdealGasThermo`` works in eV and hides the parts of S (the tests use it
as the independent check).

The rotational symmetry number σ comes from the point group that PySCF detects
(``pyscf.hessian.thermo.rotational_symmetry_number``, CCCBDB's rules) with a geometry tolerance of
:data:`SYMMETRY_TOLERANCE_BOHR` (an optimised geometry is symmetric only to its convergence), or from the
user (``--symmetry-number``); PySCF's ``thermo`` then runs with that σ. Modes below zero (imaginary) are
left out of the vibrational sums, as PySCF does; the result says how many.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence
from unittest import mock

import numpy as np
from pyscf import gto, lib, symm
from pyscf.hessian import thermo as pyscf_thermo

from ..errors import InputError
from ..result import HARTREE_TO_KCAL
from .vibrations import AU_TO_CM1

#: atoms may be off their symmetric positions by this much (bohr) in the point-group detection
SYMMETRY_TOLERANCE_BOHR = 1e-3
#: the default temperature (K) and pressure (Pa: 1 atm, PySCF's default)
DEFAULT_TEMPERATURE = 298.15
DEFAULT_PRESSURE = 101325.0
_PARTS = ("elec", "trans", "rot", "vib")


def bare_molecule(symbols: Sequence[str], coords_bohr: np.ndarray, charge: int = 0, multiplicity: int = 1) -> gto.Mole:
    """A Mole of the atoms (a placeholder basis): what the thermochemistry reads (masses, geometry, spin)."""
    mol = gto.Mole()
    mol.atom = [(s, tuple(c)) for s, c in zip(symbols, np.asarray(coords_bohr).reshape(-1, 3))]
    mol.unit = "Bohr"
    mol.basis = {s: [[0, [1.0, 1.0]]] for s in set(symbols)}   # one s function each: never used, keeps PySCF quiet
    mol.charge = charge
    mol.spin = multiplicity - 1
    mol.verbose = 0
    try:
        mol.build()
    except RuntimeError as exc:
        raise InputError(f"thermochemistry: {exc}") from None
    return mol


def point_group(mol: gto.Mole, tolerance: float = SYMMETRY_TOLERANCE_BOHR) -> str:
    """The point group PySCF detects (Schoenflies, e.g. C2v, Dooh) with ``tolerance`` bohr."""
    with lib.temporary_env(symm.geom, TOLERANCE=tolerance):
        return symm.detect_symm(mol._atom)[0]


def symmetry_number(mol: gto.Mole, tolerance: float = SYMMETRY_TOLERANCE_BOHR) -> int:
    """The rotational symmetry number σ of the point group (PySCF's rules: C2v 2, C3v 3, Td 12, D6h 12...)."""
    with lib.temporary_env(symm.geom, TOLERANCE=tolerance):
        return int(pyscf_thermo.rotational_symmetry_number(mol))


@dataclass
class Thermochemistry:
    """U, H, S, G and their parts at one temperature and pressure (PySCF's result dictionary, values only).

    parts: PySCF's keys — ``E0`` (electronic energy), ``ZPE``, ``E_tot`` (U), ``H_tot``, ``S_tot`` (Eh/K),
    ``G_tot``, ``Cv_tot``, and per part ``S_trans``, ``H_rot``, ``G_vib``, ... (Eh, Eh/K).
    symmetry_number σ and where it came from (``point group C2v`` or ``--symmetry-number``).
    """

    temperature: float
    pressure: float
    parts: dict[str, float]
    symmetry_number: int
    symmetry_source: str
    frequencies_cm1: list[float]
    excluded_imaginary: int

    @property
    def zpe(self) -> float:
        return self.parts["ZPE"]

    @property
    def internal_energy(self) -> float:
        return self.parts["E_tot"]

    @property
    def enthalpy(self) -> float:
        return self.parts["H_tot"]

    @property
    def entropy(self) -> float:
        return self.parts["S_tot"]

    @property
    def gibbs(self) -> float:
        return self.parts["G_tot"]

    def record(self) -> dict[str, Any]:
        """The JSON record: totals include the electronic energy (Eh; S in Eh/K), kcal/mol corrections,
        every part, σ and the frequencies used (imaginary ones negative)."""
        e0 = self.parts["E0"]
        corrections = {"zpe": self.zpe, "thermal_energy": self.internal_energy - e0,
                       "thermal_enthalpy": self.enthalpy - e0, "thermal_gibbs": self.gibbs - e0}
        return {"temperature": self.temperature, "pressure": self.pressure, "electronic_energy": e0,
                "zpe": self.zpe, "internal_energy": self.internal_energy, "enthalpy": self.enthalpy,
                "entropy": self.entropy, "gibbs": self.gibbs,
                "corrections_kcal_per_mol": {k: v * HARTREE_TO_KCAL for k, v in corrections.items()},
                "entropy_cal_per_mol_k": self.entropy * HARTREE_TO_KCAL * 1000,
                "parts": dict(self.parts), "symmetry_number": self.symmetry_number,
                "symmetry_source": self.symmetry_source, "frequencies_cm1": list(self.frequencies_cm1),
                "imaginary_modes_left_out": self.excluded_imaginary,
                "model": "ideal gas, rigid rotor, harmonic oscillator (pyscf.hessian.thermo)"}


def thermochemistry(mol: gto.Mole, electronic_energy: float, frequencies_cm1: Sequence[float],
                    temperature: float = DEFAULT_TEMPERATURE, pressure: float = DEFAULT_PRESSURE,
                    sigma: int | None = None) -> Thermochemistry:
    """Thermochemistry of the molecule ``mol`` (its real atoms; masses from PySCF) with the vibrational
    ``frequencies_cm1`` (imaginary ones negative) and electronic energy (Eh), at ``temperature`` (K) and
    ``pressure`` (Pa); ``sigma``: the rotational symmetry number, None to take the point group's."""
    if not temperature > 0:
        raise InputError(f"--temperature must be positive (K), got {temperature}")
    if not pressure > 0:
        raise InputError(f"--pressure must be positive (Pa), got {pressure}")
    if sigma is not None and (int(sigma) != sigma or sigma < 1):
        raise InputError(f"--symmetry-number must be a whole number ≥ 1, got {sigma}")
    source = "--symmetry-number"
    if sigma is None:
        sigma, source = symmetry_number(mol), f"point group {point_group(mol)}"
    freq = np.asarray(frequencies_cm1, dtype=float)
    freq_au = _to_pyscf_frequency(freq)
    model = _Model(mol, float(electronic_energy))
    with mock.patch.object(pyscf_thermo, "rotational_symmetry_number", lambda _mol: int(sigma)):
        results = pyscf_thermo.thermo(model, freq_au, temperature, pressure)
    parts = {k: float(v[0]) for k, v in results.items() if np.ndim(v[0]) == 0}
    return Thermochemistry(float(temperature), float(pressure), parts, int(sigma), source, freq.tolist(),
                           int(np.count_nonzero(freq < 0)))


def _to_pyscf_frequency(freq_cm1: np.ndarray) -> np.ndarray:
    """cm⁻¹ → the angular frequency unit PySCF's ``thermo`` takes (√(Eh/(bohr² amu)), its ``freq_au``)."""
    return np.asarray(freq_cm1, dtype=float) / AU_TO_CM1


@dataclass
class _Model:
    """What ``pyscf.hessian.thermo.thermo`` reads of a mean-field object: the molecule and its energy."""

    mol: gto.Mole
    e_tot: float


__all__ = ["DEFAULT_PRESSURE", "DEFAULT_TEMPERATURE", "SYMMETRY_TOLERANCE_BOHR", "Thermochemistry", "bare_molecule",
           "point_group", "symmetry_number", "thermochemistry"]
