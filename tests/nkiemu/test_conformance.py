"""Conformance: our own NKI 0.3.0 kernels for the public tutorial families, against NumPy."""

from __future__ import annotations


import numpy as np
import pytest

from .conftest import BF16, load_conformance


def _bf16_ref(a, b):
    return a.astype(np.float32).T.astype(np.float64) @ b.astype(np.float32).astype(np.float64)


# -- tensor addition ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_tensor_add_tiles(rng, dtype):
    m = load_conformance("tensor_addition")
    a = rng.standard_normal((256, 1024)).astype(dtype)
    b = rng.standard_normal((256, 1024)).astype(dtype)
    out = m.tensor_add(a, b)
    assert out.dtype == np.dtype(dtype) and out.shape == a.shape
    # engine math in fp32, one RNE rounding into the destination dtype
    expect = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype)
    np.testing.assert_array_equal(out, expect)
    rep = m.tensor_add.last_report
    assert rep.instruction_counts["vector"]["tensor_tensor"] == 2 * 2
    assert rep.instruction_counts["dma"]["dma_copy"] == 3 * 4


def test_tensor_add_nl_wrappers(rng):
    m = load_conformance("tensor_addition")
    a = rng.standard_normal((128, 512)).astype(np.float32)
    b = rng.standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_array_equal(m.tensor_add_nl(a, b), a + b)


# -- matmul progression ------------------------------------------------------------------------------------
def test_matmul_single_tile_64x128x512(rng):
    m = load_conformance("matmul")
    lhsT = rng.standard_normal((128, 64)).astype(np.float32)
    rhs = rng.standard_normal((128, 512)).astype(np.float32)
    out = m.mm_single_tile(lhsT, rhs)
    np.testing.assert_allclose(out, lhsT.astype(np.float64).T @ rhs, rtol=1e-4, atol=1e-4)
    lb, rb = lhsT.astype(BF16), rhs.astype(BF16)
    outb = m.mm_single_tile(lb, rb)
    assert outb.dtype == BF16
    np.testing.assert_allclose(outb.astype(np.float32), _bf16_ref(lb, rb), atol=1e-4, rtol=1e-2)


VARIANT_KW = {"tiled": {}, "hoisted": {}, "block_free": {}, "blocked": {"TILES_M": 8, "TILES_N": 2, "TILES_K": 8}}


@pytest.mark.parametrize("variant", list(VARIANT_KW))
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_matmul_1024x1024x2048(rng, variant, dtype):
    m = load_conformance("matmul")
    K, M, N = 1024, 1024, 2048
    lhsT = rng.standard_normal((K, M)).astype(dtype)
    rhs = rng.standard_normal((K, N)).astype(dtype)
    kern = m.VARIANTS[variant]
    out = kern(lhsT, rhs, **VARIANT_KW[variant])
    assert out.shape == (M, N) and out.dtype == np.dtype(dtype)
    if dtype is np.float32:
        np.testing.assert_allclose(out, lhsT.astype(np.float64).T @ rhs, rtol=1e-4, atol=1e-3)
    else:
        np.testing.assert_allclose(out.astype(np.float32), _bf16_ref(lhsT, rhs), atol=1e-4, rtol=1e-2)
    rep = kern.last_report
    assert rep.flops == 2 * K * M * N
    assert rep.instruction_counts["tensor"]["nc_matmul"] == (K // 128) * (M // 128) * (N // 512)


def test_matmul_tiled_1024x1024x2048_fp32(rng):
    """The fp32 tiled kernel at 1024x1024x2048 (its emulation wall time, goal < 10 s, is printed by
    scripts/emu_matmul_report.py; speed is never asserted in tests)."""
    m = load_conformance("matmul")
    lhsT = rng.standard_normal((1024, 1024)).astype(np.float32)
    rhs = rng.standard_normal((1024, 2048)).astype(np.float32)
    out = m.mm_tiled(lhsT, rhs)
    np.testing.assert_allclose(out, lhsT.T.astype(np.float64) @ rhs, rtol=1e-4, atol=1e-3)


def test_matmul_catches_a_wrong_kernel(rng):
    """The comparison can fail: dropping one K tile from the accumulation is detected."""
    m = load_conformance("matmul")
    lhsT = rng.standard_normal((256, 128)).astype(np.float32)
    rhs = rng.standard_normal((256, 512)).astype(np.float32)
    out = m.mm_tiled(lhsT[:128], rhs[:128])
    assert not np.allclose(out, lhsT.T @ rhs, rtol=1e-4, atol=1e-3)


# -- transpose2d --------------------------------------------------------------------------------------------
def test_transpose2d_int8_tutorial_case():
    m = load_conformance("transpose2d")
    P, X, Y = 5, 3, 4
    a = np.arange(P * X * Y, dtype=np.int8).reshape(P, X * Y)
    out = m.transpose_rows(a, (X, Y))
    np.testing.assert_array_equal(out, np.transpose(a.reshape(P, X, Y), (0, 2, 1)).reshape(P, X * Y))


def test_transpose2d_float(rng):
    m = load_conformance("transpose2d")
    a = rng.standard_normal((128, 6 * 10)).astype(np.float32)
    out = m.transpose_rows(a, (6, 10))
    np.testing.assert_array_equal(out, a.reshape(128, 6, 10).transpose(0, 2, 1).reshape(128, 60))


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_transpose_tensor_engine(rng, dtype):
    m = load_conformance("transpose2d")
    a = rng.standard_normal((96, 128)).astype(dtype)
    out = m.transpose_tile_pe(a)
    np.testing.assert_array_equal(out, a.T)


# -- average pool 2d -------------------------------------------------------------------------------------------
def test_avgpool_tutorial_case():
    m = load_conformance("average_pool2d")
    x = np.arange(2 * 6 * 6, dtype=np.float16).reshape(2, 6, 6)
    out = m.avgpool2d(x, 2)
    ref = x.astype(np.float32).reshape(2, 3, 2, 3, 2).mean(axis=(2, 4)).astype(np.float16)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, ref)


def test_avgpool_random(rng):
    m = load_conformance("average_pool2d")
    x = rng.standard_normal((128, 12, 16)).astype(np.float32)
    out = m.avgpool2d(x, 4)
    np.testing.assert_allclose(out, x.reshape(128, 3, 4, 4, 4).mean(axis=(2, 4)), rtol=1e-5, atol=1e-6)


# -- rmsnorm-style fused reduction ----------------------------------------------------------------------------------
@pytest.mark.parametrize("C,T", [(1, 64), (3, 200)])
def test_rmsnorm_fused_reduction(rng, C, T):
    m = load_conformance("rmsnorm")
    D = 128 * C
    x = rng.standard_normal((D, T)).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    y, ss = m.rmsnorm_T(x, w)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(axis=0, keepdims=True) + 1e-6) * w[:, None]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    ss_ref = (x64 ** 2).reshape(C, 128, T).sum(axis=(0, 2))
    np.testing.assert_allclose(ss[:, 0], ss_ref, rtol=1e-5)
    rep = m.rmsnorm_T.last_report
    counts = rep.instruction_counts
    assert counts["tensor"]["nc_matmul"] == 1
    assert counts["scalar"]["activation"] == 2
    assert counts["vector"]["tensor_reduce"] == 1


def test_psum_accumulation_across_banks(rng):
    """K tiles accumulate into one 4-bank PSUM tile, each matmul within a bank; one matmul spanning a
    bank boundary is refused (nc_matmul.psum_bank)."""
    from mp2trn.nkiemu import NkiRuleError

    m = load_conformance("matmul")
    lhsT = rng.standard_normal((384, 128)).astype(np.float32)
    rhs = rng.standard_normal((384, 2048)).astype(np.float32)
    out = m.mm_psum_banks(lhsT, rhs)
    np.testing.assert_allclose(out, lhsT.astype(np.float64).T @ rhs, rtol=1e-4, atol=1e-3)
    assert m.mm_psum_banks.last_report.peak_psum_bytes == 4 * 2048
    with pytest.raises(NkiRuleError) as err:
        m.mm_psum_banks(lhsT, rhs, cross_banks=True)
    assert err.value.rule == "nc_matmul.psum_bank"
