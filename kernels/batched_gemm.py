"""batched_gemm — the two AO→MO half-transforms of DF-MP2 in one launch (NKI 0.3.0)::

    out[P, i, a] = Σ_μν C_occ[μ, i] (P|μν) C_vir[ν, a]        for a block of auxiliary functions P

Dimensions
    p: auxiliary functions in the host's AO block; nao: AO basis functions; no ≤ 512: occupied orbitals
    (one PSUM bank of columns; the host splits more); nv: virtual orbitals. Any sizes otherwise (edge
    tiles are partition/free slices; nothing is padded).

Args
    ao (p, nao, nao) float32 HBM, (P|μν) symmetric in μν; c_occ (nao, no), c_vir (nao, nv) float32;
    group: auxiliary functions per on-chip group (0: :func:`group_size` from the target's SBUF).
    ``batched_gemm_x3``: the compensated planes of ao, c_occ, c_vir and β, the grid bits of the on-chip
    re-split of X.

Returns
    (p·no, nv) float32 = (P|ia) with rows (P, i) — exactly the aux-major B[P, i·nv + a] layout the host
    stores (``batched_gemm_x3``: the pair (y_exact, y_rest), added in fp64 by the host).

Engines
    DMA: the ao group (one transfer per plane), C_occ/C_vir once per launch, result rows. TensorE: both
    half-transforms (and, in x3, the transposes of X). VectorE: PSUM evictions (x3: row maxima, grid
    rounding). GpSimd: x3 widening of bf16 planes and exponent masks.

Pseudocode
    load C_occ, C_vir                                     # resident for the launch
    for each group of g auxiliary functions P:
        load ao[P group, :, :]
        X[μ, (P, i)] = Σ_ν ao[P, ν, μ] C_occ[ν, i]        # first half, PSUM → SBUF; never to HBM
        (x3: re-split X along μ into hi/lo planes on chip)
        Y[(P, i), a] = Σ_μ X[μ, (P, i)] C_vir[μ, a]       # second half, X already stationary
        store Y rows

Dataflow and tiling (per group of g auxiliary functions, g·no ≤ 512)
    1. DMA: ONE ``dma_copy`` per plane brings ao[P0:P0+g, ν, :] for all full 128-row ν tiles into an SBUF
       tile [ν-in-tile (partitions), ν-tile, g, nao] through a 4-level access pattern (each partition
       reads g·ntiles contiguous rows of nao); a short last ν tile gets its own transfer.
    2. First half (TensorE): X[μ, (P, i)] = Σ_ν ao[P, ν, μ] C_occ[ν, i] — stationary = an ao tile
       [K = ν, M = μ-tile], moving = C_occ tile [K = ν, N = no] (resident for the launch); every P of
       the group writes its own no columns of ONE PSUM bank per μ tile, accumulating over ν tiles.
       VectorE evicts X to SBUF. X never goes back to HBM.
    3. Second half (TensorE): Y[(P, i), a] = Σ_μ X[μ, (P, i)] C_vir[μ, a] — X is *already* in the
       [K = μ, M = (P, i)] stationary layout (no transpose), and the (P, i) rows of up to 128/no
       auxiliary functions share one stationary tile, so the M dimension is full. Moving = C_vir tile
       [K = μ, N ≤ 512] (resident). VectorE evicts, DMA stores contiguous rows of the result.
    The group size g comes from the SBUF budget of the target (``total_available_sbuf_size``) and the
    PSUM bank (g·no ≤ 512 fp32 columns).

Engines and Trainium features
    DMA with multi-dimensional access patterns (one transfer per plane per group; the full 128-row
    output tiles of a group leave in one transfer per column chunk), TensorE with PSUM
    accumulation over the contraction tiles, SBUF residency of C_occ/C_vir for the whole launch and of
    X between the halves (the intermediate (P|iν) never touches HBM), VectorE evictions overlapping
    TensorE work on the next tiles. One launch per host AO block (a few hundred P).

Cost note: the first-half matmuls have N = no moving columns; the cost model charges
max(64, no)·4 cycles, so TensorE runs at min(1, no/64) of peak there — still the cheaper order: the
occupied-first order does 2·p·nao²·no flops, the virtual-first one nv/no times more.

Compensated mode ``batched_gemm_x3`` (precision "fp32x3", docs/precision.md)
    ao, C_occ, C_vir arrive split on the host (hi on a bf16-exact grid along the contraction axis, + lo,
    + full fp32 for moving operands; see kernels/gemm.py). The first half accumulates the exact
    hi·hi part (X_A) and the corrections (X_R) in two PSUM tiles. X must then be split again along μ
    (its contraction axis in the second half), per (P, i) column: TensorE transposes X_A/X_R to
    [(P, i), μ] (128 rows), VectorE takes max|X_A + X_R| per row, GpSimd/VectorE turn it into a power of
    two (exponent bits via an int32 view, ``bitwise_and``), and the round-to-grid is the fp32 trick
    hi = (x + c) − c with x = X_A + X_R and c = 1.5·2^23·grid (two fp32 writes); lo = (X_A − hi) + X_R
    (hi from X_A alone would leave lo up to X_R larger than grid/2: X_R holds the hi·lo products, 2^-β of X); both are
    transposed back to [μ, (P, i)] for the second half, which accumulates hi·hi and hi·lo + lo·x in
    two PSUM tiles and writes both: (P|ia) leaves the chip as an fp32 pair, never rounded to fp32 (the
    metric step amplifies white rounding noise in (P|ia), see docs/precision.md).

NumPy reference: :func:`batched_gemm_reference`. Tests: tests/test_kernel_batched_gemm.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._nki import nki, nisa, nl
from .tiles import (EXP_MASK, FP32, MAGIC, NFMAX, PMAX, evict, load_operand_tiles, matmul_planes, sbuf_budget,
                    store_rows, tiles)

__all__ = ["batched_gemm", "batched_gemm_x3", "batched_gemm_reference", "group_size"]


def group_size(nao, no, nv, x3=False, budget=0):
    """Auxiliary functions per group: g·no ≤ 512 (one PSUM bank for X) and the SBUF working set
    (ao tiles for the group, X in SBUF, resident C_occ/C_vir) within the per-partition budget."""
    nt = -(-nao // PMAX)
    budget = budget or sbuf_budget()
    ao_b = 10 if x3 else FP32                       # per ao element (hi16 + hi32 + lo)
    x_b = 18 if x3 else FP32                        # per X element (A, R copies; hi16, hi32, lo)
    c_b = 10 if x3 else FP32
    fixed = nt * (no + nv) * c_b + 4 * NFMAX * FP32 + (6 * 2 * NFMAX * FP32 if x3 else 0)
    per_p = nt * nao * ao_b + nt * no * x_b
    g = max(1, min(NFMAX // max(no, 1), (budget - fixed) // max(per_p, 1)))
    return int(g)


def _load_ao_group(ao_planes, g0, gs, nao, ktiles, x3):
    """ao[g0:g0+gs, ν, :] for every ν tile -> SBUF views [ν (partitions), gs, nao]. All full 128-row ν
    tiles of a plane arrive in ONE dma_copy through a 4-level access pattern [ν-in-tile, ν-tile, P, μ]
    (each partition reads gs·ntiles contiguous rows of nao); a short last ν tile gets its own."""
    full = [t for t in ktiles if t[1] == PMAX]
    per_plane = []
    for pi, src in enumerate(ao_planes):
        dt = nl.bfloat16 if (x3 and pi == 0) else nl.float32
        views = []
        if full:
            big = nl.ndarray((PMAX, len(full), gs, nao), dtype=dt, buffer=nl.sbuf, name="ao_tiles")
            nisa.dma_copy(dst=big, src=src.ap([[nao, PMAX], [PMAX * nao, len(full)], [nao * nao, gs], [1, nao]],
                                              offset=g0 * nao * nao))
            views = [big[:, i, :, :] for i in range(len(full))]
        for k0, ksz in ktiles[len(full):]:
            t = nl.ndarray((ksz, gs, nao), dtype=dt, buffer=nl.sbuf, name="ao_tail")
            nisa.dma_copy(dst=t, src=src.ap([[nao, ksz], [nao * nao, gs], [1, nao]], offset=g0 * nao * nao + k0 * nao))
            views.append(t)
        per_plane.append(views)
    out = []
    for k in range(len(ktiles)):
        planes = [pp[k] for pp in per_plane]
        if x3:
            hi32 = nl.ndarray(planes[0].shape, dtype=nl.float32, buffer=nl.sbuf, name="ao_hi32")
            nisa.tensor_copy(dst=hi32, src=planes[0], engine=nisa.gpsimd_engine)
            planes = [planes[0], hi32, planes[1]]
        out.append(planes)
    return out


def _resident(planes, ktiles, stationary, name):
    """Load a small (nao, n) operand (C_occ / C_vir, all planes) once per launch."""
    n = planes[0].shape[1]
    return load_operand_tiles(planes, ktiles, 0, n, stationary=stationary, name=name)


def _first_half(aot, cocc, ktiles, gs, no, x3):
    """X[μ-tile] in SBUF: [(msz, gs·no)] per μ tile; for x3 a pair (X_A exact, X_R corrections)."""
    xs = []
    for m0, msz in ktiles:                          # μ tiles (same tiling as ν)
        accs = [nl.ndarray((msz, gs * no), dtype=nl.float32, buffer=nl.psum, name="x_acc")
                for _ in range(2 if x3 else 1)]
        for q in range(gs):
            c0, c1 = q * no, (q + 1) * no
            st = [tuple(p[:, q, m0:m0 + msz] for p in planes) for planes in aot]
            if not x3:
                matmul_planes((accs[0][:, c0:c1],), st, cocc)
            else:
                for s, m in zip(st, cocc):          # exact part: hi16 x hi16
                    nisa.nc_matmul(dst=accs[0][:, c0:c1], stationary=s[0], moving=m[0])
                for s, m in zip(st, cocc):          # corrections: hi x lo, lo x full
                    nisa.nc_matmul(dst=accs[1][:, c0:c1], stationary=s[1], moving=m[1])
                for s, m in zip(st, cocc):
                    nisa.nc_matmul(dst=accs[1][:, c0:c1], stationary=s[2], moving=m[2])
        sb = []
        for a in accs:
            t = nl.ndarray((msz, gs * no), dtype=nl.float32, buffer=nl.sbuf, name="x_sb")
            nisa.tensor_copy(dst=t, src=a)
            sb.append(t)
        xs.append(sb)
    return xs


def _resplit(xs, ktiles, ncols, nao, beta):
    """fp32x3: split X (= X_A + X_R, [μ, (P, i)]) into hi (bf16 grid per (P, i) column, constant along μ)
    and lo, back in the [μ, (P, i)] stationary layout: [(hi16, hi32, lo)] per μ tile."""
    out = [(nl.ndarray((msz, ncols), dtype=nl.bfloat16, buffer=nl.sbuf, name="xh16"),
            nl.ndarray((msz, ncols), dtype=nl.float32, buffer=nl.sbuf, name="xh32"),
            nl.ndarray((msz, ncols), dtype=nl.float32, buffer=nl.sbuf, name="xlo")) for _, msz in ktiles]
    for r0, rsz in tiles(ncols, PMAX):
        # pass 1: row maxima of |X_A + X_R| over all μ (row layout via TensorE transposes, 512 columns at a time)
        mx = nl.ndarray((rsz, 1), dtype=nl.float32, buffer=nl.sbuf, name="rowmax")
        nisa.memset(dst=mx, value=0.0)
        for c0, csz in tiles(nao, NFMAX):
            ta = _to_rows(xs, ktiles, 0, r0, rsz, c0, csz)
            ab = nl.ndarray((rsz, csz), dtype=nl.float32, buffer=nl.sbuf, name="absx")
            nisa.tensor_copy(dst=ab, src=_to_rows(xs, ktiles, 1, r0, rsz, c0, csz))
            nisa.tensor_tensor(dst=ab, data1=ta, data2=ab, op=nl.add)            # x = X_A + X_R
            nisa.activation(dst=ab, op=nl.abs, data=ab)
            part = nl.ndarray((rsz, 1), dtype=nl.float32, buffer=nl.sbuf, name="partmax")
            nisa.tensor_reduce(dst=part, op=nl.maximum, data=ab, axis=1)
            nisa.tensor_tensor(dst=mx, data1=mx, data2=part, op=nl.maximum)
        # grid 2^(e+1-β) with 2^e = 2^floor(log2 max): magic constant c = 1.5·2^23·grid per row
        pw = nl.ndarray((rsz, 1), dtype=nl.float32, buffer=nl.sbuf, name="pow2")
        nisa.tensor_scalar(dst=pw.view(nl.int32), data=mx.view(nl.int32), op0=nl.bitwise_and, operand0=EXP_MASK)
        magic = nl.ndarray((rsz, 1), dtype=nl.float32, buffer=nl.sbuf, name="magic")
        nisa.tensor_scalar(dst=magic, data=pw, op0=nl.multiply, operand0=MAGIC * 2.0 ** (1 - beta))
        # pass 2: hi = (x + c) − c (two fp32 writes: each result is rounded to fp32), lo = (X_A − hi) + X_R
        for c0, csz in tiles(nao, NFMAX):
            ta = _to_rows(xs, ktiles, 0, r0, rsz, c0, csz)
            tr = _to_rows(xs, ktiles, 1, r0, rsz, c0, csz)
            hi = nl.ndarray((rsz, csz), dtype=nl.float32, buffer=nl.sbuf, name="hi_rows")
            nisa.tensor_copy(dst=hi, src=tr)
            nisa.tensor_tensor(dst=hi, data1=ta, data2=hi, op=nl.add)            # x, then its grid point
            nisa.tensor_scalar(dst=hi, data=hi, op0=nl.add, operand0=magic)
            nisa.tensor_scalar(dst=hi, data=hi, op0=nl.subtract, operand0=magic)
            lo = nl.ndarray((rsz, csz), dtype=nl.float32, buffer=nl.sbuf, name="lo_rows")
            nisa.tensor_tensor(dst=lo, data1=ta, data2=hi, op=nl.subtract)        # exact
            nisa.tensor_tensor(dst=lo, data1=lo, data2=tr, op=nl.add)
            _from_rows(hi, out, ktiles, r0, rsz, c0, csz, (0, 1))
            _from_rows(lo, out, ktiles, r0, rsz, c0, csz, (2,))
    return out


def _to_rows(xs, ktiles, which, r0, rsz, c0, csz):
    """PSUM [rsz, csz] = transpose of X columns r0:r0+rsz for μ in [c0, c0+csz) (TensorE transposes)."""
    t = nl.ndarray((rsz, csz), dtype=nl.float32, buffer=nl.psum, name="x_rows")
    for kt, (m0, msz) in enumerate(ktiles):
        lo_, hi_ = max(m0, c0), min(m0 + msz, c0 + csz)
        if lo_ >= hi_:
            continue
        nisa.nc_transpose(dst=t[:, lo_ - c0:hi_ - c0], data=xs[kt][which][lo_ - m0:hi_ - m0, r0:r0 + rsz])
    return t


def _from_rows(rows, out, ktiles, r0, rsz, c0, csz, planes):
    """Transpose a [rsz, csz] row-layout SBUF tile back into out[μ tile][plane][:, r0:r0+rsz]."""
    for kt, (m0, msz) in enumerate(ktiles):
        lo_, hi_ = max(m0, c0), min(m0 + msz, c0 + csz)
        if lo_ >= hi_:
            continue
        tp = nl.ndarray((hi_ - lo_, rsz), dtype=nl.float32, buffer=nl.psum, name="x_cols")
        nisa.nc_transpose(dst=tp, data=rows[:, lo_ - c0:hi_ - c0])
        for pl in planes:
            nisa.tensor_copy(dst=out[kt][pl][lo_ - m0:hi_ - m0, r0:r0 + rsz], src=tp)


def _second_half(xst, cvir, ktiles, ncols, nv, outs, row0):
    """Y[(P,i) rows, a] = Σ_μ X[μ, rows]ᵀ C_vir[μ, a] -> ``outs[0]`` rows row0 + (P,i) (fp32x3: exact
    part to ``outs[0]``, corrections to ``outs[1]``). Full 128-row tiles are staged and stored with one
    DMA per column chunk."""
    rtiles = tiles(ncols, PMAX)
    nfull = sum(1 for _, r in rtiles if r == PMAX)
    for a0, asz in tiles(nv, NFMAX):
        stage = [nl.ndarray((PMAX, max(nfull, 1), asz), dtype=nl.float32, buffer=nl.sbuf, name="y_stage")
                 for _ in outs]
        mv = [tuple(p[:, a0:a0 + asz] for p in planes) for planes in cvir]
        for ri, (r0, rsz) in enumerate(rtiles):
            accs = [nl.ndarray((rsz, asz), dtype=nl.float32, buffer=nl.psum, name="y_acc") for _ in outs]
            st = [tuple(p[:, r0:r0 + rsz] for p in planes) for planes in xst]
            matmul_planes(accs, st, mv)
            for o, acc, sg in zip(outs, accs, stage):
                if rsz == PMAX:
                    nisa.tensor_copy(dst=sg[:, ri, :], src=acc)
                else:
                    evict(o[row0 + r0:row0 + r0 + rsz, a0:a0 + asz], acc, rsz, asz, name="y_sb")
        if nfull:
            for o, sg in zip(outs, stage):
                store_rows(o, row0, nfull * PMAX, a0, asz, sg)


@dataclass
class Transform(nl.NKIObject):
    """What every group of one launch shares: the AO planes in HBM, the resident C_occ/C_vir tiles, the
    sizes, the outputs ((out,), or (out, out_rest) for the x3 corrections) and the re-split grid bits."""

    ao_planes: tuple
    cocc: list
    cvir: list
    ktiles: list
    nao: int
    no: int
    nv: int
    x3: bool
    beta: int
    outs: tuple


def _body(ao_planes, co_planes, cv_planes, outs, group, beta):
    p, nao, _ = ao_planes[0].shape
    no = co_planes[0].shape[1]
    nv = cv_planes[0].shape[1]
    x3 = len(ao_planes) > 1
    assert no <= NFMAX, f"batched_gemm: {no} occupied orbitals exceed one PSUM bank ({NFMAX}); split them"
    ktiles = tiles(nao, PMAX)
    g = group if group else group_size(nao, no, nv, x3)
    job = Transform(ao_planes, _resident(co_planes, ktiles, stationary=False, name="c_occ"),
                    _resident(cv_planes, ktiles, stationary=False, name="c_vir"), ktiles, nao, no, nv, x3, beta,
                    outs)
    for g0 in range(0, p, g):
        _group(job, g0, min(g, p - g0))


def _group(job, g0, gs):
    """Both half-transforms for auxiliary functions g0 .. g0+gs of the launch."""
    aot = _load_ao_group(job.ao_planes, g0, gs, job.nao, job.ktiles, job.x3)
    xs = _first_half(aot, job.cocc, job.ktiles, gs, job.no, job.x3)
    if job.x3:
        xst = _resplit(xs, job.ktiles, gs * job.no, job.nao, job.beta)
    else:
        xst = [(x[0],) for x in xs]
    _second_half(xst, job.cvir, job.ktiles, gs * job.no, job.nv, job.outs, g0 * job.no)


@nki.jit
def batched_gemm(ao, c_occ, c_vir, group=0):
    """fp32: (P|μν) block (p, nao, nao) -> (P|ia) as (p·no, nv). ``group``: P per group (0 = auto)."""
    p = ao.shape[0]
    out = nl.ndarray((p * c_occ.shape[1], c_vir.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    _body((ao,), (c_occ,), (c_vir,), (out,), group, 0)
    return out


@nki.jit
def batched_gemm_x3(ao_hi, ao_lo, co_hi, co_lo, co, cv_hi, cv_lo, cv, beta, group=0):
    """fp32x3: planes of ao (hi bf16 / lo, split along ν per (P, μ)), C_occ and C_vir (hi / lo / full,
    split along the AO axis per column); ``beta``: grid bits of the on-chip re-split of X.
    Returns (y_exact, y_rest), (p·no, nv) float32 each; (P|ia) = y_exact + y_rest (fp64 on the host)."""
    p = ao_hi.shape[0]
    out = nl.ndarray((p * co.shape[1], cv.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    out_rest = nl.ndarray((p * co.shape[1], cv.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    _body((ao_hi, ao_lo), (co_hi, co_lo, co), (cv_hi, cv_lo, cv), (out, out_rest), group, beta)
    return out, out_rest


def batched_gemm_reference(ao: np.ndarray, c_occ: np.ndarray, c_vir: np.ndarray) -> np.ndarray:
    """NumPy reference (fp64): (p·no, nv) = C_occᵀ (P|μν) C_vir stacked over P."""
    ao = np.asarray(ao, dtype=np.float64)
    y = np.einsum("pmn,mi,na->pia", ao, np.asarray(c_occ, np.float64), np.asarray(c_vir, np.float64),
                  optimize=True)
    return y.reshape(-1, c_vir.shape[1])
