"""ASE: ``MP2Calculator`` for ``Atoms`` objects, and molecule files in any format ASE reads.

    from ase.build import molecule
    from mp2trn.ase import MP2Calculator

    atoms = molecule("H2O")
    atoms.calc = MP2Calculator(basis="cc-pvdz", device="cpu")
    atoms.get_potential_energy()          # eV (DF-MP2 total energy)
    atoms.calc.result                     # the MP2Result (Hartree, what ran, timings)

    atoms.get_forces()                    # eV/Å: −(analytic DF-MP2 gradient)
    atoms.get_dipole_moment()             # e·Å: the relaxed MP2 density's dipole, nuclei included

ASE is the optional extra ``mp2trn[ase]``. Forces (and the dipole) come from the analytic gradient (mp2,
scs-mp2, sos-mp2), so ``ase.optimize.BFGS`` and ASE's molecular dynamics run on it; every calculation after
the first starts its SCF from the previous one's density while the atoms stay the same. Positions are in
Ångström, as everywhere in ASE.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import InputError
from .methods import get_method
from .molecule import geometry_of_atoms, read_molecule_file, require_ase
from .options import RunOptions


try:
    from ase.calculators.calculator import Calculator as _CalculatorBase
except ImportError:  # the class still exists without ASE; making one says what to install
    _CalculatorBase = object


class MP2Calculator(_CalculatorBase):
    """ASE calculator: DF-MP2 (or any method of :mod:`mp2trn.methods`, or HF) energy through :func:`mp2trn.run`.

    Parameters: ``method`` ("mp2", "scs-mp2", "sos-mp2", a double hybrid, "hf"), ``charge``, ``multiplicity`` and every field of
    :class:`~mp2trn.options.RunOptions` (``basis``, ``auxbasis``, ``device``, ``precision``, ``frozen``,
    ``max_memory``, ``target``, ``reference`` ("rhf", "uhf", "rohf"), ...).
    ``self.result`` is the last MP2Result (Hartree).
    """

    implemented_properties = ["energy", "forces", "dipole"]
    default_parameters: dict[str, Any] = {"method": "mp2", "basis": "cc-pvdz", "charge": 0, "multiplicity": None}
    name = "mp2trn"

    def __init__(self, **kwargs: Any):
        require_ase()
        unknown = set(kwargs) - set(RunOptions.__dataclass_fields__) - {"method", "label", "atoms", "directory"}
        if unknown:
            raise InputError(f"MP2Calculator: unknown parameter(s) {', '.join(sorted(unknown))}")
        super().__init__(**kwargs)
        self.result = None
        self._dm = None   # the last SCF density: the next calculation's initial guess

    def reset(self):
        super().reset()
        self._dm = None

    def calculate(self, atoms=None, properties=("energy",), system_changes=None):
        from ase.calculators.calculator import PropertyNotImplementedError, all_changes
        from ase.units import Bohr, Hartree

        from .pipeline import compute, open_device, scf_only
        from .scratch import run_scratch

        changes = system_changes if system_changes is not None else all_changes
        if set(changes) - {"positions"}:
            self._dm = None    # other atoms, charges or settings: the old density is no guess
        super().calculate(atoms, properties, changes)
        params = dict(self.parameters)
        method = str(params.pop("method", "mp2")).lower()
        if method not in ("hf", "scf"):
            params["method"] = get_method(method).name   # unknown names: an InputError listing the known ones
        geometry = geometry_of_atoms(self.atoms, params.pop("charge", None), params.pop("multiplicity", None))
        options = RunOptions.build(None, **{k: v for k, v in params.items() if k in RunOptions.__dataclass_fields__})
        derivatives = bool({"forces", "dipole"} & set(properties))
        if method in ("hf", "scf"):
            if derivatives:
                raise PropertyNotImplementedError("MP2Calculator: forces and dipoles need an MP2 method (mp2, "
                                                  "scs-mp2, sos-mp2), not hf")
            energy = float(scf_only(geometry, options)[0].mf.e_tot)
            self.result = None
        else:
            options = RunOptions.build(options, gradient=derivatives)
            with run_scratch(options.scratch), open_device(options) as device:
                self.result, mf = compute(geometry, options, device, dm0=self._dm)
            self._dm = mf.make_rdm1()
            energy = self.result.e_tot   # the method's total energy
            if derivatives:
                self.results["forces"] = -self.result.gradient * (Hartree / Bohr)
                self.results["dipole"] = np.asarray(self.result.dipoles["mp2_relaxed"]) * Bohr
        self.results["energy"] = self.results["free_energy"] = energy * Hartree


__all__ = ["MP2Calculator", "geometry_of_atoms", "read_molecule_file"]
