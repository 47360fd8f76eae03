"""gemm — ``C[M, N] = A_T[K, M]ᵀ · B[K, N]`` on TensorE (NKI 0.3.0), plus the tile helpers the other
mp2trn kernels share.

Shapes and layout
    a_t (K, M) and b (K, N) in HBM, row-major, float32 (``gemm``) — the contraction index K is the leading
    axis of both operands, so every K-tile lands on the 128 SBUF partitions without a transpose, exactly
    the [K, M] stationary / [K, N] moving form ``nisa.nc_matmul`` wants. c (M, N) float32 in HBM.
    K, M, N are arbitrary (no multiple-of-128 requirement): edge tiles are partition/free slices.

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

Engines
    DMA: HBM→SBUF panel/chunk loads (≥ 2 KiB per partition per transfer), SBUF→HBM result tiles.
    TensorE: ``nc_matmul`` with fp32 accumulation over the K tiles in one PSUM bank (``accumulate=None``:
    the first matmul into a fresh PSUM tile overwrites, the rest accumulate).
    VectorE: PSUM→SBUF eviction (``tensor_copy``) — DMA cannot read PSUM.

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

PMAX = 128      # nl.tile_size.pmax
MFMAX = 128     # nl.tile_size.gemm_stationary_fmax
NFMAX = 512     # nl.tile_size.gemm_moving_fmax == psum_fmax (fp32 elements in one PSUM bank)
FP32 = 4
MAGIC = 1.5 * 2.0 ** 23          # fl(fl(x + MAGIC·g) − MAGIC·g) rounds x to a multiple of g (|x| < 2^22·g)
EXP_MASK = 0x7F800000           # fp32 exponent bits: (bits & mask) reinterpreted = 2^floor(log2 |x|)

__all__ = ["gemm", "gemm_x3", "gemm_reference", "tiles", "gemm_body", "load_rows", "load_operand_tiles",
           "matmul_planes", "evict", "sbuf_budget"]


# ------------------------------------------------------------------------------------------------------
# shared helpers (sub-kernels: plain functions called from @nki.jit kernels, never jitted themselves)


def tiles(n, size):
    """[(start, length)] covering range(n) in pieces of at most ``size`` (the last one may be shorter)."""
    return [(s, min(size, n - s)) for s in range(0, n, size)]


def sbuf_budget(fraction=0.85):
    """Bytes per partition this kernel may plan for: a share of ``total_available_sbuf_size`` of the
    target generation (180224 B trn1, 212984 B trn2), leaving room for allocator fragmentation."""
    return int(nl.tile_size.total_available_sbuf_size * fraction)


def load_rows(src, r0, rsz, c0, csz, dtype, name=""):
    """DMA ``src[r0:r0+rsz, c0:c0+csz]`` (HBM, 2-D) into a fresh SBUF tile [rsz, csz]."""
    t = nl.ndarray((rsz, csz), dtype=dtype, buffer=nl.sbuf, name=name)
    nisa.dma_copy(dst=t, src=src[r0:r0 + rsz, c0:c0 + csz])
    return t


def load_ktiles(src, ktiles, c0, csz, dtype, name=""):
    """Columns c0:c0+csz of every K tile of the 2-D HBM tensor ``src`` (K, ·) -> list of [ksz, csz]
    SBUF views. All full 128-row tiles arrive in ONE dma_copy through an access pattern
    (partition = row within the tile, then tile, then column) into an SBUF tile [128, ntiles, csz];
    a shorter last tile gets its own transfer. Fewer, larger DMAs: each transfer has a fixed cost."""
    ncols = src.shape[1]
    full = [t for t in ktiles if t[1] == PMAX]
    out = []
    if full:
        k0 = full[0][0]
        big = nl.ndarray((PMAX, len(full), csz), dtype=dtype, buffer=nl.sbuf, name=name)
        nisa.dma_copy(dst=big, src=src.ap([[ncols, PMAX], [PMAX * ncols, len(full)], [1, csz]],
                                          offset=k0 * ncols + c0))
        out = [big[:, i, :] for i in range(len(full))]
    for k0, ksz in ktiles[len(full):]:
        out.append(load_rows(src, k0, ksz, c0, csz, dtype, name))
    return out


def load_operand_tiles(planes, ktiles, c0, csz, stationary, name=""):
    """Load one operand (a tuple of HBM planes, all (K, ·)) for columns c0:c0+csz as a list over K-tiles
    of plane tuples ready for :func:`matmul_planes`.

    fp32:    planes = (x,)                        -> [(x_k,)]
    fp32x3:  stationary planes = (x_hi, x_lo)     -> [(hi16_k, hi32_k, lo_k)]  (hi32 = GpSimd copy of hi16)
             moving planes     = (x_hi, x_lo, x)  -> [(hi16_k, lo_k, x_k)]
    ``ktiles`` must be full 128-row tiles except possibly the last one.
    """
    if len(planes) == 1:
        return [(t,) for t in load_ktiles(planes[0], ktiles, c0, csz, nl.float32, name)]
    hi16 = load_ktiles(planes[0], ktiles, c0, csz, nl.bfloat16, name + "_hi")
    lo = load_ktiles(planes[1], ktiles, c0, csz, nl.float32, name + "_lo")
    if stationary:
        out = []
        for h, l_ in zip(hi16, lo):
            hi32 = nl.ndarray(h.shape, dtype=nl.float32, buffer=nl.sbuf, name=name + "_hi32")
            nisa.tensor_copy(dst=hi32, src=h, engine=nisa.gpsimd_engine)   # exact widening
            out.append((h, hi32, l_))
        return out
    full = load_ktiles(planes[2], ktiles, c0, csz, nl.float32, name + "_x")
    return list(zip(hi16, lo, full))


def store_rows(dst, r0, rows, n0, nsz, tiles_sb, name=""):
    """Write output row tiles to ``dst`` (2-D HBM) rows r0.., columns n0:n0+nsz: ``tiles_sb`` is an SBUF
    tile [128, n, nsz] holding n full 128-row tiles (one dma_copy through an access pattern) — the
    counterpart of :func:`load_ktiles`."""
    ncols = dst.shape[1]
    nisa.dma_copy(dst=dst.ap([[ncols, PMAX], [PMAX * ncols, rows // PMAX], [1, nsz]], offset=r0 * ncols + n0),
                  src=tiles_sb)


def matmul_planes(acc, stationary, moving, acc_rest=None):
    """Accumulate Σ_k stationary_kᵀ · moving_k into the PSUM tile ``acc``.

    ``stationary``/``moving``: lists (over K tiles) of plane tuples of *views* (see
    :func:`load_operand_tiles`). One plane: plain fp32 matmuls. Three planes (fp32x3): all exact
    hi·hi bf16 products first, then hi·lo and lo·x in fp32 — into the same accumulator, or, with
    ``acc_rest``, the corrections into that second accumulator (the result is then the *pair*
    ``acc + acc_rest``, kept apart so it can leave the chip with more than fp32 precision).
    """
    if len(stationary[0]) == 1:
        for s, m in zip(stationary, moving):
            nisa.nc_matmul(dst=acc, stationary=s[0], moving=m[0])
        return
    rest = acc if acc_rest is None else acc_rest
    for s, m in zip(stationary, moving):
        nisa.nc_matmul(dst=acc, stationary=s[0], moving=m[0])      # hi16 x hi16: exact in PSUM
    for s, m in zip(stationary, moving):
        nisa.nc_matmul(dst=rest, stationary=s[1], moving=m[1])     # hi(fp32) x lo
    for s, m in zip(stationary, moving):
        nisa.nc_matmul(dst=rest, stationary=s[2], moving=m[2])     # lo x full


def evict(dst_hbm, acc, rows, cols, name="res"):
    """PSUM accumulator -> SBUF (VectorE) -> HBM (DMA). DMA cannot read PSUM in NKI 0.3.0."""
    res = nl.ndarray((rows, cols), dtype=nl.float32, buffer=nl.sbuf, name=name)
    nisa.tensor_copy(dst=res, src=acc)
    nisa.dma_copy(dst=dst_hbm, src=res)


def plan_panels(nk, nm, N, x3, m_block=None, budget=None):
    """(M tiles per resident A panel, column-chunk width of B) minimizing the bytes streamed from HBM:
    B is read once per panel, so taller panels mean less traffic; a narrower B chunk (double-buffered)
    leaves SBUF for a taller panel. Widths 512/256/128 (a chunk of ≥ 128 moving columns keeps TensorE
    at full rate in the cost model, max(64, N))."""
    a_bytes = 10 if x3 else FP32           # per stationary element in SBUF (hi16 + hi32 + lo)
    b_bytes = 10 if x3 else FP32           # per moving element (hi16 + lo + x)
    outs = 2 if x3 else 1
    budget = sbuf_budget() if budget is None else budget
    best = None
    for width in (NFMAX, 256, 128):
        if width > max(N, 1) and width != NFMAX:
            continue
        fixed = 2 * nk * width * b_bytes + 2 * outs * 4 * width * FP32
        mb = m_block or max(1, (budget - fixed) // (nk * MFMAX * a_bytes))
        panels = -(-nm // mb)
        key = (panels, -width)
        if best is None or key < best[0]:
            best = (key, mb, width)
        if m_block:
            break
    return best[1], best[2]


def _views(tile_list, c0, csz):
    return [tuple(p[:, c0:c0 + csz] for p in planes) for planes in tile_list]


def gemm_body(a_planes, b_planes, out, lower=False, m_block=None, out_rest=None, n_width=None):
    """Shared body of gemm/gemm_x3/trsm: ``out[M, N] = A_Tᵀ B`` with A_T given by ``a_planes`` and B by
    ``b_planes`` (HBM). ``lower=True``: A_T is block upper-triangular with the same tiling on K and M
    (A = A_Tᵀ lower triangular), so K tiles above the output tile's M tile are skipped entirely (never
    loaded, never multiplied). ``m_block``: M tiles per resident panel (None: from the SBUF budget).
    ``out_rest`` (fp32x3): the exact hi·hi part goes to ``out`` and the corrections to ``out_rest``.
    ``n_width``: columns of B per streamed chunk (None: chosen with the panel height, :func:`plan_panels`)."""
    K, M = a_planes[0].shape
    N = b_planes[0].shape[1]
    ktiles = tiles(K, PMAX)
    mtiles = tiles(M, MFMAX)
    x3 = len(a_planes) > 1
    if m_block is None or n_width is None:
        m_block, n_width = plan_panels(len(ktiles), len(mtiles), N, x3, m_block)
    ntiles = tiles(N, n_width)
    for mb0 in range(0, len(mtiles), m_block):
        blk = mtiles[mb0:mb0 + m_block]
        c0 = blk[0][0]
        csz = blk[-1][0] + blk[-1][1] - c0
        kmax = len(ktiles) if not lower else mb0 + len(blk)    # K tiles any output tile of the block needs
        panel = load_operand_tiles(a_planes, ktiles[:kmax], c0, csz, stationary=True, name="a_panel")
        for n0, nsz in ntiles:
            chunk = load_operand_tiles(b_planes, ktiles[:kmax], n0, nsz, stationary=False, name="b_chunk")
            nfull = sum(1 for _, msz in blk if msz == MFMAX)
            outs = [out] if out_rest is None else [out, out_rest]
            stage = [nl.ndarray((MFMAX, max(nfull, 1), nsz), dtype=nl.float32, buffer=nl.sbuf, name="res_panel")
                     for _ in outs]
            for bi, (m0, msz) in enumerate(blk):
                kk = kmax if not lower else mb0 + bi + 1
                accs = [nl.ndarray((msz, nsz), dtype=nl.float32, buffer=nl.psum, name="acc") for _ in outs]
                matmul_planes(accs[0], _views(panel[:kk], m0 - c0, msz), chunk[:kk], accs[1] if len(accs) > 1 else None)
                for o, acc, st in zip(outs, accs, stage):
                    if msz == MFMAX:                          # full tiles: staged, one store per panel
                        nisa.tensor_copy(dst=st[:, bi, :], src=acc)
                    else:                                     # the short last M tile: its own store
                        evict(o[m0:m0 + msz, n0:n0 + nsz], acc, msz, nsz)
            if nfull:
                for o, st in zip(outs, stage):
                    store_rows(o, c0, nfull * MFMAX, n0, nsz, st)


# ------------------------------------------------------------------------------------------------------
# kernels


@nki.jit
def gemm(a_t, b, m_block=None, n_width=None):
    """``c = a_tᵀ @ b`` in fp32: a_t (K, M), b (K, N) float32 HBM -> c (M, N) float32."""
    K, M = a_t.shape
    K2, N = b.shape
    assert K == K2, f"gemm: contraction mismatch {a_t.shape} vs {b.shape}"
    c = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    gemm_body((a_t,), (b,), c, lower=False, m_block=m_block, n_width=n_width)
    return c


@nki.jit
def gemm_x3(a_t_hi, a_t_lo, b_hi, b_lo, b, m_block=None, n_width=None):
    """Compensated ``c = a_tᵀ @ b`` (fp32x3): a_t = a_t_hi (bf16 grid) + a_t_lo (fp32); b = b_hi + b_lo,
    b (fp32) — see the module docstring. Returns (c_exact, c_rest), (M, N) float32 each:
    c = c_exact + c_rest, to be added in fp64 (the pair carries ~fp32·2^-β relative accuracy)."""
    K, M = a_t_hi.shape
    N = b.shape[1]
    c = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    c_rest = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    gemm_body((a_t_hi, a_t_lo), (b_hi, b_lo, b), c, lower=False, m_block=m_block, out_rest=c_rest, n_width=n_width)
    return c, c_rest


def gemm_reference(a_t: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy reference: ``a_tᵀ @ b`` in float64."""
    return np.asarray(a_t, dtype=np.float64).T @ np.asarray(b, dtype=np.float64)
