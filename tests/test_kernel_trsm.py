"""kernels/trsm.py (B = L⁻¹V as a block-triangular GEMM with the host-inverted factor) against the fp64
forward substitution, in the emulator."""

from __future__ import annotations

import numpy as np
import pytest

from mp2trn.precision import beta_for, split
from mp2trn.kernels.trsm import inverse_factor_t, trsm, trsm_reference, trsm_x3

from .kernel_helpers import EPS32, bound, run


def metric(rng, n, cond=1e3):
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return np.linalg.cholesky((q * np.logspace(0, -np.log10(cond), n)) @ q.T)


# (naux, ncols, m_block): naux not a multiple of 128, one column, one aux function, > one PSUM bank
SHAPES = [(84, 95, None), (300, 700, None), (129, 1, None), (1, 3, None), (256, 512, 1), (420, 1953, None),
          (200, 64, 1)]


@pytest.mark.parametrize("naux,n,m_block", SHAPES)
@pytest.mark.parametrize("precision", ["fp32", "fp32x3"])
def test_trsm_matches_forward_substitution(naux, n, m_block, precision):
    rng = np.random.default_rng(naux + n)
    l_chol = metric(rng, naux)
    v = rng.standard_normal((naux, n))
    lt = inverse_factor_t(l_chol)
    assert np.array_equal(lt, np.triu(lt))
    if precision == "fp32":
        b, rep = run(trsm, lt.astype(np.float32), v.astype(np.float32), m_block=m_block)
        tol = 8 * np.sqrt(naux) * EPS32 * bound(lt, v)
    else:
        beta = beta_for(naux)
        (b, b_rest), rep = run(trsm_x3, *split(lt, 0, beta), *split(v, 0, beta, with_full=True), m_block=m_block)
        b = b.astype(np.float64) + b_rest
        tol = 8 * np.sqrt(naux) * EPS32 * 2.0 ** -beta * bound(lt, v)
    ref = trsm_reference(l_chol, v)
    assert b.shape == (naux, n)
    assert np.max(np.abs(b - ref)) <= tol


def test_trsm_skips_the_zero_triangle():
    """Only K tiles at or below the output tile are multiplied: nt(nt+1)/2 per column chunk, not nt²."""
    rng = np.random.default_rng(1)
    naux, n = 520, 300                      # 5 aux tiles, 1 column chunk
    lt = inverse_factor_t(metric(rng, naux)).astype(np.float32)
    _, rep = run(trsm, lt, rng.standard_normal((naux, n)).astype(np.float32))
    assert rep.instruction_counts["tensor"]["nc_matmul"] == 5 * 6 // 2


def test_trsm_x3_recovers_ill_conditioned_metric():
    """cond(J) = 1e7 and B of moderate size: V = L B cancels inside L⁻¹V; fp32x3 stays ~fp32-rounding close."""
    rng = np.random.default_rng(7)
    naux = 300
    l_chol = metric(rng, naux, cond=1e7)
    b_true = rng.standard_normal((naux, 40))
    v = l_chol @ b_true
    lt = inverse_factor_t(l_chol)
    b32, _ = run(trsm, lt.astype(np.float32), v.astype(np.float32))
    beta = beta_for(naux)
    (b3, b3_rest), _ = run(trsm_x3, *split(lt, 0, beta), *split(v, 0, beta, with_full=True))
    b3 = b3.astype(np.float64) + b3_rest
    e32 = np.max(np.abs(b32 - b_true))
    e3 = np.max(np.abs(b3 - b_true))
    assert e3 < e32 / 10
