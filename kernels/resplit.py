"""resplit_x3 — a compensated kernel's output pair split again on chip for the next compensated kernel (NKI 0.3.0).

A compensated (fp32x3) kernel returns its result as two fp32 planes, the exact hi·hi part and the corrections
(``z = z_exact + z_rest``, more bits than fp32 holds). When that result is the operand of the next compensated
kernel it must be split into the planes of mp2trn.precision — hi on a bf16-exact power-of-two grid that is
constant along the next contraction, lo the rest, x the full fp32 value. The SCF's exchange build is the
case: ``Z = Cᵀ B_P`` (``batched_gemm_x3``) feeds ``K = Zᵀ Z`` (``syrk_x3``), whose contraction runs over Z's
rows. Doing the split here keeps Z in device memory between the two launches; before, Z went to the host,
was added in fp64, split and sent back at every build. The same kernel makes the SCF tensor's planes from the
tensor sent as an fp32 pair (fp32(B), fp32(B − fp32(B)): 8 bytes per element instead of the planes' 16).

Dimensions
    R: rows of the launch — the next kernel's contraction, one grid per column over each group of rows
    (a group of at most :func:`rows_that_fit` rows for the column count — 4608 rows of 326 columns on trn1
    — stays in SBUF while it is split; a larger one is read twice, for its maxima and for the split). W: columns of the inputs;
    N ≤ W: the columns split (the first N). Any R, N otherwise (edge tiles are slices).

Args
    z_exact, z_rest (R, W) float32 in HBM: the two planes of a compensated kernel's output.
    beta: the grid's bits (mp2trn.precision.beta_for(R)): |hi / grid| ≤ 2^β, exact in bfloat16 (β ≤ 8).
    ncols: N, the columns to split (0: all W).
    rows_out: rows of the outputs (0: R); rows R .. rows_out are zero, so that every launch of the next
    kernel sees one shape (one compile) however many rows the last part of a block has.
    group: rows per grid (0: all R): rows g·group .. (g+1)·group − 1 share one grid per column (the next
    kernel contracts over each group separately: the tensor's (P, μ) rows split along μ per P use nao).
    planes: 3 (hi, lo, x: a moving operand) or 2 (hi, lo: a stationary one).

Returns
    (hi bfloat16, lo float32, x float32), (rows_out, N) each, C-contiguous (the first ``planes`` of them):
    the operand planes of mp2trn.precision.split for contraction along the rows (per group), with
        x = fp32(z_exact + z_rest);  grid[c] = 2^(⌊log2 max_r |x[r, c]|⌋ + 1 − β)
        hi = x rounded to a multiple of grid[c];  lo = fp32((z_exact − hi) + z_rest)
    The grid is a power of two no finer than z_exact's last bit and |z_exact − hi| is about grid/2, so
    z_exact − hi is exact in fp32 and lo is z − hi rounded once, as the host's fp64 split makes it. (hi must
    come from x, not from z_exact: the corrections plane is not small — it holds the hi·lo products, 2^-β of
    z — and a hi rounded from z_exact alone leaves lo up to that much larger than grid/2.)

Engines
    DMA: each row tile of both planes in once, the three planes out. VectorE: x, |x|, the running column
    maxima over row tiles, the grid's exponent bits (int32 view, ``bitwise_and``), the round-to-grid as
    (z + c) − c with c = 1.5·2^23·grid (two fp32 writes), lo and x. GpSimd: the maxima across the 128
    partitions of a row tile. TensorE: the per-column constant c spread over the partitions (ones matmul).

Pseudocode
    for each column chunk (c0, ≤ 512 columns), for each group of rows:
        load every row tile of the group, z_exact and z_rest [rows, chunk]   # resident for the group
        x = z_exact + z_rest                                                 # VectorE, fp32
        m = max over row tiles of |x|                                        # VectorE, [128, chunk]
        m = max over partitions of m                                         # GpSimd, [1, chunk]
        c = 1.5·2^23 · 2^(1−β) · (bits(m) & EXP_MASK)                        # VectorE, [1, chunk]
        C = onesᵀ · c                                                        # TensorE, [128, chunk]
        for each row tile:
            hi = (x + C) − C;  lo = (z_exact − hi) + z_rest
            store bf16(hi) (exact), lo, x

NumPy reference: :func:`resplit_reference`. Tests: tests/test_kernel_jk.py.
"""

from __future__ import annotations

import numpy as np

from ._nki import nki, nisa, nl
from .tiles import EXP_MASK, FP32, MAGIC, NFMAX, PMAX, sbuf_budget, tiles

__all__ = ["resplit_x3", "resplit_reference", "rows_that_fit"]


def rows_that_fit(ncols, budget=0):
    """The most rows of a group kept in SBUF: both input planes and x of every row tile stay there for a
    column chunk (12 bytes per element per partition), beside the maxima, the spread constant and the output tiles."""
    budget = budget or sbuf_budget()
    csz = min(max(ncols, 1), NFMAX)
    fixed = csz * (3 * FP32 + 2 * (2 + 2 * FP32))     # maxima, |x| and C; hi16, hi and lo of two row tiles
    return PMAX * max(1, (budget - fixed) // (3 * FP32 * csz))


def _column_grid(x_tiles, csz, beta, ones_row):
    """[PMAX, csz] SBUF tile of c = 1.5·2^23·grid per column (the same on every partition)."""
    mx = nl.ndarray((PMAX, csz), dtype=nl.float32, buffer=nl.sbuf, name="colmax")
    nisa.memset(dst=mx, value=0.0)
    for t in x_tiles:
        rsz = t.shape[0]
        ab = nl.ndarray((rsz, csz), dtype=nl.float32, buffer=nl.sbuf, name="absz")
        nisa.activation(dst=ab, op=nl.abs, data=t)
        nisa.tensor_tensor(dst=mx[:rsz], data1=mx[:rsz], data2=ab, op=nl.maximum)
    row = nl.ndarray((1, csz), dtype=nl.float32, buffer=nl.sbuf, name="colmax_row")
    nisa.tensor_partition_reduce(dst=row, op=nl.maximum, data=mx)
    pw = nl.ndarray((1, csz), dtype=nl.float32, buffer=nl.sbuf, name="pow2_row")
    nisa.tensor_scalar(dst=pw.view(nl.int32), data=row.view(nl.int32), op0=nl.bitwise_and, operand0=EXP_MASK)
    nisa.tensor_scalar(dst=pw, data=pw, op0=nl.multiply, operand0=MAGIC * 2.0 ** (1 - beta))
    spread = nl.ndarray((PMAX, csz), dtype=nl.float32, buffer=nl.psum, name="magic_ps")
    nisa.nc_matmul(dst=spread, stationary=ones_row, moving=pw, is_stationary_onezero=True)
    magic = nl.ndarray((PMAX, csz), dtype=nl.float32, buffer=nl.sbuf, name="magic")
    nisa.tensor_copy(dst=magic, src=spread)
    return magic


def _split_tile(za, zr, x, magic, outs, r0, c0):
    """hi and lo of one row tile (x made already), the three stored to rows r0.. and columns c0.. of the
    output planes."""
    rsz, csz = za.shape
    c = magic[:rsz]
    hi = nl.ndarray((rsz, csz), dtype=nl.float32, buffer=nl.sbuf, name="hi")
    nisa.tensor_tensor(dst=hi, data1=x, data2=c, op=nl.add)           # rounded to fp32: the grid's rounding
    nisa.tensor_tensor(dst=hi, data1=hi, data2=c, op=nl.subtract)
    lo = nl.ndarray((rsz, csz), dtype=nl.float32, buffer=nl.sbuf, name="lo")
    nisa.tensor_tensor(dst=lo, data1=za, data2=hi, op=nl.subtract)    # exact
    nisa.tensor_tensor(dst=lo, data1=lo, data2=zr, op=nl.add)
    hi16 = nl.ndarray((rsz, csz), dtype=nl.bfloat16, buffer=nl.sbuf, name="hi16")
    nisa.tensor_copy(dst=hi16, src=hi)                                # exact: at most β ≤ 8 significant bits
    for out, t in zip(outs, (hi16, lo, x)):                           # (hi16, lo) for a stationary operand
        nisa.dma_copy(dst=out[r0:r0 + rsz, c0:c0 + csz], src=t)


def _zero_rows(outs, r0, rows, ncols):
    """Rows r0 .. rows of every output plane set to zero (one zero tile, DMA'd out)."""
    for q0, qsz in tiles(rows - r0, PMAX):
        for c0, csz in tiles(ncols, NFMAX):
            for out in outs:
                z = nl.ndarray((qsz, csz), dtype=out.dtype, buffer=nl.sbuf, name="zeros")
                nisa.memset(dst=z, value=0.0)
                nisa.dma_copy(dst=out[r0 + q0:r0 + q0 + qsz, c0:c0 + csz], src=z)


def _load_tile(z_exact, z_rest, r0, rsz, c0, csz):
    """(z_exact, z_rest, x = z_exact + z_rest) of one row tile in SBUF."""
    pair = []
    for plane, name in ((z_exact, "za"), (z_rest, "zr")):
        t = nl.ndarray((rsz, csz), dtype=nl.float32, buffer=nl.sbuf, name=name)
        nisa.dma_copy(dst=t, src=plane[r0:r0 + rsz, c0:c0 + csz])
        pair.append(t)
    x = nl.ndarray((rsz, csz), dtype=nl.float32, buffer=nl.sbuf, name="x")
    nisa.tensor_tensor(dst=x, data1=pair[0], data2=pair[1], op=nl.add)   # the one rounding of z
    return pair[0], pair[1], x


@nki.jit
def resplit_x3(z_exact, z_rest, beta, ncols=0, rows_out=0, group=0, planes=3):
    """(z_exact, z_rest) (R, W) float32 -> (hi bf16, lo[, x]) (rows_out, N) split along the rows, one grid per
    column for every ``group`` rows (see the module)."""
    R, W = z_exact.shape
    N = ncols if ncols else W
    G = group if group else R
    rows = max(rows_out, R)
    resident = G <= rows_that_fit(N)      # else each tile of a group is read twice: maxima, then the split
    dtypes = (nl.bfloat16, nl.float32, nl.float32)[:planes]
    outs = tuple(nl.ndarray((rows, N), dtype=d, buffer=nl.shared_hbm) for d in dtypes)
    if rows > R:
        _zero_rows(outs, R, rows, N)
    ones_row = nl.ndarray((1, PMAX), dtype=nl.float32, buffer=nl.sbuf, name="ones_row")
    nisa.memset(dst=ones_row, value=1.0)
    for c0, csz in tiles(N, NFMAX):
        for g0, gsz in tiles(R, G):
            rtiles = [(g0 + r0, rsz) for r0, rsz in tiles(gsz, PMAX)]    # tiles never straddle two groups
            if resident:
                loaded = [_load_tile(z_exact, z_rest, r0, rsz, c0, csz) for r0, rsz in rtiles]
                magic = _column_grid([t[2] for t in loaded], csz, beta, ones_row)
            else:
                magic = _column_grid((_load_tile(z_exact, z_rest, r0, rsz, c0, csz)[2] for r0, rsz in rtiles),
                                     csz, beta, ones_row)
            for k, (r0, rsz) in enumerate(rtiles):
                za, zr, x = loaded[k] if resident else _load_tile(z_exact, z_rest, r0, rsz, c0, csz)
                _split_tile(za, zr, x, magic, outs, r0, c0)
    return outs


def resplit_reference(z_exact: np.ndarray, z_rest: np.ndarray, beta: int, ncols: int = 0, rows_out: int = 0,
                      group: int = 0, planes: int = 3):
    """NumPy reference: the fp64 sum of the planes, zero rows to ``rows_out``, each group of rows split by the
    host's rule (mp2trn.precision.split)."""
    from mp2trn.precision import split

    R, n = z_exact.shape[0], ncols or z_exact.shape[1]
    z = np.zeros((max(rows_out, R), n))
    z[:R] = np.asarray(z_exact[:, :n], np.float64) + np.asarray(z_rest[:, :n], np.float64)
    out = [np.zeros(z.shape, d) for d in (np.dtype("bfloat16"), np.float32, np.float32)][:planes]
    for g0 in range(0, R, group or R):
        part = split(z[g0:g0 + (group or R)], 0, beta, with_full=True)
        for o, q in zip(out, part):
            o[g0:g0 + q.shape[0]] = q
    return tuple(out)
