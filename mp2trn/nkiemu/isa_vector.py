"""More ``nki.isa`` instructions (NKI 0.3.0): scans, cumulative and selective reductions, batch-norm
statistics, top-8 search, predicated copies, cross-partition reduction, DMA transpose.

Each follows its page in the ISA reference (aws-neuron-sdk ``nki/api/nki/isa/__init__.py`` at the 2.29
release): the NumPy equivalent given there, the operand rules stated there (memory types, dtypes, shapes,
engines), float32 engine math with the result cast to ``dst.dtype``. Costs reuse the formula classes of
:mod:`.cost` (Vector Engine element streams; GpSimd for the cross-partition reduction; DMA bytes for
``dma_transpose``) — estimates where the reference gives no cost note, as docs/emulator.md says.
The Vector Engine's accumulator registers (``reduce_cmd``) are shared with ``activation``'s.
"""

from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from . import language as nl
from . import runtime as _rt
from .errors import NkiRuleError
from .isa import (SBUF, HBM_REGIONS, _ALU, _BITVEC, _REDUCE, PSUM, NkiTensor, dge_mode, _apply_alu, _f32_2d, _no_gpsimd_psum, _onchip, _opname,
                  _pf, _same_pf, _scalar_or_col, _shapes, _tensors, _write, _dma_descriptors, instruction,
                  reduce_cmd)

_cmd = reduce_cmd   # the enum (functions below take a parameter of the same name, as in the ISA reference)

__all__ = ["scalar_tensor_tensor", "tensor_tensor_scan", "tensor_partition_reduce", "tensor_scalar_cumulative",
           "select_reduce", "range_select", "bn_stats", "bn_aggr", "max8", "nc_find_index8", "nc_match_replace8",
           "exponential", "tensor_copy_predicated", "dma_transpose", "dma_compute", "nc_stream_shuffle",
           "nonzero_with_count", "nc_n_gather", "local_gather", "sequence_bounds"]

_CMP = (nl.equal, nl.less, nl.less_equal, nl.greater, nl.greater_equal)
_CUMULATIVE = {nl.add: (np.add, 0.0), nl.subtract: (np.subtract, 0.0), nl.multiply: (np.multiply, 1.0),
               nl.maximum: (np.maximum, -np.inf), nl.minimum: (np.minimum, np.inf)}


def _record(engine, inst, params, reads, writes):
    _rt.current().record(engine, inst, params, _tensors(*reads), _tensors(*writes))


def _not_both_psum(inst, a_name, a, b_name, b, shapes):
    if isinstance(a, NkiTensor) and isinstance(b, NkiTensor) and a.buffer is PSUM and b.buffer is PSUM:
        raise NkiRuleError(f"{inst}.both_psum", inst, f"{a_name} and {b_name} cannot both be in PSUM", shapes)


def _arith(op, inst, shapes, arg, binary=False):
    unary = () if binary else (nl.rsqrt, nl.reciprocal, nl.abs)
    if op in _BITVEC or (op not in _ALU and op not in unary):
        raise NkiRuleError(f"{inst}.op", inst, f"{arg} must be {'a binary' if binary else 'an'} arithmetic ALU "
                           f"operator, got {_opname(op)}", shapes)


def _col(v, P, arg, inst, shapes):
    """A scalar or a (P, 1) tile as a (P, 1) float32 array."""
    return np.broadcast_to(np.asarray(_scalar_or_col(v, P, arg, inst, shapes), np.float32).reshape(-1, 1),
                           (P, 1)).copy()


def _accumulator(cmd, init, P, inst, shapes, load=None):
    """The shared Vector Engine accumulator registers after ``cmd`` (None: idle, not used)."""
    regs = _rt.current().reduce_regs
    if cmd is _cmd.idle:
        return None
    if cmd in (_cmd.reset, _cmd.reset_reduce):
        regs[:P] = init
    elif cmd is _cmd.load_reduce:
        if load is None:
            raise NkiRuleError(f"{inst}.load_reduce", inst, "reduce_cmd.load_reduce needs an initial value", shapes)
        regs[:P] = _col(load, P, "initial value", inst, shapes)[:, 0]
    return regs


@instruction(tensors=("dst", "data", "operand1"), onchip=("dst", "data", "operand1"))
def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None):
    """``dst = (data op0 operand0) op1 operand1`` on the Vector Engine (operand0 a scalar or (P, 1) tile)."""
    inst = "scalar_tensor_tensor"
    P, F = _same_pf(inst, "scalar_tensor_tensor.shape", dst=dst, data=data, operand1=operand1)
    shapes = _shapes(dst=dst, data=data, operand0=operand0, operand1=operand1)
    _not_both_psum(inst, "data", data, "operand1", operand1, shapes)
    _arith(op0, inst, shapes, "op0")
    _arith(op1, inst, shapes, "op1")
    a0 = _scalar_or_col(operand0, P, "operand0", inst, shapes, fp32_required=False)
    with np.errstate(all="ignore"):
        r = _apply_alu(op0, _f32_2d(data), a0, reverse0, inst, shapes)
        r = _apply_alu(op1, r, _f32_2d(operand1), reverse1, inst, shapes)
    _write(dst, np.asarray(r, dtype=np.float32))
    _record("vector", inst, ("tt", F, False, 1), (data, operand0, operand1), (dst,))


@instruction(tensors=("dst", "data0", "data1"), onchip=("dst", "data0", "data1"))
def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    """Per partition: ``r[0] = op1(op0(data0[0], initial), data1[0])``, ``r[i] = op1(op0(data0[i], r[i-1]),
    data1[i])`` (Vector Engine, float32 math)."""
    inst = "tensor_tensor_scan"
    P, F = _same_pf(inst, "tensor_tensor_scan.shape", dst=dst, data0=data0, data1=data1)
    shapes = _shapes(dst=dst, data0=data0, data1=data1, initial=initial)
    _not_both_psum(inst, "data0", data0, "data1", data1, shapes)
    _arith(op0, inst, shapes, "op0", binary=True)
    _arith(op1, inst, shapes, "op1", binary=True)
    prev = _col(initial, P, "initial", inst, shapes)
    x0, x1 = _f32_2d(data0), _f32_2d(data1)
    out = np.empty((P, F), np.float32)
    with np.errstate(all="ignore"):
        for i in range(F):
            a = _ALU[op0](prev[:, 0], x0[:, i]) if reverse0 else _ALU[op0](x0[:, i], prev[:, 0])
            prev = (_ALU[op1](x1[:, i], a) if reverse1 else _ALU[op1](a, x1[:, i])).astype(np.float32).reshape(P, 1)
            out[:, i] = prev[:, 0]
    _write(dst, out)
    _record("vector", inst, ("tt", F, False, 1), (data0, data1, initial), (dst,))


@instruction(tensors=("dst", "data"), onchip=("dst", "data"))
def tensor_partition_reduce(dst, op, data, name=None):
    """Reduce ``data`` (P, F) across its partitions into ``dst`` (1, F) on the GpSimd Engine
    (add, maximum, bitwise_or, bitwise_and)."""
    inst = "tensor_partition_reduce"
    P, F = _pf(data)
    shapes = _shapes(dst=dst, data=data)
    if op not in (nl.add, nl.maximum, nl.bitwise_or, nl.bitwise_and):
        raise NkiRuleError(f"{inst}.op", inst, f"op must be add, maximum, bitwise_or or bitwise_and, got {_opname(op)}",
                           shapes)
    if _pf(dst) != (1, F):
        raise NkiRuleError(f"{inst}.shape", inst, f"dst must have 1 partition and {F} elements, got {dst.shape}", shapes)
    _no_gpsimd_psum(inst, "gpsimd", dst=dst, data=data)
    if op in _BITVEC:
        if not _dt.is_int(data.dtype):
            raise NkiRuleError(f"{inst}.bitvec_dtype", inst, "bitwise reductions need integer tiles", shapes)
        r = _REDUCE[op].reduce(data._data.reshape(P, F), axis=0, keepdims=True)
        dst._data.reshape(1, F)[...] = r.astype(dst._data.dtype)
    else:
        _write(dst, _REDUCE[op].reduce(_f32_2d(data), axis=0, keepdims=True).astype(np.float32))
    _record("gpsimd", inst, ("gp", P * F), (data,), (dst,))


@instruction(tensors=("dst", "src"), onchip=("dst", "src"))
def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None):
    """Per partition, along the free axis: ``reg = op1(op0(src[i], imm0), reg); dst[i] = reg`` (Vector
    Engine); ``reg`` starts from the op1 identity (reset_reduce), ``imm1`` (load_reduce) or carries on."""
    inst = "tensor_scalar_cumulative"
    P, F = _same_pf(inst, "tensor_scalar_cumulative.shape", dst=dst, src=src)
    shapes = _shapes(dst=dst, src=src, imm0=imm0, imm1=imm1)
    if op1 not in _CUMULATIVE:
        raise NkiRuleError(f"{inst}.op1", inst, f"op1 must be add, subtract, multiply, maximum or minimum, got "
                           f"{_opname(op1)}", shapes)
    _arith(op0, inst, shapes, "op0", binary=True)
    for arg, t in (("src", src), ("dst", dst)):
        if t.dtype in (_dt.int32, _dt.uint32):
            raise NkiRuleError(f"{inst}.dtype", inst, f"{arg}: int32/uint32 are not supported (ISA limitation)", shapes)
    f, ident = _CUMULATIVE[op1]
    regs = _accumulator(reduce_cmd, ident, P, inst, shapes, load=imm1)
    reg = (regs[:P].astype(np.float32) if regs is not None else np.full(P, ident, np.float32)).copy()
    a0 = _col(imm0, P, "imm0", inst, shapes)[:, 0]
    x = _f32_2d(src)
    out = np.empty((P, F), np.float32)
    with np.errstate(all="ignore"):
        for i in range(F):
            reg = f(_ALU[op0](x[:, i], a0), reg).astype(np.float32)
            out[:, i] = reg
    if regs is not None:
        regs[:P] = reg
    _write(dst, out)
    _record("vector", inst, ("simple", F, 1, 1), (src, imm0, imm1), (dst,))


def _select_reduce_common(inst, dst, values, P, reduce_res, cmd, reduce_op, shapes):
    if reduce_op is not nl.maximum:
        raise NkiRuleError(f"{inst}.reduce_op", inst, "only nl.maximum is supported as reduce_op", shapes)
    _write(dst, values)
    if reduce_res is None:
        return
    if _pf(reduce_res) != (P, 1) or not _dt.is_float(reduce_res.dtype):
        raise NkiRuleError(f"{inst}.reduce_res", inst, f"reduce_res must be a float (P, 1) tile, got {reduce_res.shape}",
                           shapes)
    regs = _accumulator(cmd, -np.inf, P, inst, shapes)
    row_max = values.max(axis=1)
    if regs is not None:
        regs[:P] = np.maximum(regs[:P], row_max)
        row_max = regs[:P]
    _write(reduce_res, row_max.reshape(P, 1).astype(np.float32))


@instruction(tensors=("dst", "predicate", "on_true"), onchip=("dst", "predicate", "on_true"))
def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                  reduce_op=nl.maximum, reverse_pred=False, name=None):
    """``dst = where(predicate, on_true, on_false)`` (Vector Engine), with an optional per-partition max
    into ``reduce_res`` through the accumulator registers."""
    inst = "select_reduce"
    P, F = _same_pf(inst, "select_reduce.shape", dst=dst, predicate=predicate, on_true=on_true)
    shapes = _shapes(dst=dst, predicate=predicate, on_true=on_true, on_false=on_false)
    _not_both_psum(inst, "on_true", on_true, "predicate", predicate, shapes)
    if predicate.dtype not in (_dt.int8, _dt.uint8, _dt.int16, _dt.uint16):
        raise NkiRuleError(f"{inst}.predicate_dtype", inst, "predicate must be int8/uint8/int16/uint16", shapes)
    if on_true.dtype in (_dt.int32, _dt.uint32, _dt.tfloat32):
        raise NkiRuleError(f"{inst}.dtype", inst, "on_true cannot be tfloat32, int32 or uint32", shapes)
    pred = predicate._data.reshape(P, F) != 0
    if reverse_pred:
        pred = ~pred
    alt = _col(on_false, P, "on_false", inst, shapes)
    values = np.where(pred, _f32_2d(on_true), alt).astype(np.float32)
    _select_reduce_common(inst, dst, values, P, reduce_res, reduce_cmd, reduce_op, shapes)
    _record("vector", inst, ("tt", F, False, 1), (predicate, on_true, on_false), (dst, reduce_res))


@instruction(tensors=("dst", "on_true_tile", "bound0", "bound1"), onchip=("dst", "on_true_tile", "bound0", "bound1"))
def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.reset_reduce,
                 reduce_res=None, reduce_op=nl.maximum, range_start=0, on_false_value=-3.4028235e38, name=None):
    """Keep elements whose free index + ``range_start`` satisfies both comparisons with the per-partition
    bounds, else ``on_false_value`` (FP32_MIN); optional per-partition max (Vector Engine, NeuronCore-v3+)."""
    inst = "range_select"
    P, F = _same_pf(inst, "range_select.shape", dst=dst, on_true_tile=on_true_tile)
    shapes = _shapes(dst=dst, on_true_tile=on_true_tile, bound0=bound0, bound1=bound1)
    if _rt.current().target.gen < 3:
        raise NkiRuleError(f"{inst}.target", inst, "range_select needs NeuronCore-v3 or newer (trn2+)", shapes)
    if comp_op0 not in _CMP or comp_op1 not in _CMP:
        raise NkiRuleError(f"{inst}.comp_op", inst, "comparisons must be equal, less, less_equal, greater or "
                           "greater_equal", shapes)
    if np.float32(on_false_value) != np.float32(-3.4028235e38):
        raise NkiRuleError(f"{inst}.on_false_value", inst, "on_false_value must be FP32_MIN (-3.4028235e+38)", shapes)
    for arg, b in (("bound0", bound0), ("bound1", bound1)):
        if _pf(b) != (P, 1) or b.dtype != _dt.float32:
            raise NkiRuleError(f"{inst}.bound", inst, f"{arg} must be a float32 (P, 1) tile", shapes)
    if not _dt.is_float(on_true_tile.dtype):
        raise NkiRuleError(f"{inst}.dtype", inst, "on_true_tile must have a float dtype", shapes)
    idx = (np.float32(range_start) + np.arange(F, dtype=np.float32))[None, :]
    mask = (_ALU[comp_op0](idx, _f32_2d(bound0)) != 0) & (_ALU[comp_op1](idx, _f32_2d(bound1)) != 0)
    values = np.where(mask, _f32_2d(on_true_tile), np.float32(on_false_value)).astype(np.float32)
    _select_reduce_common(inst, dst, values, P, reduce_res, reduce_cmd, reduce_op, shapes)
    _record("vector", inst, ("simple", F, 1, 1), (on_true_tile, bound0, bound1), (dst, reduce_res))


@instruction(tensors=("dst", "data"), onchip=("dst", "data"))
def bn_stats(dst, data, name=None):
    """Per partition: (count, mean, variance·count) of the even-indexed and of the odd-indexed elements
    (6 values; Vector Engine, ≤ 512 elements per partition)."""
    inst = "bn_stats"
    P, F = _pf(data)
    shapes = _shapes(dst=dst, data=data)
    if F > nl.tile_size.bn_stats_fmax:
        raise NkiRuleError(f"{inst}.fmax", inst, f"{F} elements per partition exceed {nl.tile_size.bn_stats_fmax}",
                           shapes)
    if _pf(dst) != (P, 6):
        raise NkiRuleError(f"{inst}.dst_shape", inst, f"dst must hold 6 elements per partition, got {dst.shape}", shapes)
    x = _f32_2d(data)
    out = np.zeros((P, 6), np.float32)
    for k, half in enumerate((x[:, 0::2], x[:, 1::2])):
        n = half.shape[1]
        if n:
            mean = half.mean(axis=1)
            out[:, 3 * k:3 * k + 3] = np.stack([np.full(P, n, np.float32), mean, ((half - mean[:, None]) ** 2).sum(axis=1)], 1)
    _write(dst, out)
    _record("vector", inst, ("simple", F, 1, 1), (data,), (dst,))


@instruction(tensors=("dst", "data"), onchip=("dst", "data"))
def bn_aggr(dst, data, name=None):
    """Combine (count, mean, variance·count) triples per partition into (mean, variance) (Vector Engine)."""
    inst = "bn_aggr"
    P, F = _pf(data)
    shapes = _shapes(dst=dst, data=data)
    if F % 3:
        raise NkiRuleError(f"{inst}.triples", inst, f"data must hold (count, mean, var·count) triples, {F} elements",
                           shapes)
    if _pf(dst) != (P, 2):
        raise NkiRuleError(f"{inst}.dst_shape", inst, f"dst must hold 2 elements per partition, got {dst.shape}", shapes)
    t = _f32_2d(data).astype(np.float64).reshape(P, F // 3, 3)
    n, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    total = n.sum(axis=1)
    with np.errstate(all="ignore"):
        mu = (n * mean).sum(axis=1) / total
        var = (m2 + n * (mean - mu[:, None]) ** 2).sum(axis=1) / total
    _write(dst, np.stack([mu, var], 1).astype(np.float32))
    _record("vector", inst, ("simple", F, 1, 1), (data,), (dst,))


def _eight(inst, dst, src, shapes, out_ok=None):
    P, F = _pf(src)
    if not 8 <= F <= 16384:
        raise NkiRuleError(f"{inst}.size", inst, f"{F} elements per partition: must be 8..16384", shapes)
    if _pf(dst) != (P, 8):
        raise NkiRuleError(f"{inst}.dst_shape", inst, f"dst must be (partitions, 8), got {dst.shape}", shapes)
    return P, F


@instruction(tensors=("dst", "src"), onchip=("dst", "src"))
def max8(dst, src, name=None):
    """The 8 largest values of each partition, in descending order (Vector Engine)."""
    inst = "max8"
    shapes = _shapes(dst=dst, src=src)
    P, F = _eight(inst, dst, src, shapes)
    x = _f32_2d(src)
    _write(dst, -np.sort(-x, axis=1)[:, :8])
    _record("vector", inst, ("simple", F, 1, 1), (src,), (dst,))


@instruction(tensors=("dst", "data", "vals"), onchip=("dst", "data", "vals"))
def nc_find_index8(dst, data, vals, name=None):
    """Index of the first occurrence of each of 8 values per partition (uint16/uint32 output)."""
    inst = "nc_find_index8"
    shapes = _shapes(dst=dst, data=data, vals=vals)
    P, F = _eight(inst, dst, data, shapes)
    if _pf(vals) != (P, 8):
        raise NkiRuleError(f"{inst}.vals", inst, "vals must hold 8 values per partition", shapes)
    if dst.dtype not in (_dt.uint16, _dt.uint32):
        raise NkiRuleError(f"{inst}.dst_dtype", inst, "dst must be uint16 or uint32", shapes)
    x, v = _f32_2d(data), _f32_2d(vals)
    hit = x[:, None, :] == v[:, :, None]                     # (P, 8, F)
    idx = np.where(hit.any(axis=2), hit.argmax(axis=2), 0)  # undefined when absent: 0 here
    dst._data.reshape(P, 8)[...] = idx.astype(dst._data.dtype)
    _record("vector", inst, ("simple", F, 1, 1), (data, vals), (dst,))


@instruction(tensors=("dst", "data", "vals"), onchip=("dst", "data", "vals"))
def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """``data`` with the first occurrence of each of 8 values per partition replaced by ``imm``; their
    indices to ``dst_idx`` when given (Vector Engine)."""
    inst = "nc_match_replace8"
    P, F = _same_pf(inst, "nc_match_replace8.shape", dst=dst, data=data)
    shapes = _shapes(dst=dst, data=data, vals=vals, dst_idx=dst_idx)
    if _pf(vals) != (P, 8):
        raise NkiRuleError(f"{inst}.vals", inst, "vals must hold 8 values per partition", shapes)
    x = _f32_2d(data).copy()
    v = _f32_2d(vals)
    idx = np.zeros((P, 8), np.int64)
    for p in range(P):
        for k in range(8):
            pos = np.flatnonzero(x[p] == v[p, k])
            if pos.size:
                idx[p, k] = pos[0]
                x[p, pos[0]] = np.float32(imm)
    _write(dst, x)
    if dst_idx is not None:
        _onchip(inst, dst_idx=dst_idx)
        dst_idx._data.reshape(P, 8)[...] = idx.astype(dst_idx._data.dtype)
    _record("vector", inst, ("simple", F, 1, 1), (data, vals), (dst, dst_idx))


@instruction(tensors=("dst", "src"), onchip=("dst", "src"))
def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_init=0.0, name=None):
    """``dst = exp(src − max_value)`` with an optional running sum into ``reduce_res`` (Vector Engine,
    NeuronCore-v4 and newer)."""
    inst = "exponential"
    P, F = _same_pf(inst, "exponential.shape", dst=dst, src=src)
    shapes = _shapes(dst=dst, src=src, max_value=max_value, reduce_res=reduce_res)
    if _rt.current().target.gen < 4:
        raise NkiRuleError(f"{inst}.target", inst, "exponential is available only on NeuronCore-v4 and newer (trn3)",
                           shapes)
    if reduce_cmd is not _cmd.load_reduce and float(reduce_init) != 0.0:
        raise NkiRuleError(f"{inst}.reduce_init", inst, "reduce_init must be 0.0 unless reduce_cmd is load_reduce",
                           shapes)
    m = _col(max_value, P, "max_value", inst, shapes)
    with np.errstate(all="ignore"):
        y = np.exp(_f32_2d(src) - m).astype(np.float32)
    _write(dst, y)
    regs = _accumulator(reduce_cmd, 0.0, P, inst, shapes, load=reduce_init)
    if regs is not None:
        regs[:P] = regs[:P] + y.sum(axis=1)
        if reduce_res is not None:
            _write(reduce_res, regs[:P].reshape(P, 1).astype(np.float32))
    _record("vector", inst, ("simple", F, 1, 1), (src, max_value), (dst, reduce_res))


@instruction(tensors=("dst", "predicate"), onchip=("dst", "predicate"))
def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """Copy ``src`` (a tile or a number) into ``dst`` where ``predicate`` is true; elsewhere ``dst`` keeps
    its values (Vector Engine)."""
    inst = "tensor_copy_predicated"
    shapes = _shapes(dst=dst, src=src, predicate=predicate)
    P, F = _same_pf(inst, "tensor_copy_predicated.shape", dst=dst, predicate=predicate)
    if isinstance(src, NkiTensor):
        _onchip(inst, src=src)
        _same_pf(inst, "tensor_copy_predicated.shape", dst=dst, src=src)
        _not_both_psum(inst, "src", src, "predicate", predicate, shapes)
        if src.dtype != dst.dtype:
            raise NkiRuleError(f"{inst}.dtype", inst, "src and dst must share the same dtype", shapes)
        values = src._data.reshape(P, F)
    else:
        values = np.asarray(src, dtype=dst._data.dtype)
    if predicate.dtype not in (_dt.uint8, _dt.uint16, _dt.uint32):
        raise NkiRuleError(f"{inst}.predicate_dtype", inst, "predicate must be uint8, uint16 or uint32", shapes)
    pred = predicate._data.reshape(P, F) != 0
    if reverse_pred:
        pred = ~pred
    target = dst._data.reshape(P, F)
    target[...] = np.where(pred, values, target)
    _record("vector", inst, ("tt", F, False, 1), (src, predicate, dst), (dst,))


#: the permutation dma_transpose applies, by rank (ISA reference)
_DMA_T_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


@instruction(tensors=("dst", "src"))
def dma_transpose(dst, src, axes=None, dge_mode=dge_mode.unknown, oob_mode=None, name=None):
    """Transpose ``src`` into ``dst`` with a DMA engine (direct mode): 2-d [1, 0], 3-d [2, 1, 0], 4-d
    [3, 1, 2, 0]; 2-byte dtypes; the hardware-DGE form also needs ``src.shape[0] == 16`` and a last
    dimension that is a multiple of 128. The indirect (gather) form is not emulated (dynamic indices)."""
    inst = "dma_transpose"
    shapes = _shapes(dst=dst, src=src)
    if dge_mode not in (type(dge_mode).unknown, type(dge_mode).hwdge):
        raise NkiRuleError(f"{inst}.dge_mode", inst, "direct transposes use dge_mode unknown or hwdge (swdge is the "
                           "indirect gather-transpose, which needs dynamic indices: not emulated)", shapes)
    perm = _DMA_T_AXES.get(len(src.shape))
    if perm is None:
        raise NkiRuleError(f"{inst}.rank", inst, f"src must be 2-, 3- or 4-dimensional, got {src.shape}", shapes)
    if axes is not None and tuple(axes) != perm:
        raise NkiRuleError(f"{inst}.axes", inst, f"a {len(perm)}-d transpose permutes {perm}, not {tuple(axes)}", shapes)
    if src.dtype.itemsize != 2:
        raise NkiRuleError(f"{inst}.dtype", inst, f"src must be a 2-byte dtype, got {_dt.name(src.dtype)}", shapes)
    if dge_mode is type(dge_mode).hwdge and (src.shape[0] != 16 or src.shape[-1] % 128):
        raise NkiRuleError(f"{inst}.hwdge_shape", inst, "hardware-DGE transposes need src.shape[0] == 16 and "
                           "src.shape[-1] % 128 == 0", shapes)
    if src.buffer is PSUM or dst.buffer is PSUM:
        raise NkiRuleError(f"{inst}.psum", inst, "DMA engines cannot access PSUM", shapes)
    out = np.transpose(src._data, perm)
    if tuple(dst.shape) != out.shape or dst.dtype != src.dtype:
        raise NkiRuleError(f"{inst}.dst_shape", inst, f"dst must be {out.shape} of {_dt.name(src.dtype)}, got "
                           f"{dst.shape}", shapes)
    dst._data[...] = out
    nbytes = src._data.size * src.dtype.itemsize
    sk = "hbm" if src.buffer in HBM_REGIONS else "sbuf"
    dk = "hbm" if dst.buffer in HBM_REGIONS else "sbuf"
    parts = dst.shape[0] if dk == "sbuf" else min(128, dst.shape[0])
    # the transpose itself is done by the DMA engine's transpose hardware (not modeled): descriptors of dst
    _record("dma", inst, ("dma", nbytes, parts, sk, dk, _dma_descriptors(dst)), (src,), (dst,))


@instruction(tensors=("dst",))
def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, name=None):
    """``dst = srcs[0]·scales[0] + srcs[1]·scales[1] + ...`` inside the DMA engines (float32 math): add is the
    only reduction and every scale is 1.0; HBM or SBUF tensors with equal element counts; ≤ 16 sources.
    The read-modify-write forms with ``vector_offset`` (indirect scatter/gather) are not emulated."""
    inst = "dma_compute"
    srcs = tuple(srcs)
    shapes = _shapes(dst=dst, **{f"srcs[{k}]": t for k, t in enumerate(srcs) if isinstance(t, NkiTensor)})
    if not srcs or len(srcs) > 16 or not all(isinstance(t, NkiTensor) for t in srcs):
        raise NkiRuleError(f"{inst}.srcs", inst, "srcs must be 1 to 16 tensors", shapes)
    if reduce_op is not nl.add:
        raise NkiRuleError(f"{inst}.reduce_op", inst, f"only nl.add is supported, got {_opname(reduce_op)}", shapes)
    if scales is not None and (len(scales) != len(srcs) or any(float(x) != 1.0 for x in scales)):
        raise NkiRuleError(f"{inst}.scales", inst, "every scale must be 1.0 (or scales=None)", shapes)
    for t in (dst, *srcs):
        if t.buffer is PSUM:
            raise NkiRuleError(f"{inst}.psum", inst, "DMA engines cannot access PSUM", shapes)
        if t._data.size != dst._data.size:
            raise NkiRuleError(f"{inst}.element_count", inst, "every source holds as many elements as dst", shapes)
    total = np.zeros(dst._data.size, np.float32)
    for t in srcs:
        total = total + t._data.reshape(-1).astype(np.float32)
    _write(dst, total.reshape(dst._data.shape))
    nbytes = sum(t._data.size * t.dtype.itemsize for t in (dst, *srcs))
    sk = "sbuf" if any(t.buffer is SBUF for t in srcs) else "hbm"
    dk = "sbuf" if dst.buffer is SBUF else "hbm"
    parts = dst.shape[0] if dk == "sbuf" else min(128, dst.shape[0] if dst.shape else 1)
    _record("dma", inst, ("dma", nbytes, parts, sk, dk, _dma_descriptors(dst, *srcs)), srcs, (dst,))


@instruction(tensors=("dst", "src"), onchip=())
def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Within each quadrant of 32 partitions, output partition k copies input partition ``shuffle_mask[k]``
    (255: left unmodified) — the Vector Engine's cross-partition move; the same mask for every quadrant."""
    inst = "nc_stream_shuffle"
    shapes = _shapes(dst=dst, src=src)
    for t in (dst, src):
        if t.buffer in HBM_REGIONS:
            raise NkiRuleError("engine.hbm_access", inst, "src and dst are SBUF or PSUM tiles", shapes)
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32 or any(not (0 <= m < 32 or m == 255) for m in mask):
        raise NkiRuleError(f"{inst}.mask", inst, "shuffle_mask holds 32 partition numbers 0..31 (or 255)", shapes)
    if dst.dtype != src.dtype:
        raise NkiRuleError(f"{inst}.dtype", inst, "dst must have the dtype of src", shapes)
    (ps, fs), (pd, fd) = _pf(src), _pf(dst)
    if fs != fd:
        raise NkiRuleError(f"{inst}.shape", inst, "dst and src hold the same elements per partition", shapes)
    active = -(-max(ps, pd) // 32) * 32
    allowed = {32: (0, 32, 64, 96), 64: (0, 64)}.get(active, (0,))
    for arg, t in (("src", src), ("dst", dst)):
        if t.partition_start not in allowed:
            raise NkiRuleError(f"{inst}.start_partition", inst, f"{arg} starts at partition {t.partition_start}; with "
                               f"{active} active partitions the start must be one of {allowed}", shapes)
    x = src._data.reshape(ps, fs).copy()
    out = dst._data.reshape(pd, fd)
    for q0 in range(0, pd, 32):
        for k, m in enumerate(mask):
            p_out, p_in = q0 + k, q0 + m
            if m != 255 and p_out < pd and p_in < ps:
                out[p_out] = x[p_in]
    _record("vector", inst, ("simple", fs, 1, 1), (src,), (dst,))


@instruction(tensors=("dst", "src"), onchip=("dst", "src"))
def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """On partitions 0, 16, ..., 112 (the first of each GpSimd core's 16): the indices (+ ``index_offset``)
    of the nonzero elements, ``padding_val`` for the rest, and their count as the last element
    (GpSimd, NeuronCore-v3+); other partitions of ``dst`` are not written."""
    inst = "nonzero_with_count"
    shapes = _shapes(dst=dst, src=src)
    if _rt.current().target.gen < 3:
        raise NkiRuleError(f"{inst}.target", inst, "nonzero_with_count needs NeuronCore-v3 or newer (trn2+)", shapes)
    (ps, fs), (pd, fd) = _pf(src), _pf(dst)
    if ps != pd or fd != fs + 1:
        raise NkiRuleError(f"{inst}.shape", inst, "dst has the partitions of src and one more element each", shapes)
    if src.buffer is not SBUF or dst.buffer is not SBUF:
        raise NkiRuleError(f"{inst}.sbuf", inst, "src and dst are SBUF tiles", shapes)
    if src.dtype not in (_dt.float32, _dt.int32) or dst.dtype != _dt.int32:
        raise NkiRuleError(f"{inst}.dtype", inst, "src float32 or int32, dst int32", shapes)
    x = src._data.reshape(ps, fs)
    out = dst._data.reshape(pd, fd)
    for p in range(0, ps, 16):
        idx = np.flatnonzero(x[p] != 0)
        row = np.full(fd, int(padding_val), np.int64)
        row[:idx.size] = idx + int(index_offset)
        row[-1] = idx.size
        out[p] = row.astype(out.dtype)
    _record("gpsimd", inst, ("gp", fs), (src,), (dst,))


@instruction(tensors=("dst", "data", "indices"), onchip=("dst", "data", "indices"))
def nc_n_gather(dst, data, indices, name=None):
    """Per partition: ``dst[p, k] = data[p].flat[indices[p, k]]`` (GpSimd; all three in SBUF; uint32
    indices within the partition's element count; dst has data's dtype and indices' element count)."""
    inst = "nc_n_gather"
    shapes = _shapes(dst=dst, data=data, indices=indices)
    (pd, fd), (pa, fa), (pi, fi) = _pf(dst), _pf(data), _pf(indices)
    if not pd == pa == pi:
        raise NkiRuleError(f"{inst}.partitions", inst, "data, indices and dst have the same partitions", shapes)
    if fd != fi:
        raise NkiRuleError(f"{inst}.shape", inst, "dst holds as many elements per partition as indices", shapes)
    for arg, t in (("dst", dst), ("data", data), ("indices", indices)):
        if t.buffer is not SBUF:
            raise NkiRuleError(f"{inst}.sbuf", inst, f"{arg} must be in SBUF (GpSimd cannot access PSUM)", shapes)
    if indices.dtype != _dt.uint32 or dst.dtype != data.dtype:
        raise NkiRuleError(f"{inst}.dtype", inst, "indices uint32; dst has the dtype of data", shapes)
    idx = indices._data.reshape(pi, fi).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= fa):
        raise NkiRuleError(f"{inst}.index_range", inst, f"indices must lie in [0, {fa})", shapes)
    dst._data.reshape(pd, fd)[...] = np.take_along_axis(data._data.reshape(pa, fa), idx, axis=1)
    _record("gpsimd", inst, ("gp", fi * -(-fa // 512)), (data, indices), (dst,))


@instruction(tensors=("dst", "src_buffer", "index"), onchip=("dst", "src_buffer", "index"))
def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """GpSimd gather within each core's 16 partitions: the core's indices (``index`` rows of its 16
    partitions, flattened partition-first, the first ``num_valid_indices``) are element offsets into each
    of its partitions' data; ``num_elem_per_idx`` contiguous elements are read per index. Semantics of the
    reference's NumPy test (nki/test/test_nki_isa_local_gather.py at 2.29)."""
    inst = "local_gather"
    shapes = _shapes(dst=dst, src_buffer=src_buffer, index=index)
    (ps, fs), (pi, fi), (pd, fd) = _pf(src_buffer), _pf(index), _pf(dst)
    if ps != pi or ps % 16:
        raise NkiRuleError(f"{inst}.partitions", inst, "src_buffer and index have the same partitions, a multiple "
                           "of 16", shapes)
    if num_elem_per_idx not in (1, 2, 4, 8, 16, 32):
        raise NkiRuleError(f"{inst}.num_elem_per_idx", inst, "num_elem_per_idx is one of 1, 2, 4, 8, 16, 32", shapes)
    per_core = 16 * fi
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= min(per_core, 4096):
        raise NkiRuleError(f"{inst}.num_valid_indices", inst, f"1..{min(per_core, 4096)} indices per core", shapes)
    if index.dtype != _dt.uint16 or dst.dtype != src_buffer.dtype:
        raise NkiRuleError(f"{inst}.dtype", inst, "index uint16; dst has the dtype of src_buffer", shapes)
    if pd != ps or fd != valid * num_elem_per_idx:
        raise NkiRuleError(f"{inst}.dst_shape", inst, f"dst must hold {valid} × {num_elem_per_idx} elements on each "
                           f"of {ps} partitions", shapes)
    for arg, t in (("dst", dst), ("src_buffer", src_buffer), ("index", index)):
        if t.buffer is not SBUF:
            raise NkiRuleError(f"{inst}.sbuf", inst, f"{arg} must be in SBUF", shapes)
    src = src_buffer._data.reshape(ps, fs)
    idx = index._data.reshape(pi, fi).astype(np.int64)
    out = dst._data.reshape(pd, fd)
    for c0 in range(0, ps, 16):
        offsets = idx[c0:c0 + 16].flatten(order="F")[:valid]
        if offsets.size and (offsets.max() + num_elem_per_idx > fs):
            raise NkiRuleError(f"{inst}.index_range", inst, "an index reads past the partition's data", shapes)
        cols = (offsets[:, None] + np.arange(num_elem_per_idx)[None, :]).reshape(-1)
        out[c0:c0 + 16] = src[c0:c0 + 16][:, cols]
    _record("gpsimd", inst, ("gp", valid * num_elem_per_idx), (src_buffer, index), (dst,))


@instruction(tensors=("dst", "segment_ids"), onchip=("dst", "segment_ids"))
def sequence_bounds(dst, segment_ids, name=None):
    """For each element of a (1, n) tile of segment ids: the first index of its segment and one past the
    last (segment id 0 = padding: n and −1), as dst (1, 2, n) (GpSimd). Semantics of the reference's NumPy
    test (nki/test/test_nki_isa_sequence_bounds.py at 2.29)."""
    inst = "sequence_bounds"
    shapes = _shapes(dst=dst, segment_ids=segment_ids)
    p, n = _pf(segment_ids)
    if p != 1 or tuple(dst.shape) != (1, 2, n):
        raise NkiRuleError(f"{inst}.shape", inst, f"segment_ids is (1, n) and dst (1, 2, n); got {segment_ids.shape}, "
                           f"{dst.shape}", shapes)
    if segment_ids.dtype not in (_dt.float32, _dt.int32) or dst.dtype not in (_dt.float32, _dt.int32):
        raise NkiRuleError(f"{inst}.dtype", inst, "segment_ids and dst are float32 or int32", shapes)
    seq = segment_ids._data.reshape(n)
    lo = np.empty(n, np.int64)
    hi = np.empty(n, np.int64)
    for k in range(n):
        lo[k] = n if seq[k] == 0 else (lo[k - 1] if k and seq[k] == seq[k - 1] else k)
    for k in range(n - 1, -1, -1):
        hi[k] = -1 if seq[k] == 0 else (hi[k + 1] if k < n - 1 and seq[k] == seq[k + 1] else k + 1)
    dst._data.reshape(1, 2, n)[0] = np.stack([lo, hi]).astype(dst._data.dtype)
    _record("gpsimd", inst, ("gp", n), (segment_ids,), (dst,))
