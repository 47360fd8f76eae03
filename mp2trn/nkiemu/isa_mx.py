"""Microscaling (MX) instructions of NeuronCore-v4 (trn3): ``quantize_mx`` and ``nc_matmul_mx``.

Semantics and layout follow the ISA reference pages (aws-neuron-sdk ``nki/api/nki/isa/__init__.py`` at the
2.29 release) and, where those defer to it, the MXFP deep dive (``nki/deep-dives/mxfp-matmul.rst`` and
the host utilities it documents, ``nki/deep-dives/src/mxfp-matmul/mx_cpu_utils.py``):

- A scaling group is 8 partitions × 4 consecutive free elements of the *unpacked* (interleaved) tile,
  i.e. 8 partitions × one x4 element of the packed tile: 32 values share one uint8 scale.
- The scale is a biased power-of-two exponent (bias 127): quantize_mx takes the largest float32 exponent
  in the group minus the largest exponent of the target type (e4m3fn: 8, e5m2: 15), divides by
  2^(scale − 127), saturates to the type's largest normal (OCP saturation) and rounds to the type.
- Scale rows live in the quadrant their group came from: group row i (partitions 8i..8i+7) has its scale
  on partition 32·(i // 4) + i % 4 of the scale tile. A tile of ≤ 32 partitions may use a [P/8, F]
  scale tile; more partitions need a scale tile with as many partitions as the data ("oversize required").
- nc_matmul_mx contracts over the partition axis and the four lanes of each packed element:
  dst[i, j] = Σ_k Σ_q S[k, i, q]·2^(s_k,i − 127) · M[k, j, q]·2^(m_k,j − 127).

Cost: Tensor Engine cycles as a bf16 matmul of the same [K, M] × [K, N] tile (each PE performs four
FP8/FP4 multiply-accumulates per cycle: "4x throughput compared to BF16", the deep dive); quantize_mx one
Vector Engine pass over the source elements. Both are estimates; the reference gives no cost formula.
"""

from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from . import runtime as _rt
from .errors import NkiRuleError
from .isa import PSUM, SBUF, _accumulate_psum, _bank_span, _copy_raw, _pf, _shapes, _tensors, instruction

__all__ = ["quantize_mx", "nc_matmul_mx"]

#: largest normal value and its exponent per lane type (OCP MX v1.0; as the deep dive's utilities use them)
_LANE_MAX = {"float8_e4m3fn": (448.0, 8), "float8_e5m2": (57344.0, 15), "float4_e2m1fn": (6.0, 2)}
_F32_BIAS = 127


def scale_partition(i: int) -> int:
    """Partition of the scale of group row ``i`` (data partitions 8i..8i+7) within the scale tile."""
    return 32 * (i // 4) + i % 4


def _need_gen4(inst: str, shapes: dict) -> None:
    T = _rt.current().target
    if T.gen < 4:
        raise NkiRuleError(f"{inst}.target", inst, f"{inst} is available only on NeuronCore-v4 and newer (trn3); "
                           f"the target is {T.name} ({T.core})", shapes)


def _scale_rows(inst: str, arg: str, scale, P: int, F: int, shapes: dict) -> np.ndarray:
    """Indices of the scale tile's partitions holding the P/8 group rows; checks its shape and dtype."""
    if scale.buffer is not SBUF:
        raise NkiRuleError(f"{inst}.scale_sbuf", inst, f"{arg} must be in SBUF", shapes)
    if scale.dtype != _dt.uint8:
        raise NkiRuleError(f"{inst}.scale_dtype", inst, f"{arg} must be uint8, got {_dt.name(scale.dtype)}", shapes)
    Ps, Fs = _pf(scale)
    need = P // 8 if P <= 32 else P
    if Ps < need or (P > 32 and Ps != P):
        raise NkiRuleError(f"{inst}.scale_shape", inst,
                           f"{arg} needs {'at least ' + str(need) if P <= 32 else str(P)} partitions for data of "
                           f"{P} partitions (one scale per 8 partitions, kept in the group's quadrant), got {Ps}",
                           shapes)
    if Fs < F:
        raise NkiRuleError(f"{inst}.scale_shape", inst, f"{arg} needs at least {F} elements per partition, got {Fs}",
                           shapes)
    return np.array([scale_partition(i) for i in range(P // 8)])


def _partitions(inst: str, arg: str, P: int, shapes: dict) -> None:
    if P % 32 or P > 128:
        raise NkiRuleError(f"{inst}.partition_size", inst,
                           f"{arg} partition size must be a multiple of 32, at most 128; got {P}", shapes)


@instruction(tensors=("dst", "src", "dst_scale"), onchip=("dst", "src", "dst_scale"))
def quantize_mx(dst, src, dst_scale, name=None):
    """Quantize a float16/bfloat16 SBUF tile [P, F] to MXFP8 data [P, F/4] (x4-packed) and uint8 scales."""
    inst = "quantize_mx"
    shapes = _shapes(dst=dst, src=src, dst_scale=dst_scale)
    _need_gen4(inst, shapes)
    if src.buffer is not SBUF or dst.buffer is not SBUF:
        raise NkiRuleError(f"{inst}.sbuf", inst, "src and dst must be in SBUF (src cannot be in PSUM)", shapes)
    if src.dtype not in (_dt.float16, _dt.bfloat16):
        raise NkiRuleError(f"{inst}.src_dtype", inst, f"src must be float16 or bfloat16, got {_dt.name(src.dtype)}",
                           shapes)
    if dst.dtype not in (_dt.float8_e5m2_x4, _dt.float8_e4m3fn_x4):
        raise NkiRuleError(f"{inst}.dst_dtype", inst, "dst must be float8_e5m2_x4 or float8_e4m3fn_x4 (quantize_mx "
                           f"has no FP4 output), got {_dt.name(dst.dtype)}", shapes)
    P, F = _pf(src)
    _partitions(inst, "src", P, shapes)
    if F % 4:
        raise NkiRuleError(f"{inst}.free_size", inst, f"src free size must be a multiple of 4, got {F}", shapes)
    Pd, Fd = _pf(dst)
    if (Pd, Fd) != (P, F // 4):
        raise NkiRuleError(f"{inst}.dst_shape", inst, f"dst must be [{P}, {F // 4}] (a quarter of src's free size "
                           f"in x4 elements), got {Pd}x{Fd}", shapes)
    rows = _scale_rows(inst, "dst_scale", dst_scale, P, F // 4, shapes)
    lane_max, lane_emax = _LANE_MAX[dst.dtype.lane.name]
    x = src._data.astype(np.float32).reshape(P // 8, 8, F // 4, 4)
    exp = ((x.view(np.uint32) >> 23) & 0xFF).max(axis=(1, 3)).astype(np.int32)         # (P/8, F/4)
    scale = np.clip(exp - lane_emax, 0, 255).astype(np.uint8)
    factor = np.exp2(scale.astype(np.float32) - _F32_BIAS)[:, None, :, None]
    q = np.clip(x / factor, -lane_max, lane_max).reshape(P, F // 4, 4)
    _copy_raw(dst, _dt.pack_x4(q, dst.dtype))
    sc = dst_scale._data.reshape(dst_scale.shape[0], -1)
    sc[rows, : F // 4] = scale
    dst_scale._alloc.written = True
    _rt.current().record("vector", inst, ("simple", F, 1, 1), _tensors(src), _tensors(dst, dst_scale))


def _dequantized(t, scale, rows: np.ndarray) -> np.ndarray:
    """(K, F, 4) float32 values of packed tile ``t`` times its group scales."""
    K, F = _pf(t)
    vals = _dt.unpack_x4(t._data.reshape(K, F), t.dtype)
    s = scale._data.reshape(scale.shape[0], -1)[rows, :F].astype(np.float32)              # (K/8, F)
    return vals * np.repeat(np.exp2(s - _F32_BIAS), 8, axis=0)[:, :, None]


@instruction(tensors=("dst", "stationary", "moving", "stationary_scale", "moving_scale"),
             onchip=("dst", "stationary", "moving", "stationary_scale", "moving_scale"))
def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None, tile_size=None,
                 accumulate=None, name=None):
    """``dst[M, N] (+)= Σ_k Σ_q stationary[k, M, q]·moving[k, N, q]`` with MX scales applied (Tensor Engine)."""
    inst = "nc_matmul_mx"
    shapes = _shapes(dst=dst, stationary=stationary, moving=moving)
    _need_gen4(inst, shapes)
    if stationary.buffer is not SBUF or moving.buffer is not SBUF:
        raise NkiRuleError(f"{inst}.operands_sbuf", inst, "stationary and moving must be in SBUF", shapes)
    if dst.buffer is not PSUM:
        raise NkiRuleError(f"{inst}.dst_psum", inst, f"dst must be in PSUM (is {dst.buffer.value})", shapes)
    for arg, t in (("stationary", stationary), ("moving", moving)):
        if not _dt.is_packed(t.dtype):
            raise NkiRuleError(f"{inst}.input_dtype", inst, f"{arg} must be float8_e5m2_x4, float8_e4m3fn_x4 or "
                               f"float4_e2m1fn_x4, got {_dt.name(t.dtype)}", shapes)
    if dst.dtype not in (_dt.float32, _dt.bfloat16):
        raise NkiRuleError(f"{inst}.dst_dtype", inst, f"dst must be float32 or bfloat16, got {_dt.name(dst.dtype)}",
                           shapes)
    K, M = _pf(stationary)
    Km, N = _pf(moving)
    if K != Km:
        raise NkiRuleError(f"{inst}.contraction_match", inst,
                           f"stationary and moving partition sizes differ: {K} vs {Km}", shapes)
    _partitions(inst, "stationary", K, shapes)
    if M % 2 or M > 128:
        raise NkiRuleError(f"{inst}.stationary_fmax", inst, f"stationary free size must be even and at most 128, "
                           f"got {M}", shapes)
    nmax = 512 if dst.dtype == _dt.float32 else 1024
    if N > nmax:
        raise NkiRuleError(f"{inst}.moving_fmax", inst, f"moving free size {N} exceeds {nmax} for a "
                           f"{_dt.name(dst.dtype)} dst", shapes)
    if _pf(dst) != (M, N):
        raise NkiRuleError(f"{inst}.dst_shape", inst, f"dst must hold [{M}, {N}], got {_pf(dst)}", shapes)
    b0, b1 = _bank_span(dst, _rt.current().target)
    if b0 != b1:
        raise NkiRuleError(f"{inst}.psum_bank", inst, "the matmul output must lie within one 2 KiB PSUM bank "
                           "per partition", shapes)
    _row_tiling(inst, tile_position, tile_size, K, shapes)
    if accumulate not in (None, True, False):
        raise TypeError("nc_matmul_mx: accumulate must be None, True or False")
    s = _dequantized(stationary, stationary_scale, _scale_rows(inst, "stationary_scale", stationary_scale, K, M, shapes))
    m = _dequantized(moving, moving_scale, _scale_rows(inst, "moving_scale", moving_scale, K, N, shapes))
    _accumulate_psum(dst, np.einsum("kiq,kjq->ij", s, m), accumulate)
    _rt.current().record("tensor", inst, ("mmx", K, M, N),
                         _tensors(stationary, moving, stationary_scale, moving_scale), _tensors(dst))


def _row_tiling(inst: str, tile_position, tile_size, K: int, shapes: dict) -> None:
    """Row tiling only: tile_size (rows, 128) with rows 32/64/128, tile_position (start_row, 0)."""
    if tile_position is None and tile_size is None:
        return
    if tile_position is None or tile_size is None:
        raise NkiRuleError(f"{inst}.tiling", inst, "tile_position and tile_size must be given together", shapes)
    rows, cols = (int(v) for v in tile_size)
    start, col0 = (int(v) for v in tile_position)
    if cols != 128 or col0 != 0 or rows not in (32, 64, 128) or start % rows or start + rows > 128:
        raise NkiRuleError(f"{inst}.tiling", inst, "nc_matmul_mx tiles rows only: tile_size (32, 64 or 128, 128), "
                           f"tile_position (a multiple of the row size, 0); got {tile_size} at {tile_position}",
                           shapes)
    if K > rows:
        raise NkiRuleError(f"{inst}.tiling", inst, f"stationary's {K} partitions exceed the row tile of {rows}",
                           shapes)
