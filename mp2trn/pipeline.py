"""The one compute path: molecule → SCF → DF-MP2 → result.

Every entry point — ``mp2trn.run``, ``interaction_energy``, ``mp2trn validate``, ``mp2trn bench`` and
the CLI — builds a :class:`~mp2trn.options.RunOptions`, opens the device once with :func:`open_device`
and calls :func:`compute` for each molecule::

    options = RunOptions(basis="cc-pvtz", device="sim")
    with open_device(options) as device:
        result, mf = compute("molecules/water.xyz", options, device)

Everything cheap is checked before the SCF starts: the molecule, the MP2 fitting basis and whether the
memory budget can hold the smallest block of the MP2 step.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from pyscf import gto

from . import dfmp2
from .devices import Device, get_device
from .errors import NumericalError
from .geometry import check_geometry
from .df import largest_shell, make_auxmol
from .memory import budget_mb, check_budget_before_scf, peak_rss_mb
from .molecule import build_mole
from .options import RunOptions
from .costreport import add_run_summary
from .result import MP2Result
from .scf import run_scf, scf_record
from .scratch import check_stopped, run_scratch
from .parallel import Comm, device_comm, open_comm
from .progress import Progress

Source = str | os.PathLike | gto.Mole


@contextlib.contextmanager
def open_device(options: RunOptions) -> Iterator[Device]:
    """The run's device, built from ``options`` and closed at the end (a Device object passed in
    ``options.device`` belongs to the caller and is left open)."""
    owned = not isinstance(options.device, Device)
    device = get_device(options.device, options.precision, **options.device_kwargs())
    try:
        yield device
    finally:
        if owned:
            device.close()


def bind_device(options: RunOptions, device: Device) -> RunOptions:
    """``options`` with an open ``device`` in place of the device settings (for runs sharing it)."""
    return replace(options, device=device, precision=None, target=None, device_options={})


def build_molecule(source: Source, options: RunOptions) -> tuple[gto.Mole, list[str]]:
    """The molecule of ``source`` (XYZ path or text, PySCF atom string, Mole) with the options' basis,
    charge, multiplicity and unit, and the geometry's notes; impossible geometries are refused here,
    before any integral."""
    mol = build_mole(source, basis=options.basis, charge=options.charge, multiplicity=options.multiplicity,
                     unit=options.unit)
    return mol, check_geometry(mol)


@dataclass
class ScfStage:
    """A converged SCF, its wall time (s) and the notes about its geometry."""

    mf: Any
    seconds: float
    notes: list[str]


def check_before_scf(mol: gto.Mole, options: RunOptions, device: Device) -> None:
    """Errors that need no SCF, raised before it: an unusable MP2 fitting basis, a budget too small."""
    auxmol, _ = make_auxmol(mol, options.auxbasis)
    check_budget_before_scf(mol.nao_nr(), mol.nelec, auxmol.nao_nr(), largest_shell(auxmol),
                            budget_mb(options.max_memory), device.storage_dtype.itemsize)


def scf_stage(source: Source, options: RunOptions, device: Device, progress: Progress | None = None,
              comm: Comm | None = None) -> ScfStage:
    """Molecule → converged SCF (J/K builds on ``device`` where it has them, shared over the ranks of
    ``comm``), after the checks that need no SCF."""
    mol, notes = build_molecule(source, options)
    check_before_scf(mol, options, device)
    t0 = time.perf_counter()
    if progress:
        progress("scf", 0, options.max_cycle)
    mf = run_scf(mol, options.scf, max_memory=budget_mb(options.max_memory), device=device, progress=progress,
                 comm=comm)
    if progress:
        progress("scf", mf.cycles, mf.cycles)  # converged: the bar completes
    return ScfStage(mf, time.perf_counter() - t0, notes)


def compute(
    source: Source,
    options: RunOptions,
    device: Device,
    progress: Progress | None = None,
    keep_pair_energies: bool = False,
    comm: Comm | None = None,
) -> tuple[MP2Result, Any]:
    """Molecule → SCF → DF-MP2 on ``device``. Returns the result (timings: scf, the DF-MP2 stages,
    total) and the converged PySCF mean-field object. With ``comm`` over several ranks (see
    :func:`open_ranks`) every rank returns the same result, which records each rank's memory and traffic."""
    if comm is not None:
        comm = device_comm(comm, device)   # on NKI devices the arrays travel in NKI collective kernels
    stage = scf_stage(source, options, device, progress, comm)
    mf, t_scf = stage.mf, stage.seconds
    check_stopped()
    result = dfmp2.kernel(mf, device, budget_mb(options.max_memory), options.auxbasis, options.frozen, progress,
                          keep_pair_energies, comm)
    timings = {"scf": t_scf, **result.timings}
    timings["total"] = t_scf + result.timings["mp2"]
    record = scf_record(mf, t_scf, options.lindep)
    if result.cost:
        add_run_summary(result.cost, record, timings)
    check_stopped()
    energies = result.energies()
    if not all(math.isfinite(v) for v in energies.values()):
        raise NumericalError(f"non-finite energies {energies}: the calculation is numerically degenerate; "
                             "nothing is written")
    notes = result.notes + stage.notes
    parallel = None
    if comm is not None and comm.size > 1:
        parallel = rank_record(comm, result)
        if result.cost:
            notes = notes + [f"the cost report is rank {comm.rank}'s own share of the kernels (1 of {comm.size} "
                             "ranks); extras.mp2trn.parallel.per_rank has each rank's modeled device time"]
    return replace(result, timings=timings, scf=record, notes=notes, parallel=parallel), mf


def rank_record(comm: Comm, result: MP2Result) -> dict[str, Any]:
    """Per rank: peak resident memory (MB), its share of B (MB, and as a fraction of the whole B) and the
    bytes it sent per stage — gathered from every rank."""
    mine = {"rank": comm.rank, "peak_memory_mb": peak_rss_mb(), "b_share_mb": result.what_ran.get("b_share_mb"),
            "b_share_fraction": result.what_ran.get("b_share_fraction"), "bytes_sent": dict(comm.bytes_sent)}
    if result.cost and result.cost.get("kind") == "model":   # each rank priced its own kernels
        mine["modeled_device_s"] = {t: result.cost["total"][t]["modeled_time_s"] for t in ("trn1", "trn2")}
    return {**comm.record(), "per_rank": comm.gather(mine)}


@contextlib.contextmanager
def open_ranks(options: RunOptions) -> Iterator[Comm]:
    """The ranks this run is spread over (:func:`mp2trn.parallel.open_comm`; one rank when not launched
    by torchrun and no process group is initialised)."""
    with open_comm(options.distributed, options.device_name.split(":")[0]) as comm:
        yield comm


def run(
    source: Source,
    options: RunOptions | None = None,
    progress: Progress | None = None,
    keep_pair_energies: bool = False,
    **changes: Any,
) -> MP2Result:
    """Molecule → SCF → DF-MP2 in one call; returns the MP2Result (``.e_tot``, ``.to_qcschema()``).

    ``source``: XYZ path, XYZ text, PySCF atom string or ``gto.Mole``. Settings: ``options`` and/or the
    fields of :class:`~mp2trn.options.RunOptions` as keywords (``basis=``, ``device=``, ``max_memory=``...).
    """
    options = RunOptions.build(options, **changes)
    with open_ranks(options) as comm, run_scratch(options.scratch), open_device(options) as device:
        result, _ = compute(source, options, device, progress if comm.rank == 0 else None, keep_pair_energies,
                            comm)
    return result


def scf_only(source: Source, options: RunOptions | None = None, **changes: Any) -> tuple[ScfStage, str]:
    """Molecule → converged SCF alone (methods hf/scf of the QCSchema and ASE front ends), in its own
    scratch directory and device like :func:`run`; returns the stage and the name of the device."""
    options = RunOptions.build(options, **changes)
    with run_scratch(options.scratch), open_device(options) as device:
        return scf_stage(source, options, device), device.name
