"""The DF-MP2 nuclear gradient of exactly the energy mp2trn computes, in PySCF's shape.

The energy is a density-fitted SCF (the JK-fit basis) plus DF-MP2 (the RI basis); its gradient is

    dE/dR = V_nn^R + Σ (D + P)·h^R − Σ (W_SCF + W)·S^R          (P relaxed, W energy-weighted: stage 3)
          + [½D·J[D] − ½Σ_σ D^σ·K[D^σ] + Σ_σ P^σ·G^σ[D]]^R      (JK-fit integrals and metric: .jk_terms)
          + Σ Γ^P_μν (μν|P)^R − ½ Σ γ_PQ (P|Q)^R                (the RI basis: stage 2)

Stages: B as the energy builds it (:mod:`mp2trn.transform`), the pair sweep on the device
(:mod:`.densities`), the fitting-basis pass (:mod:`.ri`), the orbital response with the SCF's J/K
(:mod:`.response`), then the derivative integrals (libcint through PySCF) for the rest.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pyscf import df, dft

from ..devices import Device
from ..df import build_df, largest_shell, quiet_pyscf
from ..energy import PairEnergies
from ..errors import InputError, ResourceError
from ..memory import (MAX_GRADIENT_BLOCK_BYTES, MB, ChannelShape, GradientPlan, GradientSizes, ao_block_cap,
                      carving, plan_gradient)
from ..options import LINDEP_GRADIENT, Frozen
from ..orbitals import SpinOrbitals, is_uhf, reference_orbitals, select_frozen
from ..parallel import Comm
from ..progress import Progress
from ..scf import check_converged
from ..threads import one_blas_pool
from ..transform import BStore, KeptB, build_b, scratch_writes
from . import cpks, densities, jk_terms, ri, rohf
from .jk_terms import two_electron_gradient
from .orbitals import channels
from .properties import spin_summed
from .cpks import ResponseJK
from .response import Products, Response, relax, unrelaxed


@dataclass
class GradientResult:
    """The gradient (natm, 3) in Eh/bohr, its terms, the densities (AO, spin-summed unless noted) and
    what the stages took (s)."""

    gradient: np.ndarray | None
    terms: dict[str, np.ndarray]
    dm_hf: np.ndarray                  #: SCF density, (nao, nao) or (2, nao, nao) for UHF
    dm_relaxed: np.ndarray             #: SCF + relaxed MP2 correction, same shape
    dm_unrelaxed: np.ndarray           #: SCF + unrelaxed MP2 correction (amplitude blocks only)
    zvector_iterations: int
    timings: dict[str, float] = field(default_factory=dict)
    what_ran: dict[str, Any] = field(default_factory=dict)
    #: the MP2 pair energies from the pair sweep's amplitudes (``pair_energies=True``), else None
    pair_energies: PairEnergies | None = None


def sweep_gives_energies(device: Device, reference: str, c_os: float, c_ss: float, one_rank: bool) -> bool:
    """Whether this run's gradient sweep can sum the MP2 pair energies itself (so that the energy needs no
    pair step): one rank, a device that sums them in its sweep (:attr:`~mp2trn.devices.Device.sweep_energies`),
    and coefficients whose strips meet every pair sum reported (:func:`mp2trn.grad.densities.gives_energies`).
    ROHF sweeps the semicanonical channels its energy's UHF pair step runs on (its singles energy is the
    energy's own either way)."""
    nspins = 1 if reference == "RHF" else 2
    return one_rank and device.sweep_energies and densities.gives_energies(nspins, c_os, c_ss)


def check_supported(mf) -> None:
    """Refuse what the gradient does not cover yet, saying what is supported."""
    if isinstance(mf, dft.rks.KohnShamDFT):
        raise InputError("analytic gradients cover MP2, SCS-MP2 and SOS-MP2 on a density-fitted RHF/UHF reference; "
                         "double-hybrid gradients are not supported yet")
    if getattr(mf, "with_df", None) is None:
        raise InputError("analytic gradients need the density-fitted SCF mp2trn runs by default (the gradient "
                         "differentiates exactly that energy); drop --no-scf-df")
    check_converged(mf)


def check_full_orbital_space(mf) -> None:
    """Refuse to differentiate an SCF whose orbitals span fewer combinations than the basis has functions
    (canonical orthogonalisation, ``--lindep``): the projection's derivative is not in the gradient."""
    nao, nmo = mf.mol.nao_nr(), np.shape(mf.mo_coeff)[-1]
    if nmo < nao:
        raise InputError(f"the SCF's orbitals span {nmo} of the {nao} basis functions: {LINDEP_GRADIENT}")


def kernel(mf, device: Device, max_memory: float, auxbasis: str | dict | None = None, frozen: Frozen = None,
           c_os: float = 1.0, c_ss: float = 1.0, progress: Progress | None = None,
           derivatives: bool = True, comm: Comm | None = None, kept_b: KeptB | None = None,
           reuse_scf_tensor: bool = True, pair_energies: bool = False) -> GradientResult:
    """Analytic gradient of E_SCF + c_os·E_os + c_ss·E_ss (DF-MP2 with ``auxbasis``) for the converged
    density-fitted SCF ``mf``; the pair sweep runs on ``device`` within ``max_memory`` MB.

    ``derivatives=False`` stops after the relaxed density (no derivative integrals; ``gradient`` is None).
    ``comm``: ranks that share the work — each holds the whole B, runs its share of the pair strips, of the
    fitting-basis pass (its Γ̄ columns) and of the JK-fit derivative blocks; the sums are all-reduced and
    the orbital response is solved on every rank alike, so every rank returns the same gradient.
    ``kept_b``: the energy's B and fitting integrals (:class:`mp2trn.transform.KeptB`), used instead of
    building them again when they were made for these orbitals; ``reuse_scf_tensor``: the response's MO
    blocks are made from the SCF's own JK-fit tensor where the SCF holds it whole in memory (False: built
    anew, as a check). What-ran's ``gradient_reused`` says what was taken and what was built.
    ``pair_energies``: the sweep also sums the MP2 pair energies (:func:`mp2trn.grad.densities.sweep`'s
    ``energies``; where :func:`sweep_gives_energies` says it can), returned in ``pair_energies``."""
    check_supported(mf)
    if derivatives:
        check_full_orbital_space(mf)
    if not device.has_pair_densities:
        raise InputError(f"device {device.name!r} has no gradient pair step in precision {device.precision!r}; run "
                         "gradients on --device cpu (fp64, fp32) or sim/neuron with --precision fp32")
    with one_blas_pool():
        return _kernel(mf, device, max_memory, auxbasis, frozen, c_os, c_ss, progress, derivatives, comm or Comm(),
                       kept_b, reuse_scf_tensor, pair_energies)


@dataclass
class _GradientRun:
    """What every stage of one gradient reads (the SCF, device, ranks, channels and memory plan), and what the
    stages record as they go: seconds per stage and what each took from earlier stages or built."""

    mf: Any
    device: Device
    comm: Comm
    chans: list[SpinOrbitals]
    plan: GradientPlan
    derivatives: bool
    progress: Progress | None
    timings: dict[str, float] = field(default_factory=dict)
    reused: dict[str, str] = field(default_factory=dict)


@dataclass
class _RiOutputs:
    """Out of the pair sweep and the fitting-basis pass: the densities, the Lagrangian and the RI basis's
    derivative terms (None without derivatives)."""

    dens: Any
    lagrangian: list[np.ndarray]
    de_3c: np.ndarray | None
    de_metric: np.ndarray | None


def _kernel(mf, device, max_memory, auxbasis, frozen, c_os, c_ss, progress, derivatives, comm, kept_b,
            reuse_scf_tensor, pair_energies=False) -> GradientResult:
    t_start = time.perf_counter()
    mol = mf.mol
    orbs = reference_orbitals(mf)     # ROHF: semicanonical orbitals per spin (stage 3 is then .rohf's)
    chans = channels(orbs, select_frozen(orbs, frozen))
    reuse_b = kept_b is not None and comm.size == 1 and kept_b.matches(auxbasis, chans, device.storage_dtype)
    dfi = kept_b.dfi if reuse_b else build_df(mol, auxbasis)
    rows_unused = kept_b is not None and kept_b.dfi is not None and kept_b.dfi.rows is not None and not reuse_b
    if rows_unused:
        kept_b.dfi.rows = None          # the energy's integrals, kept for a B this gradient does not take
    device_mb = device.memory_mb()
    if device_mb is not None:     # B held since the energy is the sweep's B (or is freed when not taken)
        device_mb += device.held_mb()
    # the reduced copy of the response's blocks only where the solve takes it (not the ROHF one's)
    reduced_itemsize = device.reduced_response_itemsize if orbs is mf else 0
    plan = plan_gradient(gradient_sizes(mol, dfi.auxmol, mf.with_df.auxmol, [channel_shape(ch) for ch in chans],
                                        device.storage_dtype.itemsize, reduced_itemsize), max_memory, device_mb)
    run = _GradientRun(mf, device, comm, chans, plan, derivatives, progress)
    # the large block-sized arrays of each stage carved in turn from one mapping (memory.carving): a stage
    # takes the pages the one before it faulted in; no more stays mapped than the largest stage plans
    with carving(max(plan.stage_mb.values()) * MB) as arena:
        ri_out = _pairs_and_fitting_basis(run, dfi, kept_b, reuse_b, rows_unused, c_os, c_ss, pair_energies)
        del dfi
        resp, zvector, fast, held = _response(run, orbs, arena, ri_out, reuse_scf_tensor)
        terms, gradient = _derivative_stage(run, arena, resp, held, ri_out) if derivatives else ({}, None)
        del held
    timings = run.timings
    timings["gradient"] = time.perf_counter() - t_start
    dens = ri_out.dens
    dm_hf = np.asarray(mf.make_rdm1())
    shared = f", shared over {comm.size} ranks" if comm.size > 1 else ""
    jk = (f"occupied-factor products of the JK-fit tensor (GEMMs on {zvector['device']}, {zvector['precision']}"
          f"{_refined_text(zvector)})" if fast else f"J/K builds on {_jk_where(mf)}")
    what_ran = {"gradient": "analytic DF-MP2 (relaxed)" + shared,
                "gradient_pairs": f"{device.name} ({device.pair_densities_precision})",
                "gradient_jk": jk, "zvector_iterations": resp.iterations,
                "zvector": zvector, "gradient_gamma_ao": f"{device.name} ({device.response_precision})",
                "zvector_residual": resp.residual, "derivative_integrals": "libcint through PySCF (host, fp64)",
                "gradient_strips": dens.strips,
                "gradient_out_of_core": not plan.stores_incore, "gradient_memory": plan.residency(fast),
                "gradient_reused": run.reused}
    p_unrelaxed = unrelaxed(chans, dens.p_occ, dens.p_vir) if orbs is mf else resp.p_unrelaxed
    return GradientResult(gradient, terms, dm_hf, _ao(chans, resp.p_relaxed, dm_hf), _ao(chans, p_unrelaxed, dm_hf),
                          resp.iterations, timings, what_ran, dens.energies)


def _pairs_and_fitting_basis(run: _GradientRun, dfi, kept_b: KeptB | None, reuse_b: bool, rows_unused: bool,
                             c_os: float, c_ss: float, pair_energies: bool) -> _RiOutputs:
    """Stages 1-2: B (the energy's in ``kept_b`` where ``reuse_b``, else built), the pair sweep's densities and
    Γ̄, the metric density, and the fitting-basis pass's Lagrangian and derivative terms. B and Γ̄ are in memory when both fit
    the plan, else in HDF5 files beside each other (each strip then reads one spin's B, or pairs of its
    occupied blocks, and writes its block's Γ̄ rows); the energy's B is moved to where this plan wants it."""
    device, comm, chans, plan, timings, reused = run.device, run.comm, run.chans, run.plan, run.timings, run.reused
    t0 = time.perf_counter()
    if reuse_b:
        was_incore = kept_b.store.incore
        dfi, b_store = kept_b.take(plan.stores_incore)
        reused["B"] = "the energy's" + ("" if was_incore == plan.stores_incore else
                                        ", moved " + ("into memory" if plan.stores_incore else "to an HDF5 file"))
    else:
        b_store = BStore(dfi.naux, chans, device.storage_dtype, plan.stores_incore)
        reused["B"] = "built" + (" (the energy's was not kept for these orbitals)" if kept_b is not None else "")
    with b_store, BStore(dfi.naux, chans, np.float64, plan.stores_incore, made_ahead=True) as gamma:
        if not reuse_b:
            build_b(dfi, chans, device, plan.b_blocks, b_store, run.progress)
        # other ranks' Γ̄ columns stay zero here: Γ̄ starts as zeros (made ahead in memory; HDF5 datasets)
        timings["gradient_b"] = time.perf_counter() - t0
        # B on the device for the sweep when the energy left it there (the plan above counted it); nothing new
        # is held here, beyond what the plan counted
        reused["B_on_device"] = device.hold(b_store.arrays, add=False) if b_store.incore else \
            "read from the HDF5 file strip by strip"
        t0 = time.perf_counter()
        try:
            with scratch_writes("the gradient's Γ̄", plan.b_blocks.b_tensor_mb * 1e6):
                dens = densities.sweep(b_store, chans, device, plan.strip_block, c_os, c_ss, gamma, run.progress, comm,
                                       plan.pair_block, energies=pair_energies)
        finally:
            device.release()
        timings["gradient_pairs"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        weights = [ch.weight for ch in chans]
        gam = comm.allreduce(ri.metric_density(gamma, b_store, weights, dfi.l_chol, plan.metric_cols), "gradient")
        b_store.close()       # B is done with: the fitting-basis pass has the budget without it
        ri.to_fitting_coefficients(gamma, dfi.l_chol, plan.metric_cols)
        unused = "; the energy's, kept for a B this gradient does not take, were freed unused" if rows_unused else ""
        reused["ri_integrals"] = ("the energy's 3-index integrals (P|μν), kept" if dfi.rows is not None
                                  else "computed (3-index integrals)" + unused)
        lagrangian, de_3c = ri.ri_pass(dfi, chans, gamma, plan.ri_aux_block, run.derivatives, device)
        lagrangian = [comm.allreduce(x, "gradient") for x in lagrangian]   # linear in Γ: each rank's columns
        de_3c = None if de_3c is None else comm.allreduce(de_3c, "gradient")
        de_metric = ri.metric_gradient(dfi.auxmol, run.mf.mol.natm, gam) if run.derivatives else None
        timings["gradient_ri"] = time.perf_counter() - t0
    return _RiOutputs(dens, lagrangian, de_3c, de_metric)


def _response(run: _GradientRun, orbs, arena, ri_out: _RiOutputs, reuse_scf_tensor: bool):
    """Stage 3: the orbital response (Z-vector, relaxed density, W). Returns (the response, what-ran's Z-vector
    record, whether its products were the JK-fit tensor's MO blocks, and the SCF's tensor when it is held for
    the JK-fit pass's first half, else None)."""
    mf, device, chans, plan = run.mf, run.device, run.chans, run.plan
    dens, lagrangian = ri_out.dens, ri_out.lagrangian
    t0 = time.perf_counter()
    if arena is not None:   # the fitting-basis pass's pages past what the response carves go back now
        arena.trim(cpks.arena_bytes(mf.with_df.auxmol.nao_nr(), chans, device.reduced_response_itemsize
                                    if plan.response_reduced else 0) if plan.response_factors else 0)
    products, run.reused["jkfit_tensor"], from_scf = _response_products(mf, chans, plan, reuse_scf_tensor, device)
    fast = isinstance(products, ResponseJK)
    # the Z-vector's inner solves on the blocks' reduced copy where the plan has room for it (refined by these
    # fp64 products; the ROHF solve takes its products as they are)
    resp = relax(products, chans, dens.p_occ, dens.p_vir, lagrangian, reduced=plan.response_reduced) if orbs is mf \
        else rohf.relax(products, orbs, chans, chans, dens.p_occ, dens.p_vir, lagrangian)
    zvector = {**(resp.zvector or products.describe()), "iterations": resp.iterations, "residual": resp.residual,
               **({"fallback": resp.fallback} if resp.fallback else {}),
               **({} if orbs is mf else {"preconditioner": rohf.PRECONDITIONER})}
    del products
    # the J/K builds' tensor is not needed past the response, but for the JK-fit pass's first half where it
    # is L⁻¹(Q|μν) whole and the response's MO blocks came from it: then the plan held it beside everything
    # (pipeline.scf_tensor_held_mb). Its device blocks go now, its rows after that pass's first half
    held = cholesky_scf_tensor(mf) if run.derivatives and from_scf else None
    release_scf_tensor(mf, keep_rows=held is not None)
    run.reused["jkfit_integrals"] = ("the SCF's tensor L⁻¹(Q|μν) (ρ and (Q|iμ) read from it)" if held is not None
                                     else "computed (3-index integrals)") if run.derivatives else "not needed"
    run.timings["gradient_response"] = time.perf_counter() - t0
    return resp, zvector, fast, held


def _derivative_stage(run: _GradientRun, arena, resp: Response, held, ri_out: _RiOutputs) -> tuple[dict, np.ndarray]:
    """Stage 4: the JK-fit and one-electron derivative terms, and the gradient summed over every term."""
    mf, plan = run.mf, run.plan
    t0 = time.perf_counter()
    if arena is not None:     # the response's pages past what the JK-fit pass carves go back now
        arena.trim(jk_terms.arena_bytes(mf.mol.nao_nr(), mf.with_df.auxmol.nao_nr(), plan.jk_aux_block,
                                        plan.jk_columns, [len(ch.occ) for ch in run.chans], plan.jk_half_incore))
    terms = _derivative_terms(mf, run.chans, resp.p_relaxed, resp.w, plan.jk_aux_block, run.comm, plan.jk_columns,
                              plan.jk_half_incore, held)
    run.timings["gradient_integrals"] = time.perf_counter() - t0
    terms["mp2_ri_3c"] = ri_out.de_3c
    terms["mp2_ri_metric"] = ri_out.de_metric
    return terms, sum(terms.values())


def _refined_text(zvector: dict) -> str:
    """', refined by N cpu fp64 products' for a Z-vector whose reduced products were refined, else ''."""
    by = zvector.get("refined_by")
    return "" if not by else f", refined by {by['products']} {by['device']} {by['precision']} products"


def channel_shape(ch: SpinOrbitals) -> ChannelShape:
    """The orbital counts of a channel, for the memory plan."""
    return ChannelShape(len(ch.occ), ch.nact, ch.nvir)


def gradient_sizes(mol, rifit_auxmol, jkfit_auxmol, shapes: list[ChannelShape], itemsize: int,
                   reduced_response_itemsize: int = 0) -> GradientSizes:
    """The sizes the gradient's memory plan reads: basis, both fitting bases, the channels, B's itemsize and
    that of the device's reduced copy of the response's blocks (0: none)."""
    return GradientSizes(mol.nao_nr(), rifit_auxmol.nao_nr(), largest_shell(rifit_auxmol), jkfit_auxmol.nao_nr(),
                         largest_shell(jkfit_auxmol), tuple(shapes), itemsize, reduced_response_itemsize)


def check_budget_before_scf(mol, rifit_auxmol, jk_auxbasis: str | dict, itemsize: int, budget: float,
                            device_mb: float | None = None, reduced_itemsize: int = 0) -> GradientPlan:
    """The gradient's plan before the SCF, from the all-electron orbital counts per spin (an upper bound:
    frozen core only shrinks them); ResourceError when none fits ``budget`` MB (``jk_auxbasis``: the SCF's
    JK-fit basis as PySCF takes it; ``reduced_itemsize``: the device's reduced copy of the response's blocks,
    as :func:`gradient_sizes` takes it)."""
    with quiet_pyscf():
        jkfit_auxmol = df.addons.make_auxmol(mol, jk_auxbasis)
    nao = mol.nao_nr()
    shapes = [ChannelShape(n, n, max(1, nao - n)) for n in sorted(set(mol.nelec))]
    return plan_gradient(gradient_sizes(mol, rifit_auxmol, jkfit_auxmol, shapes, itemsize, reduced_itemsize), budget,
                         device_mb)


def scf_tensor(mf) -> np.ndarray | None:
    """The SCF's JK-fit tensor B = L⁻¹(Q|μν) (fp64) where the SCF holds all its rows in memory: packed
    (naux, nao(nao+1)/2) or unpacked (naux, nao, nao) as its J/K builds read it — mp2trn's resident tensor,
    or PySCF's own ``_cderi`` — else None (streamed, shared over ranks, or not built)."""
    from ..jk import DeviceJK

    with_df = mf.with_df
    if not isinstance(with_df, df.DF) or with_df.auxmol is None:
        return None
    naux = with_df.auxmol.nao_nr()
    held = [with_df.tensor.full] if isinstance(with_df, DeviceJK) else []
    for tensor in held + [with_df._cderi]:   # PySCF's own, in memory (not its HDF5 file's name)
        if isinstance(tensor, np.ndarray) and tensor.shape[0] == naux:
            return tensor
    return None


def cholesky_scf_tensor(mf):
    """The SCF J/K stage's tensor (:class:`mp2trn.jk.JKTensor`) when it holds L⁻¹(Q|μν) with L the metric's
    Cholesky factor, every row in memory (mp2trn's own build, one rank), else None."""
    from ..jk import DeviceJK
    if isinstance(mf.with_df, DeviceJK) and mf.with_df.tensor.by_cholesky and mf.with_df.tensor.full is not None:
        return mf.with_df.tensor
    return None


def _response_products(mf, chans: list[SpinOrbitals], plan, reuse: bool, device: Device) -> tuple[Any, str, bool]:
    """The response's Coulomb/exchange products, where their JK-fit tensor came from (what-ran) and whether
    it was the tensor the SCF held for them: the MO blocks of the SCF's own tensor when the plan has room for
    them (``reuse``: that tensor as the SCF holds it; else one built here), or the SCF's J/K builds."""
    if not plan.response_factors:
        return Products(mf, chans), "not needed (the response ran J/K builds of the SCF's tensor)", False
    tensor = scf_tensor(mf) if reuse else None
    if tensor is not None:
        return ResponseJK(mf, chans, tensor, device), "the SCF's (its MO blocks made from it)", True
    built = ResponseJK.build(mf, chans, plan.factor_chunk_mb, device)
    if built is None:
        return Products(mf, chans), "not made (metric not positive definite): the SCF's J/K builds", False
    return built, "built again" + ("" if not reuse else " (the SCF does not hold it whole in memory)"), False


def release_scf_tensor(mf, keep_rows: bool = False) -> None:
    """Free the SCF J/K stage's tensor (kept after the SCF for the response, or made again for its J/K
    builds; a later build makes it anew) but for its host rows where ``keep_rows``, and its builds' work
    buffers, leaving its device open."""
    from ..jk import DeviceJK
    if isinstance(mf.with_df, DeviceJK):
        mf.with_df.release_builds(keep_rows)


class Gradients:
    """Nuclear gradients of a :class:`mp2trn.DFMP2` (PySCF's shape: ``DFMP2(mf).run().nuc_grad_method()``).

    ``kernel()`` returns the gradient (natm, 3) in Eh/bohr of the DFMP2 object's method (``mp2``,
    ``scs-mp2``, ``sos-mp2``) and keeps it as ``de``; ``result`` holds the terms, densities and timings.
    """

    def __init__(self, mp):
        self.base = mp
        self.mol = mp.mol
        self.de: np.ndarray | None = None
        self.result: GradientResult | None = None

    def kernel(self) -> np.ndarray:
        self.result = self.base.gradient_result(derivatives=True)
        self.de = self.result.gradient
        return self.de

    grad = kernel


def _ao(chans: list[SpinOrbitals], mats: list[np.ndarray], dm_hf: np.ndarray) -> np.ndarray:
    """SCF density plus the MO-basis corrections, in the SCF density's shape (spin-summed for RHF)."""
    corr = [ch.weight * ch.c @ m @ ch.c.T for ch, m in zip(chans, mats)]
    return dm_hf + (corr[0] if len(corr) == 1 else np.array(corr))


def _aux_block(nao: int, max_shell: int, max_memory: float) -> int:
    """JK-fit functions per block of the SCF gradient's derivative pass (:func:`scf_gradient`): integrals,
    derivative sets and the AO densities within 0.4 of ``max_memory`` MB, and at most the gradient's block
    cap (:data:`mp2trn.memory.MAX_GRADIENT_BLOCK_BYTES` of nao² squares)."""
    per_aux = 9 * nao * nao * 8
    block = int(0.4 * max_memory * 1e6 // per_aux)
    if block < max_shell:
        need = math.ceil(max_shell * per_aux / 0.4 / 1e6)
        raise ResourceError(f"the gradient's fitting-basis pass needs {need} MB for its smallest block; raise --memory")
    return min(block, ao_block_cap(nao, max_shell, MAX_GRADIENT_BLOCK_BYTES))


def _jk_where(mf) -> str:
    from ..jk import DeviceJK
    return f"device {mf.with_df.device.name}" if isinstance(mf.with_df, DeviceJK) else "pyscf (host, fp64)"


def _derivative_terms(mf, chans: list[SpinOrbitals], p_mo: list[np.ndarray], w_mo: list[np.ndarray],
                      aux_block: int, comm: Comm | None = None, columns: int | None = None,
                      half_incore: bool = True, held=None) -> dict[str, np.ndarray]:
    """Every term through the SCF's integrals, for the SCF density plus the MP2 correction ``p_mo`` and
    the SCF's plus the MP2 energy-weighted density ``w_mo`` (MO bases, per channel; zero matrices give
    the SCF gradient alone): nuclear repulsion, Σ (D + P)·h^R − Σ (W_SCF + W)·S^R and the JK-fit
    two-electron terms (:mod:`.jk_terms`). ``held``: the SCF's tensor (:func:`cholesky_scf_tensor`), which
    the JK-fit pass reads instead of the 3-index integrals and then releases."""
    mol = mf.mol
    with quiet_pyscf():
        mf_grad = mf.nuc_grad_method()
    hcore_deriv = mf_grad.hcore_generator(mol)
    s1 = mf_grad.get_ovlp(mol)
    p_spin = [ch.c @ p @ ch.c.T for ch, p in zip(chans, p_mo)]     # per channel, one spin each
    dm = spin_summed(mf.make_rdm1()) + sum(ch.weight * p for ch, p in zip(chans, p_spin))
    w_ao = spin_summed(mf_grad.make_rdm1e(mf.mo_energy, mf.mo_coeff, mf.mo_occ)) + sum(ch.weight * ch.c @ w @ ch.c.T
                                                                    for ch, w in zip(chans, w_mo))
    de_1e = np.zeros((mol.natm, 3))
    for atom, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        de_1e[atom] = np.einsum("xij,ij->x", hcore_deriv(atom), dm) \
            - 2.0 * np.einsum("xij,ij->x", s1[:, p0:p1], w_ao[p0:p1])
    return {"nuclear": np.asarray(mf_grad.grad_nuc()), "one_electron": de_1e,
            "two_electron_jk": two_electron_gradient(mf, chans, p_spin, aux_block, comm, columns, half_incore, held)}


def scf_gradient(mf, max_memory: float) -> np.ndarray:
    """The density-fitted SCF's own gradient (natm, 3) through the same terms (a check on them: it equals
    PySCF's DF gradient with the fitting basis' response)."""
    chans = channels(mf, select_frozen(mf, None))
    zeros = [np.zeros((ch.nmo, ch.nmo)) for ch in chans]
    aux_block = _aux_block(mf.mol.nao_nr(), largest_shell(mf.with_df.auxmol), max_memory)
    return sum(_derivative_terms(mf, chans, zeros, zeros, aux_block).values())
