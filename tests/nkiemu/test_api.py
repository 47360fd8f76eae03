"""API surface and semantics: jit/simulate forms, targets, fills, accumulation, casts, views, nl.*."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import mp2trn.nkiemu as nki
import mp2trn.nkiemu.isa as nisa
import mp2trn.nkiemu.language as nl
import mp2trn.nkiemu.typing as nt

from .conftest import BF16


def test_module_tree_and_names():
    assert nki.language is nl and nki.isa is nisa and nki.typing is nt
    assert callable(nki.jit) and callable(nki.simulate)
    for name in ["ndarray", "zeros", "ones", "full", "sbuf", "psum", "hbm", "shared_hbm", "private_hbm",
                 "bfloat16", "float8_e4m3", "float8_e5m2", "tile_size", "affine_range", "sequential_range",
                 "static_range", "ds", "program_id", "num_programs", "load", "store", "copy", "matmul",
                 "transpose", "add", "exp", "sum"]:
        assert hasattr(nl, name), name
    for name in ["nc_matmul", "nc_transpose", "dma_copy", "tensor_copy", "tensor_tensor", "tensor_scalar",
                 "tensor_reduce", "activation", "activation_reduce", "tensor_scalar_reduce", "memset", "iota",
                 "reciprocal", "affine_select", "engine", "reduce_cmd", "dge_mode", "oob_mode", "nc_version",
                 "get_nc_version", "matmul_perf_mode"]:
        assert hasattr(nisa, name), name
    assert nl.hbm is nl.private_hbm
    assert nl.bfloat16 == "bfloat16" and nl.float32 == np.float32
    assert nisa.engine.vector.value == 5 and nisa.engine.tensor.value == 1


def test_tile_size_plain_ints_follow_target():
    ts = nl.tile_size
    assert (ts.pmax, ts.psum_fmax, ts.gemm_stationary_fmax, ts.gemm_moving_fmax) == (128, 512, 128, 512)
    assert type(ts.pmax) is int
    assert ts.total_available_sbuf_size == 180224            # DEFAULT_TARGET = trn1, as the sim device
    with nki.target("trn2"):
        assert ts.total_available_sbuf_size == 212984
        assert nisa.get_nc_version() is nisa.nc_version.gen3


def test_target_precedence(monkeypatch):
    k = nki.jit(lambda: nisa.get_nc_version())
    assert k() is nisa.nc_version.gen2                       # default trn1 (DEFAULT_TARGET)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen3")
    assert k() is nisa.nc_version.gen3                       # env var
    with nki.target("trn3"):
        assert k() is nisa.nc_version.gen4                   # context manager beats env
        assert nki.simulate(k, target="trn2")() is nisa.nc_version.gen3  # per-call beats all
    nki.set_default_target("trn2")
    assert k() is nisa.nc_version.gen3
    with pytest.raises(ValueError):
        nki.target("trn9").__enter__()


def test_jit_forms_and_simulate():
    def body(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out, t)
        return out
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    for k in (nki.jit(body), nki.jit()(body), nki.jit(mode="baremetal")(body)):
        out = k(a)
        assert isinstance(out, np.ndarray)
        np.testing.assert_array_equal(out, a)
    np.testing.assert_array_equal(nki.simulate(body)(a), a)          # plain function auto-wrapped
    np.testing.assert_array_equal(nki.simulate(nki.jit(body))(a), a)


@pytest.mark.usefixtures("on_trn2")
def test_lnc_grid_program_ids():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        n = nl.num_programs()
        pid = nl.program_id(0)
        rows = a.shape[0] // n
        t = nl.ndarray((rows, a.shape[1]), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[pid * rows:(pid + 1) * rows, :])
        t2 = nl.ndarray((rows, a.shape[1]), a.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(t2, t, nl.add, float(pid))
        nisa.dma_copy(dst=out[pid * rows:(pid + 1) * rows, :], src=t2)
        return out
    a = np.zeros((8, 4), np.float32)
    out = k[2](a)
    np.testing.assert_array_equal(out[:4], 0.0)
    np.testing.assert_array_equal(out[4:], 1.0)
    np.testing.assert_array_equal(k(a), 0.0)
    assert set(k.last_report.engine_busy_s) >= {"vector", "dma"}
    out2 = nki.simulate(k[2])(a)
    np.testing.assert_array_equal(out2, out)


def test_fresh_allocations_are_sentinel_filled():
    @nki.jit
    def k():
        f = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
        i = nl.ndarray((4, 4), nl.int32, buffer=nl.shared_hbm)
        s = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=f, src=s)            # reading unwritten SBUF shows up as NaN
        return f, i
    f, i = k()
    assert np.isnan(f).all()
    np.testing.assert_array_equal(i, 4)


def test_psum_accumulate_semantics():
    @nki.jit
    def k(a, b, mode):
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        sa = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        sb_ = nl.ndarray(b.shape, b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(sa, a)
        nisa.dma_copy(sb_, b)
        p = nl.ndarray((4, 8), nl.float32, buffer=nl.psum)
        acc = {"default": None, "false": False, "true": True}[mode]
        for _ in nl.static_range(3):
            nisa.nc_matmul(p, sa, sb_, accumulate=acc)
        s = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(s, p)
        nisa.dma_copy(out, s)
        return out
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 4)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    one = a.T @ b
    np.testing.assert_allclose(k(a, b, "default"), 3 * one, rtol=1e-5)   # first overwrites, then accumulates
    np.testing.assert_allclose(k(a, b, "false"), one, rtol=1e-5)
    assert np.isnan(k(a, b, "true")).all()                                 # accumulates onto the NaN sentinel


def test_psum_flag_reset_by_reallocation_and_non_matmul_writes():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((2, 4, 8), nl.float32, buffer=nl.shared_hbm)
        sa = nl.load(a)
        sb_ = nl.load(b)
        p = nl.ndarray((4, 8), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(p, sa, sb_)
        nisa.memset(p, 100.0)                  # a non-matmul write: next matmul overwrites
        nisa.nc_matmul(p, sa, sb_)
        nisa.nc_matmul(p[:, 0:4], sa, sb_[:, 0:4])  # half of it accumulates
        s = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(s, p)
        nisa.dma_copy(out[0], s)
        p = nl.ndarray((4, 8), nl.float32, buffer=nl.psum)   # re-allocation: fresh flags
        nisa.nc_matmul(p, sa, sb_)
        nisa.tensor_copy(s, p)
        nisa.dma_copy(out[1], s)
        return out
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 4)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    one = a.T @ b
    out = k(a, b)
    np.testing.assert_allclose(out[0][:, :4], 2 * one[:, :4], rtol=1e-5)
    np.testing.assert_allclose(out[0][:, 4:], one[:, 4:], rtol=1e-5)
    np.testing.assert_allclose(out[1], one, rtol=1e-5)


def test_rne_cast_and_fp32_engine_math():
    @nki.jit
    def k(x, y):
        out = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.shared_hbm)
        a, b = nl.load(x), nl.load(y)
        s = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_tensor(s, a, b, nl.add)     # bf16 + bf16 -> fp32 add -> one RNE rounding
        nisa.dma_copy(out, s)
        return out
    rng = np.random.default_rng(2)
    x = rng.standard_normal((128, 64)).astype(BF16)
    y = (rng.standard_normal((128, 64)) * 1e-3).astype(BF16)
    np.testing.assert_array_equal(k(x, y), (x.astype(np.float32) + y.astype(np.float32)).astype(BF16))

    @nki.jit
    def cast(x):
        out = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load(x)
        c = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_copy(c, t)
        nisa.dma_copy(out, c)
        return out
    # halfway cases round to even
    v = np.array([[1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8)]], np.float32)
    np.testing.assert_array_equal(cast(v).astype(np.float32), [[1.0, 1.0 + 2 ** -6, -1.0]])


def test_float8_types():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, nl.float8_e4m3, buffer=nl.shared_hbm)
        t = nl.load(x)
        c = nl.ndarray(x.shape, nl.float8_e4m3, buffer=nl.sbuf)
        nisa.tensor_copy(c, t)
        nisa.dma_copy(out, c)
        return out
    x = np.linspace(-3, 3, 32, dtype=np.float32).reshape(4, 8)
    out = k(x)
    assert out.dtype == ml_dtypes.float8_e4m3
    np.testing.assert_array_equal(out, x.astype(ml_dtypes.float8_e4m3))


def test_views_write_through_slices_reshape_ap():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        nisa.memset(t, 0.0)
        nisa.dma_copy(dst=t[:, nl.ds(4, 4)], src=a)          # slice view
        r = t.reshape((128, 4, 4))
        nisa.memset(r[:, 3, :], 7.0)                          # reshape view
        v = t.ap(pattern=[[16, 128], [2, 2]], offset=0)       # elements 0 and 2 of each partition
        nisa.memset(v, -1.0)
        nisa.dma_copy(out, t)
        return out
    a = np.ones((128, 4), np.float32)
    out = k(a)
    expect = np.zeros((128, 16), np.float32)
    expect[:, 4:8] = 1.0
    expect[:, 12:16] = 7.0
    expect[:, [0, 2]] = -1.0
    np.testing.assert_array_equal(out, expect)


def test_kernel_updates_inputs_in_place():
    @nki.jit
    def k(a):
        t = nl.load(a)
        t2 = nl.multiply(t, 2.0)
        nl.store(a, t2)
        return None
    a = np.ones((4, 4), np.float32)
    k(a)
    np.testing.assert_array_equal(a, 2.0)
    b = np.ones((8, 4), np.float32)[::2]          # non-contiguous: written back too
    base = b.base
    k(b)
    np.testing.assert_array_equal(base[::2], 2.0)
    np.testing.assert_array_equal(base[1::2], 1.0)


def test_nl_wrappers_values_and_engines():
    @nki.jit
    def k(x):
        out = nl.ndarray((128, 9), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        cols = [nl.add(t, 2.0), nl.exp(t), nl.multiply(t, t), nl.maximum(t, 0.5), nl.negative(t),
                nl.rsqrt(nl.add(nl.square(t), 1.0))]
        res = nl.ndarray((128, 9), nl.float32, buffer=nl.sbuf)
        for i, c in enumerate(cols):
            nisa.tensor_copy(res[:, i:i + 1], nl.sum(c, axis=1, keepdims=True))
        nisa.tensor_copy(res[:, 6:7], nl.max(t, axis=1, keepdims=True))
        nisa.tensor_copy(res[:, 7:8], nl.mean(t, axis=[1], keepdims=True))
        nisa.tensor_copy(res[:, 8:9], nl.sum(nl.copy(t), axis=1, keepdims=True))
        nl.store(out, res)
        return out
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 32)).astype(np.float32)
    out = k(x)
    x64 = x.astype(np.float64)
    ref = np.stack([(x64 + 2).sum(1), np.exp(x64).sum(1), (x64 * x64).sum(1), np.maximum(x64, 0.5).sum(1),
                    -x64.sum(1), (1 / np.sqrt(x64 ** 2 + 1)).sum(1), x64.max(1), x64.mean(1), x64.sum(1)], 1)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    counts = k.last_report.instruction_counts
    assert counts["scalar"]["activation"] >= 4     # exp, square, rsqrt, copy on ScalarE
    assert counts["vector"]["tensor_reduce"] == 9


def test_nl_matmul_and_transpose():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.shared_hbm)
        out2 = nl.ndarray((a.shape[1], a.shape[0]), nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        p = nl.matmul(ta, tb, transpose_x=True)
        s = nl.ndarray(p.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(s, p)
        nl.store(out, s)
        tp = nl.transpose(ta)
        s2 = nl.ndarray(tp.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(s2, tp)
        nl.store(out2, s2)
        return out, out2
    rng = np.random.default_rng(4)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((64, 100)).astype(np.float32)
    o1, o2 = k(a, b)
    np.testing.assert_allclose(o1, a.T @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(o2, a.T)


def test_activation_reduce_registers():
    @nki.jit
    def k(x):
        out = nl.ndarray((128, 3), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        y = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((128, 3), nl.float32, buffer=nl.sbuf)
        nisa.activation(y, nl.exp, t, reduce_op=nl.add, reduce_res=r[:, 0:1],
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(y, nl.copy, t, scale=2.0, reduce_op=nl.add, reduce_res=r[:, 1:2],
                        reduce_cmd=nisa.reduce_cmd.reduce)                 # accumulates on top
        nisa.activation_reduce(y, nl.square, t, nl.add, r[:, 2:3])
        nl.store(out, r)
        return out
    rng = np.random.default_rng(5)
    x = rng.standard_normal((128, 16)).astype(np.float32)
    out = k(x)
    e = np.exp(x.astype(np.float64)).sum(1)
    np.testing.assert_allclose(out[:, 0], e, rtol=1e-5)
    np.testing.assert_allclose(out[:, 1], e + 2 * x.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[:, 2], (x.astype(np.float64) ** 2).sum(1), rtol=1e-5)
    assert k.last_report.instruction_counts["scalar"]["activation"] == 2


def test_gpsimd_and_vector_misc_ops():
    @nki.jit
    def k(x):
        out = nl.ndarray((4, 4, 8), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        io = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.iota(io, [[1, 8]], offset=1, channel_multiplier=10)
        sel = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        # keep on_true where (col - row) >= 0, i.e. upper triangle
        nisa.affine_select(sel, [[1, 8]], -1, t, -9.0, cmp_op=nl.greater_equal)
        rc = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(rc, t)
        red = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        rs = nl.ndarray((4, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(red, t, nl.multiply, 3.0, nl.add, rs)
        for i, v in enumerate((io, sel, rc, red)):
            nisa.dma_copy(out[i], v)
        return out
    x = np.arange(1, 33, dtype=np.float32).reshape(4, 8)
    out = k(x)
    p, c = np.meshgrid(np.arange(4), np.arange(8), indexing="ij")
    np.testing.assert_array_equal(out[0], 1 + 10 * p + c)
    np.testing.assert_array_equal(out[1], np.where(c - p >= 0, x, -9.0))
    np.testing.assert_allclose(out[2], 1 / x, rtol=1e-7)
    np.testing.assert_array_equal(out[3], 3 * x)
    counts = k.last_report.instruction_counts
    assert counts["gpsimd"] == {"affine_select": 1, "iota": 1}


def test_positional_and_keyword_call_forms():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.shared_hbm)
        sa = nl.ndarray(a.shape, a.dtype, nl.sbuf)
        sb_ = nl.ndarray(b.shape, b.dtype, nl.sbuf)
        nisa.dma_copy(sa, a)
        nisa.dma_copy(src=b, dst=sb_)
        p1 = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, nl.psum)
        p2 = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, nl.psum)
        nisa.nc_matmul(p1, sa, sb_)
        nisa.nc_matmul(dst=p2, stationary=sa, moving=sb_)
        s = nl.ndarray(p1.shape, nl.float32, nl.sbuf)
        c2 = nl.ndarray(p1.shape, nl.float32, nl.sbuf)
        nisa.tensor_copy(c2, p2)
        nisa.tensor_tensor(s, p1, c2, nl.subtract)
        nisa.dma_copy(out, s)
        return out
    a = np.ones((8, 4), np.float32)
    b = np.ones((8, 6), np.float32)
    np.testing.assert_array_equal(k(a, b), 0.0)


def test_typing_annotations():
    ann = nt.tensor[128, 512]
    assert ann.shape == (128, 512)


def test_setitem_is_rejected():
    @nki.jit
    def k():
        t = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        t[0, 0] = 1.0
    with pytest.raises(nki.NkiRuleError, match="tensor.setitem"):
        k()


def test_unimplemented_apis_say_so():
    with pytest.raises(nki.NkiUnsupportedError, match="random-number state"):
        nisa.rand2(None, None)
    with pytest.raises(AttributeError):
        nisa.not_an_instruction  # noqa: B018


def test_nested_jit_rejected():
    inner = nki.jit(lambda: None)
    outer = nki.jit(lambda: inner())
    with pytest.raises(nki.NkiRuleError, match="jit.nested"):
        outer()
