"""Every enforced rule: a violating kernel raises the named error; its legal neighbour runs."""

from __future__ import annotations

import numpy as np
import pytest

import mp2trn.nkiemu as nki
import mp2trn.nkiemu.isa as nisa
import mp2trn.nkiemu.language as nl
from mp2trn.nkiemu import NkiCapacityError, NkiRemovedAPIError, NkiRuleError

from .conftest import BF16


def run(body, *args, target=None, strict=None):
    """Run ``body(*hbm_args)`` as a kernel (returns whatever body returns)."""
    def kernel(*a):
        r = body(*a)
        # hand back HBM results only (on-chip tiles a lambda happens to return are not outputs)
        return r if isinstance(r, nki.NkiTensor) and nl.is_hbm(r.buffer) else None
    kernel.__name__ = body.__name__
    return nki.simulate(nki.jit(kernel), target=target, strict=strict)(*args)


def sb(shape, dtype=nl.float32, value=None):
    t = nl.ndarray(shape, dtype, buffer=nl.sbuf)
    if value != None:  # noqa: E711 (kernel code: NKI has no `is`)
        nisa.memset(t, value)
    return t


def ps(shape, dtype=nl.float32):
    return nl.ndarray(shape, dtype, buffer=nl.psum)


def raises(rule, body, *args, exc=NkiRuleError, target=None, strict=None):
    with pytest.raises(exc) as ei:
        run(body, *args, target=target, strict=strict)
    e = ei.value
    assert e.rule == rule, str(e)
    assert f"[rule {rule}]" in str(e)
    assert e.instruction in str(e)
    for v in e.shapes.values():
        assert str(tuple(v)) in str(e)
    return e


def mm(sshape, mshape, dshape, sd=nl.float32, md=nl.float32, dd=nl.float32, dslice=None):
    def body():
        one = lambda d: 1 if getattr(d, "kind", "f") in "iu" else 1.0  # noqa: E731
        s, m = sb(sshape, sd, one(sd)), sb(mshape, md, one(md))
        d = ps(dshape, dd)
        nisa.nc_matmul(d if dslice == None else d[dslice], s, m)  # noqa: E711 (NKI has no `is`)
    return body


# -- partition dim ------------------------------------------------------------------------------------
def test_partition_max():
    raises("partition.max", lambda: sb((129, 4)))
    run(lambda: sb((128, 4)))


def test_partition_max_on_hbm_is_fine():
    run(lambda: nl.ndarray((4096, 4), nl.float32, buffer=nl.shared_hbm))


# -- nc_matmul ------------------------------------------------------------------------------------------
def test_matmul_moving_fmax_message():
    e = raises("nc_matmul.moving_fmax", mm((128, 128), (128, 640), (128, 640)))
    assert "moving free size 640 exceeds 512" in str(e)
    assert e.instruction == "nc_matmul"
    assert e.shapes == {"dst": (128, 640), "stationary": (128, 128), "moving": (128, 640)}
    run(mm((128, 128), (128, 512), (128, 512)))


def test_matmul_stationary_fmax():
    raises("nc_matmul.stationary_fmax", mm((128, 129), (128, 512), (128, 512)))
    run(mm((128, 128), (128, 512), (128, 512)))


def test_matmul_contraction_match():
    raises("nc_matmul.contraction_match", mm((64, 128), (128, 512), (128, 512)))
    run(mm((64, 128), (64, 512), (128, 512)))


def test_matmul_dst_in_psum():
    def bad():
        nisa.nc_matmul(sb((128, 512)), sb((128, 128), value=1.0), sb((128, 512), value=1.0))
    raises("nc_matmul.dst_psum", bad)


def test_matmul_operands_in_sbuf():
    def bad(a):
        nisa.nc_matmul(ps((128, 512)), a, sb((128, 512), value=1.0))
    raises("nc_matmul.operands_sbuf", bad, np.ones((128, 128), np.float32))


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_matmul_dst_fp32_on_trn1_trn2(target):
    raises("nc_matmul.dst_dtype", mm((128, 128), (128, 512), (128, 512), BF16, BF16, nl.bfloat16), target=target)
    run(mm((128, 128), (128, 512), (128, 512), BF16, BF16, nl.float32), target=target)


def test_matmul_bf16_dst_allowed_on_trn3():
    run(mm((128, 128), (128, 512), (128, 512), BF16, BF16, nl.bfloat16), target="trn3")


def test_matmul_within_one_psum_bank():
    raises("nc_matmul.psum_bank", mm((128, 128), (128, 512), (128, 1024), dslice=(slice(None), slice(256, 768))))
    run(mm((128, 128), (128, 512), (128, 1024), dslice=(slice(None), slice(512, 1024))))


def test_matmul_fp32_pairing():
    raises("nc_matmul.fp32_pairing", mm((128, 128), (128, 512), (128, 512), nl.float32, BF16))
    raises("nc_matmul.fp32_pairing", mm((128, 128), (128, 512), (128, 512), BF16, nl.float32))
    run(mm((128, 128), (128, 512), (128, 512), BF16, nl.float16))
    run(mm((128, 128), (128, 512), (128, 512), nl.tfloat32, nl.float32))


def test_matmul_input_dtype():
    raises("nc_matmul.input_dtype", mm((128, 128), (128, 512), (128, 512), nl.int8, nl.int8))


def test_matmul_dst_shape():
    raises("nc_matmul.dst_shape", mm((128, 64), (128, 512), (128, 512)))
    run(mm((128, 64), (128, 512), (64, 512)))


# -- DMA -------------------------------------------------------------------------------------------------------
def test_dma_never_reads_psum():
    def bad():
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        p = ps((128, 512))
        nisa.nc_matmul(p, sb((128, 128), value=1.0), sb((128, 512), value=1.0))
        nisa.dma_copy(dst=out, src=p)
        return out

    def good():
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        p = ps((128, 512))
        nisa.nc_matmul(p, sb((128, 128), value=1.0), sb((128, 512), value=1.0))
        s = sb((128, 512))
        nisa.tensor_copy(dst=s, src=p)
        nisa.dma_copy(dst=out, src=s)
        return out
    e = raises("dma_copy.psum_source", bad)
    assert "tensor_copy" in str(e)
    np.testing.assert_array_equal(run(good), np.full((128, 512), 128.0, np.float32))


def test_dma_never_writes_psum():
    raises("dma_copy.psum_dest", lambda a: nisa.dma_copy(dst=ps((128, 4)), src=a), np.ones((128, 4), np.float32))


def test_dma_element_count():
    raises("dma_copy.element_count", lambda a: nisa.dma_copy(dst=sb((128, 8)), src=a), np.ones((128, 4), np.float32))
    run(lambda a: nisa.dma_copy(dst=sb((128, 4)), src=a), np.ones((4, 128), np.float32))


# -- GpSimd and PSUM --------------------------------------------------------------------------------------------
def test_gpsimd_never_touches_psum():
    def copy_on(engine):
        def body():
            p = ps((128, 512))
            nisa.memset(p, 0.0)
            nisa.tensor_copy(dst=sb((128, 512)), src=p, engine=engine)
        return body
    raises("gpsimd.psum", copy_on(nisa.engine.gpsimd))
    run(copy_on(nisa.engine.vector))
    raises("gpsimd.psum", lambda: nisa.memset(ps((128, 4)), 0.0, engine=nisa.engine.gpsimd))
    run(lambda: nisa.memset(sb((128, 4)), 0.0, engine=nisa.engine.gpsimd))
    raises("gpsimd.psum", lambda: nisa.iota(ps((128, 4), nl.int32), [[1, 4]]))
    run(lambda: nisa.iota(sb((128, 4), nl.int32), [[1, 4]]))


# -- tensor_tensor ------------------------------------------------------------------------------------------------
def test_tensor_tensor_no_broadcast():
    raises("tensor_tensor.broadcast",
           lambda: nisa.tensor_tensor(sb((128, 512)), sb((128, 512), value=1.0), sb((128, 1), value=2.0), nl.add))
    run(lambda: nisa.tensor_scalar(sb((128, 512)), sb((128, 512), value=1.0), nl.add, sb((128, 1), value=2.0)))
    # same partitions and elements per partition, different free shapes: allowed
    run(lambda: nisa.tensor_tensor(sb((128, 8, 64)), sb((128, 512), value=1.0), sb((128, 512), value=2.0), nl.add))


def test_tensor_tensor_not_both_psum():
    def body(both):
        def f():
            a, b = ps((128, 512)), ps((128, 512)) if both else sb((128, 512))
            nisa.memset(a, 1.0)
            nisa.memset(b, 2.0)
            nisa.tensor_tensor(sb((128, 512)), a, b, nl.add)
        return f
    raises("tensor_tensor.both_psum", body(True))
    run(body(False))


# -- tensor_reduce -------------------------------------------------------------------------------------------------
def test_tensor_reduce_free_axes_only():
    raises("tensor_reduce.partition_axis",
           lambda: nisa.tensor_reduce(sb((1, 512)), nl.add, sb((128, 512), value=1.0), axis=0))
    raises("tensor_reduce.axis",
           lambda: nisa.tensor_reduce(sb((128, 8)), nl.add, sb((128, 4, 8), value=1.0), axis=1))
    run(lambda: nisa.tensor_reduce(sb((128, 4)), nl.add, sb((128, 4, 8), value=1.0), axis=2))
    run(lambda: nisa.tensor_reduce(sb((128, 1)), nl.add, sb((128, 4, 8), value=1.0), axis=(1, 2)))


# -- memset -------------------------------------------------------------------------------------------------------
def test_memset_value_matches_dtype():
    raises("memset.value_dtype", lambda: nisa.memset(sb((128, 4), nl.int32), 2.0))
    run(lambda: nisa.memset(sb((128, 4), nl.int32), 2))
    run(lambda: nisa.memset(sb((128, 4), nl.float32), 2.0))


# -- removed APIs -----------------------------------------------------------------------------------------------------
def test_nl_divide_removed():
    def bad():
        x, y = sb((128, 4), value=1.0), sb((128, 4), value=2.0)
        nl.divide(x, y)

    def good():
        x, y = sb((128, 4), value=1.0), sb((128, 4), value=2.0)
        return nl.multiply(x, nl.reciprocal(y))
    e = raises("removed_api.divide", bad, exc=NkiRemovedAPIError)
    assert "reciprocal" in str(e)
    run(good)
    raises("removed_api.divide", lambda: nisa.tensor_tensor(sb((128, 4)), sb((128, 4), value=1.0),
                                                           sb((128, 4), value=2.0), nl.divide),
           exc=NkiRemovedAPIError)


def test_tensor_copy_dtype_removed():
    raises("removed_api.tensor_copy.dtype",
           lambda: nisa.tensor_copy(dst=sb((128, 4), BF16), src=sb((128, 4), value=1.0), dtype=nl.bfloat16),
           exc=NkiRemovedAPIError)
    run(lambda: nisa.tensor_copy(dst=sb((128, 4), BF16), src=sb((128, 4), value=1.0)))


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword"):
        run(lambda: nisa.tensor_copy(dst=sb((128, 4)), src=sb((128, 4), value=1.0), bogus=1))


def test_jit_platform_target_rejected_mode_ignored():
    with pytest.raises(NkiRemovedAPIError) as ei:
        nki.jit(lambda a: a, platform_target="trn2")
    assert ei.value.rule == "removed_api.jit.platform_target"
    assert "NEURON_PLATFORM_TARGET_OVERRIDE" in str(ei.value)
    k = nki.jit(mode="simulation")(lambda: None)
    assert k() is None


def test_string_buffer_rejected():
    raises("buffer.string", lambda: nl.ndarray((128, 4), nl.float32, buffer="sbuf"), exc=NkiRemovedAPIError)


# -- capacity ------------------------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("on_trn2")
def test_sbuf_capacity_trn2():
    """Strict mode refuses live tiles over trn2's 212,984 B; the default models the compiler's spill
    (tests/nkiemu/test_spills.py)."""
    cap = 212984
    f = (cap // 4) // 2  # fp32 elements per partition in half the SBUF
    def two_halves_plus():
        a = sb((128, f))
        b = sb((128, f))
        c = sb((128, 64))  # noqa: F841
        return a, b
    e = raises("capacity.sbuf", two_halves_plus, exc=NkiCapacityError, strict=True)
    assert "212984" in str(e) and "trn2" in str(e)
    run(lambda: (sb((128, f)), sb((128, f))), strict=True)
    run(two_halves_plus)   # default: liveness by last use (nothing reads these tiles), spills modeled


def test_sbuf_tile_larger_than_a_partition_depends_on_generation():
    def big():
        sb((128, 190000 // 4))
    run(big, target="trn2")
    raises("capacity.sbuf_tile", big, exc=NkiCapacityError, target="trn1")


@pytest.mark.usefixtures("on_trn2")
def test_sbuf_per_iteration_tiles_are_freed():
    def loop():
        for _ in nl.affine_range(50):
            t = sb((128, 100_000 // 4))  # 100 kB per partition each iteration
            nisa.memset(t, 0.0)
    run(loop)
    rep = nki.last_report()
    assert rep.peak_sbuf_bytes == 100_000  # live until its last use: one tile at a time
    run(loop, strict=True)                 # strict: the old tile is still referenced when the new one comes


def test_sbuf_long_lived_tiles_accumulate_in_strict_mode():
    def keep():
        tiles = []
        for _ in nl.affine_range(50):
            tiles.append(sb((128, 10_000 // 4)))  # kept alive: 50 x 10 kB > 212984
    raises("capacity.sbuf", keep, exc=NkiCapacityError, strict=True)
    run(keep)   # never used by an instruction: the compiler drops such tiles, nothing to spill


def test_psum_banks():
    def n_banks(n, free=512):
        def body():
            keep = [ps((128, free)) for _ in range(n)]  # each 2 KiB (one bank) per partition
            return None if keep else None
        return body
    run(n_banks(8), strict=True)
    e = raises("capacity.psum", n_banks(9), exc=NkiCapacityError, strict=True)
    assert "8" in str(e)
    run(n_banks(2, 2048), strict=True)              # 8 KiB = 4 banks each
    raises("capacity.psum", n_banks(3, 2048), exc=NkiCapacityError, strict=True)
    run(n_banks(4, 300), strict=True)               # 1200 B still takes a whole bank ...
    raises("capacity.psum", n_banks(9, 300), exc=NkiCapacityError, strict=True)   # ... so 9 don't fit
    raises("capacity.psum", n_banks(1, 4097), exc=NkiCapacityError)  # > 16 KiB per partition: always
    run(n_banks(9))                    # default mode: held by Python, never used: the compiler drops them


def test_psum_freed_per_iteration():
    def loop():
        for _ in nl.affine_range(40):
            p = ps((128, 512))
            nisa.memset(p, 0.0)
    run(loop)
    assert nki.last_report().peak_psum_bytes <= 2 * 2048


# -- outputs, engines, shapes, misc ---------------------------------------------------------------------------------------------
def test_outputs_must_be_shared_hbm():
    raises("jit.output_buffer", lambda: nl.ndarray((4, 4), nl.float32, buffer=nl.hbm))
    run(lambda: nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm))


def test_compute_engines_do_not_access_hbm():
    raises("engine.hbm_access", lambda a: nisa.tensor_copy(dst=sb((128, 4)), src=a), np.ones((128, 4), np.float32))


def test_tensor_copy_shape():
    raises("tensor_copy.shape", lambda: nisa.tensor_copy(dst=sb((128, 8)), src=sb((128, 4), value=1.0)))
    run(lambda: nisa.tensor_copy(dst=sb((128, 2, 2)), src=sb((128, 4), value=1.0)))


def test_tensor_copy_scalar_engine_not_on_trn1():
    body = lambda: nisa.tensor_copy(dst=sb((128, 4)), src=sb((128, 4), value=1.0), engine=nisa.engine.scalar)  # noqa: E731
    raises("tensor_copy.scalar_nc_v2", body, target="trn1")
    run(body, target="trn2")


def test_index_out_of_bounds():
    raises("index.out_of_bounds", lambda: sb((128, 4))[:, 2:6])
    raises("index.out_of_bounds", lambda: sb((128, 4))[:, nl.ds(3, 2)])
    run(lambda: sb((128, 4))[:, nl.ds(2, 2)])


def test_reshape_keeps_partition_dim_on_chip():
    raises("reshape.partition", lambda: sb((128, 4)).reshape((64, 8)))
    run(lambda: sb((128, 4)).reshape((128, 2, 2)))
    run(lambda a: a.reshape((64, 8)).shape, np.ones((128, 4), np.float32))


def test_tensor_scalar_operand_rules():
    raises("tensor_scalar.operand_dtype",
           lambda: nisa.tensor_scalar(sb((128, 4)), sb((128, 4), value=1.0), nl.add, sb((128, 1), BF16, 1.0)))
    raises("tensor_scalar.operand_shape",
           lambda: nisa.tensor_scalar(sb((128, 4)), sb((128, 4), value=1.0), nl.add, sb((128, 2), value=1.0)))
    raises("tensor_scalar.op1_none",
           lambda: nisa.tensor_scalar(sb((128, 4)), sb((128, 4), value=1.0), nl.add, 1.0, operand1=2.0))
    run(lambda: nisa.tensor_scalar(sb((128, 4)), sb((128, 4), value=1.0), nl.add, sb((128, 1), value=1.0),
                                   op1=nl.multiply, operand1=3.0))


@pytest.mark.usefixtures("on_trn2")
def test_tensor_scalar_scalar_engine_ops_trn2():
    bad = lambda: nisa.tensor_scalar(sb((128, 4)), sb((128, 4), value=1.0), nl.maximum, 0.0,  # noqa: E731
                                     engine=nisa.engine.scalar)
    raises("tensor_scalar.scalar_engine_ops", bad)
    run(lambda: nisa.tensor_scalar(sb((128, 4)), sb((128, 4), value=1.0), nl.multiply, 2.0, op1=nl.add,
                                   operand1=1.0, engine=nisa.engine.scalar))


def test_activation_rules():
    raises("activation.reduce_op",
           lambda: nisa.activation(sb((128, 4)), nl.exp, sb((128, 4), value=1.0), reduce_op=nl.multiply,
                                   reduce_res=sb((128, 1))))
    raises("activation.bias_shape",
           lambda: nisa.activation(sb((128, 4)), nl.exp, sb((128, 4), value=1.0), bias=sb((128, 4), value=0.0)))
    raises("activation.bias_scalar_nc_v2",
           lambda: nisa.activation(sb((128, 4)), nl.exp, sb((128, 4), value=1.0), bias=1.0), target="trn1")
    run(lambda: nisa.activation(sb((128, 4)), nl.exp, sb((128, 4), value=1.0), bias=1.0), target="trn2")
    run(lambda: nisa.activation(sb((128, 4)), nl.exp, sb((128, 4), value=1.0), bias=sb((128, 1), value=0.0),
                                reduce_op=nl.add, reduce_res=sb((128, 1)), reduce_cmd=nisa.reduce_cmd.reset_reduce),
        target="trn1")


def test_nc_transpose_rules():
    raises("nc_transpose.dtype",
           lambda: nisa.nc_transpose(ps((64, 128), BF16), sb((128, 64), value=1.0), engine=nisa.engine.tensor))
    raises("nc_transpose.vector_size",
           lambda: nisa.nc_transpose(sb((64, 64)), sb((64, 64), value=1.0), engine=nisa.engine.vector))
    run(lambda: nisa.nc_transpose(sb((32, 16)), sb((16, 32), value=1.0), engine=nisa.engine.vector))


def test_raw_enum_values_rejected():
    raises("enum.raw_value", lambda: nisa.tensor_copy(dst=sb((128, 4)), src=sb((128, 4), value=1.0), engine=5))


@pytest.mark.usefixtures("on_trn2")
def test_lnc_grid():
    k = nki.jit(lambda: nl.program_id(0))
    with pytest.raises(NkiRuleError) as ei:
        k[3]()
    assert ei.value.rule == "lnc.grid"
    k[2]()
    with nki.target("trn1"):
        with pytest.raises(NkiRuleError):
            k[2]()


def test_list_arguments_rejected():
    with pytest.raises(NkiRuleError) as ei:
        nki.jit(lambda xs: None)([1, 2])
    assert ei.value.rule == "jit.list_argument"
    nki.jit(lambda xs: None)((1, 2))


def test_float64_inputs_rejected():
    with pytest.raises(NkiRuleError) as ei:
        nki.jit(lambda a: None)(np.ones((4, 4)))
    assert ei.value.rule == "dtype.unsupported"


def test_errors_are_picklable():
    import pickle
    e = NkiCapacityError("capacity.sbuf", "nl.ndarray", "too big", {"new": (128, 4)})
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is NkiCapacityError and e2.rule == e.rule and str(e2) == str(e)


# -- partition access of compute operands (trainium_inferentia2_arch.rst, nki-aps.rst) -------------------
def _copy_rows(p0, p1, step=1):
    def body():
        src = sb((128, 4), value=1.0)
        dst = sb((128, 4))
        nisa.tensor_copy(dst=dst[p0:p1:step, :], src=src[p0:p1:step, :])
    return body


@pytest.mark.parametrize("p0,p1", [(16, 32), (1, 2), (97, 128), (32, 80), (32, 128), (16, 80)])
def test_start_partition_rule(p0, p1):
    raises("partition.start", _copy_rows(p0, p1))


@pytest.mark.parametrize("p0,p1", [(0, 32), (32, 64), (96, 128), (64, 96), (0, 64), (64, 128), (0, 128), (32, 33)])
def test_start_partition_rule_allowed(p0, p1):
    run(_copy_rows(p0, p1))


def test_start_partition_rule_applies_to_the_tensor_engine():
    def body(start):
        s, m = sb((128, 16), value=1.0), sb((128, 64), value=1.0)
        d = ps((16, 64))
        nisa.nc_matmul(d, s[start:start + 16, :], m[start:start + 16, :])
    raises("partition.start", lambda: body(8))
    run(lambda: body(32))


def test_partition_step_must_be_contiguous():
    raises("partition.step", _copy_rows(0, 128, 2))
    run(_copy_rows(0, 64, 1))


def test_gpsimd_tensor_scalar_is_rsqrt_only():
    def body(op):
        t, d = sb((128, 8), value=4.0), sb((128, 8))
        nisa.tensor_scalar(dst=d, data=t, op0=op, operand0=0.0, engine=nisa.engine.gpsimd)
    raises("tensor_scalar.gpsimd_op", lambda: body(nl.add))
    run(lambda: body(nl.rsqrt))


def test_bitvec_tensor_scalar_runs_on_the_vector_engine_only():
    def body(eng):
        t, d = sb((128, 8), nl.int32, 6), sb((128, 8), nl.int32)
        nisa.tensor_scalar(dst=d, data=t, op0=nl.bitwise_and, operand0=3, engine=eng)
    raises("tensor_scalar.bitvec_engine", lambda: body(nisa.engine.scalar))
    raises("tensor_scalar.gpsimd_op", lambda: body(nisa.engine.gpsimd))
    run(lambda: body(nisa.engine.vector))


def test_ap_only_on_an_unsliced_ndarray():
    def body(sliced):
        t = sb((128, 8), value=1.0)
        d = sb((64, 8))
        src = t[0:64, :] if sliced else t
        nisa.tensor_copy(dst=d, src=src.ap([[8, 64], [1, 8]]))
    raises("ap.indexed_tensor", lambda: body(True))
    run(lambda: body(False))
