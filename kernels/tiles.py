"""Tile helpers shared by the mp2trn kernels: sub-kernels (plain functions called from ``@nki.jit``
kernels and inlined by the compiler, never jitted themselves) and the compile-time planning they use.

Dimensions
    K: contraction length (partition axis, tiles of ``PMAX`` = 128). M: stationary free size (tiles of
    ``MFMAX`` = 128). N: moving free size (chunks of ≤ ``NFMAX`` = 512 fp32, one 2 KiB PSUM bank).

Helpers (engine)
    load_rows / load_ktiles / load_operand_tiles   HBM → SBUF (DMA; GpSimd widens hi planes to fp32)
    ktile_buffer / refill_ktiles                    K-tile buffers allocated once, refilled per use (DMA)
    load_column_runs                                several column runs of every K tile in one DMA
    store_rows                                      SBUF → HBM (DMA, one access pattern per panel)
    group_chunks / grouped_rows                     column chunks and output views of a GEMM whose columns
                                                    come in groups written as row blocks (``gemm(width=w)``)
    matmul_planes                                   Σ_k stationaryᵀ·moving into PSUM (TensorE)
    evict                                           PSUM → SBUF (VectorE) → HBM (DMA)
    broadcast_row                                   an HBM row on every partition (DMA with partition step 0,
                                                    or one DMA + a TensorE ones matmul)
    tiles / plan_panels / sbuf_budget               host-side (compile-time) tiling arithmetic

Operands are tuples of *planes*: ``(x,)`` in fp32, or the compensated planes of :mod:`mp2trn.precision`
(stationary (hi, lo), moving (hi, lo, x)); see kernels/gemm.py for the arithmetic.
"""

from __future__ import annotations

from ._nki import nisa, nl

PMAX = 128      # nl.tile_size.pmax
MFMAX = 128     # nl.tile_size.gemm_stationary_fmax
NFMAX = 512     # nl.tile_size.gemm_moving_fmax == psum_fmax (fp32 elements in one PSUM bank)
FP32 = 4
MAGIC = 1.5 * 2.0 ** 23          # fl(fl(x + MAGIC·g) − MAGIC·g) rounds x to a multiple of g (|x| < 2^22·g)
EXP_MASK = 0x7F800000           # fp32 exponent bits: (bits & mask) reinterpreted = 2^floor(log2 |x|)

__all__ = ["broadcast_row", "PMAX", "MFMAX", "NFMAX", "FP32", "MAGIC", "EXP_MASK", "tiles", "sbuf_budget", "load_rows", "load_ktiles",
           "load_operand_tiles", "store_rows", "matmul_planes", "evict", "plan_panels", "column_views",
           "full_ktiles", "ktile_buffer", "refill_ktiles", "load_column_runs", "group_chunks", "grouped_rows"]


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


def full_ktiles(ktiles):
    """How many of the K tiles are full 128-row tiles (all but possibly the last)."""
    n = 0
    for _, ksz in ktiles:
        if ksz == PMAX:
            n += 1
    return n


def ktile_buffer(ktiles, ncol, name):
    """SBUF buffers for ``ncol`` fp32 columns of every K tile (one [128, nfull, ncol] tile for the full tiles,
    one for a short last tile), allocated once and refilled by :func:`refill_ktiles` — the counterpart of
    :func:`load_ktiles` for data that changes inside a launch. Returns (full, tail, views per K tile)."""
    nfull = full_ktiles(ktiles)
    full = nl.ndarray((PMAX, max(nfull, 1), ncol), dtype=nl.float32, buffer=nl.sbuf, name=name)
    tail = None
    if nfull < len(ktiles):
        tail = nl.ndarray((ktiles[-1][1], ncol), dtype=nl.float32, buffer=nl.sbuf, name=name + "_tail")
    views = [full[:, q, :] for q in range(nfull)] + ([tail] if nfull < len(ktiles) else [])
    return full, tail, views


def refill_ktiles(full, tail, src, ktiles, c0, csz):
    """src[:, c0:c0+csz] (HBM (K, ·)) into the buffers of :func:`ktile_buffer`: all full K tiles in one
    access-pattern DMA, a short last tile in one more."""
    ncols = src.shape[1]
    nfull = full_ktiles(ktiles)
    if nfull:
        nisa.dma_copy(dst=full, src=src.ap([[ncols, PMAX], [PMAX * ncols, nfull], [1, csz]], offset=c0))
    if nfull < len(ktiles):
        q0, qsz = ktiles[-1]
        nisa.dma_copy(dst=tail, src=src[q0:q0 + qsz, c0:c0 + csz])


def load_column_runs(src, ktiles, c0, csz, stride, count, name):
    """Columns c0 + m·stride + (0 .. csz) of ``src`` (K, ·) for m < count: per K tile a [ksz, count, csz] SBUF
    view; all full 128-row tiles arrive in ONE dma_copy (4-level access pattern), a short last tile in one
    more (the counterpart of :func:`load_ktiles` for several column runs)."""
    ncols = src.shape[1]
    full = [t for t in ktiles if t[1] == PMAX]
    out = []
    if full:
        big = nl.ndarray((PMAX, len(full), count, csz), dtype=nl.float32, buffer=nl.sbuf, name=name)
        nisa.dma_copy(dst=big, src=src.ap([[ncols, PMAX], [PMAX * ncols, len(full)], [stride, count], [1, csz]],
                                          offset=full[0][0] * ncols + c0))
        out = [big[:, q, :, :] for q in range(len(full))]
    for k0, ksz in ktiles[len(full):]:
        t = nl.ndarray((ksz, count, csz), dtype=nl.float32, buffer=nl.sbuf, name=name)
        nisa.dma_copy(dst=t, src=src.ap([[ncols, ksz], [stride, count], [1, csz]], offset=k0 * ncols + c0))
        out.append(t)
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


def group_chunks(n, width, chunk):
    """Column chunks of ≤ ``chunk`` columns over ``n`` = G·``width`` columns that never cut a group of
    ``width`` columns unless a group is wider than a chunk: whole groups per chunk (⌊chunk/width⌋ of them),
    else pieces of one group."""
    if width <= chunk:
        step = (chunk // width) * width
        return [(s, min(step, n - s)) for s in range(0, n, step)]
    return [(g + s, sz) for g in range(0, n, width) for s, sz in tiles(width, chunk)]


def grouped_rows(dst, m, width, r0, prows, ntile, n0, nsz):
    """The HBM view of ``dst`` (G·m, width) that holds rows r0 .. of C (m, G·width), columns n0:n0+nsz,
    with C[r, g·width + c] at dst[g·m + r, c]: [prows partitions (rows), ntile row tiles of 128 (0: no
    tile level), columns] — one access pattern, so a panel's row tiles leave in one DMA. The columns are
    whole groups or a piece of one group (:func:`group_chunks`)."""
    g, c = divmod(n0, width)
    levels = [[width, prows]] + ([[PMAX * width, ntile]] if ntile else [])
    if c + nsz > width:                       # several whole groups
        assert c == 0 and nsz % width == 0, "grouped_rows: a chunk crossing groups must hold whole groups"
        levels += [[m * width, nsz // width], [1, width]]
    else:
        levels += [[1, nsz]]
    return dst.ap(levels, offset=(g * m + r0) * width + c)


def matmul_planes(accs, stationary, moving):
    """Accumulate Σ_k stationary_kᵀ · moving_k into the PSUM tile ``accs[0]``.

    ``stationary``/``moving``: lists (over K tiles) of plane tuples of *views* (see
    :func:`load_operand_tiles`). One plane: plain fp32 matmuls. Three planes (fp32x3): all exact
    hi·hi bf16 products first, then hi·lo and lo·x in fp32 — into the same accumulator, or, when
    ``accs`` holds two tiles, the corrections into ``accs[1]`` (the result is then the *pair*
    ``accs[0] + accs[1]``, kept apart so it can leave the chip with more than fp32 precision).
    """
    acc, rest = accs[0], accs[-1]
    if len(stationary[0]) == 1:
        for s, m in zip(stationary, moving):
            nisa.nc_matmul(dst=acc, stationary=s[0], moving=m[0])
        return
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


def plan_panels(nk, nm, N, x3, m_block=0, budget=0):
    """(M tiles per resident A panel, column-chunk width of B) minimizing the bytes streamed from HBM:
    B is read once per panel, so taller panels mean less traffic; a narrower B chunk (double-buffered)
    leaves SBUF for a taller panel. Widths 512/256/128 (a chunk of ≥ 128 moving columns keeps TensorE
    at full rate in the cost model, max(64, N))."""
    a_bytes = 10 if x3 else FP32           # per stationary element in SBUF (hi16 + hi32 + lo)
    b_bytes = 10 if x3 else FP32           # per moving element (hi16 + lo + x)
    outs = 2 if x3 else 1
    budget = budget or sbuf_budget()
    best = ((nm + 1, 0), 1, NFMAX)                 # worse than any real plan
    for width in (NFMAX, 256, 128):
        if width > max(N, 1) and width != NFMAX:
            continue
        fixed = 2 * nk * width * b_bytes + 2 * outs * 4 * width * FP32
        # per M tile of the panel: its A columns (all K tiles) and its staged output row block ("res_panel",
        # width fp32 per partition per output, two alive: the chunk being stored and the next), which with
        # few K tiles outweighs the A columns
        a_tile, stage_tile = nk * MFMAX * a_bytes, 2 * outs * width * FP32
        mb = m_block or max(1, (budget - fixed) // (a_tile + stage_tile))
        if not m_block and mb < nm:    # several panels: the next is loaded while the last is still alive
            mb = max(1, (budget - fixed) // (2 * a_tile + stage_tile))
        panels = -(-nm // mb)
        key = (panels, -width)
        if key < best[0]:
            best = (key, mb, width)
        if m_block:
            break
    return best[1], best[2]


def k_tiles_that_fit(nm, N, x3, budget=0):
    """The most K tiles one ``gemm``/``gemm_x3`` launch can take: a panel of one M tile (all K tiles; two
    alive when there are several panels), the B chunk as wide as the kernel streams it (double-buffered)
    and the staged output row block must fit the SBUF budget. A longer contraction is split over launches by
    the host, whose fp64 sum of their outputs is the product."""
    a_bytes = b_bytes = 10 if x3 else FP32
    outs = 2 if x3 else 1
    budget = budget or sbuf_budget()
    nsz = min(max(N, 1), NFMAX)
    per_k = 2 * nsz * b_bytes + (2 if nm > 1 else 1) * MFMAX * a_bytes
    return max(1, (budget - 2 * outs * nsz * FP32) // per_k)


def column_views(tile_list, c0, csz):
    """Columns c0:c0+csz of every plane of every K tile (views, no copies)."""
    return [tuple(p[:, c0:c0 + csz] for p in planes) for planes in tile_list]


def broadcast_row(dst, src, offset, n, ones_row, dma):
    """dst[p, :] = src[offset:offset + n] (HBM, row-major) for every partition p of ``dst`` (PMAX, n).

    ``dma``: one DMA whose partition step is 0 (reads the HBM row PMAX times; legal for HBM sources, as
    AWS's nki-library does). Otherwise the documented fallback: the row loaded once into one partition
    and spread by TensorE, ones(1, PMAX)ᵀ · row(1, n) with ``is_stationary_onezero`` (exact: one product
    per element), then copied out of PSUM."""
    if dma:
        nisa.dma_copy(dst=dst, src=src.ap([[0, PMAX], [1, n]], offset=offset))
        return
    row = nl.ndarray((1, n), dtype=nl.float32, buffer=nl.sbuf, name="bcast_row")
    nisa.dma_copy(dst=row, src=src.ap([[n, 1], [1, n]], offset=offset))
    for c0, csz in tiles(n, NFMAX):
        ps = nl.ndarray((PMAX, csz), dtype=nl.float32, buffer=nl.psum, name="bcast_ps")
        nisa.nc_matmul(dst=ps, stationary=ones_row, moving=row[:, c0:c0 + csz], is_stationary_onezero=True)
        nisa.tensor_copy(dst=dst[:, c0:c0 + csz], src=ps)
