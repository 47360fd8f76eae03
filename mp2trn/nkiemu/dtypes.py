"""NKI data types mapped onto NumPy / ml_dtypes storage types.

``nl.bfloat16`` etc. are NumPy dtype objects (``np.dtype(ml_dtypes.bfloat16)``), so they compare equal
to the strings the real stubs use (``nl.bfloat16 == "bfloat16"``) and to ``tensor.dtype``. Low precision
types are stored *precisely* (the equivalent of the official simulator's ``NKI_PRECISE_FP=1``).
``tfloat32`` has no NumPy type: it is a marker stored as float32 and rounded to 10 mantissa bits (RNE)
whenever an engine writes it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .errors import NkiRuleError


class _TF32:
    """Marker dtype for tfloat32 (1 sign, 8 exponent, 10 mantissa bits; stored in 4 bytes)."""

    name = "tfloat32"
    itemsize = 4
    kind = "f"

    def __eq__(self, other):
        return other is self or other == "tfloat32"

    def __hash__(self):
        return hash("tfloat32")

    def __repr__(self):
        return "tfloat32"

    __str__ = __repr__


class _Packed:
    """A 4-packed MX data type of NeuronCore-v4 (``float8_e4m3fn_x4``, ``float8_e5m2_x4``, ``float4_e2m1fn_x4``).

    One element holds four ``lane`` values (nki/api/nki/language: "4x packed ... elements"); it is stored as
    an unsigned integer of ``itemsize`` bytes, lane q in bits [q·b, (q+1)·b) with b = 8 (fp8) or 4 (fp4) —
    the packing of the MXFP deep dive's host utilities (nki/deep-dives/src/mxfp-matmul/mx_cpu_utils.py).
    Only DMA, ``.view``, ``nisa.quantize_mx`` (writes) and ``nisa.nc_matmul_mx`` (reads) touch them.
    """

    kind = "V"

    def __init__(self, name: str, lane, bits: int):
        self.name, self.lane, self.bits = name, np.dtype(lane), bits
        self.storage = np.dtype(np.uint32 if bits == 8 else np.uint16)
        self.itemsize = self.storage.itemsize

    def __eq__(self, other):
        return other is self or other == self.name

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return self.name

    __str__ = __repr__


uint8 = np.dtype(np.uint8)
int8 = np.dtype(np.int8)
uint16 = np.dtype(np.uint16)
int16 = np.dtype(np.int16)
uint32 = np.dtype(np.uint32)
int32 = np.dtype(np.int32)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
bool_ = np.dtype(np.bool_)
tfloat32 = _TF32()
float8_e4m3fn_x4 = _Packed("float8_e4m3fn_x4", ml_dtypes.float8_e4m3fn, 8)
float8_e5m2_x4 = _Packed("float8_e5m2_x4", ml_dtypes.float8_e5m2, 8)
float4_e2m1fn_x4 = _Packed("float4_e2m1fn_x4", ml_dtypes.float4_e2m1fn, 4)
PACKED = (float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4)

_BY_NAME = {
    "uint8": uint8, "int8": int8, "uint16": uint16, "int16": int16, "uint32": uint32, "int32": int32,
    "float16": float16, "float32": float32, "bfloat16": bfloat16, "float8_e4m3": float8_e4m3,
    "float8_e4m3fn": float8_e4m3fn, "float8_e5m2": float8_e5m2, "bool": bool_, "bool_": bool_,
    "tfloat32": tfloat32, "fp32": float32, "bf16": bfloat16, "fp16": float16,
    **{p.name: p for p in PACKED},
}
SUPPORTED = frozenset(v for v in _BY_NAME.values() if isinstance(v, np.dtype))
_cache: dict = {}


def normalize(dt, where: str = "dtype"):
    """Any dtype spelling (NumPy dtype/type, ml_dtypes type, NKI name string) -> canonical dtype."""
    try:
        return _cache[dt]
    except (KeyError, TypeError):
        pass
    if isinstance(dt, (_TF32, _Packed)):
        return dt
    if isinstance(dt, str):
        if dt not in _BY_NAME:
            raise NkiRuleError("dtype.unsupported", where, f"unknown dtype {dt!r}")
        out = _BY_NAME[dt]
    else:
        try:
            out = np.dtype(dt)
        except TypeError:
            raise NkiRuleError("dtype.unsupported", where, f"unknown dtype {dt!r}") from None
        if out not in SUPPORTED:
            raise NkiRuleError(
                "dtype.unsupported", where,
                f"dtype {out} is not a Trainium dtype (use float32, bfloat16, float16, float8, int8..int32)")
    try:
        _cache[dt] = out
    except TypeError:
        pass
    return out


def storage(dt) -> np.dtype:
    """NumPy dtype that stores values of ``dt``."""
    if isinstance(dt, _Packed):
        return dt.storage
    return float32 if dt is tfloat32 else dt


def is_packed(dt) -> bool:
    """A 4-packed MX type."""
    return isinstance(dt, _Packed)


def unpack_x4(bits: np.ndarray, dt: _Packed) -> np.ndarray:
    """(..., F) packed elements → (..., F, 4) float32 lane values."""
    b = np.asarray(bits, dtype=dt.storage)
    mask = (1 << dt.bits) - 1
    lanes = np.stack([(b >> (q * dt.bits)) & mask for q in range(4)], axis=-1).astype(np.uint8)
    return lanes.view(dt.lane).astype(np.float32)


def pack_x4(values: np.ndarray, dt: _Packed) -> np.ndarray:
    """(..., F, 4) values (already in the lane type's range) → (..., F) packed elements (RNE cast per lane)."""
    lanes = np.asarray(values, dtype=np.float32).astype(dt.lane).view(np.uint8).astype(dt.storage)
    mask = (1 << dt.bits) - 1
    out = np.zeros(lanes.shape[:-1], dtype=dt.storage)
    for q in range(4):
        out |= (lanes[..., q] & mask) << (q * dt.bits)
    return out


def itemsize(dt) -> int:
    return dt.itemsize


def is_float(dt) -> bool:
    return dt is tfloat32 or dt.kind == "f" or dt in (bfloat16, float8_e4m3, float8_e4m3fn, float8_e5m2)


def is_int(dt) -> bool:
    return dt is not tfloat32 and dt.kind in "iub"


def is_fp32_class(dt) -> bool:
    """float32 or tfloat32 (nc_matmul pairs them only with each other)."""
    return dt is tfloat32 or dt == float32


def is_16bit_float(dt) -> bool:
    return dt is bfloat16 or dt is float16 or dt == bfloat16 or dt == float16


def name(dt) -> str:
    return "tfloat32" if dt is tfloat32 else str(dt)


def round_tf32(a: np.ndarray) -> np.ndarray:
    """Round float32 values to tfloat32 precision (RNE on the 13 dropped mantissa bits)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    bits = a.view(np.uint32)
    lsb = (bits >> 13) & 1
    out = ((bits + 0x0FFF + lsb) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(a), out, a)


def fill_value(dt):
    """Sentinel for fresh allocations (nki/guides/nki_simulator.rst, Neuron 2.29): NaN for floats, 4 for integers
    (packed MX data: all bits set — NaN lanes in fp8, −6 in fp4)."""
    if isinstance(dt, _Packed):
        return np.iinfo(dt.storage).max
    return 4 if is_int(dt) else np.nan
