"""The instructions of nkiemu/isa_vector.py against NumPy references written from the ISA reference's
own NumPy equivalents, plus one broken rule each; and the list of what is not emulated."""

from __future__ import annotations

import numpy as np
import pytest

import mp2trn.nkiemu as nki
import mp2trn.nkiemu.isa as nisa
import mp2trn.nkiemu.language as nl
from mp2trn.nkiemu import NkiRuleError

from .conftest import BF16

RNG = np.random.default_rng(11)
P, F = 64, 40


def launch(body, *arrays, target="trn2"):
    """Run ``body`` on SBUF copies of ``arrays``; it returns the SBUF tiles to bring back."""
    def kernel(*hbm):
        tiles = []
        for a in hbm:
            t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a)
            tiles.append(t)
        outs = body(*tiles)
        results = []
        for o in outs:
            h = nl.ndarray(o.shape, o.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=h, src=o)
            results.append(h)
        return tuple(results)
    kernel.__name__ = body.__name__
    return nki.simulate(nki.jit(kernel), target=target)(*arrays)


def sb(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype, buffer=nl.sbuf)


def test_scalar_tensor_tensor():
    x, y = RNG.standard_normal((P, F)).astype(np.float32), RNG.standard_normal((P, F)).astype(np.float32)
    col = RNG.standard_normal((P, 1)).astype(np.float32)

    def body(x, y, col):
        d1, d2 = sb((P, F)), sb((P, F))
        nisa.scalar_tensor_tensor(dst=d1, data=x, op0=nl.multiply, operand0=col, op1=nl.subtract, operand1=y)
        nisa.scalar_tensor_tensor(dst=d2, data=x, op0=nl.add, operand0=2.0, op1=nl.subtract, operand1=y, reverse1=True)
        return d1, d2
    d1, d2 = launch(body, x, y, col)
    np.testing.assert_allclose(d1, x * col - y, rtol=1e-6)
    np.testing.assert_allclose(d2, y - (x + 2.0), rtol=1e-6)


def test_tensor_tensor_scan_is_the_documented_recurrence():
    a, b = RNG.random((P, F)).astype(np.float32), RNG.standard_normal((P, F)).astype(np.float32)

    def body(a, b):
        d = sb((P, F))
        nisa.tensor_tensor_scan(dst=d, data0=a, data1=b, initial=0.5, op0=nl.multiply, op1=nl.add)
        return (d,)
    (d,) = launch(body, a, b)
    ref = np.empty((P, F))
    prev = np.full(P, 0.5)
    for i in range(F):                       # r[i] = a[i]·r[i-1] + b[i]: a linear recurrence (Mamba's scan)
        prev = a[:, i] * prev + b[:, i]
        ref[:, i] = prev
    np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-5)


def test_tensor_partition_reduce():
    x = RNG.standard_normal((P, F)).astype(np.float32)

    def body(x):
        s, m = sb((1, F)), sb((1, F))
        nisa.tensor_partition_reduce(dst=s, op=nl.add, data=x)
        nisa.tensor_partition_reduce(dst=m, op=nl.maximum, data=x)
        return s, m
    s, m = launch(body, x)
    np.testing.assert_allclose(s, x.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m, x.max(0, keepdims=True))


def test_tensor_scalar_cumulative():
    x = RNG.standard_normal((P, F)).astype(np.float32)

    def body(x):
        c, mx = sb((P, F)), sb((P, F))
        nisa.tensor_scalar_cumulative(dst=c, src=x, op0=nl.multiply, op1=nl.add, imm0=2.0)
        nisa.tensor_scalar_cumulative(dst=mx, src=x, op0=nl.add, op1=nl.maximum, imm0=0.0)
        return c, mx
    c, mx = launch(body, x)
    np.testing.assert_allclose(c, np.cumsum(2 * x, axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mx, np.maximum.accumulate(x, axis=1))


def test_select_reduce_and_range_select():
    x = RNG.standard_normal((P, F)).astype(np.float32)
    pred = (RNG.random((P, F)) > 0.5).astype(np.uint8)
    lo = np.full((P, 1), 5.0, np.float32)
    hi = np.arange(P, dtype=np.float32).reshape(P, 1) % F + 6   # row p keeps indices 5 .. hi_p−1

    def body(x, pred, lo, hi):
        d, r = sb((P, F)), sb((P, 1))
        nisa.select_reduce(dst=d, predicate=pred, on_true=x, on_false=-1.0, reduce_res=r,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)
        e, q = sb((P, F)), sb((P, 1))
        nisa.range_select(dst=e, on_true_tile=x, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=lo,
                          bound1=hi, reduce_res=q)
        return d, r, e, q
    d, r, e, q = launch(body, x, pred, lo, hi)
    sel = np.where(pred != 0, x, -1.0)
    np.testing.assert_array_equal(d, sel)
    np.testing.assert_array_equal(r[:, 0], sel.max(1))
    idx = np.arange(F)[None, :]
    rng = np.where((idx >= lo) & (idx < hi), x, np.float32(-3.4028235e38))
    np.testing.assert_array_equal(e, rng)
    np.testing.assert_array_equal(q[:, 0], rng.max(1))


def test_bn_stats_then_bn_aggr_give_mean_and_variance():
    x = RNG.standard_normal((P, 1000)).astype(np.float32)

    def body(x):
        stats = sb((P, 12))
        nisa.bn_stats(dst=stats[:, 0:6], data=x[:, 0:500])
        nisa.bn_stats(dst=stats[:, 6:12], data=x[:, 500:1000])
        mv = sb((P, 2))
        nisa.bn_aggr(dst=mv, data=stats)
        return (mv,)
    (mv,) = launch(body, x)
    np.testing.assert_allclose(mv[:, 0], x.mean(1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mv[:, 1], x.var(1), rtol=1e-4)


def test_max8_find_index8_match_replace8():
    x = RNG.permutation(P * F).reshape(P, F).astype(np.float32)

    def body(x):
        top, idx, rep = sb((P, 8)), sb((P, 8), nl.uint32), sb((P, F))
        nisa.max8(dst=top, src=x)
        nisa.nc_find_index8(dst=idx, data=x, vals=top)
        nisa.nc_match_replace8(dst=rep, data=x, vals=top, imm=-1.0)
        return top, idx, rep
    top, idx, rep = launch(body, x)
    ref_top = -np.sort(-x, axis=1)[:, :8]
    np.testing.assert_array_equal(top, ref_top)
    np.testing.assert_array_equal(np.take_along_axis(x, idx.astype(np.int64), 1), ref_top)
    ref_rep = x.copy()
    np.put_along_axis(ref_rep, np.argsort(-x, axis=1)[:, :8], -1.0, axis=1)
    np.testing.assert_array_equal(rep, ref_rep)


def test_exponential_on_trn3_with_a_running_sum():
    x = RNG.standard_normal((P, F)).astype(np.float32)

    def body(x):
        d, s = sb((P, F)), sb((P, 1))
        nisa.exponential(dst=d, src=x, max_value=1.0, reduce_res=s, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return d, s
    d, s = launch(body, x, target="trn3")
    np.testing.assert_allclose(d, np.exp(x - 1.0), rtol=1e-6)
    np.testing.assert_allclose(s[:, 0], np.exp(x - 1.0).sum(1), rtol=1e-5)
    with pytest.raises(NkiRuleError, match="exponential.target"):
        launch(body, x, target="trn2")


def test_tensor_copy_predicated_keeps_the_rest():
    x, y = RNG.standard_normal((P, F)).astype(np.float32), RNG.standard_normal((P, F)).astype(np.float32)
    pred = (RNG.random((P, F)) > 0.3).astype(np.uint8)

    def body(x, y, pred):
        nisa.tensor_copy_predicated(dst=y, src=x, predicate=pred)
        return (y,)
    (d,) = launch(body, x, y, pred)
    np.testing.assert_array_equal(d, np.where(pred != 0, x, y))


@pytest.mark.parametrize("shape", [(16, 256), (4, 6, 10), (2, 3, 4, 5)])
def test_dma_transpose_permutations(shape):
    x = RNG.standard_normal(shape).astype(BF16)
    perm = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}[len(shape)]

    @nki.jit
    def k(x):
        out = nl.ndarray(tuple(shape[i] for i in perm), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_transpose(dst=out, src=x)
        return out
    np.testing.assert_array_equal(nki.simulate(k)(x), np.transpose(x, perm))


@pytest.mark.parametrize("case", ["scan_bitvec", "select_pred_dtype", "range_select_trn1", "bn_stats_fmax",
                                  "cumulative_int32", "dma_transpose_fp32", "partition_reduce_psum",
                                  "shuffle_mask", "dma_compute_scale", "nonzero_trn1"])
def test_each_documented_rule_is_enforced(case):
    def body():
        a, b = sb((P, F)), sb((P, F))
        nisa.memset(dst=a, value=1.0)
        nisa.memset(dst=b, value=1.0)
        if case == "scan_bitvec":
            nisa.tensor_tensor_scan(dst=a, data0=a, data1=b, initial=0.0, op0=nl.bitwise_and, op1=nl.add)
        elif case == "select_pred_dtype":
            nisa.select_reduce(dst=a, predicate=b, on_true=a, on_false=0.0)
        elif case == "range_select_trn1":
            col = sb((P, 1))
            nisa.memset(dst=col, value=0.0)
            nisa.range_select(dst=a, on_true_tile=b, comp_op0=nl.less, comp_op1=nl.less, bound0=col, bound1=col)
        elif case == "bn_stats_fmax":
            big, st = sb((P, 600)), sb((P, 6))
            nisa.memset(dst=big, value=0.0)
            nisa.bn_stats(dst=st, data=big)
        elif case == "cumulative_int32":
            i = sb((P, F), nl.int32)
            nisa.memset(dst=i, value=0)
            nisa.tensor_scalar_cumulative(dst=i, src=i, op0=nl.add, op1=nl.add, imm0=1.0)
        elif case == "dma_transpose_fp32":
            nisa.dma_transpose(dst=sb((F, P)), src=a)
        elif case == "shuffle_mask":
            nisa.nc_stream_shuffle(dst=a, src=b, shuffle_mask=list(range(16)))
        elif case == "dma_compute_scale":
            nisa.dma_compute(dst=a, srcs=(a, b), reduce_op=nl.add, scales=(1.0, 2.0))
        elif case == "nonzero_trn1":
            d = sb((P, F + 1), nl.int32)
            nisa.nonzero_with_count(dst=d, src=a)
        elif case == "partition_reduce_psum":
            ps = nl.ndarray((P, F), nl.float32, buffer=nl.psum)
            nisa.memset(dst=ps, value=0.0)
            nisa.tensor_partition_reduce(dst=sb((1, F)), op=nl.add, data=ps)
    with pytest.raises(NkiRuleError):
        nki.simulate(nki.jit(body), target="trn1")()


def test_what_is_not_emulated_is_listed_with_a_reason():
    assert len(nisa.INSTRUCTIONS) + len(nisa.NOT_EMULATED) == 48   # + get_nc_version: the 49 of the reference
    for name, why in nisa.NOT_EMULATED.items():
        with pytest.raises(nki.NkiUnsupportedError) as err:
            getattr(nisa, name)()
        assert why in str(err.value)


def test_dma_compute_adds_sources():
    a, b, c = (RNG.standard_normal((P, F)).astype(np.float32) for _ in range(3))

    @nki.jit
    def k(a, b, c):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=c)
        nisa.dma_compute(dst=out, srcs=(a, b, t), reduce_op=nl.add)
        return out
    np.testing.assert_allclose(nki.simulate(k)(a, b, c), a + b + c, rtol=1e-6)


def test_nc_stream_shuffle_per_quadrant():
    x = RNG.standard_normal((64, 8)).astype(np.float32)
    mask = [31 - k for k in range(32)]            # reverse each quadrant

    def body(x):
        d = sb((64, 8))
        nisa.memset(dst=d, value=0.0)
        nisa.nc_stream_shuffle(dst=d, src=x, shuffle_mask=mask)
        return (d,)
    (d,) = launch(body, x)
    ref = np.concatenate([x[0:32][::-1], x[32:64][::-1]])
    np.testing.assert_array_equal(d, ref)


def test_nonzero_with_count_on_the_first_partition_of_each_core():
    x = (RNG.random((128, 8)) > 0.6).astype(np.float32)

    def body(x):
        d = sb((128, 9), nl.int32)
        nisa.memset(dst=d, value=7)
        nisa.nonzero_with_count(dst=d, src=x, index_offset=16, padding_val=-1)
        return (d,)
    (d,) = launch(body, x)
    for p in range(128):
        if p % 16:
            assert np.all(d[p] == 7)                 # not written
        else:
            idx = np.flatnonzero(x[p]) + 16
            ref = np.concatenate([idx, -np.ones(8 - idx.size), [idx.size]])
            np.testing.assert_array_equal(d[p], ref)


def test_nc_n_gather_within_partitions():
    x = RNG.standard_normal((P, F)).astype(np.float32)
    idx = RNG.integers(0, F, (P, 12)).astype(np.uint32)

    def body(x, idx):
        d = sb((P, 12))
        nisa.nc_n_gather(dst=d, data=x, indices=idx)
        return (d,)
    (d,) = launch(body, x, idx)
    np.testing.assert_array_equal(d, np.take_along_axis(x, idx.astype(np.int64), axis=1))


def test_local_gather_as_the_reference_test_describes():
    src = (RNG.random((128, 64, 4)) * 100).astype(np.float32)
    per_core = RNG.integers(0, 64, (16, 2)).astype(np.uint16)
    index = np.tile(per_core, (8, 1))
    valid, per_idx = 24, 4

    def body(src, index_hw):
        d = sb((128, valid * per_idx))
        nisa.local_gather(dst=d, src_buffer=src, index=index_hw, num_elem_per_idx=per_idx, num_valid_indices=valid)
        return (d,)
    (d,) = launch(body, src.reshape(128, -1), (index * per_idx).astype(np.uint16))
    ref = np.empty((128, valid, per_idx), np.float32)
    for c in range(8):                               # the reference test's NumPy semantics
        rows = slice(16 * c, 16 * c + 16)
        ref[rows] = np.take(src[rows], index[rows].flatten(order="F")[:valid], axis=1)
    np.testing.assert_array_equal(d, ref.reshape(128, -1))


def test_sequence_bounds_example():
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], dtype=np.int32)

    @nki.jit
    def k(ids):
        out = nl.ndarray((1, 2, ids.shape[1]), ids.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(ids.shape, ids.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=ids)
        d = nl.ndarray((1, 2, ids.shape[1]), ids.dtype, buffer=nl.sbuf)
        nisa.sequence_bounds(dst=d, segment_ids=t)
        nisa.dma_copy(dst=out, src=d)
        return out
    np.testing.assert_array_equal(nki.simulate(k)(ids)[0], [[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]])
