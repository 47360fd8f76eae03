"""Sums over b of the pair products of kernels/mp2_energy.py, per j segment of a group's columns (NKI 0.3.0
sub-kernels, inlined into ``mp2_energy`` / ``mp2_energy_x3``; never jitted themselves).

Dimensions
    asz ≤ 128: rows (a) of the product tile; csz ≤ 512: its columns, a run c0:c0+csz of the group's
    (j, b) columns (nvb per j); nseg: the j segments the run touches.

Helpers (engine)
    segments            host-side: the j segments [(jl, col0, ncol, b0)] of a column run
    reduce_segments     Σ_b within each segment (VectorE tensor_reduce over a 3-D view when whole j's)
    exact_segment_sums  the same without fp32 swamping (fp32x3): hi/lo split on a power-of-two grid of the
                        row maximum (ScalarE (x + c) − c, GpSimd lo = x − hi), Σ hi exact, Σ lo 2^15× smaller
    seg_reduce          per-pair mode: segment sums, then over the a partitions by a ones-vector matmul into
                        a PSUM accumulator (TensorE); row mode (fp32x3): exact segment sums kept per row

Pseudocode
    for each j segment s of columns c0:c0+csz:  red[a, s] = Σ_{b in s} prod[a, b]
    per-pair:  acc[0, j0 + s] += Σ_a red[a, s]          row mode:  rows[a, col + j0 + s] (+)= red[a, s]

Reference: ``mp2_energy_reference`` in kernels/mp2_energy.py (the sums these produce, in NumPy).
"""

from __future__ import annotations

from ._nki import nisa, nl
from .tiles import EXP_MASK, MAGIC

SUM_BITS = 15    # grid bits of the exact row sums: ≤ 512 terms of ≤ 2^15 grid units stay below 2^24

__all__ = ["SUM_BITS", "segments", "reduce_segments", "exact_segment_sums", "seg_reduce"]


def segments(c0, csz, nvb):
    """j segments [(jl, col0, ncol, b0)] of the group columns c0:c0+csz (jl local j index)."""
    out = []
    c = c0
    while c < c0 + csz:
        jl = c // nvb
        end = min(c0 + csz, (jl + 1) * nvb)
        out.append((jl, c, end - c, c - jl * nvb))
        c = end
    return out


def reduce_segments(dst, data, asz, nseg, nvb, whole):
    if whole:                                      # whole j's: one reduction over a 3-D view
        nisa.tensor_reduce(dst=dst, op=nl.add, data=data.reshape((asz, nseg, nvb)), axis=2)
    else:                                          # a chunk of one j (nvb > 512)
        nisa.tensor_reduce(dst=dst, op=nl.add, data=data, axis=1)


def exact_segment_sums(red, prod, asz, csz, nseg, nvb, whole, signed):
    """Segment sums of ``prod`` without fp32 swamping (fp32x3). Adding a term below half an ulp of the
    running sum loses it — always downwards for T²/D, a systematic −3e-8 relative bias once orbitals
    break symmetry and many terms are tiny. So each row is split like a GEMM operand: hi on the
    power-of-two grid 2^(e+1−15) of the row maximum 2^e (ScalarE: (x + c) − c, c = 1.5·2^23·grid),
    lo = x − hi (GpSimd, exact); Σ hi over ≤ 512 terms is exact in fp32, Σ lo is 2^15 times smaller."""
    mx_src = prod
    if signed:
        mx_src = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.sbuf, name="abs_prod")
        nisa.activation(dst=mx_src, op=nl.abs, data=prod)
    mx = nl.ndarray((asz, 1), dtype=nl.float32, buffer=nl.sbuf, name="rowmax")
    nisa.tensor_reduce(dst=mx, op=nl.maximum, data=mx_src, axis=1)
    pw = nl.ndarray((asz, 1), dtype=nl.float32, buffer=nl.sbuf, name="pow2")
    nisa.tensor_scalar(dst=pw.view(nl.int32), data=mx.view(nl.int32), op0=nl.bitwise_and, operand0=EXP_MASK)
    c = nl.ndarray((asz, 1), dtype=nl.float32, buffer=nl.sbuf, name="magic")
    nisa.tensor_scalar(dst=c, data=pw, op0=nl.multiply, operand0=MAGIC * 2.0 ** (1 - SUM_BITS))
    nc = nl.ndarray((asz, 1), dtype=nl.float32, buffer=nl.sbuf, name="neg_magic")
    nisa.tensor_scalar(dst=nc, data=pw, op0=nl.multiply, operand0=-MAGIC * 2.0 ** (1 - SUM_BITS))
    hi = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.sbuf, name="prod_hi")
    nisa.activation(dst=hi, op=nl.copy, data=prod, bias=c)          # fl(x + c)
    nisa.activation(dst=hi, op=nl.copy, data=hi, bias=nc)           # fl(fl(x + c) − c): x on the grid
    lo = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.sbuf, name="prod_lo")
    nisa.tensor_tensor(dst=lo, data1=prod, data2=hi, op=nl.subtract, engine=nisa.gpsimd_engine)
    rl = nl.ndarray((asz, nseg), dtype=nl.float32, buffer=nl.sbuf, name="seg_lo")
    reduce_segments(red, hi, asz, nseg, nvb, whole)                  # exact
    reduce_segments(rl, lo, asz, nseg, nvb, whole)
    nisa.tensor_tensor(dst=red, data1=red, data2=rl, op=nl.add)


def seg_reduce(acc, ones, prod, asz, c0, csz, nvb, rows=(), row_col=0, first=True, signed=False):
    """Sum ``prod`` [asz, csz] over b within each j segment. Per-pair mode (``rows`` empty): then over
    the a partitions by a ones-vector matmul into acc[0:1, local j] (PSUM accumulation across a tiles and
    chunks). Row mode (fp32x3, ``rows`` = (tile,)): swamping-free segment sums go to
    tile[:, row_col + local j] (SBUF), added to what is there unless ``first``."""
    segs = segments(c0, csz, nvb)
    nseg = len(segs)
    j0 = segs[0][0]
    whole = all(s[2] == nvb for s in segs)
    if rows and first:
        red = rows[0][0:asz, row_col + j0:row_col + j0 + nseg]
    else:
        red = nl.ndarray((asz, nseg), dtype=nl.float32, buffer=nl.sbuf, name="segsum")
    if not rows:
        reduce_segments(red, prod, asz, nseg, nvb, whole)
        nisa.nc_matmul(dst=acc[0:1, j0:j0 + nseg], stationary=ones[0:asz, :], moving=red)
        return
    exact_segment_sums(red, prod, asz, csz, nseg, nvb, whole, signed)
    if not first:
        dst = rows[0][0:asz, row_col + j0:row_col + j0 + nseg]
        nisa.tensor_tensor(dst=dst, data1=dst, data2=red, op=nl.add)
