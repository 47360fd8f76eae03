"""The frequency stage over the gradient: mp2trn's Hessian (:mod:`.driver`) at a geometry, its harmonic
analysis (:mod:`.vibrations`) and thermochemistry (:mod:`.thermo`), and the QCSchema hessian document.

    with open_ranks(options) as comm, open_device(options) as device:
        freq = run_frequencies("molecules/water.xyz", options, device, comm)
    freq.vibrations.frequencies_cm1, freq.thermo.gibbs, freq.to_qcschema()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..devices import Device
from ..errors import InputError
from ..options import RunOptions
from ..parallel import Comm
from .driver import (DEFAULT_STEP, Displacement, DisplacementStore, HessianResult, Point, finite_difference_hessian,
                     mp2_evaluator, store_header)
from .thermo import (DEFAULT_PRESSURE, DEFAULT_TEMPERATURE, Thermochemistry, bare_molecule, point_group,
                     thermochemistry)
from .vibrations import IMAGINARY_CUTOFF_CM1, Vibrations, analyse

#: geomeTRIC's GAU criteria (Eh/bohr): above them the geometry is not a stationary point
GAU_MAX_GRADIENT = 4.5e-4
GAU_RMS_GRADIENT = 3.0e-4
#: the RunOptions fields that change a gradient: a store of points belongs to one set of them
_GRADIENT_SETTINGS = ("method", "basis", "auxbasis", "ecp", "cartesian", "charge", "multiplicity", "unit", "frozen",
                      "scf_df", "jkbasis", "conv_tol", "conv_tol_grad", "lindep", "precision", "target")


@dataclass
class FrequencyResult:
    """A frequency calculation: the Hessian with what it took, the vibrational analysis of the real atoms,
    the thermochemistry, the atoms' symbols, the point group, and warnings (not a stationary point,
    imaginary modes). ``reference_document``: the QCSchema gradient document of the reference geometry."""

    hessian: HessianResult
    vibrations: Vibrations
    thermo: Thermochemistry
    symbols: list[str]
    point_group: str
    reference_document: dict[str, Any]
    molecule: Any = None    # the bare Mole of the real atoms (thermochemistry at other conditions)
    warnings: list[str] = field(default_factory=list)

    @property
    def imaginary(self) -> int:
        return self.vibrations.imaginary

    def thermochemistry_at(self, temperature: float = DEFAULT_TEMPERATURE, pressure: float = DEFAULT_PRESSURE,
                           sigma: int | None = None) -> Thermochemistry:
        """The thermochemistry of these frequencies at another temperature (K), pressure (Pa) or σ."""
        return thermochemistry(self.molecule, self.hessian.reference.energy, self.vibrations.frequencies_cm1,
                               temperature, pressure, sigma)

    def to_qcschema(self) -> dict[str, Any]:
        """A QCSchema AtomicResult-shaped document with ``driver: "hessian"``: ``return_result`` the
        (3·natm)² Hessian flattened (Eh/bohr²), the reference energies and gradient in ``properties``,
        ``extras.mp2trn.thermochemistry`` (K, Pa, Eh, Eh/K; frequencies in cm⁻¹, imaginary negative),
        ``extras.mp2trn.vibrations`` and ``extras.mp2trn.hessian`` (step, displacements, timings)."""
        doc = dict(self.reference_document)
        doc["driver"] = "hessian"
        doc["return_result"] = self.hessian.hessian.ravel().tolist()
        props = dict(doc.get("properties", {}))
        props["return_hessian"] = doc["return_result"]
        doc["properties"] = props
        extras = dict(doc.get("extras", {}).get("mp2trn", {}))
        extras["thermochemistry"] = self.thermo.record()
        extras["vibrations"] = {**self.vibrations.record(), "symbols": self.symbols, "point_group": self.point_group}
        extras["hessian"] = self.hessian.record()
        if self.hessian.dipole_derivatives is not None:
            extras["dipole_derivatives"] = self.hessian.dipole_derivatives.tolist()
        extras["notes"] = list(extras.get("notes", [])) + self.warnings
        doc["extras"] = {**doc.get("extras", {}), "mp2trn": extras}
        return doc


def run_frequencies(source, options: RunOptions, device: Device, comm: Comm | None = None,
                    store_dir: str | Path | None = None, resume: bool = False,
                    temperature: float = DEFAULT_TEMPERATURE, pressure: float = DEFAULT_PRESSURE,
                    sigma: int | None = None, step: float | None = None,
                    report: Callable[[Displacement, Point, int, int], None] | None = None,
                    coords_bohr: np.ndarray | None = None) -> FrequencyResult:
    """Frequencies of ``source`` (at ``coords_bohr`` when given, e.g. an optimised geometry) with
    ``options``' method, basis, device...: the Hessian by central differences of mp2trn's analytic
    gradients (``step`` bohr, default ``options.hessian_step``), shared over the ranks of ``comm``, its
    points kept in ``store_dir`` (``resume``: continue from them), then the harmonic analysis and the
    thermochemistry at ``temperature`` (K) and ``pressure`` (Pa), ``sigma`` the symmetry number (None: from
    the point group). Every rank returns the same result."""
    from ..geomopt import PointCalculator

    comm = comm or Comm()
    options = RunOptions.build(options, gradient=True, hessian=False)
    step = options.hessian_step if step is None else step
    if resume and store_dir is None:
        raise InputError("--resume continues from the --displacements directory of the killed run: give "
                         "--displacements")
    calc = PointCalculator(source, options, device, reuse_density=False, comm=Comm())   # one rank per gradient
    if coords_bohr is not None:
        calc.molecule.mol = calc.molecule.mol.set_geom_(np.asarray(coords_bohr).reshape(-1, 3), unit="Bohr",
                                                        inplace=False)
    mol = calc.molecule.mol
    coords = mol.atom_coords(unit="Bohr")
    moved = calc.real
    store = None
    if store_dir is not None:
        # stores written before a setting existed lack it: read as "None" (driver.header_differences)
        settings = {name: str(getattr(options, name)) for name in _GRADIENT_SETTINGS}
        settings["device"] = options.device_name
        header = store_header(calc.labels, coords, step, settings)
        if comm.rank == 0:
            store = DisplacementStore(store_dir, header, resume)
        comm.gather(None)   # rank 0 has checked or made the directory; the others attach to it
        if comm.rank != 0:
            store = DisplacementStore(store_dir, header, resume=True)
    hess = finite_difference_hessian(mp2_evaluator(calc), coords, moved, step, store, comm, report)
    return analyse_hessian(hess, [calc.labels[i] for i in moved], mol.charge, mol.spin + 1, temperature, pressure,
                           sigma, hess.reference.document)


def analyse_hessian(hess: HessianResult, symbols: list[str], charge: int, multiplicity: int,
                    temperature: float = DEFAULT_TEMPERATURE, pressure: float = DEFAULT_PRESSURE,
                    sigma: int | None = None, document: dict[str, Any] | None = None) -> FrequencyResult:
    """The vibrational analysis and thermochemistry of ``hess`` over its moved (real) atoms ``symbols``."""
    moved = hess.moved
    rows = np.array([3 * a + k for a in moved for k in range(3)], dtype=int)
    coords = hess.coords[moved]
    mol = bare_molecule(symbols, coords, charge, multiplicity)
    masses = mol.atom_mass_list(isotope_avg=True)
    derivatives = None if hess.dipole_derivatives is None else hess.dipole_derivatives[rows]
    vib = analyse(hess.hessian[np.ix_(rows, rows)], masses, coords, derivatives)
    thermo = thermochemistry(mol, hess.reference.energy, vib.frequencies_cm1, temperature, pressure, sigma)
    return FrequencyResult(hess, vib, thermo, symbols, point_group(mol), document or {}, mol,
                           _warnings(hess, vib))


def _warnings(hess: HessianResult, vib: Vibrations) -> list[str]:
    """Not a stationary point (gradient above GAU), or imaginary modes: said, never hidden."""
    out = []
    g = np.asarray(hess.reference.gradient)[hess.moved]
    gmax, grms = float(np.max(np.abs(g))), float(np.sqrt(np.mean(g ** 2)))
    if gmax > GAU_MAX_GRADIENT or grms > GAU_RMS_GRADIENT:
        out.append(f"WARNING: not a stationary point (max |g| {gmax:.2e}, rms {grms:.2e} Eh/bohr above geomeTRIC's "
                   "GAU thresholds 4.5e-4 / 3.0e-4): frequencies and thermochemistry of a non-stationary geometry; "
                   "optimise first (mp2trn optimize --freq)")
    if vib.imaginary:
        freqs = ", ".join(f"{f:.1f}" for f in vib.frequencies_cm1[vib.frequencies_cm1 < -IMAGINARY_CUTOFF_CM1])
        out.append(f"WARNING: {vib.imaginary} imaginary mode(s) ({freqs} cm⁻¹): not a minimum; they are left out "
                   "of the thermochemistry")
    return out


__all__ = ["DEFAULT_STEP", "FrequencyResult", "GAU_MAX_GRADIENT", "analyse_hessian", "run_frequencies"]
