"""kernels/gemm.py against its NumPy reference in the emulator (fp32 and compensated fp32x3)."""

from __future__ import annotations

import numpy as np
import pytest

from mp2trn.precision import beta_for, split
from mp2trn.kernels.gemm import gemm, gemm_reference, gemm_x3
from mp2trn.kernels.tiles import tiles

from .kernel_helpers import EPS32, bound, cancelling, run

# (K, M, N, m_block): edge tiles on every axis, single elements, > one PSUM bank, forced small panels
SHAPES = [
    (100, 70, 30, None),
    (128, 128, 512, None),
    (257, 129, 513, None),
    (300, 260, 700, 1),
    (1, 1, 1, None),
    (130, 1, 1000, None),
    (64, 300, 17, 2),
]


@pytest.mark.parametrize("k,m,n,m_block", SHAPES)
def test_gemm_fp32_matches_reference(k, m, n, m_block):
    rng = np.random.default_rng(k * 7 + m)
    a_t, b = rng.standard_normal((k, m)), rng.standard_normal((k, n))
    c, rep = run(gemm, a_t.astype(np.float32), b.astype(np.float32), m_block=m_block)
    ref = gemm_reference(a_t, b)
    assert c.shape == (m, n) and c.dtype == np.float32
    assert np.max(np.abs(c - ref)) <= 8 * np.sqrt(k) * EPS32 * bound(a_t, b)
    # every product is charged to TensorE; one output eviction per (M tile, N chunk)
    assert rep.instruction_counts["vector"]["tensor_copy"] == len(tiles(m, 128)) * len(tiles(n, 512))


@pytest.mark.parametrize("k,m,n,m_block", SHAPES)
def test_gemm_x3_matches_reference(k, m, n, m_block):
    rng = np.random.default_rng(k * 5 + n)
    a_t, b = rng.standard_normal((k, m)), rng.standard_normal((k, n))
    beta = beta_for(k)
    (c, c_rest), _ = run(gemm_x3, *split(a_t, 0, beta), *split(b, 0, beta, with_full=True), m_block=m_block)
    ref = gemm_reference(a_t, b)
    c = c.astype(np.float64) + c_rest                   # the exact part and the corrections, added in fp64
    assert np.max(np.abs(c - ref)) <= 8 * np.sqrt(k) * EPS32 * 2.0 ** -beta * bound(a_t, b)


def test_gemm_x3_removes_cancellation_error():
    """Output 10^4 smaller than Σ|a||b|: fp32 loses ~4 digits, the compensated split does not."""
    rng = np.random.default_rng(3)
    a_t, b = cancelling(rng, 300, 100, 200)
    ref = gemm_reference(a_t, b)
    c32, _ = run(gemm, a_t.astype(np.float32), b.astype(np.float32))
    beta = beta_for(300)
    (c3, c3_rest), _ = run(gemm_x3, *split(a_t, 0, beta), *split(b, 0, beta, with_full=True))
    c3 = c3.astype(np.float64) + c3_rest
    e32 = np.max(np.abs(c32 - ref)) / np.max(np.abs(ref))
    e3 = np.max(np.abs(c3 - ref)) / np.max(np.abs(ref))
    assert e32 > 1e-5
    assert e3 < e32 / 30


def test_split_hi_is_exact_bf16_on_a_shared_grid():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 30)) * np.logspace(-3, 3, 30)
    beta = beta_for(200)
    hi16, lo, full = split(x, 0, beta, with_full=True)
    hi = hi16.astype(np.float64)
    grid = 2.0 ** (np.floor(np.log2(np.abs(x).max(axis=0))) + 1 - beta)
    n = hi / grid
    assert np.array_equal(n, np.rint(n)) and np.max(np.abs(n)) <= 2 ** beta
    assert np.max(np.abs(hi + lo - x) / np.abs(x).max(axis=0)) < 2.0 ** -(24 + beta - 1)
    assert full.dtype == np.float32 and 200 * 2 ** (2 * beta) <= 2 ** 24


@pytest.mark.parametrize("kernel", ["gemm", "gemm_x3"])
def test_a_short_wide_stationary_operand_fits_trn1_sbuf(kernel):
    """Few K tiles and many M tiles (the Z-vector's products on Inosine: K 256, M 17 536, N 256): the panel
    plan counts each M tile's staged output beside its A columns, so the launch fits trn1's SBUF (it
    allocated 2 × 137 KiB per partition of 176 KiB before)."""
    from mp2trn.kernels.tiles import plan_panels

    k, m, n = 256, 17536, 256
    rng = np.random.default_rng(5)
    a_t, b = rng.standard_normal((k, m)), rng.standard_normal((k, n))
    if kernel == "gemm":
        c, _ = run(gemm, a_t.astype(np.float32), b.astype(np.float32), target="trn1")
        assert np.max(np.abs(c - gemm_reference(a_t, b))) <= 8 * np.sqrt(k) * EPS32 * bound(a_t, b)
    else:
        beta = beta_for(k)
        (c_exact, c_rest), _ = run(gemm_x3, *split(a_t, 0, beta), *split(b, 0, beta, with_full=True), target="trn1")
        assert np.max(np.abs(c_exact.astype(np.float64) + c_rest - gemm_reference(a_t, b))) <= \
            8 * np.sqrt(k) * EPS32 * 2.0 ** -beta * bound(a_t, b)
    assert plan_panels(2, 137, n, kernel == "gemm_x3")[0] < 137


# (K, M, G, width, m_block, n_width): whole groups per chunk (70 → 7 per 512), groups wider than a chunk
# (600 in pieces of 512 + 88), a short last M tile, one group, forced small panels and chunks
GROUPED = [
    (70, 256, 9, 70, None, None),
    (256, 70, 4, 70, None, None),
    (130, 129, 3, 600, None, None),
    (100, 300, 5, 64, 1, 128),
    (5, 1, 1, 1, None, None),
    (64, 130, 7, 33, 2, 128),
]


@pytest.mark.parametrize("k,m,g,width,m_block,n_width", GROUPED)
def test_gemm_grouped_output_matches_reference(k, m, g, width, m_block, n_width):
    """``width``: each group of B's columns comes out as its own block of M rows, in fp32 and fp32x3."""
    rng = np.random.default_rng(k + m + g)
    a_t, b = rng.standard_normal((k, m)), rng.standard_normal((k, g * width))
    ref = gemm_reference(a_t, b, width)
    assert np.allclose(ref[(g - 1) * m:, :], (a_t.T @ b)[:, (g - 1) * width:])
    kw = {"width": width, "m_block": m_block or 0, "n_width": n_width or 0}
    c, _ = run(gemm, a_t.astype(np.float32), b.astype(np.float32), **kw)
    assert c.shape == (g * m, width)
    assert np.max(np.abs(c - ref)) <= 8 * np.sqrt(k) * EPS32 * bound(a_t, b)
    beta = beta_for(k)
    (c, c_rest), _ = run(gemm_x3, *split(a_t, 0, beta), *split(b, 0, beta, with_full=True), **kw)
    assert c.shape == c_rest.shape == (g * m, width)
    assert np.max(np.abs(c.astype(np.float64) + c_rest - ref)) <= 8 * np.sqrt(k) * EPS32 * 2.0 ** -beta * bound(a_t, b)


def test_group_chunks_cover_every_column_without_cutting_a_group():
    from mp2trn.kernels.tiles import group_chunks

    for n, width, chunk in [(630, 70, 512), (1800, 600, 512), (7, 1, 512), (512, 512, 512), (1024, 256, 512)]:
        chunks = group_chunks(n, width, chunk)
        assert [c for s, sz in chunks for c in range(s, s + sz)] == list(range(n))
        assert all(sz <= chunk for _, sz in chunks)
        for s, sz in chunks:
            whole = s % width == 0 and sz % width == 0
            assert whole or s // width == (s + sz - 1) // width
