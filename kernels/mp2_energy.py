"""mp2_energy — fused DF-MP2 pair energies for a block of occupied pairs (NKI 0.3.0)::

    T_ab      = Σ_Q B[Q, i, a] B[Q, j, b]                     (formed in PSUM, never stored)
    os[i, j]  = Σ_ab T_ab² / D_ab
    x[i, j]   = Σ_ab T_ab T_ba / D_ab                          (same-spin blocks only)
    D_ab      = e_i + e_j − ε_a − ε_b

Only the per-pair sums os (and x) leave the chip; the host adds them up in fp64 (RHF: E_os = Σ os,
E_ss = Σ (os − x); UHF: αα/ββ give os − x, αβ gives os).

Dimensions
    naux: auxiliary functions (contraction, SBUF partitions); nI, nJ ≥ 1: occupied orbitals of the two
    blocks (nJ ≤ 512, one PSUM bank of per-pair sums; nocc = 1 works); nva, nvb: virtuals of each side
    (nva ≠ nvb allowed without exchange, UHF αβ). Any sizes otherwise: edge tiles are slices, nothing is
    padded, so no padded denominators exist.

Args (host-prepared, see mp2trn/devices/nki_device.py)
    b_i (naux, nI·nva), b_j (naux, nJ·nvb) float32: B aux-major — B[Q, i·nv + a] — so the contraction
    index Q is on the SBUF partitions exactly as TensorE wants: stationary = B_i[Q-tile, a-tile]
    (M = a ≤ 128), moving = B_j[Q-tile, (j, b) columns ≤ 512].
    ev_a (nva, 1); neg_e_i (1, nI) = −e_i; evb_minus_ej (nJ, nvb) = ε_b − e_j  (float32).
    exchange: also x (same-spin blocks); same: b_j is b_i (diagonal block: only pairs i ≤ j are formed,
    others are returned as 0); i_block: I orbitals resident at once (0: :func:`i_block_size`).
    ``mp2_energy_x3``: the compensated planes of b_i (hi, lo) and b_j (hi, lo, full).

Returns
    os (nI, nJ) float32 [and x (nI, nJ) when ``exchange``]; ``mp2_energy_x3``: per-pair row sums
    (nva, nI·nJ), negated, which the host adds in fp64.

Engines (one line per step of the pseudocode)
    TensorE: T in PSUM, the Tᵀ transposes, the sums over a (ones-vector matmul). ScalarE: denominators
    (activation with bias), T copies to SBUF. GpSimd: reciprocals. VectorE: W = T/D, T·W and W·Tᵀ, the
    segment sums over b. DMA: B blocks once per launch, per-pair sums out.

Pseudocode
    load B_I[:, I sub-block]                              # resident
    for each j-group (whole j's per PSUM bank):
        load B_J[:, group]                                # (a view of B_I on a resident diagonal block)
        for i in the sub-block, for each a tile:
            T[a, (j, b)] = Σ_Q B_I[Q, (i, a)] B_J[Q, (j, b)]     # PSUM
            D' = (ε_b − e_j) + (ε_a − e_i);  R = 1/D'             # ScalarE, GpSimd
            W = T·R;  os[i, j] += Σ_ab W·T                         # VectorE, TensorE (sum over a)
            exchange: Tᵀ by transposes; x[i, j] += Σ_ab W·Tᵀ
    store os (and x)                                      # negated: D' = −D

Tiling and dataflow
    * The I block (all Q tiles × all (i, a) columns) is loaded once and stays resident in SBUF for the
      whole launch (sub-blocked only if it does not fit the target's SBUF budget).
    * The J side streams in *j-groups*: as many whole j as fit one PSUM bank (nj·nvb ≤ 512 fp32), or
      one j split into 512-column chunks when nvb > 512. A j-group is loaded once (one dma_copy for all
      full Q tiles, through an access pattern) and reused by every i of the block; with ``same`` and a
      resident block it is a view of the I tiles (no DMA at all).
    * For each (i, j-group, a-tile): TensorE accumulates T[a, (j, b)] over the Q tiles in one PSUM bank.
      ScalarE forms D' = (ε_b − e_j) + (ε_a − e_i) from a partition-broadcast row (loaded once per
      j-group) with the per-partition bias column (ε_a − e_i); GpSimd turns it into R = 1/D' (rsqrt,
      then a square: fp32 math on an otherwise idle engine, no VectorE time, and exact enough — the
      ScalarE reciprocal is a low-precision approximation); VectorE forms W = T·R and T·W straight from
      PSUM and reduces each j segment over b; TensorE sums over the a partitions with a ones-vector
      matmul into a per-pair PSUM accumulator (accumulating over a tiles and column chunks).
    * A short last a tile (nva mod 128 ≤ 64 rows, and fewer than nvb/64 b tiles) runs with the roles
      swapped (``TailSwap`` in kernels/mp2_energy_tail.py, switch ``tail_swap``): T'[b, a] with the b tiles stationary and the tail
      columns moving costs (b tiles) × 64 cycles per Q tile instead of nvb; its direct term reduces over
      a (free) then b (ones matmul), and its exchange pieces are already transposed: the main tiles take
      Tᵀ for b in the tail from T', the tail takes T_ba from the main T tiles (and one 42×42-style
      transpose of T' for b and a both in the tail, at partition 0). fp32 only (x3 keeps the plain path).
    * Exchange (same-spin): T is copied to SBUF (ScalarE) for every a tile of the (i, j-group); then
      Tᵀ tiles are built with TensorE transposes (128×128 blocks, cheap next to the nc_matmuls) into
      PSUM and VectorE forms W·Tᵀ and its segment sums the same way. TensorE has the spare time when
      naux is large (T costs 4·(naux/128) cycles per column, the transposes ~1/2 cycle per column).

Engines / Trainium features
    TensorE: T (PSUM accumulation over naux), transposes, partition reductions by ones-matmul.
    ScalarE: denominators (activation with bias), T evictions. GpSimd: reciprocals. VectorE: the
    fused products and free-axis reductions. DMA: B blocks once per launch. SBUF residency of B_I across
    all pairs, PSUM accumulation, four compute engines overlapping, reductions fused on chip (T never
    round-trips through HBM — the trnblas bottleneck), many pairs per launch.

Compensated mode ``mp2_energy_x3`` (fp32x3): B_i = hi (bf16 grid per (i, a) column along Q) + lo,
B_j = hi + lo (+ full fp32); T = hi·hi (exact) + hi·lo + lo·B_j accumulated in the same PSUM tile.
The fp32 sums of a pair's nva·nvb terms are the last fp32-limited step: ~1e-7 relative noise per pair
and, worse, a systematic swamping bias (tiny terms below half an ulp of the running sum are lost). So
this mode sums each row segment exactly (hi on a power-of-two grid of the row maximum, Σ hi exact in
fp32, plus Σ lo) and stops one level earlier: it writes each pair's nva partial sums over b (still nvb
times less data than T) and the host adds them in fp64 (docs/precision.md).

NumPy reference: :func:`mp2_energy_reference`. Tests: tests/test_kernel_mp2_energy.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._nki import nki, nisa, nl
from .mp2_energy_reduce import seg_reduce, segments
from .mp2_energy_tail import tail_constants, tail_exchange, tail_pairs
from .tiles import FP32, NFMAX, PMAX, broadcast_row, load_operand_tiles, matmul_planes, sbuf_budget, tiles


__all__ = ["mp2_energy", "mp2_energy_x3", "mp2_energy_reference", "j_groups", "i_block_size"]


def j_groups(nJ, nvb):
    """[(j0, nj)]: whole j's per PSUM bank when nvb ≤ 512, else one j per group."""
    per = max(1, NFMAX // nvb) if nvb <= NFMAX else 1
    return [(j0, min(per, nJ - j0)) for j0 in range(0, nJ, per)]


def i_block_size(naux, nI, nJ, nva, nvb, x3=False, budget=0):
    """Occupied orbitals of the I block kept resident in SBUF at once (the rest of the working set —
    a double-buffered j-group, the broadcast denominators, T/W copies and temporaries — is fixed)."""
    nk = -(-naux // PMAX)
    at = -(-nva // PMAX)
    budget = budget or sbuf_budget()
    a_b = 10 if x3 else FP32
    b_b = 10 if x3 else FP32
    cols = NFMAX if nvb <= NFMAX else nvb
    fixed = (2 * nk * cols * b_b                     # j-group planes (double buffered)
             + 2 * cols * FP32                       # broadcast ε_b − e_j row
             + 2 * at * cols * FP32                  # T and W copies (exchange)
             + 8 * NFMAX * FP32                      # D', y, R, T·W, T·Tᵀ... temporaries
             + (at + 3) * nI * FP32 + 2 * nI * nJ * FP32)    # bias columns, per-pair results
    per_i = (nk * nva * a_b + (nk * nva * FP32 if x3 else 0)  # x3: + full-fp32 plane for a diagonal block
             + (2 * nJ * FP32 if x3 else 0))                    # x3: row-sum buffers of the sub-block
    return int(max(1, min(nI, (budget - fixed) // per_i)))


@dataclass
class PairBlock(nl.NKIObject):
    """What every pair group of one resident I sub-block shares: the I planes per Q tile, the launch
    constants (ones column, (ε_a − e_i) bias columns per a tile), sizes, modes and the result tiles
    (per-pair mode: [1, nI·nJ] rows; row mode: one [asz, nI·nJ] tile per a tile)."""

    ip: list
    bias: list
    ones: object
    atiles: list
    nva: int
    nvb: int
    exchange: bool
    rowsums: bool
    res_os: object
    res_x: object
    tail: tuple          # () or (TailSwap,): the a-tile tail computed with the roles swapped


@dataclass
class JGroup(nl.NKIObject):
    """One j-group: its B_J planes per Q tile, the broadcast (ε_b − e_j) row, and how many j it holds."""

    jt: list
    ej: object
    nj: int
    j0: int


def _pair_group(blk, grp, i, il, out_col, j_skip):
    """All pairs (i, j in the group): T tiles, denominators, fused reductions; results into the block's
    result tiles from column ``out_col``; on a diagonal block the first ``j_skip`` pairs are not written."""
    ip, jt, ej, bias, ones, atiles = blk.ip, grp.jt, grp.ej, blk.bias, blk.ones, blk.atiles
    nva, nvb, nj, exchange, rowsums = blk.nva, blk.nvb, grp.nj, blk.exchange, blk.rowsums
    res_os, res_x = blk.res_os, blk.res_x
    ncols = nj * nvb
    chunks = tiles(ncols, NFMAX)
    main_tiles = atiles[:len(atiles) - len(blk.tail)]       # the tail tile, if swapped, is done below
    acc_os = acc_x = None
    if not rowsums:
        acc_os = nl.ndarray((1, nj), dtype=nl.float32, buffer=nl.psum, name="acc_os")
        acc_x = nl.ndarray((1, nj), dtype=nl.float32, buffer=nl.psum, name="acc_x") if exchange else None
    t_sb = []
    w_sb = []
    for at, (a0, asz) in enumerate(main_tiles):
        if exchange:
            t_sb.append(nl.ndarray((asz, ncols), dtype=nl.float32, buffer=nl.sbuf, name="t_sb"))
            w_sb.append(nl.ndarray((asz, ncols), dtype=nl.float32, buffer=nl.sbuf, name="w_sb"))
        st = [tuple(p[:, il * nva + a0:il * nva + a0 + asz] for p in planes) for planes in ip]
        for c0, csz in chunks:
            t = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.psum, name="t_ps")
            matmul_planes((t,), st, [tuple(p[:, c0:c0 + csz] for p in planes) for planes in jt])
            # D' = (ε_b − e_j) + (ε_a − e_i) > 0  (ScalarE, per-partition bias), R = 1/D' (GpSimd)
            dn = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.sbuf, name="denom")
            nisa.activation(dst=dn, op=nl.copy, data=ej[0:asz, c0:c0 + csz], bias=bias[at][:, i:i + 1])
            y = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.sbuf, name="rsqrt")
            nisa.tensor_scalar(dst=y, data=dn, op0=nl.rsqrt, operand0=0.0, engine=nisa.gpsimd_engine)
            r = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.sbuf, name="recip")
            nisa.tensor_tensor(dst=r, data1=y, data2=y, op=nl.multiply, engine=nisa.gpsimd_engine)
            if exchange:
                w = w_sb[at][:, c0:c0 + csz]
                nisa.activation(dst=t_sb[at][:, c0:c0 + csz], op=nl.copy, data=t)
            else:
                w = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.sbuf, name="w")
            nisa.tensor_tensor(dst=w, data1=t, data2=r, op=nl.multiply)          # W = T/D' (T in PSUM)
            p1 = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.sbuf, name="tw")
            nisa.tensor_tensor(dst=p1, data1=w, data2=t, op=nl.multiply)         # T²/D'
            seg_reduce(acc_os, ones, p1, asz, c0, csz, nvb, (res_os[at],) if rowsums else (), out_col, c0 < NFMAX)
    swapped = tail_pairs(blk, grp, i, il, acc_os, acc_x, t_sb) if blk.tail else ()
    if exchange:
        for at, (a0, asz) in enumerate(main_tiles):
            for c0, csz in chunks:
                tt = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.psum, name="tt_ps")
                for jl, s0, sn, b0 in segments(c0, csz, nvb):
                    for bt, (q0, qsz) in enumerate(atiles):            # b tiles (nvb == nva)
                        lo, hi = max(q0, b0), min(q0 + qsz, b0 + sn)
                        if lo >= hi:
                            continue
                        cols = (s0 - c0 + lo - b0, s0 - c0 + hi - b0)
                        if bt < len(main_tiles):
                            # Tᵀ[a, (j, b)] = T[b, (j, a)]: transpose a [b-rows, a-cols] block of T (SBUF)
                            nisa.nc_transpose(dst=tt[:, cols[0]:cols[1]],
                                              data=t_sb[bt][lo - q0:hi - q0, jl * nvb + a0:jl * nvb + a0 + asz])
                        else:
                            # b in the swapped tail: T'[a, b] = T_ba already, rows a of b tile ``at``
                            src = swapped[jl * len(blk.tail[0].btiles) + at][0]
                            nisa.tensor_copy(dst=tt[:, cols[0]:cols[1]], src=src[:, lo - q0:hi - q0])
                p2 = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.sbuf, name="ttw")
                nisa.tensor_tensor(dst=p2, data1=w_sb[at][:, c0:c0 + csz], data2=tt, op=nl.multiply)
                seg_reduce(acc_x, ones, p2, asz, c0, csz, nvb, (res_x[at],) if rowsums else (), out_col, c0 < NFMAX,
                            signed=True)
    if exchange and blk.tail:
        tail_exchange(blk, grp, acc_x, t_sb, swapped)
    if rowsums:
        return
    # os = Σ T²/D = −Σ T²/D' (D' = −D): negate while evicting the per-pair sums (ScalarE). On a diagonal
    # block the group may hold j < i (formed for free by the same matmuls): those are not written.
    k0 = j_skip
    nisa.activation(dst=res_os[0:1, out_col + k0:out_col + nj], op=nl.copy, data=acc_os[0:1, k0:nj], scale=-1.0)
    if exchange:
        nisa.activation(dst=res_x[0:1, out_col + k0:out_col + nj], op=nl.copy, data=acc_x[0:1, k0:nj], scale=-1.0)


def _row_buffers(atiles, ncols, exchange):
    """Row-mode result tiles: [asz, ncols] per a tile (zeroed: skipped pairs read as 0)."""
    res_os, res_x = [], ([] if exchange else None)
    for a0, asz in atiles:
        for lst in ((res_os, res_x) if exchange else (res_os,)):
            t = nl.ndarray((asz, ncols), dtype=nl.float32, buffer=nl.sbuf, name="res_rows")
            nisa.memset(dst=t, value=0.0)
            lst.append(t)
    return res_os, res_x


def _body(bi_planes, bj_planes, ev_a, neg_e_i, evb_ej, exchange, same, i_block, rowsums=False,
          broadcast_dma=True, tail_swap=True):
    naux, ncol_i = bi_planes[0].shape
    nva = ev_a.shape[0]
    nI = ncol_i // nva
    nJ, nvb = evb_ej.shape
    x3 = len(bi_planes) > 1
    assert not exchange or nva == nvb, "mp2_energy: exchange needs nva == nvb (same-spin block)"
    assert nJ <= NFMAX, f"mp2_energy: nJ={nJ} exceeds one PSUM bank of per-pair sums"
    ktiles = tiles(naux, PMAX)
    atiles = tiles(nva, PMAX)
    ni_blk = i_block if i_block else i_block_size(naux, nI, nJ, nva, nvb, x3)

    if rowsums:
        # per-pair partial sums over b for every a (nva numbers per pair; the host adds them in fp64),
        # buffered per I sub-block and written after it
        out_os = nl.ndarray((nva, nI * nJ), dtype=nl.float32, buffer=nl.shared_hbm)
        out_x = nl.ndarray((nva, nI * nJ), dtype=nl.float32, buffer=nl.shared_hbm) if exchange else None
    else:
        out_os = nl.ndarray((nI, nJ), dtype=nl.float32, buffer=nl.shared_hbm)
        out_x = nl.ndarray((nI, nJ), dtype=nl.float32, buffer=nl.shared_hbm) if exchange else None
        res_os = nl.ndarray((1, nI * nJ), dtype=nl.float32, buffer=nl.sbuf, name="res_os")
        nisa.memset(dst=res_os, value=0.0)
        res_x = None
        if exchange:
            res_x = nl.ndarray((1, nI * nJ), dtype=nl.float32, buffer=nl.sbuf, name="res_x")
            nisa.memset(dst=res_x, value=0.0)

    # launch constants: ones column, (ε_a − e_i) bias columns per a tile
    ones = nl.ndarray((PMAX, 1), dtype=nl.float32, buffer=nl.sbuf, name="ones")
    nisa.memset(dst=ones, value=1.0)
    ones_row = ones                       # the DMA broadcast needs no ones row; the fallback does
    if not broadcast_dma:
        ones_row = nl.ndarray((1, PMAX), dtype=nl.float32, buffer=nl.sbuf, name="ones_row")
        nisa.memset(dst=ones_row, value=1.0)
    nei = nl.ndarray((PMAX, nI), dtype=nl.float32, buffer=nl.sbuf, name="neg_ei")
    broadcast_row(nei, neg_e_i, 0, nI, ones_row, broadcast_dma)          # partition broadcast
    bias = []
    for a0, asz in atiles:
        ea = nl.ndarray((asz, 1), dtype=nl.float32, buffer=nl.sbuf, name="ev_a")
        nisa.dma_copy(dst=ea, src=ev_a[a0:a0 + asz, :])
        b = nl.ndarray((asz, nI), dtype=nl.float32, buffer=nl.sbuf, name="bias")
        nisa.tensor_scalar(dst=b, data=nei[0:asz, :], op0=nl.add, operand0=ea)  # ε_a − e_i
        bias.append(b)
    tail = ()
    if tail_swap and not x3 and not rowsums and (nva == nvb or not exchange):
        tail = tail_constants(atiles, nvb, nJ, ev_a, evb_ej, nei, ones_row, broadcast_dma)

    for i0 in range(0, nI, ni_blk):
        ni = min(ni_blk, nI - i0)
        ip = load_operand_tiles(bi_planes, ktiles, i0 * nva, ni * nva, stationary=True, name="b_i")
        if rowsums:
            res_os, res_x = _row_buffers(atiles, ni * nJ, exchange)
        resident_all = same and ni == nI
        jp = ip
        blk = PairBlock(ip, bias, ones, atiles, nva, nvb, exchange, rowsums, res_os, res_x, tail)
        if resident_all and x3:
            # moving planes of the diagonal block from the resident ones: (hi16, lo, x = hi + lo)
            jp = []
            for hi16, hi32, lo in ip:
                full = nl.ndarray(lo.shape, dtype=nl.float32, buffer=nl.sbuf, name="b_full")
                nisa.tensor_tensor(dst=full, data1=hi32, data2=lo, op=nl.add, engine=nisa.gpsimd_engine)
                jp.append((hi16, lo, full))
        for j0, nj in j_groups(nJ, nvb):
            if same and j0 + nj <= i0:
                continue                                   # every pair of the group has j < i
            if resident_all:
                jt = [tuple(p[:, j0 * nvb:(j0 + nj) * nvb] for p in planes) for planes in jp]
            else:
                jt = load_operand_tiles(bj_planes, ktiles, j0 * nvb, nj * nvb, stationary=False, name="b_j")
            ej = nl.ndarray((PMAX, nj * nvb), dtype=nl.float32, buffer=nl.sbuf, name="evb_ej")
            broadcast_row(ej, evb_ej, j0 * nvb, nj * nvb, ones_row, broadcast_dma)
            for il in range(ni):
                i = i0 + il
                if same and i >= j0 + nj:
                    continue                               # pairs i <= j only
                _pair_group(blk, JGroup(jt, ej, nj, j0), i, il, (il if rowsums else i) * nJ + j0,
                            max(0, i - j0) if same else 0)
        if rowsums:
            for at, (a0, asz) in enumerate(atiles):
                nisa.dma_copy(dst=out_os[a0:a0 + asz, i0 * nJ:(i0 + ni) * nJ], src=res_os[at])
                if exchange:
                    nisa.dma_copy(dst=out_x[a0:a0 + asz, i0 * nJ:(i0 + ni) * nJ], src=res_x[at])
    if not rowsums:
        nisa.dma_copy(dst=out_os, src=res_os)
        if exchange:
            nisa.dma_copy(dst=out_x, src=res_x)
    if exchange:
        return out_os, out_x
    return out_os


@nki.jit
def mp2_energy(b_i, b_j, ev_a, neg_e_i, evb_minus_ej, exchange=True, same=False, i_block=0, broadcast_dma=True,
               tail_swap=True):
    """fp32 pair energies. Returns (os, x) with ``exchange``, else os; (nI, nJ) float32 each.
    ``broadcast_dma=False``: the partition broadcasts by a ones-vector matmul instead of a stride-0 DMA."""
    return _body((b_i,), (b_j,), ev_a, neg_e_i, evb_minus_ej, exchange, same, i_block, broadcast_dma=broadcast_dma,
                 tail_swap=tail_swap)


@nki.jit
def mp2_energy_x3(bi_hi, bi_lo, bj_hi, bj_lo, bj, ev_a, neg_e_i, evb_minus_ej, exchange=True, same=False,
                  i_block=0, broadcast_dma=True):
    """fp32x3 pair energies: B planes split along Q per (i, a) / (j, b) column (hi bf16 + lo [+ full]).

    Returns per-pair *row sums* so that the last levels of the sum happen in fp64 on the host:
    os_rows (nva, nI·nJ) with os[i, j] = −Σ_a os_rows[a, i·nJ + j] (and x_rows alike); on a diagonal
    block the columns of pairs i > j hold values that are to be ignored."""
    return _body((bi_hi, bi_lo), (bj_hi, bj_lo, bj), ev_a, neg_e_i, evb_minus_ej, exchange, same, i_block,
                 rowsums=True, broadcast_dma=broadcast_dma)


def mp2_energy_reference(b_i, b_j, e_i, e_j, ev_a, ev_b, exchange=True):
    """NumPy reference (fp64): os[i, j] = Σ T²/D, x[i, j] = Σ T Tᵀ/D for all pairs of the two blocks.

    b_i (naux, nI, nva), b_j (naux, nJ, nvb)."""
    b_i = np.asarray(b_i, dtype=np.float64)
    b_j = np.asarray(b_j, dtype=np.float64)
    t = np.einsum("qia,qjb->ijab", b_i, b_j, optimize=True)
    d = (np.asarray(e_i)[:, None, None, None] + np.asarray(e_j)[None, :, None, None]
         - np.asarray(ev_a)[None, None, :, None] - np.asarray(ev_b)[None, None, None, :])
    os_ = np.sum(t * t / d, axis=(2, 3))
    if not exchange:
        return os_, None
    return os_, np.sum(t * t.transpose(0, 1, 3, 2) / d, axis=(2, 3))
