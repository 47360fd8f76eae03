"""The MX instructions of NeuronCore-v4 (nkiemu/isa_mx.py) against NumPy references written from the
ISA reference and the MXFP deep dive (groups of 8 partitions × 4 elements, biased power-of-two scales kept
in the group's quadrant, lanes packed four to an element), plus one broken rule each."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mp2trn.nkiemu as nki
import mp2trn.nkiemu.isa as nisa
import mp2trn.nkiemu.language as nl
from mp2trn.nkiemu import NkiRuleError

RNG = np.random.default_rng(5)
LANES = {"float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0, 8), "float8_e5m2": (ml_dtypes.float8_e5m2, 57344.0, 15)}


def quadrant_row(i):
    return 32 * (i // 4) + i % 4


def ref_quantize(x: np.ndarray, lane: str):
    """(P, F) → lane values (P, F) and scales (P/8, F/4), from the documented rule (frexp, not bit fields)."""
    dtype, big, emax = LANES[lane]
    P, F = x.shape
    _, e = np.frexp(x.astype(np.float32))
    biased = np.where(x == 0, 0, e - 1 + 127).reshape(P // 8, 8, F // 4, 4).max(axis=(1, 3))
    scale = np.maximum(biased - emax, 0)
    factor = np.repeat(np.repeat(2.0 ** (scale - 127.0), 8, axis=0), 4, axis=1)
    q = np.clip(x / factor, -big, big).astype(dtype)
    return q, scale.astype(np.uint8)


def unpack(bits: np.ndarray, lane) -> np.ndarray:
    """Packed uint32 (fp8) or uint16 (fp4) elements (P, F) → lane values (P, 4F) as float32."""
    if bits.dtype == np.uint32:
        return bits.view(np.uint8).view(lane).astype(np.float32)          # little-endian: lane q = byte q
    nibbles = np.stack([(bits >> (4 * q)) & 0xF for q in range(4)], axis=-1).astype(np.uint8)
    return nibbles.view(lane).astype(np.float32).reshape(bits.shape[0], -1)


def run(kernel, *arrays, target="trn3"):
    return nki.simulate(nki.jit(kernel), target=target)(*arrays)


def quantize_kernel(P, F, lane_x4, scale_rows):
    def kernel(x):
        src = nl.ndarray((P, F), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=src, src=x)
        q = nl.ndarray((P, F // 4), lane_x4, buffer=nl.sbuf)
        s = nl.ndarray((scale_rows, F // 4), nl.uint8, buffer=nl.sbuf)
        nisa.memset(dst=s, value=0)
        nisa.quantize_mx(dst=q, src=src, dst_scale=s)
        q_out = nl.ndarray((P, F // 4), nl.uint32, buffer=nl.shared_hbm)
        s_out = nl.ndarray((scale_rows, F // 4), nl.uint8, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=q_out.view(lane_x4), src=q)
        nisa.dma_copy(dst=s_out, src=s)
        return q_out, s_out
    return kernel


@pytest.mark.parametrize("P,F,lane,scale_rows", [(32, 64, "float8_e4m3fn", 4), (128, 32, "float8_e4m3fn", 128),
                                                 (64, 16, "float8_e5m2", 64), (32, 8, "float8_e5m2", 32)])
def test_quantize_mx_matches_the_documented_rule(P, F, lane, scale_rows):
    x = (RNG.standard_normal((P, F)) * np.exp2(RNG.integers(-6, 6, (P, 1)))).astype(ml_dtypes.bfloat16)
    q_bits, scales = run(quantize_kernel(P, F, getattr(nl, lane + "_x4"), scale_rows), x)
    want_q, want_s = ref_quantize(x.astype(np.float32), lane)
    got_q = unpack(q_bits, LANES[lane][0])
    np.testing.assert_array_equal(got_q, want_q.astype(np.float32))
    rows = [quadrant_row(i) for i in range(P // 8)]
    np.testing.assert_array_equal(scales[rows], want_s)                # each scale in its group's quadrant
    dequant = got_q * np.repeat(np.repeat(2.0 ** (want_s - 127.0), 8, 0), 4, 1)
    rel = 2.0 ** -3 if lane == "float8_e4m3fn" else 2.0 ** -2         # 3 / 2 mantissa bits, round to nearest
    big = np.abs(x.astype(np.float32)) > 2.0 ** -6 * np.abs(x.astype(np.float32)).max()
    assert np.all(np.abs(dequant - x.astype(np.float32))[big] <= rel * np.abs(x.astype(np.float32))[big])


def matmul_kernel(K, M, N, s_x4, m_x4, dst_dtype=nl.float32):
    def kernel(sbits, sscale, mbits, mscale):
        st = nl.ndarray((K, M), s_x4, buffer=nl.sbuf)
        mv = nl.ndarray((K, N), m_x4, buffer=nl.sbuf)
        ss = nl.ndarray(sscale.shape, nl.uint8, buffer=nl.sbuf)
        ms = nl.ndarray(mscale.shape, nl.uint8, buffer=nl.sbuf)
        nisa.dma_copy(dst=st, src=sbits.view(s_x4))
        nisa.dma_copy(dst=mv, src=mbits.view(m_x4))
        nisa.dma_copy(dst=ss, src=sscale)
        nisa.dma_copy(dst=ms, src=mscale)
        acc = nl.ndarray((M, N), dst_dtype, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=acc, stationary=st, moving=mv, stationary_scale=ss, moving_scale=ms)
        nisa.nc_matmul_mx(dst=acc, stationary=st, moving=mv, stationary_scale=ss, moving_scale=ms)  # accumulates
        out = nl.ndarray((M, N), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=acc)
        res = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=res, src=out)
        return res
    return kernel


def random_mx(K, F, lane, scale_rows):
    """Random packed data (K, F) and hardware-layout scales (scale_rows, F) for ``lane``."""
    values = RNG.choice(np.array([-4, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4], np.float32), size=(K, 4 * F))
    lanes = values.astype(lane)
    if lane == ml_dtypes.float4_e2m1fn:
        nib = lanes.view(np.uint8).reshape(K, F, 4).astype(np.uint16) & 0xF
        bits = nib[..., 0] | nib[..., 1] << 4 | nib[..., 2] << 8 | nib[..., 3] << 12
    else:
        bits = lanes.view(np.uint32)
    compact = RNG.integers(120, 134, (K // 8, F)).astype(np.uint8)
    hw = np.zeros((scale_rows, F), np.uint8)
    hw[[quadrant_row(i) for i in range(K // 8)]] = compact
    dequant = lanes.astype(np.float32).reshape(K, F, 4) * np.repeat(2.0 ** (compact - 127.0), 8, 0)[:, :, None]
    return bits, hw, dequant


@pytest.mark.parametrize("K,M,N,s_lane,m_lane", [(128, 128, 512, "float8_e4m3fn", "float8_e5m2"),
                                                 (32, 64, 100, "float4_e2m1fn", "float8_e4m3fn"),
                                                 (64, 2, 7, "float4_e2m1fn", "float4_e2m1fn")])
def test_nc_matmul_mx_is_the_scaled_product_over_partitions_and_lanes(K, M, N, s_lane, m_lane):
    rows = K if K > 32 else K // 8
    sbits, sscale, s = random_mx(K, M, getattr(ml_dtypes, s_lane), rows)
    mbits, mscale, m = random_mx(K, N, getattr(ml_dtypes, m_lane), rows)
    got = run(matmul_kernel(K, M, N, getattr(nl, s_lane + "_x4"), getattr(nl, m_lane + "_x4")),
              sbits, sscale, mbits, mscale)
    want = 2 * np.einsum("kiq,kjq->ij", s.astype(np.float64), m.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_quantize_then_matmul_reproduces_a_bf16_product():
    """Quantize both operands on VectorE, multiply on TensorE: close to the bf16 product (e4m3: ~2^-4)."""
    K, M, N = 64, 32, 48
    a = RNG.standard_normal((K, 4 * M)).astype(ml_dtypes.bfloat16)
    b = RNG.standard_normal((K, 4 * N)).astype(ml_dtypes.bfloat16)

    def kernel(a, b):
        tiles = []
        for x, F in ((a, 4 * M), (b, 4 * N)):
            src = nl.ndarray((K, F), nl.bfloat16, buffer=nl.sbuf)
            nisa.dma_copy(dst=src, src=x)
            q = nl.ndarray((K, F // 4), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
            s = nl.ndarray((K, F // 4), nl.uint8, buffer=nl.sbuf)
            nisa.quantize_mx(dst=q, src=src, dst_scale=s)
            tiles += [q, s]
        acc = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=acc, stationary=tiles[0], moving=tiles[2], stationary_scale=tiles[1],
                          moving_scale=tiles[3])
        out = nl.ndarray((M, N), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=acc)
        res = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=res, src=out)
        return res

    got = run(kernel, a, b)
    want = np.einsum("kiq,kjq->ij", a.astype(np.float32).reshape(K, M, 4), b.astype(np.float32).reshape(K, N, 4))
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 1e-4 < err < 0.1       # quantised: not exact, but the product of the same numbers


def test_mx_matmul_costs_a_bf16_tile_and_counts_four_times_the_flops():
    K, M, N = 128, 128, 512
    sbits, sscale, _ = random_mx(K, M, ml_dtypes.float8_e4m3fn, K)
    mbits, mscale, _ = random_mx(K, N, ml_dtypes.float8_e4m3fn, K)
    run(matmul_kernel(K, M, N, nl.float8_e4m3fn_x4, nl.float8_e4m3fn_x4), sbits, sscale, mbits, mscale)
    mx = nki.last_report()

    def bf16(a, b):
        st = nl.ndarray((K, M), nl.bfloat16, buffer=nl.sbuf)
        mv = nl.ndarray((K, N), nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=st, src=a)
        nisa.dma_copy(dst=mv, src=b)
        acc = nl.ndarray((M, N), nl.float32, buffer=nl.psum)
        for _ in range(2):
            nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
        out = nl.ndarray((M, N), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=acc)
        res = nl.ndarray((M, N), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=res, src=out)
        return res

    run(bf16, np.ones((K, M), ml_dtypes.bfloat16), np.ones((K, N), ml_dtypes.bfloat16))
    ref = nki.last_report()
    assert mx.engine_busy_s["tensor"] == pytest.approx(ref.engine_busy_s["tensor"])
    assert mx.flops == 4 * ref.flops


# -- rules --------------------------------------------------------------------------------------------------

def _expect(rule, kernel, *arrays, target="trn3"):
    with pytest.raises(NkiRuleError, match=rule):
        run(kernel, *arrays, target=target)


def test_mx_instructions_need_neuroncore_v4():
    x = np.ones((32, 8), ml_dtypes.bfloat16)
    _expect("quantize_mx.target", quantize_kernel(32, 8, nl.float8_e4m3fn_x4, 4), x, target="trn2")


@pytest.mark.parametrize("P,F,lane,rows,rule", [
    (48, 8, nl.float8_e4m3fn_x4, 48, "quantize_mx.partition_size"),
    (32, 6, nl.float8_e4m3fn_x4, 4, "quantize_mx.free_size"),
    (32, 8, nl.float4_e2m1fn_x4, 4, "quantize_mx.dst_dtype"),
    (64, 8, nl.float8_e4m3fn_x4, 8, "quantize_mx.scale_shape"),     # > 32 partitions: oversize scale required
])
def test_quantize_mx_rules(P, F, lane, rows, rule):
    _expect(rule, quantize_kernel(P, F, lane, rows), np.ones((P, F), ml_dtypes.bfloat16))


def test_quantize_mx_reads_sbuf_only():
    def kernel(x):
        src = nl.ndarray((32, 8), nl.float32, buffer=nl.psum)
        nisa.memset(dst=src, value=1.0)
        q = nl.ndarray((32, 2), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        s = nl.ndarray((4, 2), nl.uint8, buffer=nl.sbuf)
        nisa.quantize_mx(dst=q, src=src, dst_scale=s)
        return x
    _expect("quantize_mx.sbuf", kernel, np.ones((1, 1), np.float32))


def test_nc_matmul_mx_rules():
    K, M = 32, 4
    sbits, sscale, _ = random_mx(K, M, ml_dtypes.float8_e4m3fn, K // 8)
    mbits, mscale, _ = random_mx(K, 600, ml_dtypes.float8_e4m3fn, K // 8)
    _expect("nc_matmul_mx.moving_fmax", matmul_kernel(K, M, 600, nl.float8_e4m3fn_x4, nl.float8_e4m3fn_x4),
            sbits, sscale, mbits, mscale)
    sbits, sscale, _ = random_mx(K, 3, ml_dtypes.float8_e4m3fn, K // 8)
    mbits, mscale, _ = random_mx(K, 8, ml_dtypes.float8_e4m3fn, K // 8)
    _expect("nc_matmul_mx.stationary_fmax", matmul_kernel(K, 3, 8, nl.float8_e4m3fn_x4, nl.float8_e4m3fn_x4),
            sbits, sscale, mbits, mscale)


def test_packed_data_is_refused_by_ordinary_instructions():
    def kernel(x):
        q = nl.ndarray((32, 2), nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=q, src=x.view(nl.float8_e4m3fn_x4))
        out = nl.ndarray((32, 2), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=q)
        return x
    _expect("dtype.packed_x4", kernel, np.zeros((32, 2), np.uint32))
