"""Gradient stage 2: everything the MP2 fitting basis contributes, in one pass over its AO blocks.

Γ̄ (orthonormal fitting basis, from :mod:`mp2trn.grad.densities`) becomes Γ^P_ia = [L⁻ᵀ Γ̄]_P, which
contracts with the raw integrals (P|μν); the metric density is γ = L⁻ᵀ (Σ Γ̄ Bᵀ) L⁻¹. Per block of
fitting functions P this pass makes

- the orbital Lagrangian of the 2PDM, X_ti = Σ_aP (ta|P) Γ^P_ia and X_ta = Σ_iP (ti|P) Γ^P_ia (t over all
  MOs), through the half-transformed Γ^P_iν = Σ_a Γ^P_ia C_νa and integrals (P|iμ) = Σ_ν C_νi (P|νμ);
- the AO 2PDM Γ^P_μν = Σ_i C_μi Γ^P_iν (a GEMM on the gradient's device, stage ``grad_gamma``: C_o kept there,
  the (i, (P, ν)) rows of Γ^P_iν sent per block) and its contraction with the derivative integrals (μν|P)^R;

and after the pass −½ Σ_PQ γ_PQ (P|Q)^R. PySCF's derivative integrals differentiate the electron
coordinate, so d/dR_A is minus the sum over the functions centred on A.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.linalg
from scipy.linalg import blas as scipy_blas
from pyscf import gto

from ..devices import Device
from ..devices.cpu import CpuDevice
from ..df import DFIntegrals, _shell_ranges, reused_buffer, tensor_rows_unpacked, unpacked_integrals
from ..scratch import check_stopped
from ..threads import one_blas_pool
from ..transform import BStore
from ..orbitals import SpinOrbitals


@dataclass
class RiTerms:
    """X per channel ((nmo, nmo): columns of active occupied and virtual orbitals filled) and the
    fitting-basis gradient terms (natm, 3) in Eh/bohr."""

    lagrangian: list[np.ndarray]
    de_3c: np.ndarray
    de_metric: np.ndarray


def to_fitting_coefficients(gamma: BStore, l_chol: np.ndarray, column_block: int) -> None:
    """Γ̄ → Γ = L⁻ᵀ Γ̄ in place, ``column_block`` columns at a time (:func:`fitted_rows`: in memory, a block of
    whole rows is solved where it lies)."""
    low = np.asfortranarray(l_chol)
    for arr in gamma.arrays:
        ncol = arr.shape[1]
        for c0 in range(0, ncol, column_block):
            c1 = min(ncol, c0 + column_block)
            block = np.ascontiguousarray(arr[:, c0:c1])     # all of an in-memory Γ̄: the array itself
            solved = fitted_rows(low, block, both=False)
            if not (isinstance(arr, np.ndarray) and np.shares_memory(solved, arr)):
                arr[:, c0:c1] = solved


def fitted_rows(low: np.ndarray, x: np.ndarray, both: bool) -> np.ndarray:
    """L⁻ᵀx, or with ``both`` V⁻¹x = L⁻ᵀL⁻¹x, for x (naux, ncols) C-contiguous, written over x and returned
    C-contiguous; ``low``: L, Fortran-ordered. Solved as xᵀ from the right (BLAS trsm with ``side``), since
    xᵀ is Fortran-ordered as it lies: no copy in and none out, so that the GEMMs after it read rows as they
    lie (SciPy's left-side solve returned a Fortran-ordered result whose (naux·nocc, nao) reshape was a copy
    made at every use); SciPy's BLAS pool on the cores (:func:`mp2trn.threads.one_blas_pool`)."""
    xt = x.T
    with one_blas_pool("scipy"):
        if both:                                           # xᵀL⁻ᵀ: X Lᵀ = xᵀ
            xt = scipy_blas.dtrsm(1.0, low, xt, side=1, lower=1, trans_a=1, overwrite_b=1)
        xt = scipy_blas.dtrsm(1.0, low, xt, side=1, lower=1, trans_a=0, overwrite_b=1)   # · L⁻¹: X L = ·
    return xt.T


def metric_density(gamma: BStore, b: BStore, weights: list[float], l_chol: np.ndarray, column_block: int) -> np.ndarray:
    """γ = L⁻ᵀ (Σ_σ w_σ Γ̄^σ B^σᵀ) L⁻¹ (naux, naux), symmetric; Γ̄ must still be in the orthonormal basis."""
    naux = l_chol.shape[0]
    m = np.zeros((naux, naux))
    for g, bb, w in zip(gamma.arrays, b.arrays, weights):
        for c0 in range(0, g.shape[1], column_block):
            c1 = min(g.shape[1], c0 + column_block)
            m += w * (np.asarray(g[:, c0:c1], dtype=np.float64) @ np.asarray(bb[:, c0:c1], dtype=np.float64).T)
    a = scipy.linalg.solve_triangular(l_chol, m, lower=True, trans="T")
    gam = scipy.linalg.solve_triangular(l_chol, a.T, lower=True, trans="T").T
    return (gam + gam.T) / 2


def metric_gradient(auxmol: gto.Mole, natm: int, gam: np.ndarray) -> np.ndarray:
    """−½ Σ_PQ γ_PQ (P|Q)^R per atom (natm, 3)."""
    ip = auxmol.intor("int2c2e_ip1")                     # (3, naux, naux), ∇ on P
    per_function = np.einsum("xpq,pq->px", ip, gam)
    return _per_atom(auxmol, natm, per_function)


def _per_atom(mol: gto.Mole, natm: int, per_function: np.ndarray) -> np.ndarray:
    """Sum rows of a (nfunctions, 3) array over the atoms the functions sit on."""
    out = np.zeros((natm, 3))
    for atom, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        out[atom] = per_function[p0:p1].sum(axis=0)
    return out


#: bytes of the products ip1·g a thread of :func:`contract_3c_derivatives` makes and sums at a time (in cache)
_CONTRACT_CACHE_BYTES = 2e6


def contract_3c_derivatives(pmol: gto.Mole, shls: tuple, sym: np.ndarray, per_ao: np.ndarray,
                            per_aux: np.ndarray, out: np.ndarray | None = None) -> None:
    """Add Σ_Pμν g[P, μ, ν] (μν|P)^R, split by the function carrying the derivative: orbital functions into
    ``per_ao`` (nao, 3), the block's fitting functions into ``per_aux`` (p, 3).

    sym: (p, nao, nao) = g + gᵀ (each P's square symmetrised) for the fitting functions of ``shls``.
    PySCF's ``int3c2e_ip1`` comes as (3, μ, ν, P) with μ fastest in memory, i.e. C-contiguous (3, P, ν, μ)
    once transposed, ∇ on μ; d/dR_A is −∇ for functions on A. The derivative on the fitting function is not
    computed: translational invariance of each integral, ∇_μ + ∇_ν + ∇_P = 0, makes it
    −(ip1[μ,ν,P] + ip1[ν,μ,P]), so one product of ip1 with the symmetrised g gives both sums (and half the
    derivative integrals). The products ip1·g (memory-bound) are made on two threads, each over half of the
    block's fitting functions, a few functions at a time into a buffer that stays in cache, and summed there
    over ν; both sums come from those (P, μ) partial sums, so ip1 and g are read from memory once (two dot
    products over them read each twice). ``out``: a buffer of at least 3·p·nao² fp64 for the derivative
    integrals (:func:`mp2trn.df.reused_buffer`), else a new array."""
    p, nao = sym.shape[0], sym.shape[1]
    ip = pmol.intor("int3c2e_ip1", comp=3, aosym="s1", shls_slice=shls,
                    out=None if out is None else out[: 3 * p * nao * nao]).transpose(0, 3, 2, 1)
    edges = [0, p // 2, p] if p > 1 else [0, p]
    parts = np.zeros((len(edges) - 1, nao, 3))
    step = max(1, int(_CONTRACT_CACHE_BYTES // (8 * nao * nao)))

    def part(k: int) -> None:
        prod, by_p = np.empty((step, nao, nao)), np.empty((step, nao))
        for q0 in range(edges[k], edges[k + 1], step):
            q1 = min(edges[k + 1], q0 + step)
            for x in range(3):
                pr = np.multiply(ip[x, q0:q1], sym[q0:q1], out=prod[: q1 - q0])
                s = pr.sum(axis=1, out=by_p[: q1 - q0])                   # Σ_ν: (P, μ)
                parts[k, :, x] -= s.sum(axis=0)
                per_aux[q0:q1, x] += s.sum(axis=1)

    with ThreadPoolExecutor(len(edges) - 1) as pool:                   # NumPy lets go of the GIL in its loops
        for _ in pool.map(part, range(len(edges) - 1)):
            pass
    per_ao += parts.sum(axis=0)


def ri_pass(dfi: DFIntegrals, channels: list[SpinOrbitals], gamma: BStore, aux_block: int,
            derivatives: bool = True, device: Device | None = None) -> tuple[list[np.ndarray], np.ndarray | None]:
    """One pass over the fitting basis: the Lagrangian X per channel and Σ Γ^P_μν (μν|P)^R (natm, 3)
    (None without ``derivatives``: a relaxed density needs only X).

    ``gamma`` holds Γ in the fitting coefficients (after :func:`to_fitting_coefficients`); ``device`` runs
    Γ's back-transformation to the AO basis (None: the host, fp64). The 3-index integrals are ``dfi.rows``
    where the energy kept them (:attr:`mp2trn.df.DFIntegrals.rows`, taken and freed by this pass), else
    computed here."""
    device = device or CpuDevice()
    occupied = [device.response_operand(ch.c[:, ch.act].T) for ch in channels] if derivatives else []
    mol, auxmol = dfi.mol, dfi.auxmol
    nao, nbas = mol.nao_nr(), mol.nbas
    pmol = mol + auxmol
    loc = auxmol.ao_loc_nr()
    xs = [np.zeros((ch.nmo, ch.nmo)) for ch in channels]
    per_ao = np.zeros((nao, 3))          # Σ over ν, P of ip1 · (Γ + Γᵀ), by the function μ
    per_aux = np.zeros((dfi.naux, 3))     # Σ over μ, ν of ip2 · Γ, by the fitting function P
    blocks = list(_shell_ranges(loc, aux_block))
    kept_rows, dfi.rows = dfi.rows, None      # the energy's integrals, freed with this pass
    # the integrals, the symmetrised AO 2PDM and the derivative integrals of every block in buffers made once
    # for the largest (the plan's 8·nao² per fitting function holds them): a new array per block is fresh
    # memory whose first touch cost more than the work on it (Inosine/cc-pVDZ: this pass 6.9-7.0 s → 6.0-6.1 s,
    # `python scripts/bench_gradient.py --displaced 0`, docs/benchmarks.md "seventh session")
    ao_buf = reused_buffer(blocks, loc, nao * nao)
    sym_buf = reused_buffer(blocks, loc, nao * nao) if derivatives else None
    ip_buf = reused_buffer(blocks, loc, 3 * nao * nao) if derivatives else None
    back_buf = reused_buffer(blocks, loc, nao * nao) if derivatives else None     # Γ^P_μν as the device returns it
    for s0, s1 in blocks:
        p0, p1 = int(loc[s0]), int(loc[s1])
        shls = (0, nbas, 0, nbas, nbas + s0, nbas + s1)
        ao = unpacked_integrals(pmol, nbas, s0, s1, out=ao_buf) if kept_rows is None else \
            tensor_rows_unpacked(kept_rows[p0:p1], out=ao_buf)            # (p, nao, nao) (symmetric in μν)
        p = p1 - p0
        # ((P, ν), μ) = (P|νμ) = (P|μν): its transpose is the (μ, (P, ν)) operand, a view (no copy)
        ao_flat = ao.reshape(p * nao, nao)
        sym = None                                                   # Σ_ch w (Γ^P_μν + Γ^P_νμ)
        for ch, x, g_store, c_o_kept in zip(channels, xs, gamma.arrays, occupied or [None] * len(channels)):
            g = np.asarray(g_store[p0:p1], dtype=np.float64).reshape(p, ch.nact, ch.nvir)
            c_o, c_v = ch.c[:, ch.act], ch.c[:, ch.vir]
            half_o = np.matmul(c_v, np.swapaxes(g, 1, 2))                  # (P, ν, i) = Σ_a C_νa Γ^P_ia
            # X_ti: Σ_Pν (P|μν) half_o[P, ν, i], one GEMM over the (P, ν) rows
            x[:, ch.act] += ch.c.T @ (ao_flat.T @ half_o.reshape(p * nao, -1))
            # X_ta: Σ_Pi (P|μi) Γ^P_ia with (P|μi) = Σ_ν (P|μν) C_νi, one GEMM over the (P, i) rows: 2·p·nao·o·(nao + v)
            # flops, where Γ half-transformed over i first (Σ_Pν (P|μν) Σ_i C_νi Γ^P_ia) costs 2·p·nao·v·(nao + o)
            occ_ao = np.ascontiguousarray((ao_flat @ c_o).reshape(p, nao, -1).transpose(0, 2, 1))   # (P, i, μ)
            x[:, ch.vir] += ch.c.T @ (occ_ao.reshape(-1, nao).T @ g.reshape(-1, ch.nvir))
            del occ_ao
            if derivatives:                                               # (μ, (P, ν)) = Σ_i C_μi Γ^P_iν
                rows = np.ascontiguousarray(half_o.transpose(2, 0, 1)).reshape(ch.nact, p * nao)
                back = device.response_gemm(c_o_kept, rows, "grad_gamma",
                                            out=back_buf[: p * nao * nao].reshape(nao, -1)).reshape(nao, p, nao)
                if ch.weight != 1.0:
                    back *= ch.weight
                if sym is None:      # the first channel's sum written in one pass over sym (no zeroed array first)
                    sym = np.add(back.transpose(1, 0, 2), back.transpose(1, 2, 0),
                                 out=sym_buf[: p * nao * nao].reshape(p, nao, nao))
                else:
                    sym += back.transpose(1, 0, 2)
                    sym += back.transpose(1, 2, 0)
                del back
        del ao, ao_flat
        if not derivatives:
            continue
        contract_3c_derivatives(pmol, shls, sym, per_ao, per_aux[p0:p1], out=ip_buf)
        del sym
        check_stopped()
    if not derivatives:
        return xs, None
    de = _per_atom(mol, mol.natm, per_ao) + _per_atom(auxmol, mol.natm, per_aux)
    return xs, de
