"""``nki.isa`` (NKI 0.3.0) for the emulator.

Every instruction is registered with :func:`instruction`, which runs the shared preamble (removed or
unknown keywords, tensor arguments, on-chip operands) once; the engines an instruction may be placed on
are looked up in :data:`ENGINES`. Each instruction then checks the rules of the NKI 0.3.0 ISA reference (raising :class:`NkiRuleError` naming
the rule, the instruction and the shapes), computes its result with NumPy (engine math in float32,
round-to-nearest-even cast into ``dst.dtype``; matmul accumulates in float32 in PSUM), and records
itself with the inputs of its cost formula for :mod:`.cost`. ``dst`` is always the first parameter and
is written in place; nothing is returned.
"""

from __future__ import annotations

import enum
import functools
import inspect
from math import prod as _prod

import numpy as np
from numpy.lib.stride_tricks import as_strided
from scipy import special as _special

from . import dtypes as _dt
from . import language as nl
from . import runtime as _rt
from .errors import NkiRemovedAPIError, NkiRuleError, NkiUnsupportedError
from .tensor import PSUM, SBUF, HBM_REGIONS, NkiTensor

# ---------------------------------------------------------------------------------------------------
# enums


class engine(enum.Enum):
    """Neuron Device engines."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown


class reduce_cmd(enum.Enum):
    """Engine register reduce commands."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):
    """Descriptor Generation Engine mode."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    """Out-of-bounds access mode."""

    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):
    """Performance mode for matmul."""

    none = "none"
    double_row = "double_row"


class nc_version(enum.Enum):
    """NeuronCore version."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version():
    """The nc_version of the current target (trn1 -> gen2, trn2 -> gen3, trn3 -> gen4)."""
    return nc_version(_rt.current().target.gen)


_ENGINE_NAME = {engine.tensor: "tensor", engine.vector: "vector", engine.scalar: "scalar",
                engine.gpsimd: "gpsimd", engine.dma: "dma"}

# ---------------------------------------------------------------------------------------------------
# operator tables


def _logical(f):
    return lambda a, b: f(a != 0, b != 0).astype(np.float32)


def _cmp(f):
    return lambda a, b: f(a, b).astype(np.float32)


_ALU = {
    nl.add: np.add, nl.subtract: np.subtract, nl.multiply: np.multiply,
    nl.maximum: np.maximum, nl.minimum: np.minimum, nl.power: np.power,
    nl.equal: _cmp(np.equal), nl.not_equal: _cmp(np.not_equal), nl.greater: _cmp(np.greater),
    nl.greater_equal: _cmp(np.greater_equal), nl.less: _cmp(np.less), nl.less_equal: _cmp(np.less_equal),
    nl.logical_and: _logical(np.logical_and), nl.logical_or: _logical(np.logical_or),
    nl.logical_xor: _logical(np.logical_xor),
    nl.fmod: np.fmod, nl.mod: np.mod,
}
_BITVEC = {nl.bitwise_and: np.bitwise_and, nl.bitwise_or: np.bitwise_or, nl.bitwise_xor: np.bitwise_xor,
           nl.left_shift: np.left_shift, nl.right_shift: np.right_shift}
# unary ALU operators usable as tensor_scalar ops (operand ignored)
_ALU_UNARY = {nl.rsqrt: lambda x: 1.0 / np.sqrt(x), nl.reciprocal: lambda x: 1.0 / x, nl.abs: np.abs}
_REDUCE = {nl.add: np.add, nl.subtract: np.subtract, nl.multiply: np.multiply, nl.maximum: np.maximum,
           nl.minimum: np.minimum, nl.bitwise_and: np.bitwise_and, nl.bitwise_or: np.bitwise_or,
           nl.bitwise_xor: np.bitwise_xor, nl.logical_and: np.logical_and, nl.logical_or: np.logical_or,
           nl.logical_xor: np.logical_xor}
_SQRT2 = np.float32(np.sqrt(2.0))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(np.float32(0), x)


_ACT = {
    nl.copy: lambda x: x, nl.square: lambda x: x * x, nl.exp: np.exp, nl.log: np.log,
    nl.sqrt: np.sqrt, nl.rsqrt: lambda x: 1.0 / np.sqrt(x), nl.reciprocal: lambda x: 1.0 / x,
    nl.tanh: np.tanh, nl.sigmoid: _sigmoid, nl.relu: lambda x: np.maximum(x, 0),
    nl.gelu: lambda x: 0.5 * x * (1.0 + _special.erf(x / _SQRT2)),
    nl.gelu_apprx_tanh: lambda x: 0.5 * x * (1.0 + np.tanh(0.7978845608 * (x + 0.044715 * x * x * x))),
    nl.silu: lambda x: x * _sigmoid(x), nl.softplus: _softplus,
    nl.mish: lambda x: x * np.tanh(_softplus(x)), nl.erf: _special.erf,
    nl.sin: np.sin, nl.cos: np.cos, nl.tan: np.tan, nl.arctan: np.arctan, nl.sign: np.sign, nl.abs: np.abs,
}
_VEC_UNARY = {nl.negative: np.negative, nl.ceil: np.ceil, nl.floor: np.floor, nl.trunc: np.trunc,
              nl.logical_not: lambda x: (x == 0).astype(np.float32)}


def _opname(op):
    return getattr(op, "__name__", repr(op))


def _removed_divide(inst, shapes):
    raise NkiRemovedAPIError("removed_api.divide", inst,
                             "there is no divide ALU operator in NKI 0.3.0; multiply by nl.reciprocal(y)", shapes)


# ---------------------------------------------------------------------------------------------------
# helpers


#: the enums under names that the instructions' own ``engine=`` / ``dge_mode=`` / ``reduce_cmd=``
#: parameters do not shadow
Engine = engine
DgeMode = dge_mode
ReduceCmd = reduce_cmd

#: engines each instruction may be placed on with ``engine=`` (the table every engine argument is
#: checked against; dma_copy: the hardware DGE queues)
ENGINES = {
    "nc_transpose": (engine.tensor, engine.vector),
    "tensor_copy": (engine.vector, engine.scalar, engine.gpsimd),
    "tensor_tensor": (engine.vector, engine.gpsimd),
    "tensor_scalar": (engine.vector, engine.scalar, engine.gpsimd),
    "memset": (engine.vector, engine.gpsimd),
    "dma_copy": (engine.sync, engine.scalar),
}

#: every emulated instruction, by name
INSTRUCTIONS: dict = {}


def instruction(tensors=(), onchip=(), removed=("dtype", "mask")):
    """Register an ``nki.isa`` instruction and run the preamble all instructions share, once:

    keyword arguments the function does not take are rejected (those NKI 0.3.0 removed with a
    ``removed_api`` rule naming the replacement, others as a TypeError); the arguments named in
    ``tensors`` must be NkiTensors, and those in ``onchip`` must live in SBUF/PSUM with ≤ 128 partitions.
    """

    def register(fn):
        inst = fn.__name__
        sig = inspect.signature(fn)
        params = sig.parameters

        @functools.wraps(fn)
        def run(*args, **kwargs):
            unknown = {k: v for k, v in kwargs.items() if k not in params}
            if unknown:
                _kwargs(inst, unknown, removed)
            bound = sig.bind(*args, **kwargs).arguments
            for arg in tensors:
                _need_tensor(bound.get(arg), arg, inst)
            if onchip:
                _onchip(inst, **{arg: bound[arg] for arg in onchip})
            return fn(*args, **kwargs)

        INSTRUCTIONS[inst] = run
        return run

    return register


def _shapes(**kw):
    return {k: v.shape for k, v in kw.items() if isinstance(v, NkiTensor)}


def _need_tensor(x, arg, inst):
    if type(x) is not NkiTensor:
        raise TypeError(f"{inst}: {arg} must be an NkiTensor, got {type(x).__name__}")


def _kwargs(inst, kw, removed=("dtype", "mask")):
    for k in kw:
        if k in removed:
            raise NkiRemovedAPIError(f"removed_api.{inst}.{k}", inst,
                                     f"keyword '{k}=' was removed in NKI 0.3.0 "
                                     + ("(dst.dtype sets the output type)" if k == "dtype" else "(masks are gone; slice instead)"))
    raise TypeError(f"{inst}() got an unexpected keyword argument '{next(iter(kw))}'")


def _onchip(inst, **kw):
    for arg, t in kw.items():
        if t.buffer in HBM_REGIONS:
            raise NkiRuleError("engine.hbm_access", inst,
                               f"{arg} is in {t.buffer.value}; compute engines access only SBUF/PSUM "
                               "(move HBM data with nisa.dma_copy)", _shapes(**kw))
        if t.shape[0] > 128:
            raise NkiRuleError("partition.max", inst,
                               f"{arg} partition dimension {t.shape[0]} exceeds maximum 128", _shapes(**kw))
        _partition_access(inst, arg, t, kw)


#: (most partitions of an access, the start partitions it may use): trainium_inferentia2_arch.rst
START_PARTITIONS = ((32, (0, 32, 64, 96)), (64, (0, 64)), (128, (0,)))


def _partition_access(inst, arg, t, kw):
    """Compute-engine operands read consecutive partitions (step 1) from an allowed start partition."""
    start, step = t.partition_start, t.partition_step
    if t.shape and t.shape[0] > 1 and step != 1:
        raise NkiRuleError("partition.step", inst,
                           f"{arg} steps over partitions by {step}; the partition access of an SBUF/PSUM pattern "
                           "must be contiguous (nki-aps.rst)", _shapes(**kw))
    n = t.shape[0] if t.shape else 1
    allowed = next(starts for most, starts in START_PARTITIONS if n <= most)
    if start not in allowed:
        raise NkiRuleError("partition.start", inst,
                           f"{arg} accesses {n} partitions starting at partition {start}; an access of ≤ 32 "
                           "partitions may start at 0/32/64/96, ≤ 64 at 0/64, more only at 0 "
                           "(trainium_inferentia2_arch.rst)", _shapes(**kw))


def _pf(t):
    s = t.shape
    if not s:
        return 1, 1
    return s[0], t._data.size // s[0] if s[0] else 0


def _same_pf(inst, rule, **kw):
    items = list(kw.items())
    p0, f0 = _pf(items[0][1])
    for arg, t in items[1:]:
        p, f = _pf(t)
        if p != p0 or f != f0:
            raise NkiRuleError(rule, inst,
                               f"{items[0][0]} and {arg} must have the same partition size and elements per "
                               f"partition ({p0}x{f0} vs {p}x{f})", _shapes(**kw))
    return p0, f0


def _packed_guard(t, inst="instruction"):
    """4-packed MX data is read only by nc_matmul_mx and written only by quantize_mx or DMA."""
    if _dt.is_packed(t.dtype):
        raise NkiRuleError("dtype.packed_x4", inst,
                           f"{_dt.name(t.dtype)} data is read only by nisa.nc_matmul_mx and written only by "
                           "nisa.quantize_mx or DMA (nki/deep-dives/mxfp-matmul.rst)", {"tensor": t.shape})


def _f32(t):
    _packed_guard(t)
    d = t._data
    if d.dtype != np.float32:
        d = d.astype(np.float32)
    return d


def _f32_2d(t):
    d = _f32(t)
    if d.ndim != 2:
        d = d.reshape(d.shape[0], -1) if d.ndim else d.reshape(1, 1)
    return d


def _mask_view(t):
    a = t._alloc
    d = t._data
    if d is a.base or (d.shape == a.base.shape and d.strides == a.base.strides
                       and d.__array_interface__["data"][0] == a.base.__array_interface__["data"][0]):
        return a.mask
    isz = a.base.itemsize
    off = (d.__array_interface__["data"][0] - a.base.__array_interface__["data"][0]) // isz
    return as_strided(a.mask.reshape(-1)[off:], d.shape, tuple(s // isz for s in d.strides))


def _write(dst, v):
    """Cast float32 (or integer) results into dst (RNE) and mark the write."""
    _packed_guard(dst)
    d = dst._data
    if v.shape != d.shape:
        v = v.reshape(d.shape)
    dt = dst.dtype
    if dt is _dt.tfloat32:
        v = _dt.round_tf32(v)
    elif d.dtype.kind in "iub" and v.dtype.kind == "f":
        info = np.iinfo(d.dtype) if d.dtype.kind != "b" else None
        v = np.nan_to_num(np.rint(v))
        if info is not None:
            v = np.clip(v, info.min, info.max)
    d[...] = v
    a = dst._alloc
    if a.mask is not None:
        _mask_view(dst)[...] = False
    a.written = True


def _copy_raw(dst, src_data):
    d = dst._data
    d[...] = src_data.reshape(d.shape) if src_data.shape != d.shape else src_data
    a = dst._alloc
    if a.mask is not None:
        _mask_view(dst)[...] = False
    a.written = True


def _engine_arg(e, inst, default, allowed):
    if e is engine.unknown or e is None:
        return default
    if not isinstance(e, engine):
        raise NkiRuleError("enum.raw_value", inst,
                           f"engine must be a nisa.engine member, got {e!r} (raw values are rejected in 0.3.0)")
    if e not in allowed:
        raise NkiRuleError(f"{inst}.engine", inst,
                           f"engine {e.name} cannot run {inst} (allowed: {', '.join(a.name for a in allowed)})")
    return _ENGINE_NAME[e]


def _no_gpsimd_psum(inst, eng, **kw):
    if eng == "gpsimd":
        for arg, t in kw.items():
            if isinstance(t, NkiTensor) and t.buffer is PSUM:
                raise NkiRuleError("gpsimd.psum", inst,
                                   f"GpSimd engine cannot access PSUM ({arg} is in PSUM)", _shapes(**kw))


def _is16(*ts):
    return all(_dt.is_16bit_float(t.dtype) for t in ts)


def _all_sbuf(*ts):
    return all(t.buffer is SBUF for t in ts)


def _tensors(*ts):
    """The tensors among ``ts`` (scalars dropped): what an instruction record reads or writes."""
    return tuple(t for t in ts if isinstance(t, NkiTensor))


def _scalar_or_col(v, P, arg, inst, shapes, fp32_required=True):
    """tensor_scalar/activation operand: a Python/NumPy scalar or a (P, 1) on-chip tile -> broadcastable."""
    if isinstance(v, NkiTensor):
        if v.buffer in HBM_REGIONS:
            raise NkiRuleError("engine.hbm_access", inst, f"{arg} is in HBM", shapes)
        p, f = _pf(v)
        if p != P or f != 1:
            raise NkiRuleError(f"{inst}.operand_shape", inst,
                               f"{arg} must be a scalar or a ({P}, 1) tile, got {v.shape}", shapes)
        if fp32_required and v.dtype != _dt.float32:
            raise NkiRuleError(f"{inst}.operand_dtype", inst,
                               f"{arg} tile must be float32 for arithmetic operators, got {_dt.name(v.dtype)}", shapes)
        return _f32(v).reshape(P, 1)
    if isinstance(v, (int, float, np.integer, np.floating, bool)):
        return np.float32(v)
    raise TypeError(f"{inst}: {arg} must be a scalar or an NkiTensor, got {type(v).__name__}")


# ---------------------------------------------------------------------------------------------------
# TensorE


@instruction(tensors=("dst", "stationary", "moving"))
def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False,
              is_transpose=False, accumulate=None, tile_position=(), tile_size=(),
              perf_mode=matmul_perf_mode.none, name=None):
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` on TensorE, fp32 accumulation in PSUM.

    ``accumulate=None``: the first matmul write to a PSUM element overwrites it, later ones accumulate;
    ``True`` always accumulates; ``False`` always overwrites.
    """
    inst = "nc_matmul"
    L = _rt.current()
    T = L.target
    if stationary.buffer is not SBUF or moving.buffer is not SBUF:
        bad = "stationary" if stationary.buffer is not SBUF else "moving"
        raise NkiRuleError("nc_matmul.operands_sbuf", inst,
                           f"{bad} must be in SBUF (is {(stationary if bad == 'stationary' else moving).buffer.value})",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    if dst.buffer is not PSUM:
        raise NkiRuleError("nc_matmul.dst_psum", inst, f"dst must be in PSUM (is {dst.buffer.value})",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    operands = {"dst": dst, "stationary": stationary, "moving": moving}
    for arg, t in operands.items():
        _partition_access(inst, arg, t, operands)
    K, M = _pf(stationary)
    Km, N = _pf(moving)
    if K > 128 or Km > 128:
        raise NkiRuleError("partition.max", inst,
                           f"contraction (partition) dimension {builtin_max(K, Km)} exceeds maximum 128",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    if K != Km:
        raise NkiRuleError("nc_matmul.contraction_match", inst,
                           f"stationary and moving partition (contraction) sizes differ: {K} vs {Km}",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    if M > 128:
        raise NkiRuleError("nc_matmul.stationary_fmax", inst, f"stationary free size {M} exceeds 128",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    sd, md, dd = stationary.dtype, moving.dtype, dst.dtype
    dst_fp32 = dd == _dt.float32
    nmax = T.moving_fmax_fp32_dst if dst_fp32 else T.moving_fmax_bf16_dst
    if N > nmax:
        raise NkiRuleError("nc_matmul.moving_fmax", inst, f"moving free size {N} exceeds {nmax}",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    for arg, d in (("stationary", sd), ("moving", md)):
        if not (_dt.is_fp32_class(d) or d in _MM_DTYPES):
            raise NkiRuleError("nc_matmul.input_dtype", inst,
                               f"{arg} dtype {_dt.name(d)} is not a TensorE input type "
                               "(float8_e4m3/e5m2, bfloat16, float16, tfloat32, float32)",
                               _shapes(dst=dst, stationary=stationary, moving=moving))
    if _dt.is_fp32_class(sd) != _dt.is_fp32_class(md):
        raise NkiRuleError("nc_matmul.fp32_pairing", inst,
                           f"float32/tfloat32 operands pair only with float32/tfloat32 "
                           f"(stationary {_dt.name(sd)}, moving {_dt.name(md)})",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    if not dst_fp32 and not (T.psum_dst_bf16 and dd == _dt.bfloat16):
        raise NkiRuleError("nc_matmul.dst_dtype", inst,
                           f"dst must be float32 on {T.name} ({T.core}), got {_dt.name(dd)}",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    Pd, Fd = _pf(dst)
    if Pd != M or Fd != N:
        raise NkiRuleError("nc_matmul.dst_shape", inst,
                           f"dst must hold [{M}, {N}] (stationary free x moving free), got {Pd}x{Fd}",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    b0, b1 = _bank_span(dst, T)
    if b0 != b1:
        raise NkiRuleError("nc_matmul.psum_bank", inst,
                           f"the matmul output must lie within one 2 KiB PSUM bank per partition; this dst "
                           f"spans banks {dst._alloc.bank0 + b0}..{dst._alloc.bank0 + b1}",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    if perf_mode is not matmul_perf_mode.none and perf_mode is not None:
        raise NkiUnsupportedError("nc_matmul perf_mode=double_row is not emulated")
    if is_transpose:
        raise NkiUnsupportedError("nc_matmul(is_transpose=True) is not emulated; use nisa.nc_transpose")
    if bool(tile_position) != bool(tile_size):
        raise NkiRuleError("nc_matmul.tiling", inst, "tile_position and tile_size must be given together",
                           _shapes(dst=dst, stationary=stationary, moving=moving))
    if accumulate not in (None, True, False):
        raise TypeError("nc_matmul: accumulate must be None, True or False")
    s = _f32(stationary)
    m = _f32(moving)
    if s.ndim != 2:
        s = s.reshape(K, M)
    if m.ndim != 2:
        m = m.reshape(K, N)
    _accumulate_psum(dst, s.T @ m, accumulate)
    L.record("tensor", inst, ("mm", K, M, N, _dt.is_fp32_class(sd),
                              bool(is_stationary_onezero or is_moving_onezero)),
             (stationary, moving), (dst,))


def _accumulate_psum(dst, prod, accumulate):
    """Write a matmul result into PSUM ``dst``: ``accumulate=None`` overwrites an element's first write and
    accumulates later ones, True always accumulates, False always overwrites (fp32 adds; a bf16 dst adds in
    fp32 and rounds, NC-v4)."""
    d = dst._data
    if d.shape != prod.shape:
        prod = prod.reshape(d.shape)
    mask = _mask_view(dst)
    if dst.dtype == _dt.float32:
        if accumulate is None:
            if mask.all():
                d += prod
            elif not mask.any():
                d[...] = prod
            else:
                d[...] = np.where(mask, d + prod, prod)
        elif accumulate:
            d += prod
        else:
            d[...] = prod
    else:  # bf16 PSUM dst (NC-v4): fp32 add then RNE cast
        cur = d.astype(np.float32)
        if accumulate is None:
            val = np.where(mask, cur + prod, prod)
        elif accumulate:
            val = cur + prod
        else:
            val = prod
        d[...] = val
    mask[...] = True
    dst._alloc.written = True


builtin_max = max
_MM_DTYPES = (_dt.bfloat16, _dt.float16, _dt.float8_e4m3, _dt.float8_e5m2, _dt.float8_e4m3fn)


def _bank_span(t, T):
    """(first, last) PSUM bank (relative to the allocation) touched by the view, per partition."""
    a = t._alloc
    d = t._data
    base = a.base
    isz = base.itemsize
    row = (base.size // base.shape[0]) * isz
    off = d.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    f0 = off % row
    ext = d.itemsize
    for n, st in zip(d.shape[1:], d.strides[1:]):
        if n > 1 and st > 0:
            ext += (n - 1) * st
    bb = T.psum_bank_bytes
    return f0 // bb, (f0 + ext - 1) // bb


@instruction(tensors=("dst", "data"), onchip=("dst", "data"))
def nc_transpose(dst, data, engine=engine.unknown, name=None):
    """Swap partition and (flattened) free axes: TensorE (<=128x128, SBUF -> PSUM) or VectorE (<=32x32)."""
    inst = "nc_transpose"
    P, F = _pf(data)
    e = engine
    if e is None or e is Engine.unknown:
        eng = "vector" if (P <= 32 and F <= 32) else "tensor"
    else:
        eng = _engine_arg(e, inst, "tensor", ENGINES[inst])
    if dst.dtype != data.dtype:
        raise NkiRuleError("nc_transpose.dtype", inst,
                           f"dst dtype {_dt.name(dst.dtype)} must equal data dtype {_dt.name(data.dtype)}",
                           _shapes(dst=dst, data=data))
    Pd, Fd = _pf(dst)
    if Pd != F or Fd != P:
        raise NkiRuleError("nc_transpose.dst_shape", inst, f"dst must be [{F}, {P}], got {Pd}x{Fd}",
                           _shapes(dst=dst, data=data))
    if eng == "tensor":
        if P > 128 or F > 128:
            raise NkiRuleError("nc_transpose.tensor_size", inst, f"TensorE transpose input {P}x{F} exceeds 128x128",
                               _shapes(dst=dst, data=data))
        if data.buffer is not SBUF:
            raise NkiRuleError("nc_transpose.tensor_src_sbuf", inst, "TensorE transpose reads SBUF",
                               _shapes(dst=dst, data=data))
        if dst.buffer is not PSUM:
            raise NkiRuleError("nc_transpose.tensor_dst_psum", inst, "TensorE transpose writes PSUM",
                               _shapes(dst=dst, data=data))
        params = ("pet", P, F)
    else:
        if P > 32 or F > 32:
            raise NkiRuleError("nc_transpose.vector_size", inst, f"VectorE transpose input {P}x{F} exceeds 32x32",
                               _shapes(dst=dst, data=data))
        params = ("simple", F, 1, 1)
    src = data._data.reshape(P, F)
    _copy_raw(dst, np.ascontiguousarray(src.T))
    _rt.current().record(eng, inst, params, (data,), (dst,))


# ---------------------------------------------------------------------------------------------------
# DMA


@instruction(tensors=("dst", "src"), removed=("dtype", "mask", "dst_rmw_op", "unique_indices"))
def dma_copy(dst, src, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown, name=None):
    """Copy ``src`` to ``dst`` (HBM/SBUF, never PSUM) with the DMA engines; dtype cast via float32."""
    inst = "dma_copy"
    if src.buffer is PSUM:
        raise NkiRuleError("dma_copy.psum_source", inst,
                           "DMA cannot read PSUM in NKI 0.3.0; copy the PSUM tile to SBUF first with nisa.tensor_copy",
                           _shapes(dst=dst, src=src))
    if dst.buffer is PSUM:
        raise NkiRuleError("dma_copy.psum_dest", inst, "DMA moves data between HBM and SBUF only; dst is in PSUM",
                           _shapes(dst=dst, src=src))
    if dst.size != src.size:
        raise NkiRuleError("dma_copy.element_count", inst,
                           f"src has {src.size} elements, dst {dst.size}; they must match",
                           _shapes(dst=dst, src=src))
    for arg, t in (("dst", dst), ("src", src)):
        if t.buffer is SBUF and t.shape[0] > 128:
            raise NkiRuleError("partition.max", inst, f"{arg} partition dimension {t.shape[0]} exceeds maximum 128",
                               _shapes(dst=dst, src=src))
    L = _rt.current()
    dm = dge_mode
    if dm is not None and not isinstance(dm, DgeMode):
        raise NkiRuleError("enum.raw_value", inst, f"dge_mode must be a nisa.dge_mode member, got {dm!r}")
    if dm is DgeMode.hwdge:
        if L.target.gen < 3:
            raise NkiRuleError("dma_copy.hwdge_target", inst, f"hardware DGE needs NeuronCore-v3+, target is {L.target.name}",
                               _shapes(dst=dst, src=src))
        if dst.dtype != src.dtype:
            raise NkiRuleError("dma_copy.hwdge_dtype", inst, "with dge_mode=hwdge dtypes must match exactly (use .view())",
                               _shapes(dst=dst, src=src))
    if engine is not None and engine is not Engine.unknown:
        if not isinstance(engine, Engine):
            raise NkiRuleError("enum.raw_value", inst, f"engine must be a nisa.engine member, got {engine!r}")
        if dm is not DgeMode.hwdge or engine not in ENGINES[inst]:
            raise NkiRuleError("dma_copy.engine", inst,
                               "engine= is only valid (sync or scalar) together with dge_mode=hwdge",
                               _shapes(dst=dst, src=src))
    s = src._data
    if src.dtype == dst.dtype:
        _copy_raw(dst, s)
    else:
        _write(dst, s.astype(np.float32))
    nbytes = builtin_max(src.size * src.dtype.itemsize, dst.size * dst.dtype.itemsize)
    sk = "sbuf" if src.buffer is SBUF else "hbm"
    dk = "sbuf" if dst.buffer is SBUF else "hbm"
    P = dst.shape[0] if dk == "sbuf" else (src.shape[0] if sk == "sbuf" else min(128, dst.shape[0] if dst.shape else 1))
    L.record("dma", inst, ("dma", nbytes, P, sk, dk, _dma_descriptors(src, dst)), (src,), (dst,))


def _contiguous_run(t: NkiTensor) -> int:
    """Elements in the innermost contiguous run of view ``t`` (on-chip: within one partition)."""
    a = t._data
    first = 1 if t.buffer in (SBUF, PSUM) else 0
    run, expected = 1, a.itemsize
    for ax in range(a.ndim - 1, first - 1, -1):
        n = a.shape[ax]
        if n == 1:
            continue
        if a.strides[ax] != expected:
            break
        run *= n
        expected *= n
    return run


def _dma_descriptors(*views: NkiTensor) -> int:
    """DMA descriptors (packets) a transfer between ``views`` needs: one per run of elements contiguous in
    every view (a descriptor names one source and one destination address and a length,
    nki/deep-dives/nki-dge.rst); an SBUF side gives at least one per partition."""
    size = views[0]._data.size
    run = min(_contiguous_run(v) for v in views)
    return builtin_max(1, -(-size // builtin_max(run, 1)))


# ---------------------------------------------------------------------------------------------------
# Vector / Scalar / GpSimd


@instruction(tensors=("dst", "src"), onchip=("dst", "src"))
def tensor_copy(dst, src, engine=engine.unknown, name=None):
    """Copy an SBUF/PSUM tile on VectorE (default), ScalarE or GpSimdE; bit-exact if dtypes match."""
    inst = "tensor_copy"
    P, F = _same_pf(inst, "tensor_copy.shape", dst=dst, src=src)
    eng = _engine_arg(engine, inst, "vector", ENGINES[inst])
    _no_gpsimd_psum(inst, eng, dst=dst, src=src)
    L = _rt.current()
    if eng == "scalar" and L.target.gen == 2:
        raise NkiRuleError("tensor_copy.scalar_nc_v2", inst,
                           "tensor_copy is not supported on ScalarE on NeuronCore-v2; use activation(op=nl.copy)",
                           _shapes(dst=dst, src=src))
    if src.dtype == dst.dtype and eng != "scalar":
        _copy_raw(dst, src._data)
    else:
        _write(dst, _f32(src))
    perf = 4 if (_is16(src, dst) and _all_sbuf(src, dst)) else (2 if _is16(src, dst) else 1)
    L.record(eng, inst, ("simple", F, perf, 1), (src,), (dst,))


@instruction(tensors=("dst", "data1", "data2"), onchip=("dst", "data1", "data2"))
def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    """Element-wise ``dst = op(data1, data2)`` (VectorE; GpSimd for power / all-int32). No broadcasting."""
    inst = "tensor_tensor"
    P, F = _same_pf(inst, "tensor_tensor.broadcast", dst=dst, data1=data1, data2=data2)
    if data1.buffer is PSUM and data2.buffer is PSUM:
        raise NkiRuleError("tensor_tensor.both_psum", inst, "data1 and data2 cannot both be in PSUM",
                           _shapes(dst=dst, data1=data1, data2=data2))
    if op is nl.divide:
        _removed_divide(inst, _shapes(dst=dst, data1=data1, data2=data2))
    ints = all(t.dtype in (_dt.int32, _dt.uint32) for t in (dst, data1, data2))
    default = "gpsimd" if (op is nl.power or ints) else "vector"
    eng = _engine_arg(engine, inst, default, ENGINES[inst])
    if op is nl.power:
        eng = "gpsimd"
    _no_gpsimd_psum(inst, eng, dst=dst, data1=data1, data2=data2)
    if op in _BITVEC:
        if not (_dt.is_int(data1.dtype) and _dt.is_int(data2.dtype)):
            raise NkiRuleError("tensor_tensor.bitvec_dtype", inst, f"{_opname(op)} needs integer tiles",
                               _shapes(dst=dst, data1=data1, data2=data2))
        res = _BITVEC[op](data1._data.reshape(P, F), data2._data.reshape(P, F))
        _copy_raw(dst, res.astype(dst._data.dtype))
    else:
        f = _ALU.get(op)
        if f is None:
            raise NkiRuleError("tensor_tensor.op", inst, f"{_opname(op)} is not an ALU operator",
                               _shapes(dst=dst, data1=data1, data2=data2))
        with np.errstate(all="ignore"):
            res = f(_f32_2d(data1), _f32_2d(data2))
        _write(dst, res)
    one_psum = (data1.buffer is PSUM) != (data2.buffer is PSUM)
    cheap = one_psum or (all(t.dtype == _dt.bfloat16 for t in (dst, data1, data2))
                         and op in (nl.add, nl.multiply, nl.subtract) and _all_sbuf(data1, data2))
    perf = 2 if (_is16(data1, data2) and _all_sbuf(data1, data2)) else 1
    _rt.current().record(eng, inst, ("tt", F, cheap, perf), (data1, data2), (dst,))


def _apply_alu(op, x, a, reverse, inst, shapes):
    if op is nl.divide:
        _removed_divide(inst, shapes)
    if op in _ALU_UNARY:
        return _ALU_UNARY[op](x)
    f = _ALU.get(op)
    if f is None:
        raise NkiRuleError(f"{inst}.op", inst, f"{_opname(op)} is not an ALU operator", shapes)
    return f(a, x) if reverse else f(x, a)


@instruction(tensors=("dst", "data"), onchip=("dst", "data"))
def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None):
    """``dst = (data op0 operand0) op1 operand1``; operands are scalars or (P, 1) float32 tiles."""
    inst = "tensor_scalar"
    P, F = _same_pf(inst, "tensor_scalar.shape", dst=dst, data=data)
    shapes = _shapes(dst=dst, data=data, operand0=operand0, operand1=operand1)
    if op1 is None and operand1 is not None:
        raise NkiRuleError("tensor_scalar.op1_none", inst, "operand1 must be None when op1 is None", shapes)
    if op1 is not None and operand1 is None:
        raise NkiRuleError("tensor_scalar.op1_none", inst, "op1 needs operand1", shapes)
    eng = _engine_arg(engine, inst, "vector", ENGINES[inst])
    _no_gpsimd_psum(inst, eng, dst=dst, data=data, operand0=operand0, operand1=operand1)
    L = _rt.current()
    bit0 = op0 in _BITVEC
    if op1 is not None and (op1 in _BITVEC) != bit0:
        raise NkiRuleError("tensor_scalar.op_class", inst, "op0 and op1 must both be bitvec or both arithmetic", shapes)
    if eng == "scalar" and L.target.gen >= 3:
        combo = (op0, op1)
        if combo not in ((nl.multiply, nl.add), (nl.multiply, None), (nl.add, None)):
            raise NkiRuleError("tensor_scalar.scalar_engine_ops", inst,
                               "ScalarE tensor_scalar supports only (multiply, add), (multiply, None), (add, None)",
                               shapes)
    if eng == "gpsimd" and (op0 is not nl.rsqrt or op1 is not None):
        raise NkiRuleError("tensor_scalar.gpsimd_op", inst,
                           "on the GpSimd engine tensor_scalar supports only op0=nl.rsqrt (no op1) (nki.isa."
                           "tensor_scalar reference); run other operators on the Vector or Scalar engine", shapes)
    if bit0:
        if eng != "vector":
            raise NkiRuleError("tensor_scalar.bitvec_engine", inst,
                               f"bitvec operators run only on the Vector engine (asked for {eng})", shapes)
        if not _dt.is_int(data.dtype):
            raise NkiRuleError("tensor_scalar.bitvec_dtype", inst, "bitvec operators need integer tiles", shapes)
        x = data._data.reshape(P, F)
        a0 = operand0._data.reshape(P, 1) if isinstance(operand0, NkiTensor) else np.array(operand0, dtype=x.dtype)
        r = _BITVEC[op0](a0, x) if reverse0 else _BITVEC[op0](x, a0)
        if op1 is not None:
            a1 = operand1._data.reshape(P, 1) if isinstance(operand1, NkiTensor) else np.array(operand1, dtype=x.dtype)
            r = _BITVEC[op1](a1, r) if reverse1 else _BITVEC[op1](r, a1)
        _copy_raw(dst, r.astype(dst._data.dtype))
    else:
        a0 = _scalar_or_col(operand0, P, "operand0", inst, shapes)
        x = _f32_2d(data)
        with np.errstate(all="ignore"):
            r = _apply_alu(op0, x, a0, reverse0, inst, shapes)
            if op1 is not None:
                a1 = _scalar_or_col(operand1, P, "operand1", inst, shapes)
                r = _apply_alu(op1, r, a1, reverse1, inst, shapes)
        _write(dst, np.asarray(r, dtype=np.float32))
    perf = 4 if (_is16(data, dst) and _all_sbuf(data, dst)) else (2 if _is16(data, dst) else 1)
    L.record(eng, inst, ("simple", F, perf, 1), _tensors(data, operand0, operand1), (dst,))


def _reduce_axes(data, axis, inst, shapes):
    nd = len(data.shape)
    ax = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    try:
        ax = sorted({int(a) + nd if int(a) < 0 else int(a) for a in ax})
    except (TypeError, ValueError):
        raise NkiRuleError("tensor_reduce.axis", inst, f"axis must be an int or a list of ints, got {axis!r}", shapes) from None
    if not ax:
        raise NkiRuleError("tensor_reduce.axis", inst, "empty axis list", shapes)
    if 0 in ax:
        raise NkiRuleError("tensor_reduce.partition_axis", inst,
                           "the partition axis (0) cannot be reduced; transpose first or use nc_matmul with a ones "
                           "stationary for a cross-partition sum", shapes)
    if any(a >= nd for a in ax) or ax != list(range(nd - len(ax), nd)):
        raise NkiRuleError("tensor_reduce.axis", inst,
                           f"axis {tuple(ax)} must be the last contiguous free axes of a {nd}-D tile "
                           f"(e.g. {tuple(range(nd - len(ax), nd))})", shapes)
    return ax


@instruction(tensors=("dst", "data"), onchip=("dst", "data"))
def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce ``data`` along its last free axes with ``op`` on VectorE (fp32 math)."""
    inst = "tensor_reduce"
    shapes = _shapes(dst=dst, data=data)
    ax = _reduce_axes(data, axis, inst, shapes)
    f = _REDUCE.get(op)
    if f is None:
        if op is nl.divide:
            _removed_divide(inst, shapes)
        raise NkiRuleError("tensor_reduce.op", inst, f"{_opname(op)} is not a reduction operator", shapes)
    P, Fin = _pf(data)
    R = _prod(data.shape[a] for a in ax)
    Pd, Fd = _pf(dst)
    if Pd != P or Fd != Fin // R:
        raise NkiRuleError("tensor_reduce.dst_shape", inst,
                           f"dst must have {P} partitions x {Fin // R} elements, got {Pd}x{Fd}", shapes)
    if negate and op in (nl.bitwise_and, nl.bitwise_or, nl.bitwise_xor):
        raise NkiRuleError("tensor_reduce.negate", inst, "negate=True is for arithmetic operators only", shapes)
    x = _f32(data).reshape(P, Fin // R, R)
    with np.errstate(all="ignore"):
        if op in (nl.logical_and, nl.logical_or, nl.logical_xor):
            r = f.reduce(x != 0, axis=2).astype(np.float32)
        elif op in (nl.bitwise_and, nl.bitwise_or, nl.bitwise_xor):
            r = f.reduce(data._data.reshape(P, Fin // R, R), axis=2)
        else:
            r = f.reduce(x, axis=2)
    if negate:
        r = -r
    if r.dtype.kind == "f":
        _write(dst, r)
    else:
        _copy_raw(dst, r.astype(dst._data.dtype))
    half = data.dtype == _dt.bfloat16 and dst.dtype == _dt.bfloat16 and op in (nl.add, nl.maximum)
    _rt.current().record("vector", inst, ("red", Fin, half), (data,), (dst,))


def _act_common(inst, dst, op, data, bias, scale, reduce_op, reduce_res, cmd):
    _need_tensor(dst, "dst", inst)
    _need_tensor(data, "data", inst)
    _onchip(inst, dst=dst, data=data)
    P, F = _same_pf(inst, "activation.shape", dst=dst, data=data)
    shapes = _shapes(dst=dst, data=data, bias=bias, scale=scale, reduce_res=reduce_res)
    L = _rt.current()
    fn = _ACT.get(op)
    if fn is None:
        if op is nl.divide:
            _removed_divide(inst, shapes)
        raise NkiRuleError("activation.op", inst, f"{_opname(op)} is not a ScalarE activation function", shapes)
    sc = _scalar_or_col(scale, P, "scale", inst, shapes)
    if bias is None:
        b = None
    elif isinstance(bias, NkiTensor):
        if bias.dtype is _dt.tfloat32:
            raise NkiRuleError("activation.bias_dtype", inst, "bias cannot be tfloat32", shapes)
        p, f = _pf(bias)
        if p != P or f != 1:
            raise NkiRuleError("activation.bias_shape", inst, f"bias must be a ({P}, 1) tile, got {bias.shape}", shapes)
        b = _scalar_or_col(bias, P, "bias", inst, shapes, fp32_required=False)
    else:
        if L.target.gen == 2:
            raise NkiRuleError("activation.bias_scalar_nc_v2", inst,
                               "on NeuronCore-v2 bias must be a (P, 1) tile, not a scalar", shapes)
        b = np.float32(bias)
    with_reduce = reduce_op is not None or reduce_res is not None
    if with_reduce and reduce_op is not nl.add:
        raise NkiRuleError("activation.reduce_op", inst,
                           f"reduce_op must be nl.add, got {_opname(reduce_op) if reduce_op is not None else None}",
                           shapes)
    if reduce_res is not None:
        _need_tensor(reduce_res, "reduce_res", inst)
        _onchip(inst, reduce_res=reduce_res)
        p, f = _pf(reduce_res)
        if p != P or f != 1:
            raise NkiRuleError("activation.reduce_res_shape", inst,
                               f"reduce_res must be a ({P}, 1) tile, got {reduce_res.shape}", shapes)
    if not isinstance(cmd, reduce_cmd):
        raise NkiRuleError("enum.raw_value", inst, f"reduce_cmd must be a nisa.reduce_cmd member, got {cmd!r}")
    if cmd is reduce_cmd.load_reduce:
        raise NkiUnsupportedError("reduce_cmd.load_reduce is not emulated")
    x = _f32_2d(data)
    with np.errstate(all="ignore"):
        y = x * sc if not (isinstance(sc, np.float32) and sc == 1.0) else x
        if b is not None:
            y = y + b
        y = np.asarray(fn(y), dtype=np.float32)
    _write(dst, y)
    regs = L.reduce_regs
    if cmd in (reduce_cmd.reset, reduce_cmd.reset_reduce):
        regs[:P] = 0.0
    if cmd in (reduce_cmd.reduce, reduce_cmd.reset_reduce):
        regs[:P] += y.sum(axis=1, dtype=np.float32)
    extra = 0
    writes = (dst,)
    reads = _tensors(data, bias, scale)
    if reduce_res is not None:
        _write(reduce_res, regs[:P].copy())
        extra = 1
        writes = writes + (reduce_res,)
    L.record("scalar", inst, ("act", F, extra), reads, writes)


@instruction()
def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, name=None):
    """``dst = op(data * scale + bias)`` on ScalarE, with optional free-axis add-reduction into the
    engine's reduce registers (``reduce_cmd``) read out into ``reduce_res``."""
    _act_common("activation", dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd)


@instruction()
def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``activation(..., reduce_cmd=reset_reduce, reduce_res=...)``: reduce over all free axes."""
    if reduce_res is None:
        raise NkiRuleError("activation.reduce_res_shape", "activation_reduce", "reduce_res is required")
    _act_common("activation_reduce", dst, op, data, bias, scale, reduce_op, reduce_res, ReduceCmd.reset_reduce)


@instruction(tensors=("dst", "data", "reduce_res"), onchip=("dst", "data", "reduce_res"))
def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res, reverse0=False, name=None):
    """``dst = data op0 operand0``, then ``reduce_res[P, 1] = reduce_op`` over all free axes (VectorE)."""
    inst = "tensor_scalar_reduce"
    P, F = _same_pf(inst, "tensor_scalar.shape", dst=dst, data=data)
    shapes = _shapes(dst=dst, data=data, operand0=operand0, reduce_res=reduce_res)
    if reverse0:
        raise NkiRuleError("tensor_scalar_reduce.reverse0", inst, "reverse0 is not supported yet (ISA docs)", shapes)
    if reduce_op not in (nl.add, nl.subtract, nl.multiply, nl.maximum, nl.minimum):
        raise NkiRuleError("tensor_scalar_reduce.reduce_op", inst,
                           "reduce_op must be add, subtract, multiply, maximum or minimum", shapes)
    p, f = _pf(reduce_res)
    if p != P or f != 1:
        raise NkiRuleError("tensor_scalar_reduce.reduce_res_shape", inst, f"reduce_res must be ({P}, 1)", shapes)
    a0 = _scalar_or_col(operand0, P, "operand0", inst, shapes)
    with np.errstate(all="ignore"):
        r = np.asarray(_apply_alu(op0, _f32_2d(data), a0, False, inst, shapes), dtype=np.float32)
        red = _REDUCE[reduce_op].reduce(r, axis=1)
    _write(dst, r)
    _write(reduce_res, red.astype(np.float32))
    _rt.current().record("vector", inst, ("act", F, 1), _tensors(data, operand0),
                         (dst, reduce_res))


@instruction(tensors=("dst", "data"), onchip=("dst", "data"))
def reciprocal(dst, data, name=None):
    """``dst = 1 / data`` on VectorE (fp32 math); cost max(MIN_II, 8N)."""
    inst = "reciprocal"
    P, F = _same_pf(inst, "reciprocal.shape", dst=dst, data=data)
    with np.errstate(all="ignore"):
        _write(dst, np.float32(1.0) / _f32_2d(data))
    _rt.current().record("vector", inst, ("recip", F), (data,), (dst,))


@instruction(tensors=("dst",), onchip=("dst",))
def memset(dst, value, engine=engine.unknown, name=None):
    """Fill ``dst`` with a compile-time constant (VectorE by default, or GpSimd). Value must match dtype."""
    inst = "memset"
    eng = _engine_arg(engine, inst, "vector", ENGINES[inst])
    _no_gpsimd_psum(inst, eng, dst=dst)
    if isinstance(value, NkiTensor) or not isinstance(value, (int, float, np.integer, np.floating, bool, np.bool_)):
        raise NkiRuleError("memset.value_dtype", inst, f"value must be a compile-time scalar, got {type(value).__name__}",
                           _shapes(dst=dst))
    if _dt.is_int(dst.dtype) and not isinstance(value, (int, np.integer, bool, np.bool_)):
        raise NkiRuleError("memset.value_dtype", inst,
                           f"value {value!r} ({type(value).__name__}) does not match integer dst dtype "
                           f"{_dt.name(dst.dtype)}; use an integer literal", _shapes(dst=dst))
    d = dst._data
    if _dt.is_int(dst.dtype):
        info = np.iinfo(d.dtype) if d.dtype.kind != "b" else None
        if info is not None and not info.min <= int(value) <= info.max:
            raise NkiRuleError("memset.value_dtype", inst, f"value {value} out of range for {_dt.name(dst.dtype)}",
                               _shapes(dst=dst))
        _copy_raw(dst, np.full(d.shape, value, dtype=d.dtype))
    else:
        _write(dst, np.full(d.shape, value, dtype=np.float32))
    P, F = _pf(dst)
    zero16 = 2 if (value == 0 and _dt.is_16bit_float(dst.dtype)) else 1
    _rt.current().record(eng, inst, ("simple", F, 1, zero16), (), (dst,))


def _pattern(pattern, inst, shapes, F):
    try:
        pat = [(int(s), int(n)) for s, n in pattern]
    except (TypeError, ValueError):
        raise NkiRuleError(f"{inst}.pattern", inst, f"pattern must be [[step, num], ...], got {pattern!r}", shapes) from None
    if not 1 <= len(pat) <= 4:
        raise NkiRuleError(f"{inst}.pattern", inst, "pattern has 1 to 4 [step, num] levels", shapes)
    if _prod(n for _, n in pat) != F:
        raise NkiRuleError(f"{inst}.pattern", inst,
                           f"pattern covers {_prod(n for _, n in pat)} elements, dst has {F} per partition", shapes)
    return pat


def _affine_values(pat, P, offset, channel_multiplier):
    v = np.full((P, 1), int(offset), dtype=np.int64) + np.arange(P, dtype=np.int64)[:, None] * int(channel_multiplier)
    grid = np.zeros([n for _, n in pat], dtype=np.int64)
    for k, (s, n) in enumerate(pat):
        shp = [1] * len(pat)
        shp[k] = n
        grid = grid + (np.arange(n, dtype=np.int64) * s).reshape(shp)
    return v + grid.reshape(1, -1)


@instruction(tensors=("dst",), onchip=("dst",))
def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """GpSimd: ``dst[p, ...] = offset + p*channel_multiplier + sum(i_k * step_k)`` (int32, cast to dst)."""
    inst = "iota"
    _no_gpsimd_psum(inst, "gpsimd", dst=dst)
    P, F = _pf(dst)
    pat = _pattern(pattern, inst, _shapes(dst=dst), F)
    vals = _affine_values(pat, P, offset, channel_multiplier).astype(np.int32)
    if _dt.is_int(dst.dtype):
        _copy_raw(dst, vals.astype(dst._data.dtype))
    else:
        _write(dst, vals.astype(np.float32))
    _rt.current().record("gpsimd", inst, ("gp", F), (), (dst,))


@instruction(tensors=("dst", "on_true_tile"), onchip=("dst", "on_true_tile"))
def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=nl.equal, offset=0,
                  name=None):
    """GpSimd: ``dst = on_true_tile if cmp_op(affine_value, 0) else on_false_value``."""
    inst = "affine_select"
    _no_gpsimd_psum(inst, "gpsimd", dst=dst, on_true_tile=on_true_tile)
    P, F = _same_pf(inst, "affine_select.shape", dst=dst, on_true_tile=on_true_tile)
    pat = _pattern(pattern, inst, _shapes(dst=dst, on_true_tile=on_true_tile), F)
    f = _ALU.get(cmp_op)
    if f is None:
        raise NkiRuleError("affine_select.cmp_op", inst, f"{_opname(cmp_op)} is not a comparison operator")
    vals = _affine_values(pat, P, offset, channel_multiplier).astype(np.float32)
    pred = f(vals, np.float32(0)) != 0
    _write(dst, np.where(pred, _f32_2d(on_true_tile), np.float32(on_false_value)))
    _rt.current().record("gpsimd", inst, ("gp", F), (on_true_tile,), (dst,))


def _vector_unary(dst, src, op, inst, values=None, n_inputs=1, extra_reads=()):
    """Emulator-internal VectorE element-wise op used by nl.* wrappers without a dedicated instruction."""
    _onchip(inst, dst=dst, src=src)
    P, F = _pf(dst)
    if values is None:
        with np.errstate(all="ignore"):
            if op is nl.invert:
                _copy_raw(dst, np.invert(src._data))
                values = None
            else:
                values = _VEC_UNARY[op](_f32(src))
    if values is not None:
        _write(dst, np.asarray(values, dtype=np.float32))
    params = ("simple", F, 1, 1) if n_inputs == 1 else ("tt", F, False, 1)
    _rt.current().record("vector", inst.split(".")[-1], params,
                         (src,) + tuple(t for t in extra_reads), (dst,))


from .isa_vector import *  # noqa: E402,F401,F403  (the instructions of isa_vector.py are part of nki.isa)
from .isa_mx import *  # noqa: E402,F401,F403  (and the MX instructions of isa_mx.py)

#: instructions of the 0.3.0 reference the emulator does not implement, and why (docs/emulator.md)
NOT_EMULATED = {
    "register_alloc": "engine registers drive dynamic control flow, which the emulator does not run",
    "register_load": "engine registers drive dynamic control flow, which the emulator does not run",
    "register_store": "engine registers drive dynamic control flow, which the emulator does not run",
    "register_move": "engine registers drive dynamic control flow, which the emulator does not run",
    "dropout": "needs the hardware random-number state (bit-exact streams are not documented)",
    "rng": "random-number state of the engines: bit-exact streams are not documented",
    "rand2": "random-number state of the engines: bit-exact streams are not documented",
    "rand_get_state": "random-number state of the engines: bit-exact streams are not documented",
    "rand_set_state": "random-number state of the engines: bit-exact streams are not documented",
    "set_rng_seed": "random-number state of the engines: bit-exact streams are not documented",
    "sendrecv": "collective communication between NeuronCores: one core is emulated",
    "core_barrier": "synchronisation between NeuronCores: one core is emulated",
}
_NOT_EMULATED = set(NOT_EMULATED) | {"tensor_copy_dynamic_src", "tensor_copy_dynamic_dst", "iota_dynamic"}


def __getattr__(name):
    if name in _NOT_EMULATED:
        def _missing(*a, **k):
            raise NkiUnsupportedError(f"nisa.{name} exists in NKI 0.3.0 but is not implemented by the emulator: "
                                      f"{NOT_EMULATED.get(name, 'not in the 0.3.0 reference')}")
        return _missing
    raise AttributeError(f"module 'nki.isa' (emulated) has no attribute {name!r}")
