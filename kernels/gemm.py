"""gemm — ``C[M, N] = A_T[K, M]ᵀ · B[K, N]`` on TensorE (NKI 0.3.0); its body is shared with trsm.

Dimensions
    K: contraction length (the SBUF partition axis of both operands), M: rows of C, N: columns of C.
    Arbitrary sizes (no multiple-of-128 requirement): edge tiles are partition/free slices.

Args
    a_t (K, M), b (K, N): float32 in HBM, row-major — K leading, so every K tile lands on the 128 SBUF
    partitions without a transpose, exactly the [K, M] stationary / [K, N] moving form of
    ``nisa.nc_matmul``. m_block / n_width: M tiles per resident panel, B columns per streamed chunk
    (None: :func:`~mp2trn.kernels.tiles.plan_panels` chooses them from the target's SBUF).
    ``gemm_x3``: the compensated planes (a_t_hi, a_t_lo, b_hi, b_lo, b), see below.
    width: 0, or B's N columns as G = N/width groups whose products are written as blocks of rows (below).

Returns
    c (M, N) float32 in HBM (``gemm_x3``: the pair (c_exact, c_rest), c = c_exact + c_rest in fp64); with
    ``width``, (G·M, width): c[g·M + m, j] = (A_Tᵀ B)[m, g·width + j] — a batched product with a shared
    stationary operand, each group's result laid out for a next GEMM contracting over (g, m). The column
    chunks then hold whole groups, and each panel's row tiles leave through one access pattern.

Engines
    DMA: HBM→SBUF panel/chunk loads (≥ 2 KiB per partition per transfer), SBUF→HBM result tiles.
    TensorE: ``nc_matmul`` with fp32 accumulation over the K tiles in one PSUM bank (``accumulate=None``:
    the first matmul into a fresh PSUM tile overwrites, the rest accumulate).
    VectorE: PSUM→SBUF eviction (``tensor_copy``) — DMA cannot read PSUM.

Pseudocode
    for each panel of m_block M tiles:                    # A_T panel resident in SBUF
        load A_T[:, panel]                                # one DMA per plane
        for each chunk of n_width columns of B:
            load B[:, chunk]                              # one DMA per plane
            for each M tile of the panel:
                acc[M tile, chunk] = Σ_k A_T[k, M tile]ᵀ B[k, chunk]      # PSUM
                stage acc in SBUF                         # VectorE
            store the panel's tiles of C[:, chunk]        # one DMA

Tiling
    K in tiles of 128 (partition dim), M in tiles of 128 (stationary free dim, ``gemm_stationary_fmax``),
    N in chunks of ≤ 512 (moving free dim ≤ one 2 KiB PSUM bank of fp32, ``gemm_moving_fmax``).
    A block of M-tiles of A_T ("panel": all K tiles × up to ``m_block`` M-tiles) is loaded once and stays
    resident in SBUF while every N chunk of B streams past it; each B chunk (all K tiles) is loaded once
    per panel and reused by every M-tile of the panel. All full K tiles of a panel or chunk arrive in ONE
    ``dma_copy`` (access pattern [row in tile, tile, column]) and the full output tiles of a panel leave
    in one: DMAs have a fixed cost. Panel height and chunk width are chosen together from the SBUF budget
    of the target generation (``total_available_sbuf_size``) to minimize the bytes streamed from HBM
    (:func:`plan_panels`).

Trainium features exploited
    PSUM near-memory accumulation (no partial sums through SBUF), SBUF residency of the A panel and the
    B chunk (each HBM byte is read once per panel), DMA/TensorE/VectorE overlap across tiles.

Compensated precision (``gemm_x3``, precision mode "fp32x3", see docs/precision.md)
    Each operand X (fp64 on the host) arrives as planes ``x_hi`` (bfloat16) + ``x_lo`` (float32) [+ ``x``
    (float32) on the moving side], where ``x_hi`` lies on a power-of-two grid that is constant along the
    contraction axis (per output row / column, Ozaki-style), with at most β significant bits, and
    ``x_lo = fp32(X − x_hi)``. Then, in ONE PSUM accumulator::

        C = Σ_k a_hi·b_hi        (bf16 matmuls: every product and every partial sum is an integer
                                  multiple of the grid < 2^24 — exact in the fp32 PSUM)
          + Σ_k a_hi·b_lo        (fp32 matmuls; a_hi as fp32 is made on chip by GpSimd)
          + Σ_k a_lo·b           (fp32 matmuls)

    The exact part is accumulated first, so the only roundings are those of the correction terms, which
    are 2^-β smaller than the operands: the fp32 cancellation error of a plain fp32 GEMM shrinks by 2^β.
    β = ⌊(24 − ⌈log2 K⌉) / 2⌋ (≤ 8) keeps Σ_K |n_a n_b| < 2^24. When the result leaves the chip
    (gemm_x3, trsm_x3, batched_gemm_x3) the exact part and the corrections stay in two PSUM accumulators
    and both planes are written, so the result is not even rounded to fp32 (the host adds them in fp64);
    a result consumed on chip (T in mp2_energy) uses one accumulator, exact part first.

NumPy reference: :func:`gemm_reference`. Tests: tests/test_kernel_gemm.py.
"""

from __future__ import annotations

import numpy as np

from ._nki import nki, nisa, nl
from .tiles import (MFMAX, PMAX, column_views, evict, group_chunks, grouped_rows, load_operand_tiles, matmul_planes,
                    plan_panels, store_rows, tiles)

__all__ = ["gemm", "gemm_x3", "gemm_reference", "gemm_body"]

def gemm_body(a_planes, b_planes, outs, lower=False, m_block=0, n_width=0, width=0):
    """Shared body of gemm/gemm_x3/trsm: ``outs[0][M, N] = A_Tᵀ B`` with A_T given by ``a_planes`` and B by
    ``b_planes`` (HBM). ``lower=True``: A_T is block upper-triangular with the same tiling on K and M
    (A = A_Tᵀ lower triangular), so K tiles above the output tile's M tile are skipped entirely (never
    loaded, never multiplied). ``m_block``: M tiles per resident panel (0: from the SBUF budget).
    ``outs``: (out,), or (out, out_rest) for fp32x3: the exact hi·hi part goes to ``out`` and the
    corrections to ``out_rest``. ``n_width``: columns of B per streamed chunk (0: chosen with the panel
    height, :func:`plan_panels`). ``width`` > 0: B's columns are G groups of ``width`` and ``outs`` are
    (G·M, width): C[m, g·width + c] is written to out[g·M + m, c] (the chunks never cut a group that fits in
    one)."""
    K, M = a_planes[0].shape
    N = b_planes[0].shape[1]
    ktiles = tiles(K, PMAX)
    mtiles = tiles(M, MFMAX)
    x3 = len(a_planes) > 1
    if m_block == 0 or n_width == 0:
        m_block, n_width = plan_panels(len(ktiles), len(mtiles), N, x3, m_block)
    ntiles = group_chunks(N, width, n_width) if width else tiles(N, n_width)
    for mb0 in range(0, len(mtiles), m_block):
        blk = mtiles[mb0:mb0 + m_block]
        c0 = blk[0][0]
        csz = blk[-1][0] + blk[-1][1] - c0
        kmax = len(ktiles) if not lower else mb0 + len(blk)    # K tiles any output tile of the block needs
        panel = load_operand_tiles(a_planes, ktiles[:kmax], c0, csz, stationary=True, name="a_panel")
        for n0, nsz in ntiles:
            chunk = load_operand_tiles(b_planes, ktiles[:kmax], n0, nsz, stationary=False, name="b_chunk")
            nfull = sum(1 for _, msz in blk if msz == MFMAX)
            stage = [nl.ndarray((MFMAX, max(nfull, 1), nsz), dtype=nl.float32, buffer=nl.sbuf, name="res_panel")
                     for _ in outs]
            for bi, (m0, msz) in enumerate(blk):
                kk = kmax if not lower else mb0 + bi + 1
                accs = [nl.ndarray((msz, nsz), dtype=nl.float32, buffer=nl.psum, name="acc") for _ in outs]
                matmul_planes(accs, column_views(panel[:kk], m0 - c0, msz), chunk[:kk])
                for o, acc, st in zip(outs, accs, stage):
                    if msz == MFMAX:                          # full tiles: staged, one store per panel
                        nisa.tensor_copy(dst=st[:, bi, :], src=acc)
                    elif width:                               # the short last M tile: its own store
                        evict(grouped_rows(o, M, width, m0, msz, 0, n0, nsz), acc, msz, nsz)
                    else:
                        evict(o[m0:m0 + msz, n0:n0 + nsz], acc, msz, nsz)
            if nfull:
                for o, st in zip(outs, stage):
                    if width:
                        nisa.dma_copy(dst=grouped_rows(o, M, width, c0, MFMAX, nfull, n0, nsz), src=st)
                    else:
                        store_rows(o, c0, nfull * MFMAX, n0, nsz, st)


# ------------------------------------------------------------------------------------------------------
# kernels


def _out_shape(M, N, width):
    """(M, N), or (G·M, width) for B's columns in G groups of ``width`` (see ``gemm``)."""
    if not width:
        return (M, N)
    assert N % width == 0, f"gemm: {N} columns are not whole groups of {width}"
    return (N // width * M, width)


@nki.jit
def gemm(a_t, b, m_block=0, n_width=0, width=0):
    """``c = a_tᵀ @ b`` in fp32: a_t (K, M), b (K, N) float32 HBM -> c (M, N) float32. ``width`` > 0: b's
    columns are G = N/width groups and c comes out (G·M, width), c[g·M + m, j] = (a_tᵀ b)[m, g·width + j] —
    each group's product as a block of rows (a batched product with a shared stationary operand, its
    results laid out for a next GEMM that contracts over (g, m))."""
    K, M = a_t.shape
    K2, N = b.shape
    assert K == K2, f"gemm: contraction mismatch {a_t.shape} vs {b.shape}"
    c = nl.ndarray(_out_shape(M, N, width), dtype=nl.float32, buffer=nl.shared_hbm)
    gemm_body((a_t,), (b,), (c,), lower=False, m_block=m_block, n_width=n_width, width=width)
    return c


@nki.jit
def gemm_x3(a_t_hi, a_t_lo, b_hi, b_lo, b, m_block=0, n_width=0, width=0):
    """Compensated ``c = a_tᵀ @ b`` (fp32x3): a_t = a_t_hi (bf16 grid) + a_t_lo (fp32); b = b_hi + b_lo,
    b (fp32) — see the module docstring. Returns (c_exact, c_rest), (M, N) float32 each (``width``: (G·M,
    width), as ``gemm``): c = c_exact + c_rest, to be added in fp64 (the pair carries ~fp32·2^-β relative
    accuracy)."""
    K, M = a_t_hi.shape
    N = b.shape[1]
    shape = _out_shape(M, N, width)
    c = nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)
    c_rest = nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)
    gemm_body((a_t_hi, a_t_lo), (b_hi, b_lo, b), (c, c_rest), lower=False, m_block=m_block, n_width=n_width,
              width=width)
    return c, c_rest


def gemm_reference(a_t: np.ndarray, b: np.ndarray, width: int = 0) -> np.ndarray:
    """NumPy reference: ``a_tᵀ @ b`` in float64 (``width``: regrouped to (G·M, width) as ``gemm``)."""
    c = np.asarray(a_t, dtype=np.float64).T @ np.asarray(b, dtype=np.float64)
    if not width:
        return c
    m, n = c.shape
    return c.reshape(m, n // width, width).transpose(1, 0, 2).reshape(-1, width)
