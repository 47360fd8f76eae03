"""``nki.language`` (NKI 0.3.0) for the emulator: tensors, buffers, dtypes, iterators, tile sizes and the
(experimental in 0.3.0) ``nl.*`` compute wrappers, which are built on :mod:`.isa` instructions so they
are charged to engines like real instructions. Wrapper results are new SBUF tiles (``nl.copy`` keeps the
input's buffer; ``nl.matmul``/``nl.transpose`` return PSUM tiles).
"""

from __future__ import annotations

import builtins
from math import prod as _mprod

import numpy as np

from . import dtypes as _dt
from . import runtime as _rt
from .errors import NkiRemovedAPIError, NkiRuleError, NkiUnsupportedError
from .tensor import (DynSlice, MemoryRegion, NkiTensor, allocate as _allocate, ds,  # noqa: F401
                     PSUM as _PSUM, SBUF as _SBUF, SHARED_HBM as _SHARED_HBM, HBM_REGIONS as _HBM)

# ---------------------------------------------------------------------------------------------------
# buffers and dtypes
sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm
hbm = private_hbm

uint8 = _dt.uint8
int8 = _dt.int8
uint16 = _dt.uint16
int16 = _dt.int16
uint32 = _dt.uint32
int32 = _dt.int32
float16 = _dt.float16
float32 = _dt.float32
bfloat16 = _dt.bfloat16
tfloat32 = _dt.tfloat32
float8_e4m3 = _dt.float8_e4m3
float8_e4m3fn = _dt.float8_e4m3fn
float8_e5m2 = _dt.float8_e5m2
bool_ = _dt.bool_
float8_e4m3fn_x4 = _dt.float8_e4m3fn_x4
float8_e5m2_x4 = _dt.float8_e5m2_x4
float4_e2m1fn_x4 = _dt.float4_e2m1fn_x4


def is_psum(buffer) -> bool:
    return buffer is psum


def is_sbuf(buffer) -> bool:
    return buffer is sbuf


def is_hbm(buffer) -> bool:
    return buffer in _HBM


def is_on_chip(buffer) -> bool:
    return buffer is sbuf or buffer is psum


class NKIObject:
    """Base class for user classes used inside kernels (required by the real compiler)."""


# ---------------------------------------------------------------------------------------------------
# tile sizes (plain ints; total_available_sbuf_size follows the active target)
class _TileSize:
    pmax = 128
    psum_fmax = 512
    gemm_stationary_fmax = 128
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1

    @property
    def gemm_moving_fmax(self) -> int:
        return 512

    @property
    def total_available_sbuf_size(self) -> int:
        return _rt.current().target.sbuf_usable_bytes

    def __repr__(self):
        return "nl.tile_size"


tile_size = _TileSize()

# ---------------------------------------------------------------------------------------------------
# iterators (all unrolled in Python, like the compiler's static unrolling)


def static_range(start, stop=None, step=1):
    return range(start, stop, step) if stop is not None else range(start)


def affine_range(start, stop=None, step=1):
    """Deprecated in 0.3.0 (prefer ``static_range``); iterations must be independent on hardware."""
    return range(start, stop, step) if stop is not None else range(start)


def sequential_range(start, stop=None, step=1):
    """Deprecated in 0.3.0 (prefer ``static_range``)."""
    return range(start, stop, step) if stop is not None else range(start)


def dynamic_range(start, stop=None, step=1):
    return range(int(start), int(stop), int(step)) if stop is not None else range(int(start))


class no_reorder:
    """Context manager; the emulator always executes in program order."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---------------------------------------------------------------------------------------------------
# SPMD / LNC


def program_id(axis=0):
    if axis != 0:
        raise NkiRuleError("lnc.axis", "nl.program_id", "NKI 0.3.0 grids have one axis (axis=0)")
    return _rt.current().program_id


def num_programs(axes=0):
    if axes not in (0, None):
        raise NkiRuleError("lnc.axis", "nl.num_programs", "NKI 0.3.0 grids have one axis (axes=0)")
    return _rt.current().num_programs


def program_ndim():
    return 1 if _rt.current().num_programs > 1 else 0


def device_print(prefix, tensor):
    print(prefix, tensor._np() if isinstance(tensor, NkiTensor) else tensor)


# ---------------------------------------------------------------------------------------------------
# creation


def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    """Uninitialised tensor (the emulator fills it with NaN / 4 so unwritten reads show up)."""
    return _allocate(shape, dtype, buffer, name, address, "nl.ndarray")


def _filled(shape, value, dtype, buffer, name, inst):
    if buffer is sbuf or buffer is psum:
        t = _allocate(shape, dtype, buffer, name, None, inst)
        nisa.memset(t, value)
        return t
    return _allocate(shape, dtype, buffer, name, None, inst, fill=value)


def zeros(shape, dtype, buffer=sbuf, name=""):
    d = _dt.normalize(dtype, "nl.zeros")
    return _filled(shape, 0 if _dt.is_int(d) else 0.0, d, buffer, name, "nl.zeros")


def ones(shape, dtype, buffer=sbuf, name=""):
    d = _dt.normalize(dtype, "nl.ones")
    return _filled(shape, 1 if _dt.is_int(d) else 1.0, d, buffer, name, "nl.ones")


def full(shape, fill_value, dtype, buffer=sbuf, name=""):
    return _filled(shape, fill_value, _dt.normalize(dtype, "nl.full"), buffer, name, "nl.full")


def zeros_like(x, dtype=None, buffer=None, name=""):
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def empty_like(x, dtype=None, buffer=None, name=""):
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def shared_constant(constant):
    arr = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    return _allocate(arr.shape, arr.dtype, shared_hbm, "constant", None, "nl.shared_constant", fill=arr)


def shared_identity_matrix(n, dtype="uint8", dst=None):
    eye = np.eye(n)
    if dst is not None:
        dst._data[...] = eye
        return dst
    return _allocate((n, n), dtype, shared_hbm, "identity", None, "nl.shared_identity_matrix", fill=eye)


# ---------------------------------------------------------------------------------------------------
# type promotion (NKI type-promotion rules; Python scalars count as uint8/int32/float32)


def _scalar_dtype(v):
    if isinstance(v, (bool, np.bool_)):
        return uint8
    if isinstance(v, (int, np.integer)):
        return np.dtype(v.dtype) if isinstance(v, np.integer) else int32
    if isinstance(v, np.floating):
        return _dt.normalize(v.dtype)
    return float32


def _promote(a, b):
    if a == b:
        return a
    fa, fb = _dt.is_float(a), _dt.is_float(b)
    if fa and not fb:
        return a
    if fb and not fa:
        return b
    if fa and fb:
        pair = {_dt.name(a), _dt.name(b)}
        if pair == {"float16", "bfloat16"}:
            return float32
        if pair <= {"float8_e4m3", "float8_e5m2", "float8_e4m3fn"}:
            return bfloat16
        return a if a.itemsize >= b.itemsize else b
    # int, int
    if {a, b} == {int32, uint32}:
        return float32
    sa, sb = a.kind == "i", b.kind == "i"
    if sa == sb:
        return a if a.itemsize >= b.itemsize else b
    s, u = (a, b) if sa else (b, a)
    if s.itemsize > u.itemsize:
        return s
    return {1: int16, 2: int32}.get(u.itemsize, float32)


def _dtype_of(x):
    return x.dtype if isinstance(x, NkiTensor) else _scalar_dtype(x)


def _out(shape, dtype, inst, buffer=sbuf):
    return _allocate(shape, dtype, buffer, "", None, inst)


# ---------------------------------------------------------------------------------------------------
# element-wise binary ops: ALU operators for nisa.* (op=nl.add) and nl.* wrappers


def _named(fn, name: str, what: str):
    """Give an operator function its NKI name: kernels pass these functions as ``op=`` identities."""
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``nl.{name}``: {what}."
    return fn


def _operator(name: str, arity: int, apply, what: str):
    """``nl.<name>``: ``op(x, y, dtype=None)`` (arity 2) or ``op(x, dtype=None)`` running ``apply``."""
    if arity == 2:
        def op(x, y, dtype=None):
            return apply(op, x, y, dtype, f"nl.{name}")
    else:
        def op(x, dtype=None):
            return apply(op, x, dtype, f"nl.{name}")
    return _named(op, name, what)


def _binary_op(name: str):
    return _operator(name, 2, _binary, "element-wise binary operator (VectorE), also an ALU operator for nisa")


def _binary(opfunc, x, y, dtype, inst):
    xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
    if not xt and not yt:
        raise NkiUnsupportedError(f"{inst}: scalar-scalar arithmetic belongs to plain Python")
    d = _dt.normalize(dtype, inst) if dtype is not None else _promote(_dtype_of(x), _dtype_of(y))
    if xt and yt:
        if x.shape != y.shape:
            raise NkiRuleError("nl.broadcast", inst,
                               "nl.* element-wise ops do not broadcast between different shapes",
                               {"x": x.shape, "y": y.shape})
        out = _out(x.shape, d, inst)
        nisa.tensor_tensor(out, x, y, opfunc)
        return out
    tile, s, rev = (x, y, False) if xt else (y, x, True)
    out = _out(tile.shape, d, inst)
    nisa.tensor_scalar(out, tile, opfunc, float(s) if not isinstance(s, NkiTensor) else s, reverse0=rev)
    return out


(add, subtract, multiply, maximum, minimum, power, equal, not_equal, greater, greater_equal, less, less_equal,
 logical_and, logical_or, logical_xor, bitwise_and, bitwise_or, bitwise_xor, left_shift, right_shift) = map(_binary_op, (
    "add", "subtract", "multiply", "maximum", "minimum", "power", "equal", "not_equal", "greater",
    "greater_equal", "less", "less_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and",
    "bitwise_or", "bitwise_xor", "left_shift", "right_shift"))





















def fmod(x, y, dtype=None):
    """Works in simulation only (fails on hardware, per the 0.3.0 release notes)."""
    return _binary(fmod, x, y, dtype, "nl.fmod")


def mod(x, y, dtype=None):
    """Works in simulation only (fails on hardware, per the 0.3.0 release notes)."""
    return _binary(mod, x, y, dtype, "nl.mod")


def divide(x, y, dtype=None):
    """Not supported in NKI 0.3.0: there is no divide instruction."""
    raise NkiRemovedAPIError(
        "removed_api.divide", "nl.divide",
        "division is not available as a hardware instruction in NKI 0.3.0; "
        "use nl.multiply(x, nl.reciprocal(y))",
        {k: v.shape for k, v in (("x", x), ("y", y)) if isinstance(v, NkiTensor)})


# ---------------------------------------------------------------------------------------------------
# element-wise unary ops: activation functions (ScalarE) and VectorE helpers


def _unary_act(opfunc, x, dtype, inst):
    d = _dt.normalize(dtype, inst) if dtype is not None else (x.dtype if _dt.is_float(x.dtype) else float32)
    out = _out(x.shape, d, inst)
    nisa.activation(out, opfunc, x)
    return out


def _unary_vec(opfunc, x, dtype, inst):
    d = _dt.normalize(dtype, inst) if dtype is not None else x.dtype
    out = _out(x.shape, d, inst)
    nisa._vector_unary(out, x, opfunc, inst)
    return out


def _activation_op(name: str):
    return _operator(name, 1, _unary_act, "element-wise activation function (ScalarE)")


def _vector_op(name: str):
    return _operator(name, 1, _unary_vec, "element-wise unary operator (VectorE)")


def copy(x, dtype=None):
    """ScalarE ``activation(op=copy)``; the result is on the same buffer as ``x``."""
    d = _dt.normalize(dtype, "nl.copy") if dtype is not None else x.dtype
    out = _out(x.shape, d, "nl.copy", buffer=x.buffer)
    nisa.activation(out, copy, x)
    return out


(exp, log, sqrt, rsqrt, reciprocal, square, tanh, sigmoid, relu, gelu, gelu_apprx_tanh, silu, softplus, mish,
 erf, sin, cos, tan, arctan, sign, abs) = map(_activation_op, (
    "exp", "log", "sqrt", "rsqrt", "reciprocal", "square", "tanh", "sigmoid", "relu", "gelu",
    "gelu_apprx_tanh", "silu", "softplus", "mish", "erf", "sin", "cos", "tan", "arctan", "sign", "abs"))  # noqa: A001 - NKI names (abs)






















(negative, ceil, floor, trunc, invert, logical_not) = map(_vector_op, (
    "negative", "ceil", "floor", "trunc", "invert", "logical_not"))






# ---------------------------------------------------------------------------------------------------
# reductions (VectorE tensor_reduce over free axes)


def _axes(x, axis):
    ax = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    return [int(a) % len(x.shape) for a in ax]


def _reduce(opfunc, x, axis, dtype, keepdims, inst):
    ax = _axes(x, axis)
    shape = tuple(1 if i in ax else s for i, s in enumerate(x.shape)) if keepdims else \
        tuple(s for i, s in enumerate(x.shape) if i not in ax)
    if len(shape) == 1:
        shape = (shape[0], 1) if not keepdims else shape
    d = _dt.normalize(dtype, inst) if dtype is not None else x.dtype
    out = _out(shape, d, inst)
    nisa.tensor_reduce(out, opfunc, x, ax, keepdims=keepdims)
    return out


def sum(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce(add, x, axis, dtype, keepdims, "nl.sum")


def max(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce(maximum, x, axis, dtype, keepdims, "nl.max")


def min(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce(minimum, x, axis, dtype, keepdims, "nl.min")


def prod(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce(multiply, x, axis, dtype, keepdims, "nl.prod")


def all(x, axis, dtype=None, keepdims=False):  # noqa: A001
    return _reduce(logical_and, x, axis, dtype, keepdims, "nl.all")


def mean(x, axis, dtype=None, keepdims=False):
    s = _reduce(add, x, axis, float32, keepdims, "nl.mean")
    n = builtins.max(1, x.size // s.size)
    d = _dt.normalize(dtype, "nl.mean") if dtype is not None else x.dtype
    out = _out(s.shape, d, "nl.mean")
    nisa.tensor_scalar(out, s, multiply, 1.0 / n)
    return out


def var(x, axis, dtype=None, keepdims=False):
    m = mean(x, axis, dtype=float32, keepdims=True)
    ax = _axes(x, axis)
    xf = _out(x.shape, float32, "nl.var")
    mb = m._data.reshape(m.shape)
    # centre on VectorE: x - mean (charged as tensor_scalar per partition row when mean is (P,1))
    if m.size == x.shape[0]:
        nisa.tensor_scalar(xf, x, subtract, m.reshape((x.shape[0], 1)))
    else:
        nisa._vector_unary(xf, x, None, "nl.var", values=x._data.astype(np.float32) - mb)
    sq = _out(x.shape, float32, "nl.var")
    nisa.tensor_tensor(sq, xf, xf, multiply)
    return mean(sq, ax, dtype=dtype or x.dtype, keepdims=keepdims)


# ---------------------------------------------------------------------------------------------------
# tensor ops (experimental in 0.3.0)


def load(src, dtype=None):
    """HBM -> a new SBUF tile (``nisa.dma_copy``)."""
    if not isinstance(src, NkiTensor) or src.buffer not in _HBM:
        raise NkiRuleError("nl.load.source", "nl.load", "nl.load reads an HBM tensor",
                           {"src": getattr(src, "shape", ())})
    out = _out(src.shape, _dt.normalize(dtype, "nl.load") if dtype is not None else src.dtype, "nl.load")
    nisa.dma_copy(out, src)
    return out


def store(dst, value):
    """SBUF tile -> HBM (``nisa.dma_copy``); PSUM values must be copied to SBUF first."""
    nisa.dma_copy(dst, value)


def matmul(x, y, transpose_x=False):
    """``x @ y`` (``x.T @ y`` with ``transpose_x=True``, the only form that works on hardware)."""
    if not transpose_x:
        xt_ps = transpose(x)
        xt = _out(xt_ps.shape, x.dtype, "nl.matmul")
        nisa.tensor_copy(xt, xt_ps)
        x = xt
    out = _out((x.shape[1], y.shape[1]), float32, "nl.matmul", buffer=psum)
    nisa.nc_matmul(out, x, y)
    return out


def transpose(x, dtype=None):
    """2-D partition<->free transpose on TensorE; the result is a PSUM tile."""
    if len(x.shape) != 2:
        raise NkiRuleError("nl.transpose.rank", "nl.transpose", "nl.transpose takes a 2-D tile", {"x": x.shape})
    out = _out((x.shape[1], x.shape[0]), x.dtype, "nl.transpose", buffer=psum)
    nisa.nc_transpose(out, x, engine=nisa.engine.tensor)
    if dtype is not None and _dt.normalize(dtype) != x.dtype:
        o2 = _out(out.shape, dtype, "nl.transpose")
        nisa.tensor_copy(o2, out)
        return o2
    return out


def where(condition, x, y, dtype=None):
    """Element-wise select (condition 1.0/0.0); VectorE, same shapes."""
    for t in (x, y):
        if isinstance(t, NkiTensor) and t.shape != condition.shape:
            raise NkiRuleError("nl.broadcast", "nl.where", "nl.where does not broadcast",
                               {"condition": condition.shape, "x": getattr(x, "shape", ()), "y": getattr(y, "shape", ())})
    d = _dt.normalize(dtype) if dtype is not None else _promote(_dtype_of(x), _dtype_of(y))
    out = _out(condition.shape, d, "nl.where")
    c = condition._data.astype(np.float32) != 0
    xv = x._data.astype(np.float32) if isinstance(x, NkiTensor) else np.float32(x)
    yv = y._data.astype(np.float32) if isinstance(y, NkiTensor) else np.float32(y)
    nisa._vector_unary(out, condition, None, "nl.where", values=np.where(c, xv, yv), n_inputs=3,
                       extra_reads=[t for t in (x, y) if isinstance(t, NkiTensor)])
    return out


def broadcast_to(x, shape, dtype=None):
    """Broadcast size-1 dims. Free dims: a VectorE copy. The partition dim: "NKI invokes such matmul under
    the hood" (nki/guides/architecture/trainium_inferentia2_arch.rst, partition broadcast) — a TensorE
    ones-matmul per 512 columns into PSUM; a result that fits one PSUM bank stays there (a VectorE
    operand read from PSUM), a wider one is copied to SBUF by the VectorE."""
    shape = tuple(shape)
    if len(shape) != len(x.shape):
        raise NkiRuleError("nl.broadcast_to.rank", "nl.broadcast_to", "same rank required",
                           {"x": x.shape, "shape": shape})
    d = _dt.normalize(dtype) if dtype is not None else x.dtype
    vals = np.broadcast_to(x._data.astype(np.float32), shape)
    F = _mprod(shape[1:])
    if shape[0] != x.shape[0] and F * 4 <= 2048 and d == float32:   # fp32 in one PSUM bank (2 KiB/partition)
        out = _out(shape, float32, "nl.broadcast_to", buffer=psum)
        nisa._write(out, vals)
        _rt.current().record("tensor", "nc_matmul", ("mm", 1, shape[0], F, False, True), (x,),
                             (out,))
        return out
    out = _out(shape, d, "nl.broadcast_to")
    if shape[0] != x.shape[0]:
        L = _rt.current()
        for f0 in range(0, F, 512):
            L.record("tensor", "nc_matmul", ("mm", 1, shape[0], builtins.min(F - f0, 512), False, True),
                     (x,), (out,))
    nisa._vector_unary(out, x, None, "nl.broadcast_to", values=vals)
    return out


def expand_dims(x, axis):
    shape = list(x.shape)
    shape.insert(axis if axis >= 0 else len(shape) + axis + 1, 1)
    return x.reshape(tuple(shape))


_NOT_EMULATED = {"softmax", "rms_norm", "gather_flattened", "rand", "random_seed", "load_transpose2d",
                 "dropout", "abs_max", "abs_min"}


def __getattr__(name):
    if name in _NOT_EMULATED:
        def _missing(*a, **k):
            raise NkiUnsupportedError(f"nl.{name} exists in NKI 0.3.0 but is not implemented by the emulator")
        return _missing
    raise AttributeError(f"module 'nki.language' (emulated) has no attribute {name!r}")


from . import isa as nisa  # noqa: E402  (late import: isa needs the op functions above)
