"""DF-MP2 on a converged PySCF RHF, UHF or ROHF object, in PySCF's shape (ROHF: ROHF-MBPT(2), the
semicanonical orbitals of :func:`mp2trn.orbitals.semicanonical` with the singles energy).

:func:`kernel` does the math — orbitals → DF integrals → B = L⁻¹(P|ia) → pair energies — on a device
it is handed; :class:`DFMP2` is a thin class holding the settings, building (and closing) the device
when given a name, and keeping the result::

    pt = mp2trn.DFMP2(mf, frozen="auto").run()
    pt.e_corr, pt.e_corr_os, pt.e_corr_ss, pt.e_scs, pt.e_tot, pt.timings
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import numpy as np

from .devices import Device, get_device
from .basis import default_fitting
from .df import build_df, describe_basis, pyscf_fitting
from .energy import PairEnergies, pair_energies, singles_energy
from .errors import InputError, ResourceError
from .methods import get_method
from .memory import SpinShape, plan_blocks
from .options import Frozen
from .parallel import Comm
from .orbitals import is_uhf, reference_of, reference_orbitals, select_frozen, spin_orbitals, spin_square
from .result import MP2Result, qcschema_molecule
from .scf import check_converged, scf_jkbasis
from .progress import Progress
from .threads import one_blas_pool, pool_note
from .transform import BStore, EarlyIntegrals, KeptB, build_b, build_shared_b


def kernel(
    mf,
    device: Device,
    max_memory: float,
    auxbasis: str | dict | None = None,
    frozen: Frozen = None,
    progress: Progress | None = None,
    keep_pair_energies: bool = False,
    comm: Comm | None = None,
    keep_b: KeptB | None = None,
    early: EarlyIntegrals | None = None,
    pair_step: bool = True,
) -> MP2Result:
    """DF-MP2 energy of the converged SCF ``mf`` on ``device`` within ``max_memory`` MB.

    auxbasis: MP2 fitting basis as PySCF takes it, resolved by the caller (``pipeline.build_molecule``,
    :attr:`DFMP2.fitting_basis`); None: PySCF's RI partner of the orbital basis, never the JK basis.
    frozen: see :data:`mp2trn.options.Frozen`. The device is used, not closed.
    comm: the ranks the work is spread over (:mod:`mp2trn.parallel`; None: this process alone); the
    budget is then per rank and every rank returns the same energies.
    keep_b: a holder that keeps B and the fitting integrals for the gradient of the same run (one rank only:
    a run over ranks holds shares of B, which the gradient cannot use); None: B is freed here.
    early: the fitting integrals begun during the SCF (:func:`mp2trn.transform.prepare_early_integrals`, the
    same molecule and fitting basis; one rank), taken here.
    pair_step: False leaves the pair energies to the gradient's sweep of the same run, which forms the same
    amplitudes (:func:`mp2trn.grad.dfmp2.sweep_gives_energies`; needs ``keep_b``, one rank): the result's
    correlation energies are then NaN until :func:`with_pair_energies` fills them in.
    Returns an MP2Result with timings (s) of the stages: df_setup, ao_to_mo, metric, pairs, mp2.
    """
    with one_blas_pool():
        return _kernel(mf, device, max_memory, auxbasis, frozen, progress, keep_pair_energies, comm or Comm(), keep_b,
                       early, pair_step)


def _kernel(mf, device: Device, max_memory: float, auxbasis, frozen: Frozen, progress: Progress | None,
            keep_pair_energies: bool, comm: Comm, keep_b: KeptB | None,
            early: EarlyIntegrals | None = None, pair_step: bool = True) -> MP2Result:
    t_start = time.perf_counter()
    check_converged(mf)
    mol = mf.mol
    reference = reference_of(mf)
    t0 = time.perf_counter()
    orbs = reference_orbitals(mf)   # ROHF: semicanonical orbitals per spin (F^α, F^β: one J/K build)
    t_orbitals = time.perf_counter() - t0
    uhf = is_uhf(orbs)
    frozen_sel = select_frozen(orbs, frozen)
    spins = spin_orbitals(orbs, frozen_sel)
    if min(s.nocc for s in spins) == 0 or min(s.nvir for s in spins) == 0:
        raise InputError("no active occupied or virtual orbitals: nothing to correlate")
    if not pair_step and (keep_b is None or comm.size > 1):
        raise ValueError("dfmp2.kernel: without its pair step the energy needs a gradient of one rank to take B")
    if early is not None and (early.dfi.mol is not mol or comm.size > 1):
        raise ValueError("dfmp2.kernel: the early integrals are of another molecule, or the run is over ranks")
    t0 = time.perf_counter()
    # blocks made during the SCF are alive at the transform's start: the plan is made around them
    early_mb = early.take() if early is not None else 0.0
    dfi = early.dfi if early is not None else build_df(mol, auxbasis)
    t_df = time.perf_counter() - t0
    plan = plan_blocks(mol.nao_nr(), dfi.naux, [SpinShape(-(-s.nocc // comm.size), s.nvir) for s in spins],
                       dfi.max_aux_shell, max_memory - early_mb, itemsize=device.storage_dtype.itemsize)
    occ_block = plan.occ_block
    limit = device.occ_block_limit(dfi.naux, max(s.nvir for s in spins))
    if limit is not None:
        occ_block = max(1, min(occ_block, limit))
    shared_mb = None
    if comm.size > 1:
        if not plan.incore:
            raise ResourceError(f"this rank's share of the B tensors ({plan.b_tensor_mb:.0f} MB) does not fit its "
                                f"memory budget ({max_memory:.0f} MB per rank): a run over ranks keeps its share "
                                "in memory; use more ranks or raise --memory")
        store, stage_times = build_shared_b(dfi, spins, device, plan.aux_block, comm, progress)
        shared_mb = store.nbytes / 1e6
        t0 = time.perf_counter()
        pairs = pair_energies(store, spins, device, occ_block, progress, comm)
        t_pairs = time.perf_counter() - t0
        store.arrays = []
    else:
        store = BStore(dfi.naux, spins, device.storage_dtype, plan.incore)
        try:
            stage_times = build_b(dfi, spins, device, plan, store, progress, early,
                                  keep_rows=keep_b is not None and keep_b.keep_rows)
            b_on_device = device.hold(store.arrays) if store.incore else "read from the HDF5 file block by block"
            t0 = time.perf_counter()
            pairs = pair_energies(store, spins, device, occ_block, progress) if pair_step else \
                PairEnergies(math.nan, math.nan)
            t_pairs = time.perf_counter() - t0
        except BaseException:
            device.release()
            store.close()
            raise
        if keep_b is not None:    # the gradient of this run takes B from here (the device may keep holding it)
            keep_b.keep(dfi, spins, store)
        else:
            device.release()
            store.close()
    what_ran = device.what_ran()
    what_ran.update({
        "basis": describe_basis(mol.basis),
        "auxbasis": describe_basis(dfi.auxbasis),
        "jkbasis": scf_jkbasis(mf),
        "frozen": frozen_sel.text,
        "frozen_orbitals": frozen_sel.per_spin if uhf else frozen_sel.per_spin[0],
        "memory_mb": max_memory,
        "out_of_core": not plan.incore,
        "occ_block": occ_block,
        "aux_block": plan.aux_block,
        "pair_blocks": pairs.block_pairs,
        **({} if pair_step else {"pair_energies": "summed by the gradient's pair sweep from its amplitudes "
                                                  "(no pair step of their own)"}),
        **({"b_on_device": b_on_device} if comm.size == 1 else {}),
        **({"mp2_integrals_during_scf": _early_note(early.record)} if early is not None else {}),
        "blas": pool_note(),
    })
    if comm.size > 1:
        what_ran["ranks"] = comm.size
        what_ran["b_share_mb"] = shared_mb
        what_ran["b_share_fraction"] = shared_mb / (dfi.naux * sum(s.nocc * s.nvir for s in spins)
                                                    * device.storage_dtype.itemsize / 1e6)
    if early is not None:   # the thread's own time, during the SCF: part of no stage
        stage_times["integrals_during_scf"] = early.record["seconds"]
    timings = {**({"semicanonical": t_orbitals} if reference == "ROHF" else {}), "df_setup": t_df, **stage_times,
               "pairs": t_pairs, "mp2": time.perf_counter() - t_start}
    nelec = mol.nelec
    return MP2Result(
        e_hf=float(mf.e_tot),
        e_nuc=float(mol.energy_nuc()),
        e_corr_os=pairs.e_os,
        e_corr_ss=pairs.e_ss,
        e_singles=singles_energy(spins),
        spin_square=spin_square(mf) if reference != "RHF" else None,
        reference=reference,
        what_ran=what_ran,
        sizes={
            "natm": mol.natm,
            "nao": mol.nao_nr(),
            "nmo": int(np.asarray(mf.mo_energy).shape[-1]),
            "naux": dfi.naux,
            "nalpha": int(nelec[0]),
            "nbeta": int(nelec[1]),
            "nocc": [s.nocc for s in spins] if uhf else spins[0].nocc,
            "nvir": [s.nvir for s in spins] if uhf else spins[0].nvir,
        },
        timings=timings,
        cost=device.cost_report(),
        molecule=qcschema_molecule(mol),
        pair_energies=[o + s for o, s in zip(pairs.pair_os, pairs.pair_ss)] if keep_pair_energies else None,
    )


def with_pair_energies(result: MP2Result, pairs: PairEnergies, keep_pair_energies: bool = False) -> MP2Result:
    """``result`` (of a kernel run without its pair step) with the correlation energies of ``pairs``, summed
    by the gradient's sweep of the same run (and, with ``keep_pair_energies``, the per-pair matrices)."""
    return replace(result, e_corr_os=pairs.e_os, e_corr_ss=pairs.e_ss,
                   pair_energies=[o + s for o, s in zip(pairs.pair_os, pairs.pair_ss)] if keep_pair_energies
                   else None)


def _early_note(record: dict) -> str:
    """What-ran text of the 3-index blocks made during the SCF."""
    return (f"{record['blocks']} of {record['of']} 3-index blocks ({record['mb']:.3g} MB) made on the host while "
            "the SCF ran on the device")


class DFMP2:
    """Density-fitted MP2 on top of a converged PySCF RHF, UHF or ROHF object.

    mf: converged ``scf.RHF``/``scf.UHF``/``scf.ROHF`` (density-fitted or not); ROHF runs ROHF-MBPT(2)
    (semicanonical orbitals, singles energy ``e_singles``; energies only, no gradient yet).
    auxbasis: MP2 fitting basis (names, files or PySCF data), resolved once by the rules of :mod:`mp2trn.basis`
    (:attr:`fitting_basis`); None → the rules' RI partner of the orbital basis (never the JK basis).
    frozen: None/"none", "auto", an int N (lowest N per spin), or orbital indices (a list, or two for UHF).
    device: "cpu", "cuda", "sim", "neuron", "auto" or a Device (used, not closed); precision: a name of
    :data:`mp2trn.precision.PRECISIONS` or None (the device's default); device_options: constructor
    keywords of a device built by name (e.g. ``{"target": "trn2"}``).
    max_memory: MB; None → ``mf.max_memory``, as PySCF's own post-SCF classes do.
    After ``run()``: e_corr, e_corr_os, e_corr_ss, e_scs (SCS-MP2 total), e_scs_corr, e_tot, e_hf,
    timings (s), cost (modeled accelerator cost or None), result (MP2Result).
    """

    def __init__(
        self,
        mf,
        auxbasis: str | dict | None = None,
        frozen: Frozen = None,
        device: str | Device = "cpu",
        precision: str | None = None,
        max_memory: float | None = None,
        progress: Progress | None = None,
        device_options: dict[str, Any] | None = None,
        keep_pair_energies: bool = False,
        method: str = "mp2",
    ):
        self._scf = mf
        self.mol = mf.mol
        self.auxbasis = auxbasis
        self.frozen = frozen
        self.device = device
        self.precision = precision
        self.max_memory = max_memory
        self.progress = progress
        self.device_options = device_options or {}
        self.keep_pair_energies = keep_pair_energies
        self.method = get_method(method)
        if self.method.double_hybrid:
            raise InputError(f"DFMP2 takes mp2, scs-mp2 or sos-mp2; run the double hybrid {method} through mp2trn.run")
        self.result: MP2Result | None = None
        self._relaxed: dict[bool, Any] = {}

    # PySCF-style attribute access
    def _need(self) -> MP2Result:
        if self.result is None:
            raise RuntimeError("call .run() first")
        return self.result

    e_corr = property(lambda self: self._need().e_corr)
    e_corr_os = property(lambda self: self._need().e_corr_os)
    e_corr_ss = property(lambda self: self._need().e_corr_ss)
    e_singles = property(lambda self: self._need().e_singles)
    e_scs = property(lambda self: self._need().e_scs)
    e_scs_corr = property(lambda self: self._need().e_scs_corr)
    e_tot = property(lambda self: self._need().e_tot)
    e_hf = property(lambda self: self._need().e_hf)
    timings = property(lambda self: self._need().timings)
    cost = property(lambda self: self._need().cost)

    @property
    def budget_mb(self) -> float:
        """The memory budget in MB: ``max_memory`` if set, else the SCF object's ``max_memory``."""
        return float(self.max_memory if self.max_memory is not None else self._scf.max_memory)

    @property
    def fitting_basis(self) -> str | dict:
        """The MP2 fitting basis as PySCF takes it: ``auxbasis`` given as shells is used as it is; names (or
        None) are resolved by the rules of :mod:`mp2trn.basis` — this class is an entry point, as
        ``pipeline.build_molecule`` is for runs from a geometry, and the stages below receive the result."""
        given = self.auxbasis
        if isinstance(given, dict) and not all(isinstance(v, str) for v in given.values()):
            return given
        return pyscf_fitting(self.mol, default_fitting(self.mol, "rifit", given or None), "rifit")

    def _with_device(self, work):
        owned = not isinstance(self.device, Device)
        device = get_device(self.device, self.precision, **self.device_options)
        try:
            return work(device)
        finally:
            if owned:
                device.close()

    def run(self) -> DFMP2:
        """Compute the DF-MP2 energy; returns self (PySCF style). ``e_tot`` is the method's total energy."""
        auxbasis = self.fitting_basis
        result = self._with_device(lambda device: kernel(self._scf, device, self.budget_mb, auxbasis, self.frozen,
                                                         self.progress, self.keep_pair_energies))
        self.result = replace(result, method=self.method)
        return self

    kernel = run

    def gradient_result(self, derivatives: bool = True):
        """The gradient stages (:func:`mp2trn.grad.kernel`) for this object's SCF, settings and method; with
        ``derivatives=False`` only the relaxed density (no derivative integrals)."""
        from .grad import kernel as gradient_kernel

        if not derivatives and False in self._relaxed:
            return self._relaxed[False]
        out = self._with_device(lambda device: gradient_kernel(
            self._scf, device, self.budget_mb, self.fitting_basis, self.frozen, self.method.c_os, self.method.c_ss,
            self.progress, derivatives))
        self._relaxed[False] = out   # the densities of a full gradient run serve make_rdm1 too
        return out

    def nuc_grad_method(self):
        """The gradient object (PySCF's shape): ``.kernel()`` → (natm, 3) Eh/bohr."""
        from .grad import Gradients

        return Gradients(self)

    Gradients = nuc_grad_method

    def make_rdm1(self, relaxed: bool = True) -> np.ndarray:
        """The MP2 one-particle density in the AO basis (SCF part included): spin-summed (nao, nao) for RHF,
        (α, β) as (2, nao, nao) for UHF and ROHF; ``relaxed`` includes the orbital response (Z-vector)."""
        out = self.gradient_result(derivatives=False)
        return out.dm_relaxed if relaxed else out.dm_unrelaxed
