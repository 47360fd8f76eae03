"""mp2_density — the DF-MP2 gradient's pair step for one strip of occupied pairs (NKI 0.3.0)::

    τ_ik^ab          = Σ_Q B[Q, i, a] B_k[Q, k, b] / (e_i + e_k − ε_a − ε_b)      (PSUM/SBUF, never stored)
    t̃_ik^ab          = c_d τ_ik^ab − c_x τ_ik^ba                                  (c_x ≠ 0: same spin, nva == nvb)
    gamma[Q, k, b]   = Σ_ia t̃_ik^ab B[Q, i, a]        p_occ[i, i']    = Σ_kab τ_ik^ab t̃_i'k^ab
    p_vir_all[a, a'] = Σ_ikb τ_ik^ab t̃_ik^a'b         p_vir_k[b, b']  = Σ_ika τ_ik^ab t̃_ik^ab'

exactly the contract of :meth:`mp2trn.devices.base.Device.pair_densities`. Only gamma (the strip's rows of
the 3-index 2PDM) and the three small density sums leave the chip; the host adds the launches' sums in fp64.

Dimensions
    naux: auxiliary functions (the contraction of τ, on SBUF partitions); ni ≥ 1: every occupied orbital i
    of one spin; nk ≥ 1: the strip's block of occupied orbitals k; nva, nvb: virtuals of the i and k sides
    (nva ≠ nvb only without exchange, UHF αβ). Any sizes otherwise (edge tiles are slices; nothing padded).

Args (host-prepared, see mp2trn/devices/nki_device.py)
    b_all (naux, ni·nva), b_k (naux, nk·nvb) float32: B aux-major, B[Q, i·nv + a] (Q on the partitions).
    ev_a (nva, 1); neg_e_i (1, ni) = −e_i; evb_minus_ek (nk, nvb) = ε_b − e_k (float32).
    c_direct > 0, c_exch with c_direct ≥ |c_exch| (every MP2 / SCS / SOS spin case): compile-time floats.
    vir_k: also p_vir_k. resident, i_block, i_group, b_buffers: the plan of :func:`density_plan` (compile-time;
    i_block 0 = plan here for the target's SBUF).

Returns
    gamma (naux, nk·nvb), p_occ (ni, ni), p_vir_all (nva, nva) [, p_vir_k (nvb, nvb) with ``vir_k``],
    float32: this launch's sums (gamma[Q, k·nvb + b]).

Engines (one line per step of the pseudocode)
    DMA: B_k and the ε_b − e_k row per k, B_i per (i, k), the p_occ blocks of B (stream plan), results.
    TensorE: T in PSUM; Tᵀ transposes (exchange, the b-major σ for p_vir_all) and B_iᵀ transposes (gamma's
    (i, a) contraction); gamma, p_vir_k, p_vir_all and the p_occ Gram as matmuls. ScalarE: denominators
    (activation with bias), PSUM evictions of transposes. GpSimd: reciprocals (rsqrt²). VectorE: σ = T·R,
    t̃ / t̃ᵀ / u from σ and σᵀ, accumulation of PSUM partial sums into the SBUF accumulators.

Pseudocode (σ = c_d·T/D' = −c_d·τ with D' = −D > 0; r = c_x/c_d)
    for k:
        load B_k[:, k], broadcast ε_b − e_k;  gacc = 0
        for i:                                                # the (i, k) pair, complete on chip
            load B_i
            σ[a, b]   = Σ_Q B_i[Q, a] B_k[Q, b] · c_d/D'      # TensorE → PSUM, ScalarE, GpSimd, VectorE
            σᵀ        = transposes of σ                        # TensorE
            t̃ = σ − r σᵀ,  t̃ᵀ = σᵀ − r σ                      # VectorE (exchange; else t̃ = σ)
            gacc[Q, b]      −= Σ_a B_iᵀ[a, Q] t̃[a, b]          # B_iᵀ by TensorE transposes
            pvk[b, b']      += Σ_a σ[a, b] t̃[a, b']            # (vir_k)
            pva[a, a']      += Σ_b σᵀ[b, a] t̃ᵀ[b, a']
            resident plan:  U[a, b, i] = σ + q σᵀ              # u_i, see p_occ below
        p_occ += Σ_ab U[a, b, ·]ᵀ U[a, b, ·]   (resident)  or the stream pass below
        store gacc → gamma[:, k]
    store p_occ·(α/c_d)², pva/c_d, pvk/c_d

p_occ without storing two amplitude sets
    p_occ is the Gram matrix of ONE set of vectors u_i = α σ_i + β σ_iᵀ (:func:`u_coefficients`), resident
    beside the main pass when every i fits SBUF, else recomputed in a second streamed pass per k
    (kernels/mp2_density_pocc.py derives it and holds both plans).

Tiling and dataflow
    * Per k, B_k[:, k] (all Q tiles × nvb, one access-pattern DMA) and the broadcast row ε_b − e_k stay
      resident; every i streams B_i (Q tiles × nva, one DMA) once per k and everything of the (i, k) pair is
      done before the next i: T[a tile, b ≤ 512 columns] in one PSUM bank (accumulated over the Q tiles),
      σ evicted to SBUF (VectorE, with R = c_d/D' from ScalarE + GpSimd), σᵀ by 128×128 TensorE transposes.
    * gamma needs (i, a) as the contraction: B_iᵀ tiles [a tile, ≤ 512 Q] by TensorE transposes of the
      resident B_i (ScalarE evicts), then per Q tile stationary B_iᵀ[a, Q tile] (M = 128) × moving t̃[a, b]
      accumulates over the a tiles in PSUM, and VectorE subtracts it from the SBUF gamma accumulator of the
      k (gacc = −Σ B t̃(σ) = Σ B t̃). p_vir_k, p_vir_all: matmuls with b resp. a on the PSUM partitions,
      accumulated over a resp. b tiles, then added into SBUF accumulators (fp32; per-launch sums).
    * B_k, the gamma accumulator and (``b_buffers`` = 1, large naux·nva) B_i are single buffers refilled per k
      (per i); every per-(i, k) tile belongs to one helper call and dies with it.
    * Every PSUM tile is one bank ([≤128, ≤512] fp32) and short-lived; at most a handful are live.

Limits
    The main pass keeps B_k[:, k], the gamma accumulator and B_i (each naux·nv·4/128 B per partition) plus
    σ, σᵀ, t̃, t̃ᵀ of one pair (4·⌈nv/128⌉·nv·4 B) on chip: naux = 1500 with nv = 600 fits trn1 (≈ 149 KB of
    180 KB per partition), naux = 2000 with nv = 700 does not (strict mode: KernelConstraintError naming the
    SBUF capacity). fp32 only: the compensated fp32x3 planes are not implemented for this kernel.

Files
    this one: the plan, the launch's constants and accumulators, the loop over k and i, the stores and the
    NumPy reference; kernels/mp2_density_pair.py: the main pass of one (i, k) pair (σ, σᵀ, t̃, gamma, P_ab);
    kernels/mp2_density_pocc.py: p_occ (resident Gram, stream pass, mirror); kernels/tiles.py: the K-tile
    loads and buffers shared with the other kernels.

NumPy reference: :func:`mp2_density_reference`. Tests: tests/test_kernel_mp2_density.py.
"""


from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._nki import nki, nisa, nl
from .mp2_density_pair import pair_step
from .mp2_density_pocc import mirror_pocc, pocc_resident, pocc_stream
from .tiles import (FP32, NFMAX, PMAX, broadcast_row, full_ktiles, ktile_buffer, refill_ktiles, sbuf_budget,
                    store_rows, tiles)

__all__ = ["mp2_density", "mp2_density_reference", "density_plan", "u_coefficients"]


def u_coefficients(c_direct, c_exch):
    """(α, β) with ⟨α σ_i + β σ_iᵀ, α σ_i' + β σ_i'ᵀ⟩ = ⟨σ_i, c_d σ_i' − c_x σ_i'ᵀ⟩ (needs c_d ≥ |c_x|)."""
    s = math.sqrt(max(c_direct - c_exch, 0.0))
    a = math.sqrt(max(c_direct + c_exch, 0.0))
    return (s + a) / 2.0, (s - a) / 2.0


def density_plan(naux: int, ni: int, nk: int, nva: int, nvb: int, exchange: bool, vir_k: bool,
                 budget: int = 0) -> tuple[bool, int, int, int]:
    """(resident, i_block, i_group, b_buffers) for SBUF: resident when the u_i of every i fit beside the main
    pass's working set (p_occ then needs no second pass); else the stream pass's occupied orbitals per i
    block (≤ 128; two blocks on chip at once when one does not fit) and per B load (i_group ≤ 4: fewer,
    larger DMAs — each transfer has a fixed cost). b_buffers: 2 = B_i of the next i loads while this one is
    used; 1 = one B_i buffer refilled per i (large naux·nva, where two would not fit)."""
    budget = budget or sbuf_budget()
    nq = -(-naux // PMAX)
    at = -(-nva // PMAX)
    bt = -(-nvb // PMAX)
    common = (nq * nvb * FP32                                  # B_k of this k
              + nq * nvb * FP32                                # gamma accumulator of the k
              + 2 * nvb * FP32 + (at + 2) * ni * FP32          # ε_b − e_k row, −e_i row, bias columns
              + at * nva * FP32 + (bt * nvb * FP32 if vir_k else 0)   # p_vir accumulators
              + 2 * -(-ni // PMAX) * ni * FP32)                 # p_occ accumulators
    per_pair = (2 * nq * nva * FP32                            # B_i (and the next i's)
                + 2 * (at * nvb + bt * nva) * FP32              # σ, σᵀ (and the next i's)
                + ((at * nvb + bt * nva) * FP32 if exchange else 0)   # t̃, t̃ᵀ
                + 2 * at * NFMAX * FP32 + 8 * NFMAX * FP32)     # B_iᵀ group, denominators, temporaries
    b_buffers = 2 if common + per_pair <= budget else 1
    if b_buffers == 1:
        per_pair -= nq * nva * FP32
    resident = at * ni * nvb * FP32
    if ni <= PMAX and common + per_pair + resident <= budget:
        return True, ni, 1, b_buffers
    free = budget - common - 8 * PMAX * FP32 - 8 * NFMAX * FP32        # σ blocks, temporaries
    load = 4 * nq * PMAX * FP32                                # B columns X and Y of one i (and the next)
    per_i = 2 * PMAX * FP32                                    # u of the blocks [X, Y] and [Y, X]
    if ni <= PMAX:
        for g in (4, 3, 2, 1):
            if ni * per_i + g * load <= free:
                return False, ni, g, b_buffers
    s = max(1, min(PMAX, ni, (free - load) // (2 * per_i)))   # two blocks on chip at once
    return False, int(s), 1, b_buffers


@dataclass
class Strip(nl.NKIObject):
    """What every pair of one launch shares: tilings, sizes, modes, coefficients, the (ε_a − e_i)/c_d bias
    columns per a tile and the accumulators (SBUF)."""

    ktiles: list
    atiles: list
    btiles: list
    nva: int
    nvb: int
    ni: int
    exchange: bool
    vir_k: bool
    resident: bool
    inv_cd: float        # 1 / c_d
    r: float             # c_x / c_d
    q: float             # β / α of u
    bias: list           # per a tile: [asz, ni]
    pva: list            # per a tile: [asz, nva]
    pvk: list            # per b tile: [bsz, nvb] (vir_k)
    pocc: list           # per i block: [isz, ni]
    iblocks: list        # [(i0, isz)]
    i_group: int         # stream pass: occupied orbitals per B load
    b_buffers: int       # main pass: B_i buffers (1: one, refilled per i)
    u: list              # resident plan: per a tile [asz, nvb, ni]


@dataclass
class KColumn(nl.NKIObject):
    """One k of the strip: its B_k tiles (per Q tile [qsz, nvb]), the broadcast ε_b − e_k row, and the
    gamma accumulator views (per Q tile [qsz, nvb])."""

    bk: list
    erow: object
    gacc: list


def _column(st, b_all, kc):
    """Everything of one k: the main pass over i, then p_occ (resident Gram or the stream pass)."""
    one = None
    if st.b_buffers == 1:
        one = ktile_buffer(st.ktiles, st.nva, "b_i")
    for i in range(st.ni):
        bi = None
        if st.b_buffers == 1:
            refill_ktiles(one[0], one[1], b_all, st.ktiles, i * st.nva, st.nva)
            bi = one[2]
        pair_step(st, kc, b_all, i, bi)
    if st.resident:
        pocc_resident(st)
    else:
        pocc_stream(st, kc, b_all)


def _zeroed(shape, name):
    t = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf, name=name)
    nisa.memset(dst=t, value=0.0)
    return t


def _store_scaled(dst, tiles_sb, row_tiles, scale):
    """Scale each SBUF accumulator tile in place (ScalarE) and write it to rows of ``dst`` (DMA)."""
    for t, (r0, rsz) in zip(tiles_sb, row_tiles):
        nisa.activation(dst=t, op=nl.copy, data=t, scale=scale)
        nisa.dma_copy(dst=dst[r0:r0 + rsz, :], src=t)


def _body(b_all, b_k, ev_a, neg_e_i, evb_minus_ek, c_direct, c_exch, vir_k, resident, i_block, i_group,
          b_buffers):
    naux, ncol_all = b_all.shape
    nva = ev_a.shape[0]
    ni = ncol_all // nva
    nk, nvb = evb_minus_ek.shape
    exchange = c_exch != 0.0
    assert not exchange or nva == nvb, "mp2_density: exchange needs nva == nvb (same-spin strip)"
    assert c_direct > 0.0 and c_direct >= abs(c_exch), "mp2_density: needs c_direct > 0 and c_direct >= |c_exch|"
    if i_block == 0:
        resident, i_block, i_group, b_buffers = density_plan(naux, ni, nk, nva, nvb, exchange, vir_k)
    assert not resident or ni <= PMAX, "mp2_density: the resident plan holds at most 128 occupied orbitals"
    ktiles = tiles(naux, PMAX)
    atiles = tiles(nva, PMAX)
    btiles = tiles(nvb, PMAX)
    iblocks = [(0, ni)] if resident else tiles(ni, min(i_block, PMAX))
    alpha, beta = u_coefficients(c_direct, c_exch)

    gamma = nl.ndarray((naux, nk * nvb), dtype=nl.float32, buffer=nl.shared_hbm)
    out_pocc = nl.ndarray((ni, ni), dtype=nl.float32, buffer=nl.shared_hbm)
    out_pva = nl.ndarray((nva, nva), dtype=nl.float32, buffer=nl.shared_hbm)
    out_pvk = nl.ndarray((nvb, nvb), dtype=nl.float32, buffer=nl.shared_hbm) if vir_k else None

    # launch constants: (ε_a − e_i)/c_d bias columns per a tile; accumulators
    nei = nl.ndarray((PMAX, ni), dtype=nl.float32, buffer=nl.sbuf, name="neg_ei")
    broadcast_row(nei, neg_e_i, 0, ni, None, True)                       # stride-0 partition broadcast
    bias = []
    for a0, asz in atiles:
        ea = nl.ndarray((asz, 1), dtype=nl.float32, buffer=nl.sbuf, name="ev_a")
        nisa.dma_copy(dst=ea, src=ev_a[a0:a0 + asz, :])
        b = nl.ndarray((asz, ni), dtype=nl.float32, buffer=nl.sbuf, name="bias")
        nisa.tensor_scalar(dst=b, data=nei[0:asz, :], op0=nl.add, operand0=ea, op1=nl.multiply,
                           operand1=1.0 / c_direct)
        bias.append(b)
    pva = [_zeroed((asz, nva), "pva") for _, asz in atiles]
    pvk = [_zeroed((bsz, nvb), "pvk") for _, bsz in btiles] if vir_k else []
    pocc = [_zeroed((isz, ni), "pocc") for _, isz in iblocks]
    u = [nl.ndarray((asz, nvb, ni), dtype=nl.float32, buffer=nl.sbuf, name="u_store") for _, asz in atiles] \
        if resident else []
    st = Strip(ktiles, atiles, btiles, nva, nvb, ni, exchange, vir_k, resident, 1.0 / c_direct,
               c_exch / c_direct, beta / alpha, bias, pva, pvk, pocc, iblocks, max(1, i_group), b_buffers, u)

    # per-k buffers, allocated once and refilled for every k (one wait per k at the refill; a second copy
    # of each would cost the stream pass its B loads)
    bk_full, bk_tail, bk = ktile_buffer(ktiles, nvb, "b_k")
    nfull = full_ktiles(ktiles)
    erow = nl.ndarray((PMAX, nvb), dtype=nl.float32, buffer=nl.sbuf, name="evb_ek")
    gacc_t = nl.ndarray((PMAX, len(ktiles), nvb), dtype=nl.float32, buffer=nl.sbuf, name="gamma_acc")
    gacc = [gacc_t[0:qsz, q, :] for q, (_, qsz) in enumerate(ktiles)]
    for k in range(nk):
        refill_ktiles(bk_full, bk_tail, b_k, ktiles, k * nvb, nvb)
        broadcast_row(erow, evb_minus_ek, k * nvb, nvb, None, True)
        nisa.memset(dst=gacc_t, value=0.0)
        _column(st, b_all, KColumn(bk, erow, gacc))
        # gamma rows of this k: full Q tiles in one access-pattern DMA, a short last tile on its own
        if nfull:
            store_rows(gamma, 0, nfull * PMAX, k * nvb, nvb, gacc_t[:, 0:nfull, :])
        for q in range(nfull, len(ktiles)):
            q0, qsz = ktiles[q]
            nisa.dma_copy(dst=gamma[q0:q0 + qsz, k * nvb:(k + 1) * nvb], src=gacc[q])

    mirror_pocc(pocc, iblocks)   # blocks J > I of the stream plan from blocks I < J
    # u = (α/c_d)(σ + q σᵀ) with σ = c_d T/D'; p_vir sums of σ·t̃(σ) carry one c_d too much
    _store_scaled(out_pocc, pocc, iblocks, (alpha / c_direct) ** 2)
    _store_scaled(out_pva, pva, atiles, 1.0 / c_direct)
    if vir_k:
        _store_scaled(out_pvk, pvk, btiles, 1.0 / c_direct)
        return gamma, out_pocc, out_pva, out_pvk
    return gamma, out_pocc, out_pva


@nki.jit
def mp2_density(b_all, b_k, ev_a, neg_e_i, evb_minus_ek, c_direct=2.0, c_exch=1.0, vir_k=False, resident=True,
                i_block=0, i_group=1, b_buffers=2):
    """fp32 pair densities of one strip. Returns (gamma (naux, nk·nvb), p_occ (ni, ni), p_vir_all (nva, nva))
    and p_vir_k (nvb, nvb) last with ``vir_k``; ``i_block`` 0: plan resident / i block / i group here."""
    return _body(b_all, b_k, ev_a, neg_e_i, evb_minus_ek, c_direct, c_exch, vir_k, resident, i_block, i_group,
                 b_buffers)


def mp2_density_reference(b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch, vir_k):
    """NumPy reference (fp64) of the pair-density contract: (gamma (naux, nk, nvb), p_occ (ni, ni),
    p_vir_all (nva, nva), p_vir_k (nvb, nvb) or None). b_all (naux, ni, nva), b_k (naux, nk, nvb)."""
    b_all = np.asarray(b_all, dtype=np.float64)
    b_k = np.asarray(b_k, dtype=np.float64)
    naux, ni, nva = b_all.shape
    nk, nvb = b_k.shape[1], b_k.shape[2]
    gamma = np.empty((naux, nk, nvb))
    p_occ = np.zeros((ni, ni))
    p_vir_all = np.zeros((nva, nva))
    p_vir_k = np.zeros((nvb, nvb)) if vir_k else None
    d_iab = (np.asarray(e_all, np.float64)[:, None, None] - np.asarray(ev_all, np.float64)[None, :, None]
             - np.asarray(ev_k, np.float64)[None, None, :])
    for k in range(nk):                                  # one k at a time: (ni, nva, nvb) amplitudes
        tau = np.einsum("qia,qb->iab", b_all, b_k[:, k, :], optimize=True) / (d_iab + e_k[k])
        tt = c_direct * tau - c_exch * tau.transpose(0, 2, 1) if c_exch else c_direct * tau
        gamma[:, k, :] = np.einsum("qia,iab->qb", b_all, tt, optimize=True)
        p_occ += np.einsum("iab,jab->ij", tau, tt, optimize=True)
        p_vir_all += np.einsum("iab,icb->ac", tau, tt, optimize=True)
        if vir_k:
            p_vir_k += np.einsum("iab,iac->bc", tau, tt, optimize=True)
    return gamma, p_occ, p_vir_all, p_vir_k
