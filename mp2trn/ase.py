"""ASE: ``MP2Calculator`` for ``Atoms`` objects, and molecule files in any format ASE reads.

    from ase.build import molecule
    from mp2trn.ase import MP2Calculator

    atoms = molecule("H2O")
    atoms.calc = MP2Calculator(basis="cc-pvdz", device="cpu")
    atoms.get_potential_energy()          # eV (DF-MP2 total energy)
    atoms.calc.result                     # the MP2Result (Hartree, what ran, timings)

ASE is the optional extra ``mp2trn[ase]``. Energies only (``implemented_properties = ["energy"]``) until
mp2trn has gradients. Positions are in Ångström, as everywhere in ASE.
"""

from __future__ import annotations

from typing import Any

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
    ``max_memory``, ``target``, ...). ``self.result`` is the last MP2Result (Hartree).
    """

    implemented_properties = ["energy"]
    default_parameters: dict[str, Any] = {"method": "mp2", "basis": "cc-pvdz", "charge": 0, "multiplicity": None}
    name = "mp2trn"

    def __init__(self, **kwargs: Any):
        require_ase()
        unknown = set(kwargs) - set(RunOptions.__dataclass_fields__) - {"method", "label", "atoms", "directory"}
        if unknown:
            raise InputError(f"MP2Calculator: unknown parameter(s) {', '.join(sorted(unknown))}")
        super().__init__(**kwargs)
        self.result = None

    def calculate(self, atoms=None, properties=("energy",), system_changes=None):
        from ase.calculators.calculator import all_changes
        from ase.units import Hartree

        from .pipeline import run, scf_only

        super().calculate(atoms, properties, system_changes if system_changes is not None else all_changes)
        params = dict(self.parameters)
        method = str(params.pop("method", "mp2")).lower()
        if method not in ("hf", "scf"):
            params["method"] = get_method(method).name   # unknown names: an InputError listing the known ones
        geometry = geometry_of_atoms(self.atoms, params.pop("charge", None), params.pop("multiplicity", None))
        options = RunOptions.build(None, **{k: v for k, v in params.items() if k in RunOptions.__dataclass_fields__})
        if method in ("hf", "scf"):
            energy = float(scf_only(geometry, options)[0].mf.e_tot)
            self.result = None
        else:
            self.result = run(geometry, options)
            energy = self.result.e_tot   # the method's total energy
        self.results["energy"] = self.results["free_energy"] = energy * Hartree


__all__ = ["MP2Calculator", "geometry_of_atoms", "read_molecule_file"]
