"""trsm — the DF metric step ``B = L⁻¹ V`` (L: lower Cholesky factor of the Coulomb metric) on TensorE,
as a block-triangular GEMM with the inverse factor precomputed on the host (NKI 0.3.0).

Dimensions
    naux: auxiliary functions (the contraction axis P and the output rows Q); n: columns of V
    (n = nocc·nvir of one spin, or one out-of-core column block). Any naux, n.

Args
    linv_t (naux, naux) float32, upper triangular ((L⁻¹)ᵀ, from :func:`inverse_factor_t`); v (naux, n)
    float32, aux-major ((P|ia) with column index n = i·nvir + a); m_block / n_width as in gemm.
    ``trsm_x3``: the compensated planes (linv_t_hi, linv_t_lo, v_hi, v_lo, v).

Returns
    b (naux, n) float32 = L⁻¹ v (``trsm_x3``: the pair (b_exact, b_rest), added in fp64 by the host).

Engines
    As gemm: DMA loads the (L⁻¹)ᵀ panel and V chunks and stores B; TensorE accumulates over P in PSUM;
    VectorE evicts PSUM → SBUF. The host (fp64, once per molecule) factors the metric and forms L⁻¹.

Pseudocode
    for each panel of Q tiles:                            # (L⁻¹)ᵀ[P ≤ Q, Q tiles] resident in SBUF
        for each column chunk of V:
            for each Q tile: acc = Σ_{P tile ≤ Q tile} (L⁻¹)ᵀ[P, Q]ᵀ V[P, chunk]   # PSUM
            store B[panel, chunk]

Why a GEMM with L⁻¹ instead of a forward substitution (the equivalent form docs/architecture.md names)
    The Cholesky factorization stays on the host in fp64 (the metric stage in docs/architecture.md); the
    host also forms L⁻¹ once per
    molecule (O(naux³/3), fp64) and passes ``linv_t = (L⁻¹)ᵀ`` — upper triangular, contraction index P
    first, i.e. already the [K=P, M=Q] stationary layout. ``B[Q, n] = Σ_{P ≤ Q} L⁻¹[Q, P] V[P, n]`` is
    then one GEMM whose K tiles above the diagonal tile are skipped (never loaded, never multiplied),
    so it does the same naux²·n flops as a triangular solve. A blocked forward substitution on
    Trainium would have to invert the 128×128 diagonal blocks anyway (TensorE cannot divide), and it
    serializes the naux/128 block rows: TensorE waits on VectorE at every step. The GEMM form has no
    dependency chain between output tiles, so TensorE streams. Accuracy (measured, docs/precision.md):
    with fp32 operands the end-to-end MP2 error stays well below 1 µEh (the explicit-inverse rounding
    costs ~0.1 µEh on water/benzene; a blocked substitution with inverted 128×128 diagonal blocks, the
    TensorE form of trsm, was no better in a NumPy emulation: +0.19 µEh on benzene), and in the
    compensated ``fp32x3`` mode it is ≤ 0.01 µEh.

Tiling / features
    As kernels/gemm.py: Q tiles of 128 rows on the PSUM partition axis, P tiles of 128 contracted on the
    SBUF partitions, column chunks of 512 (one PSUM bank). A panel of (L⁻¹)ᵀ tiles (only the P ≤ Q
    triangle) stays resident in SBUF while all column chunks of V stream through; each V chunk is loaded
    once per panel. TensorE accumulates over P in PSUM; VectorE evicts PSUM → SBUF; DMA stores.
    One launch covers a whole (naux × n) column block (the host calls it once per spin in core, or once
    per out-of-core column block).

Compensated mode ``trsm_x3``: planes as in kernels/gemm.py (hi on a bf16-exact grid per Q row of L⁻¹
and per column of V, β from naux).

NumPy reference: :func:`trsm_reference` (fp64 ``solve_triangular``). Tests: tests/test_kernel_trsm.py.
"""

from __future__ import annotations

import numpy as np

from ._nki import nki, nl
from scipy.linalg import solve_triangular

from .gemm import gemm_body

__all__ = ["trsm", "trsm_x3", "trsm_reference", "inverse_factor_t"]


@nki.jit
def trsm(linv_t, v, m_block=0, n_width=0):
    """``b = linv_tᵀ @ v`` with ``linv_t = (L⁻¹)ᵀ`` upper triangular: b = L⁻¹ v (fp32)."""
    naux, naux2 = linv_t.shape
    assert naux == naux2 == v.shape[0], f"trsm: shapes {linv_t.shape} and {v.shape} do not match"
    b = nl.ndarray(v.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    gemm_body((linv_t,), (v,), (b,), lower=True, m_block=m_block, n_width=n_width)
    return b


@nki.jit
def trsm_x3(linv_t_hi, linv_t_lo, v_hi, v_lo, v, m_block=0, n_width=0):
    """Compensated ``b = L⁻¹ v``: (L⁻¹)ᵀ = hi (bf16 grid) + lo (fp32); v = v_hi + v_lo, v (fp32).
    Returns (b_exact, b_rest), float32 each; b = b_exact + b_rest (added in fp64 by the host)."""
    b = nl.ndarray(v.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    b_rest = nl.ndarray(v.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    gemm_body((linv_t_hi, linv_t_lo), (v_hi, v_lo, v), (b, b_rest), lower=True, m_block=m_block, n_width=n_width)
    return b, b_rest


def inverse_factor_t(l_chol: np.ndarray) -> np.ndarray:
    """Host side, fp64: ``(L⁻¹)ᵀ`` for the lower Cholesky factor L (upper triangular result)."""
    n = l_chol.shape[0]
    linv = solve_triangular(np.asarray(l_chol, dtype=np.float64), np.eye(n), lower=True)
    return np.ascontiguousarray(np.triu(linv.T))


def trsm_reference(l_chol: np.ndarray, v: np.ndarray) -> np.ndarray:
    """NumPy/SciPy reference: B = L⁻¹ V in fp64 (forward substitution)."""
    return solve_triangular(np.asarray(l_chol, dtype=np.float64), np.asarray(v, dtype=np.float64), lower=True)
