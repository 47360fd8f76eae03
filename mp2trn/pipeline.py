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
from .errors import InputError, NumericalError, ResourceError
from .geometry import check_geometry
from .df import DFIntegrals, largest_shell, make_auxmol, pyscf_fitting
from .memory import SpinShape, budget_mb, check_budget_before_scf, peak_rss_mb, plan_blocks, return_freed_memory
from .basis import BasisSet, MoleculeBases, atom_symbols, default_fitting, fitting_basis
from .methods import dispersion_energy, get_method
from .molecule import build_mole_with_bases
from .options import RunOptions
from .orbitals import reference_of
from .costreport import add_run_summary
from .result import MP2Result
from .scf import run_scf, scf_record
from .scratch import check_stopped, run_scratch
from .transform import EarlyIntegrals, KeptB, prepare_early_integrals
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


@dataclass
class BuiltMolecule:
    """A molecule ready for the SCF: the Mole, the notes about its geometry, and what its basis choice
    resolved to (None for a Mole given as is): orbital basis with sources, ECPs, JK-fit and RI-fit bases."""

    mol: gto.Mole
    notes: list[str]
    bases: MoleculeBases | None
    jkfit: BasisSet | None
    rifit: BasisSet | None

    @property
    def jk_auxbasis(self) -> str | dict:
        """The SCF's JK-fit basis as PySCF takes it, handed to ``scf.run_scf``."""
        return pyscf_fitting(self.mol, self.jkfit, "jkfit")

    @property
    def ri_auxbasis(self) -> str | dict:
        """The MP2 fitting basis as PySCF takes it, handed to the DF-MP2 and gradient stages."""
        return pyscf_fitting(self.mol, self.rifit, "rifit")

    def record(self) -> dict[str, Any]:
        """What-ran entry: every basis with its source per element, the ECPs and the function convention."""
        out: dict[str, Any] = dict(self.bases.record()) if self.bases else {}
        for key, chosen in (("jkfit", self.jkfit), ("rifit", self.rifit)):
            if chosen is not None:
                out[key] = chosen.record()
        return out

    def basis_notes(self) -> list[str]:
        """Warnings for the output table: fitting functions generated for want of a fitting basis."""
        notes = []
        for role, chosen in (("JK-fit (SCF)", self.jkfit), ("RI-fit (MP2)", self.rifit)):
            if chosen is not None and chosen.generated:
                notes.append(f"WARNING: no {role} basis covers {', '.join(chosen.generated)}: PySCF's even-tempered "
                             "functions were generated for them; name one with "
                             f"{'--jkbasis' if role.startswith('JK') else '--auxbasis'} for reproducible energies")
        if self.jkfit is not None and self.jkfit.coulomb_only:
            notes.append(f"WARNING: the JK-fit basis of {', '.join(self.jkfit.coulomb_only)} ({self.jkfit.name}) was made "
                         "to fit Coulomb only; fitting exchange with it moves the SCF energy by ~1e-3 Eh "
                         "(docs/bases.md); def2/JK (def2-universal-jkfit) fits both")
        return notes


def build_molecule(source: Source | BuiltMolecule, options: RunOptions) -> BuiltMolecule:
    """The molecule of ``source`` (XYZ path or text, PySCF atom string, Mole) with the options' basis, ECP,
    function convention, charge, multiplicity and unit, and its fitting bases; impossible geometries are
    refused here, before any integral."""
    if isinstance(source, BuiltMolecule):
        return source
    mol, bases = build_mole_with_bases(source, basis=options.basis, charge=options.charge,
                                       multiplicity=options.multiplicity, unit=options.unit, ecp=options.ecp,
                                       cartesian=options.cartesian)
    symbols, _ = atom_symbols(mol)
    if bases is not None:
        jk = fitting_basis("jkfit", bases.orbital, symbols, options.jkbasis, mol) if options.scf_df else None
        ri = fitting_basis("rifit", bases.orbital, symbols, options.auxbasis, mol)
    else:
        jk = default_fitting(mol, "jkfit", options.jkbasis) if options.scf_df else None
        ri = default_fitting(mol, "rifit", options.auxbasis)
    return BuiltMolecule(mol, check_geometry(mol), bases, jk, ri)


@dataclass
class ScfStage:
    """A converged SCF, its wall time (s), the notes about its geometry and the molecule it ran on."""

    mf: Any
    seconds: float
    notes: list[str]
    molecule: BuiltMolecule | None = None


def check_before_scf(molecule: BuiltMolecule, options: RunOptions, device: Device) -> None:
    """Errors that need no SCF, raised before it: an unusable MP2 fitting basis, a budget too small."""
    mol = molecule.mol
    auxmol, _ = make_auxmol(mol, molecule.ri_auxbasis)
    check_budget_before_scf(mol.nao_nr(), mol.nelec, auxmol.nao_nr(), largest_shell(auxmol),
                            budget_mb(options.max_memory), device.storage_dtype.itemsize)
    if options.gradient:   # every gradient stage's plan too, refused here rather than after the SCF and energy
        from .grad.dfmp2 import check_budget_before_scf as check_gradient_budget

        check_gradient_budget(mol, auxmol, molecule.jk_auxbasis, device.storage_dtype.itemsize,
                              budget_mb(options.max_memory), device.memory_mb())


def scf_stage(source: Source | BuiltMolecule, options: RunOptions, device: Device, progress: Progress | None = None,
              comm: Comm | None = None, dm0=None, keep_tensor: bool = False, checked: bool = False,
              meanwhile=None) -> ScfStage:
    """Molecule → converged SCF (J/K builds on ``device`` where it has them, shared over the ranks of
    ``comm``), after the checks that need no SCF (``checked``: done by the caller); ``keep_tensor``: the
    SCF's resident JK-fit tensor is kept for the gradient's response; ``meanwhile``: called when the
    device's builds begin (:func:`mp2trn.scf.run_scf`)."""
    molecule = build_molecule(source, options)
    mol = molecule.mol
    if not checked:
        check_before_scf(molecule, options, device)
    t0 = time.perf_counter()
    if progress:
        progress("scf", 0, options.max_cycle)
    mf = run_scf(mol, options.scf, max_memory=budget_mb(options.max_memory), device=device, progress=progress,
                 comm=comm, dm0=dm0, jkfit=molecule.jk_auxbasis, keep_tensor=keep_tensor, meanwhile=meanwhile)
    if progress:
        progress("scf", mf.cycles, mf.cycles)  # converged: the bar completes
    return ScfStage(mf, time.perf_counter() - t0, molecule.notes, molecule)


def compute(
    source: Source,
    options: RunOptions,
    device: Device,
    progress: Progress | None = None,
    keep_pair_energies: bool = False,
    comm: Comm | None = None,
    dm0=None,
) -> tuple[MP2Result, Any]:
    """Molecule → SCF → DF-MP2 on ``device``. Returns the result (timings: scf, the DF-MP2 stages,
    total) and the converged PySCF mean-field object. With ``comm`` over several ranks (see
    :func:`open_ranks`) every rank returns the same result, which records each rank's memory and traffic.
    ``dm0``: the SCF's initial density (a nearby geometry's, in the same basis), else PySCF's guess."""
    return_freed_memory(budget_mb(options.max_memory))   # the peak RSS follows the arrays alive, as planned
    if comm is not None:
        comm = device_comm(comm, device)   # on NKI devices the arrays travel in NKI collective kernels
    if options.gradient and not device.has_pair_densities:
        raise InputError(f"--gradient: device {device.name!r} has no gradient pair step in precision "
                         f"{device.precision!r}; use --device cpu (fp64, fp32) or sim/neuron with --precision fp32")
    one_rank = comm is None or comm.size == 1
    molecule = build_molecule(source, options)
    check_before_scf(molecule, options, device)
    # on a device computing off the host's cores, the MP2 step's 3-index integrals are made while the SCF runs
    early = prepare_early_integrals(molecule.mol, molecule.ri_auxbasis, device,
                                    budget_mb(options.max_memory)) if one_rank else None
    with early or contextlib.nullcontext(), KeptB() as kept:   # with --gradient, the energy's B waits in kept
        stage = scf_stage(molecule, options, device, progress, comm, dm0, keep_tensor=options.gradient and one_rank,
                          checked=True, meanwhile=early.start if early is not None else None)
        check_stopped()
        # the SCF's tensor, kept for the gradient's response, is held beside everything that follows; so are the
        # energy's 3-index integrals, kept for the gradient's RI pass, where the budget holds both
        held = scf_tensor_held_mb(stage, options, device) if options.gradient and one_rank else 0.0
        rows = ri_rows_held_mb(stage, options, device, held) if options.gradient and one_rank and early is None \
            else 0.0
        kept.keep_rows = rows > 0
        result, mf = _energy_and_gradient(stage, options, device, held, progress, keep_pair_energies, comm,
                                          kept if options.gradient else None, early, rows)
    return result, mf


def _residency(stage: ScfStage, device: Device, mb: float, reduced: bool = True) -> tuple:
    """What the energy's and the gradient's plans keep where within ``mb`` MB: the energy's B in memory or
    not, and the gradient's stores, pair blocks, response factors, JK-fit half-transform and (``reduced``) the
    response factors' reduced copy."""
    from .grad.dfmp2 import check_budget_before_scf as gradient_plan

    mol = stage.mf.mol
    auxmol, _ = make_auxmol(mol, stage.molecule.ri_auxbasis)
    nao, nocc = mol.nao_nr(), max(mol.nelec)
    energy = plan_blocks(nao, auxmol.nao_nr(), [SpinShape(nocc, max(1, nao - nocc))], largest_shell(auxmol),
                         mb, device.storage_dtype.itemsize)
    plan = gradient_plan(mol, auxmol, stage.molecule.jk_auxbasis, device.storage_dtype.itemsize, mb,
                         device.memory_mb(), device.reduced_response_itemsize)
    return (energy.incore, plan.stores_incore, plan.pair_block, plan.response_factors, plan.jk_half_incore,
            plan.response_reduced if reduced else None)


def _holds(stage: ScfStage, device: Device, budget: float, mb: float, reduced: bool = True) -> bool:
    """Whether ``mb`` MB can be held beside a run of ``budget`` MB without moving any array the plans keep
    (:func:`_residency`; with ``reduced``, nor dropping the response's reduced copy)."""
    try:
        return mb < budget and (_residency(stage, device, budget - mb, reduced)
                                == _residency(stage, device, budget, reduced))
    except ResourceError:
        return False


def ri_rows_held_mb(stage: ScfStage, options: RunOptions, device: Device, held: float) -> float:
    """MB of the energy's 3-index integrals (P|μν) of the MP2 fitting basis, kept from the energy's B build for
    the gradient's RI pass (:attr:`mp2trn.df.DFIntegrals.rows`), which then computes them only once; 0 where
    holding them beside the budget less ``held`` (the SCF's tensor) would move any array the plans keep. (Not
    asked where the MP2 step's integrals were begun during the SCF: their blocks take that room.)"""
    mol = stage.mf.mol
    auxmol, _ = make_auxmol(mol, stage.molecule.ri_auxbasis)
    mb = DFIntegrals.rows_mb(mol.nao_nr(), auxmol.nao_nr(), device.ao_packed)
    return mb if _holds(stage, device, budget_mb(options.max_memory) - held, mb) else 0.0


def scf_tensor_held_mb(stage: ScfStage, options: RunOptions, device: Device) -> float:
    """MB of the SCF's JK-fit tensor held after the SCF for the gradient's response, which the energy and
    the gradient then plan around (their budget less it). It stays only where their plans, with that much
    less, keep every array where the whole budget would (in memory or streamed, the response's MO blocks
    made); else it is freed here and the response builds it again."""
    from .grad.dfmp2 import release_scf_tensor, scf_tensor
    from .jk import DeviceJK

    mf = stage.mf
    tensor = scf_tensor(mf)
    if tensor is None or not isinstance(mf.with_df, DeviceJK):
        return 0.0      # none kept (PySCF's own tensor stays in PySCF's object either way)
    held = tensor.nbytes / 1e6
    # held even where it takes the room of the response's reduced copy (fp32 inner solves): without it the
    # response would build the tensor again
    if _holds(stage, device, budget_mb(options.max_memory), held, reduced=False):
        return held
    release_scf_tensor(mf)
    return 0.0


def _energy_and_gradient(stage: ScfStage, options: RunOptions, device: Device, held_mb: float,
                         progress: Progress | None, keep_pair_energies: bool, comm: Comm | None,
                         kept: KeptB | None, early: EarlyIntegrals | None = None,
                         rows_mb: float = 0.0) -> tuple[MP2Result, Any]:
    """The MP2 energy of the SCF of ``stage``, and its gradient with ``--gradient`` (from the energy's B in
    ``kept``), within the run's budget less the ``held_mb`` MB of the SCF's tensor kept for the gradient and
    the ``rows_mb`` MB of the 3-index integrals the energy keeps for it (``kept.keep_rows``); ``early``: the MP2
    step's integrals begun during the SCF."""
    from .grad.dfmp2 import sweep_gives_energies

    mf, t_scf, molecule = stage.mf, stage.seconds, stage.molecule
    budget = budget_mb(options.max_memory) - held_mb - rows_mb
    method = get_method(options.method)
    # a gradient whose sweep can sum the pair energies from its own amplitudes: the energy forms none
    deferred = (options.gradient and kept is not None and not method.double_hybrid
                and sweep_gives_energies(device, reference_of(mf), method.c_os, method.c_ss,
                                         comm is None or comm.size == 1))
    result = dfmp2.kernel(mf, device, budget, molecule.ri_auxbasis, options.frozen,
                          progress, keep_pair_energies, comm, keep_b=kept, early=early, pair_step=not deferred)
    what_ran = {**result.what_ran, **_basis_names(molecule, result.what_ran), "bases": molecule.record(),
                "method": method.record(), "memory_mb": budget_mb(options.max_memory)}
    if held_mb:
        what_ran["scf_tensor_kept_mb"] = round(held_mb, 1)   # planned around by the energy and the gradient
    if rows_mb:
        what_ran["ri_integrals_kept_mb"] = round(rows_mb, 1)
    timings = {"scf": t_scf, **result.timings}
    timings["total"] = t_scf + result.timings["mp2"]
    record = scf_record(mf, t_scf, options.lindep)
    if result.cost:
        add_run_summary(result.cost, record, timings)
    check_stopped()
    if not deferred:     # else after the gradient's sweep has summed them (a degenerate run fails later)
        check_finite(result)
    notes = result.notes + stage.notes + molecule.basis_notes()
    parallel = None
    if comm is not None and comm.size > 1:
        parallel = rank_record(comm, result)
        if result.cost and result.cost.get("kind") == "model":
            notes = notes + [f"the cost report is rank {comm.rank}'s own share of the kernels (1 of {comm.size} "
                             "ranks); extras.mp2trn.parallel.per_rank has each rank's modeled device time"]
    reference = result.reference.replace("HF", "KS") if method.double_hybrid else result.reference
    result = replace(result, timings=timings, scf=record, notes=notes, parallel=parallel, what_ran=what_ran,
                     method=method, e_disp=dispersion_energy(mf.mol, method), reference=reference)
    if options.gradient:
        result = gradient_stage(result, mf, molecule.ri_auxbasis, options, device, progress, comm, kept, budget,
                                pair_energies=deferred, keep_pair_energies=keep_pair_energies)
        if deferred:
            check_finite(result)
    return result, mf


def check_finite(result: MP2Result) -> None:
    """NumericalError unless every energy of ``result`` is finite (nothing is written then)."""
    energies = result.energies()
    if not all(math.isfinite(v) for v in energies.values()):
        raise NumericalError(f"non-finite energies {energies}: the calculation is numerically degenerate; "
                             "nothing is written")


def gradient_stage(result: MP2Result, mf, auxbasis, options: RunOptions, device: Device,
                   progress: Progress | None = None, comm: Comm | None = None, kept: KeptB | None = None,
                   budget: float | None = None, pair_energies: bool = False,
                   keep_pair_energies: bool = False) -> MP2Result:
    """The analytic gradient of ``result``'s energy, the relaxed density's dipole and natural occupations
    (:mod:`mp2trn.grad`), added to ``result`` with the stages' timings and what ran; ``kept``: the energy's
    B, which the gradient takes instead of building it again; ``budget``: MB (None: the run's).
    ``pair_energies``: ``result`` came from an energy without its pair step, and the gradient's sweep sums
    the pair energies into it (the per-pair matrices too with ``keep_pair_energies``)."""
    from .grad import kernel as gradient_kernel
    from .grad.properties import dipole, natural_orbitals

    check_stopped()
    method = result.method
    g = gradient_kernel(mf, device, budget_mb(options.max_memory) if budget is None else budget, auxbasis,
                        options.frozen, method.c_os, method.c_ss, progress, comm=comm, kept_b=kept,
                        pair_energies=pair_energies)
    if pair_energies:
        result = dfmp2.with_pair_energies(result, g.pair_energies, keep_pair_energies)
    mol = mf.mol
    dipoles = {"scf": dipole(mol, g.dm_hf).tolist(), "mp2_unrelaxed": dipole(mol, g.dm_unrelaxed).tolist(),
               "mp2_relaxed": dipole(mol, g.dm_relaxed).tolist()}
    nos = natural_orbitals(mol, g.dm_relaxed, mf.mo_coeff)
    timings = {**result.timings, **g.timings}
    timings["total"] = result.timings["total"] + g.timings["gradient"]
    cost = result.cost
    if cost:   # the device's modeled cost now includes the gradient's kernels
        cost = device.cost_report()
        add_run_summary(cost, result.scf, timings)
    return replace(result, gradient=g.gradient, dipoles=dipoles, natural_occupations=nos.occupations.tolist(),
                   densities=g, timings=timings, cost=cost, what_ran={**result.what_ran, **g.what_ran})


def _basis_names(molecule: BuiltMolecule, what_ran: dict[str, Any]) -> dict[str, Any]:
    """The printable basis names of what-ran from the resolved bases (the MP2 stage only sees PySCF data)."""
    out = {}
    if molecule.bases is not None:
        out["basis"] = molecule.bases.orbital.name
        out["ecp"] = molecule.bases.ecp.record()
    if molecule.rifit is not None:
        out["auxbasis"] = molecule.rifit.name
    if molecule.jkfit is not None and what_ran.get("jkbasis"):
        out["jkbasis"] = molecule.jkfit.name
    return out


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
        if options.hessian:   # the frequency stage over the gradient, its displacements shared over the ranks
            from .hessian import run_frequencies

            freq = run_frequencies(source, options, device, comm)
            return replace(freq.hessian.reference.result, frequencies=freq)
        result, _ = compute(source, options, device, progress if comm.rank == 0 else None, keep_pair_energies,
                            comm)
    return result


def scf_only(source: Source, options: RunOptions | None = None, **changes: Any) -> tuple[ScfStage, str]:
    """Molecule → converged SCF alone (methods hf/scf of the QCSchema and ASE front ends), in its own
    scratch directory and device like :func:`run`; returns the stage and the name of the device."""
    options = RunOptions.build(options, **changes)
    with run_scratch(options.scratch), open_device(options) as device:
        return scf_stage(source, options, device), device.name
