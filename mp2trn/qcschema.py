"""QCSchema in and out: run an ``AtomicInput`` and return an ``AtomicResult``, and mp2trn as a QCEngine
program (``qcengine.compute(atomic_input, "mp2trn")``).

The current QCSchema line on PyPI is used (qcelemental ≥ 0.51 / qcengine ≥ 0.52, Pydantic v2, the
``qcelemental.models.v2`` models); both are the optional extra ``mp2trn[qcschema]``. Version-1 inputs are
converted to version 2 first.

What an input may say (everything else is an InputError naming what is accepted):

- ``specification.driver``: ``energy``, ``gradient`` (return_result: the natm × 3 analytic gradient in
  Eh/bohr; mp2, scs-mp2 and sos-mp2), ``hessian`` (return_result: the (3·natm)² Hessian in Eh/bohr² by
  central differences of those gradients, :mod:`mp2trn.hessian`; frequencies and thermochemistry in
  ``extras.mp2trn``) or ``properties`` (return_result: the energies and the SCF and relaxed
  MP2 dipole moments, which also fill ``scf_dipole_moment`` / ``mp2_dipole_moment``).
- ``specification.model.method``: any method of :mod:`mp2trn.methods` — ``mp2``, ``scs-mp2``,
  ``sos-mp2``, the double hybrids (return_result is that method's total energy) — or ``hf`` / ``scf``
  (the SCF alone); ``model.basis``: a basis name (PySCF library or Basis Set Exchange) or file.
- ``specification.keywords``: :data:`KEYWORDS` — ``device``, ``precision``, ``frozen_core`` (or
  ``frozen``), ``memory`` (MB), ``target``, ``df_basis_mp2`` (or ``auxbasis``), ``df_basis_scf`` (or
  ``jkbasis``) (Psi4's names such as ``def2-svp-ri`` mean what they mean in Psi4), ``conv_tol``,
  ``conv_tol_grad``, ``max_cycle``, ``scf_jk``, ``lindep``, ``ecp`` (auto/none/a name),
  ``cartesian`` (or QCSchema's ``puream``, its opposite), ``dft_grid`` (or ``grid``), ``reference`` (``rhf``,
  ``uhf`` or ``rohf``, as Psi4 spells it, any case; default RHF for closed shells, UHF for open shells).
- the molecule: symbols, geometry (bohr, as QCSchema stores it), ``real`` flags (ghost atoms),
  ``molecular_charge``, ``molecular_multiplicity``.

Errors: every :class:`~mp2trn.errors.Mp2trnError` keeps its one-line message; QCEngine gets it as a
``FailedOperation`` whose ``error_type`` follows :data:`ERROR_TYPES` (input vs convergence vs resources).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from .errors import ConvergenceError, InputError, Mp2trnError, NumericalError, ResourceError
from .methods import METHODS, get_method
from .molecule import Atom, Geometry
from .options import RunOptions
from .version import __version__

EXTRA_HINT = "pip install 'mp2trn[qcschema]' (qcelemental and qcengine)"
#: methods of the SCF alone (return_result: the SCF energy); every method of :mod:`mp2trn.methods` also runs
SCF_METHODS = ("hf", "scf")
#: the drivers a QCSchema input may ask for
DRIVERS = ("energy", "gradient", "properties", "hessian")
#: keyword → RunOptions field
KEYWORDS = {
    "device": "device", "precision": "precision", "frozen_core": "frozen", "frozen": "frozen",
    "memory": "max_memory", "max_memory": "max_memory", "target": "target", "df_basis_mp2": "auxbasis",
    "auxbasis": "auxbasis", "df_basis_scf": "jkbasis", "jkbasis": "jkbasis", "conv_tol": "conv_tol",
    "conv_tol_grad": "conv_tol_grad", "max_cycle": "max_cycle", "scf_jk": "scf_jk", "lindep": "lindep", "scf_df": "scf_df",
    "ecp": "ecp", "cartesian": "cartesian", "puream": "spherical", "dft_grid": "grid", "grid": "grid",
    "reference": "reference",
}
#: mp2trn error class → QCEngine/QCSchema error_type
ERROR_TYPES = {InputError: "input_error", ConvergenceError: "convergence_error", ResourceError: "resource_error",
               NumericalError: "input_error"}


def _models():
    try:
        from qcelemental.models import v1, v2
    except ImportError:
        raise InputError(f"QCSchema input and output need qcelemental: {EXTRA_HINT}") from None
    return v1, v2


def looks_like_atomic_input(text: str) -> bool:
    """True when ``text`` is a JSON object shaped like a QCSchema AtomicInput (by content, not by name)."""
    if not text.lstrip().startswith("{"):
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and (
        str(data.get("schema_name", "")).startswith(("qcschema_input", "qcschema_atomic_input"))
        or ("molecule" in data and ("specification" in data or "model" in data)))


def load_atomic_input(data: str | dict | Any):
    """A v2 ``AtomicInput`` from JSON text, a dict (v1 or v2) or a model; malformed → InputError."""
    v1, v2 = _models()
    if isinstance(data, v2.AtomicInput):
        return data
    if isinstance(data, v1.AtomicInput):
        return data.convert_v(2)
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise InputError(f"not a JSON document: {exc}") from None
    if not isinstance(data, dict):
        raise InputError("a QCSchema AtomicInput must be a JSON object")
    try:
        if int(data.get("schema_version", 2 if "specification" in data else 1)) == 1:
            return v1.AtomicInput(**data).convert_v(2)
        return v2.AtomicInput(**data)
    except Exception as exc:  # pydantic's ValidationError: one line per field, keep the first
        raise InputError(f"invalid QCSchema AtomicInput: {_first_error(exc)}") from None


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        except Exception:  # noqa: BLE001 - fall back to the text below
            pass
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def geometry_of(molecule) -> Geometry:
    """The QCSchema molecule as mp2trn's Geometry (coordinates in bohr; ghosts from ``real``)."""
    symbols = list(molecule.symbols)
    xyz = [float(x) for x in list(_flat(molecule.geometry))]
    real = list(molecule.real) if molecule.real is not None else [True] * len(symbols)
    if len(xyz) != 3 * len(symbols):
        raise InputError(f"molecule: {len(symbols)} atoms but {len(xyz)} coordinates")
    atoms = [Atom(str(sym).capitalize(), (xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2]), ghost=not real[i])
             for i, sym in enumerate(symbols)]
    return Geometry(atoms, comment=str(getattr(molecule, "name", "") or ""),
                    charge=int(round(float(molecule.molecular_charge))),
                    multiplicity=int(round(float(molecule.molecular_multiplicity))))


def _flat(geometry):
    try:
        return geometry.ravel()
    except AttributeError:
        return [x for row in geometry for x in (row if isinstance(row, (list, tuple)) else [row])]


def options_of(atomic_input, base: RunOptions | None = None, memory_mb: float | None = None) -> tuple[str, RunOptions]:
    """(method, RunOptions) for an AtomicInput; unsupported drivers, methods and keywords are InputErrors."""
    spec = atomic_input.specification
    driver = str(getattr(spec.driver, "value", spec.driver)).lower()
    if driver not in DRIVERS:
        raise InputError(f"driver {driver!r} is not available in mp2trn: {', '.join(DRIVERS)}")
    method = str(spec.model.method).lower()
    if driver != "energy" and (method in SCF_METHODS or get_method(method).double_hybrid):
        raise InputError(f"driver {driver!r} needs the analytic MP2 gradient: methods mp2, scs-mp2, sos-mp2 "
                         f"(not {spec.model.method!r})")
    if method not in SCF_METHODS:
        try:
            method = get_method(method).name
        except InputError:
            raise InputError(f"method {spec.model.method!r} is not available in mp2trn: "
                             f"{', '.join(SCF_METHODS + tuple(METHODS))}") from None
    basis = spec.model.basis
    if basis is None or not isinstance(basis, str) or not basis.strip():
        raise InputError("model.basis must name a basis set (a QCSchema BasisSet object is not supported)")
    fields: dict[str, Any] = {"basis": basis, "unit": "bohr"}
    if memory_mb is not None:
        fields["max_memory"] = memory_mb
    unknown = sorted(set(spec.keywords) - set(KEYWORDS))
    if unknown:
        raise InputError(f"unknown keyword(s) {', '.join(unknown)}: mp2trn accepts {', '.join(sorted(KEYWORDS))}")
    for key, value in spec.keywords.items():
        if KEYWORDS[key] == "spherical":   # QCSchema's puream: True means spherical functions
            fields["cartesian"] = not bool(value)
        else:
            fields[KEYWORDS[key]] = value
    if method not in SCF_METHODS:
        fields["method"] = method
    if driver != "energy":
        fields["gradient"] = True
    return method, RunOptions.build(base, **fields)


def run_atomic_input(data, memory_mb: float | None = None):
    """Run a QCSchema AtomicInput (JSON text, dict or model) and return a validated v2 ``AtomicResult``.

    ``memory_mb``: the budget when the keywords set none (QCEngine passes its task's memory). Raises
    :class:`~mp2trn.errors.Mp2trnError` subclasses with one-line messages.
    """
    from .pipeline import compute, open_device, scf_only
    from .result import qcschema_molecule
    from .scf import scf_record
    from .scratch import run_scratch

    _, v2 = _models()
    atomic_input = load_atomic_input(data)
    method, options = options_of(atomic_input, memory_mb=memory_mb)
    geometry = geometry_of(atomic_input.molecule)
    if method in SCF_METHODS:
        stage, device_name = scf_only(geometry, options)
        record = scf_record(stage.mf, stage.seconds, options.lindep)
        props = _scf_properties(stage.mf, record)
        extras = {"mp2trn": {"scf": record, "notes": stage.notes, "device": device_name,
                             "molecule": qcschema_molecule(stage.mf.mol)}}
    elif driver_of(atomic_input) == "hessian":
        from .hessian import run_frequencies

        with run_scratch(options.scratch), open_device(options) as device:
            freq = run_frequencies(geometry, options, device)
        result = freq.hessian.reference.result
        doc = freq.to_qcschema()
        props = {**_scf_properties_of(doc), **{k: v for k, v in doc["properties"].items() if k != "return_hessian"}}
        extras = {"mp2trn": doc["extras"]["mp2trn"], "qcvars": _qcvars(result)}
    else:
        with run_scratch(options.scratch), open_device(options) as device:
            result, mf = compute(geometry, options, device)
        doc = result.to_qcschema()
        props = {**_scf_properties(mf, result.scf), **doc["properties"]}
        extras = {"mp2trn": doc["extras"]["mp2trn"], "qcvars": _qcvars(result)}
    value = props["scf_total_energy"] if method in SCF_METHODS else result.e_tot
    props["return_energy"] = value
    if not math.isfinite(value):
        raise NumericalError(f"the {method} energy is not finite ({value}); nothing is returned")
    driver = driver_of(atomic_input)
    returned: Any = value
    if driver == "gradient":
        returned = result.gradient
    elif driver == "hessian":
        returned = freq.hessian.hessian
        props["return_gradient"] = np.asarray(result.gradient).ravel().tolist()
        props["return_hessian"] = returned
    elif driver == "properties":
        returned = {"return_energy": value, "scf_dipole_moment": list(result.dipoles["scf"]),
                    "mp2_dipole_moment": list(result.dipoles["mp2_relaxed"])}
    return v2.AtomicResult(
        input_data=atomic_input,
        molecule=atomic_input.molecule,
        properties=v2.AtomicProperties(**props),
        return_result=returned,
        provenance=v2.Provenance(creator="mp2trn", version=__version__, routine="mp2trn.qcschema.run_atomic_input"),
        extras=extras,
        success=True,
    )


def driver_of(atomic_input) -> str:
    """The input's driver as a lower-case string."""
    driver = atomic_input.specification.driver
    return str(getattr(driver, "value", driver)).lower()


def _scf_properties_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The SCF properties of a run's QCSchema document (a hessian run keeps no mean-field object)."""
    sizes = doc["extras"]["mp2trn"].get("sizes", {})
    props = {"calcinfo_nbasis": sizes.get("nao"), "calcinfo_nmo": sizes.get("nmo"),
             "calcinfo_nalpha": sizes.get("nalpha"), "calcinfo_nbeta": sizes.get("nbeta"),
             "calcinfo_natom": sizes.get("natm")}
    return {k: v for k, v in props.items() if v is not None}


def _scf_properties(mf, record: dict[str, Any] | None) -> dict[str, Any]:
    import numpy as np

    mol = mf.mol
    props = {
        "calcinfo_nbasis": int(mol.nao_nr()),
        "calcinfo_nmo": int(np.asarray(mf.mo_energy).shape[-1]),
        "calcinfo_nalpha": int(mol.nelec[0]),
        "calcinfo_nbeta": int(mol.nelec[1]),
        "calcinfo_natom": int(mol.natm),
        "nuclear_repulsion_energy": float(mol.energy_nuc()),
        "scf_total_energy": float(mf.e_tot),
        "return_energy": float(mf.e_tot),
    }
    if record and record.get("cycles") is not None:
        props["scf_iterations"] = int(record["cycles"])
    return props


def _qcvars(result) -> dict[str, float]:
    """QCEngine's variable names for what has no AtomicProperties field (SCS-MP2)."""
    return {"SCS-MP2 CORRELATION ENERGY": result.e_scs_corr, "SCS-MP2 TOTAL ENERGY": result.e_scs,
            "MP2 TOTAL ENERGY": result.e_mp2_tot, "MP2 CORRELATION ENERGY": result.e_corr,
            "MP2 SINGLES ENERGY": result.e_singles, "MP2 DOUBLES ENERGY": result.e_doubles,
            "HF TOTAL ENERGY": result.e_hf}


def error_type(exc: BaseException) -> str:
    """The QCSchema error_type of an mp2trn error."""
    for cls, name in ERROR_TYPES.items():
        if isinstance(exc, cls):
            return name
    return "unknown_error"


def _harness_class():
    from typing import ClassVar

    from qcengine.programs.model import ProgramHarness

    class Mp2trnHarness(ProgramHarness):
        """QCEngine program ``mp2trn``: in-process DF-MP2 (and HF) through :func:`run_atomic_input`."""

        _defaults: ClassVar[dict[str, Any]] = {
            "name": "mp2trn", "scratch": True, "thread_safe": False, "thread_parallel": True,
            "node_parallel": False, "managed_memory": True,
        }

        @staticmethod
        def found(raise_error: bool = False) -> bool:
            return True  # in-process: importing mp2trn is all it takes

        def get_version(self) -> str:
            return __version__

        def compute(self, input_model, config):
            memory_mb = float(config.memory) * 1024.0 if getattr(config, "memory", None) else None
            try:
                return run_atomic_input(input_model, memory_mb=memory_mb)
            except Mp2trnError as exc:  # the CLI's one-line message, with the right error type
                return failed_operation(input_model, exc)

    return Mp2trnHarness


def failed_operation(input_data, exc: Mp2trnError):
    """A v2 ``FailedOperation`` carrying the error's one-line message (as the CLI prints it) and type."""
    _, v2 = _models()
    return v2.FailedOperation(
        input_data=input_data,
        error=v2.ComputeError(error_type=error_type(exc), error_message=str(exc),
                              extras={"mp2trn_error": type(exc).__name__, "exit_code": exc.exit_code}),
    )


def register() -> bool:
    """Register the ``mp2trn`` program with QCEngine (once); False when QCEngine is not installed."""
    try:
        import qcengine
    except ImportError:
        return False
    if "mp2trn" not in qcengine.list_all_programs():
        qcengine.register_program(_harness_class()())
    return True


def optimization_result(opt, options: RunOptions) -> dict[str, Any]:
    """A QCSchema ``OptimizationResult``-shaped document (schema qcschema_optimization_output) of an
    :class:`mp2trn.geomopt.Optimization`: the molecules, the trajectory of gradient results, energies, and
    SCF cycles and wall time per step in extras."""
    from .result import qcschema_molecule

    def molecule(step) -> dict[str, Any]:
        if step.result is not None:
            return step.result.molecule
        first = opt.steps[-1].result or next((s.result for s in opt.steps if s.result is not None), None)
        base = dict(first.molecule) if first is not None else {}
        return {**base, "geometry": step.coords.ravel().tolist()}

    def atomic(step) -> dict[str, Any]:
        if step.result is not None:
            return step.result.to_qcschema()
        return {"schema_name": "qcschema_output", "schema_version": 1, "molecule": molecule(step),
                "driver": "gradient", "model": {"method": options.method, "basis": options.basis},
                "properties": {"return_energy": step.energy}, "return_result": step.gradient.ravel().tolist(),
                "success": True, "extras": {"mp2trn": {"resumed": "read back from the trajectory"}}}

    # the reference that ran (RHF/UHF/ROHF), read from a computed step: options.reference is None when chosen
    # by the multiplicity
    ran_reference = next((s.result.reference for s in opt.steps if s.result is not None), None)
    return {
        "schema_name": "qcschema_optimization_output",
        "schema_version": 1,
        "input_specification": {"driver": "gradient", "model": {"method": options.method, "basis": options.basis},
                                "keywords": {"frozen": str(options.frozen), "auxbasis": options.auxbasis,
                                             "jkbasis": options.jkbasis, "device": str(options.device_name),
                                             "reference": options.reference}},
        "initial_molecule": molecule(opt.steps[0]),
        "final_molecule": molecule(opt.final),
        "trajectory": [atomic(s) for s in opt.steps],
        "energies": [s.energy for s in opt.steps],
        "success": bool(opt.converged),
        "provenance": {"creator": "mp2trn", "version": __version__, "routine": "mp2trn.geomopt.optimize"},
        "extras": {"mp2trn": {"message": opt.message, "reference": ran_reference,
                              "scf_cycles": [s.scf_cycles for s in opt.steps],
                              "seconds": [s.seconds for s in opt.steps],
                              "max_gradient": [s.max_gradient for s in opt.steps],
                              "constraints": [{"line": c.line, "applied": text, "geometric": c.geometric_line()}
                                              for c, text in zip(opt.constraints, opt.stated_constraints())]}},
    }


__all__ = ["looks_like_atomic_input", "load_atomic_input", "run_atomic_input", "register", "error_type",
           "failed_operation"]
