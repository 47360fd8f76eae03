"""Host side of the NKI precision modes: how fp64 operands become the fp32 / bf16 planes the kernels take.

``fp32``   every operand is rounded once to float32; TensorE accumulates in fp32 PSUM.
``fp32x3`` compensated: an operand X (fp64) is split into

    hi  = X rounded to a power-of-two grid g that is constant along the contraction axis
          (g = 2^(e−β), 2^e > max |X| over that axis: per output row of a stationary operand,
          per output column of a moving one), so hi/g is an integer with |hi/g| ≤ 2^β — exactly
          representable in bfloat16 (β ≤ 8);
    lo  = fp32(X − hi)                     (|lo| ≤ g/2: 2^-β smaller than X)
    x   = fp32(X)                          (moving operands only)

and the kernel accumulates  hi·hi (bf16, exact)  +  hi·lo  +  lo·x  (fp32)  in one PSUM tile (see
kernels/gemm.py). The hi·hi partial sums are integers times g_a·g_b below 2^24 as long as
K·2^(2β) ≤ 2^24, hence β = ⌊(24 − ⌈log2 K⌉)/2⌋ for contraction length K.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

PRECISIONS = ("fp32", "fp32x3")
BF16 = np.dtype(ml_dtypes.bfloat16)

#: what each precision mode is, for describe() and docs
DESCRIPTIONS = {
    "fp32": "fp32 operands, fp32 PSUM accumulation; per-pair sums fp32 on chip, pair totals fp64 on the host",
    "fp32x3": "compensated: operands split hi (bf16-exact power-of-two grid) + lo (fp32); "
              "hi*hi exact in PSUM, hi*lo and lo*x corrections in fp32 (3 matmuls per tile)",
}


def beta_for(k: int) -> int:
    """Bits of the hi part for contraction length ``k`` (K·2^(2β) ≤ 2^24, β ≤ 8 for bfloat16)."""
    if k < 1:
        raise ValueError("contraction length must be positive")
    return int(max(1, min(8, (24 - math.ceil(math.log2(max(k, 2)))) // 2)))


def split(x: np.ndarray, axis: int, beta: int, with_full: bool = False):
    """Split fp64 ``x`` along the contraction ``axis`` into (hi bf16, lo fp32[, x fp32])."""
    x = np.asarray(x, dtype=np.float64)
    m = np.max(np.abs(x), axis=axis, keepdims=True)
    _, e = np.frexp(np.where(m > 0, m, 1.0))          # m = f·2^e, 0.5 ≤ f < 1  ->  2^e > m
    g = np.ldexp(1.0, (e - beta).astype(np.int32))
    hi = np.rint(x / g) * g                           # x/g exact (power-of-two scaling)
    hi16 = hi.astype(BF16)
    lo = (x - hi).astype(np.float32)
    if with_full:
        return hi16, lo, x.astype(np.float32)
    return hi16, lo


def check_exact_hi(hi16: np.ndarray, hi: np.ndarray) -> bool:
    """True when the bf16 plane holds ``hi`` exactly (used by tests)."""
    return bool(np.array_equal(hi16.astype(np.float64), hi))
