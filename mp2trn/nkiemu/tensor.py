"""NkiTensor: an HBM/SBUF/PSUM tensor (or a view of one) backed by a NumPy array.

Views (integer/slice/``nl.ds`` indexing, ``.reshape``, ``.ap``, ``.view``) are NumPy views of the same
storage, so engine writes through a view land in the base tensor. Dim 0 of an SBUF/PSUM tensor is the
partition dimension.
"""

from __future__ import annotations

import enum
import numbers
import operator
from math import prod

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import dtypes as _dt
from .errors import NkiRuleError, NkiUnsupportedError, NkiRemovedAPIError
from .memory import Allocation
from . import runtime as _rt

__all__ = ["MemoryRegion", "NkiTensor", "DynSlice", "ds", "allocate", "wrap_input"]


class MemoryRegion(enum.Enum):
    """Where a tensor lives (``nl.sbuf``, ``nl.psum``, ``nl.private_hbm`` (= ``nl.hbm``), ``nl.shared_hbm``)."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __repr__(self):
        return f"nl.{self.value}"


SBUF = MemoryRegion.sbuf
PSUM = MemoryRegion.psum
PRIVATE_HBM = MemoryRegion.private_hbm
SHARED_HBM = MemoryRegion.shared_hbm
HBM_REGIONS = (PRIVATE_HBM, SHARED_HBM)
ONCHIP = (SBUF, PSUM)


class DynSlice:
    """``nl.ds(start, size)`` == ``start:start+size`` (optional ``step``)."""

    __slots__ = ("start", "size", "step")

    def __init__(self, start, size, step=1):
        self.start, self.size, self.step = int(start), int(size), int(step)

    def __repr__(self):
        return f"ds({self.start}, {self.size})"


def ds(start, size, step=1):
    return DynSlice(start, size, step)


def _oob(t, detail):
    raise NkiRuleError("index.out_of_bounds", "indexing", detail, {"tensor": t.shape})


class NkiTensor:
    """A tensor in HBM, SBUF or PSUM. ``shape``, ``dtype``, ``buffer``, ``name`` as in NKI."""

    __slots__ = ("_data", "shape", "dtype", "buffer", "_alloc", "name", "__weakref__")

    def __init__(self, data: np.ndarray, dtype, buffer: MemoryRegion, alloc: Allocation, name=""):
        self._data = data
        self.shape = data.shape
        self.dtype = dtype
        self.buffer = buffer
        self._alloc = alloc
        self.name = name

    # -- metadata -----------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def offset(self) -> int:
        """Element offset of this view from the start of its base tensor."""
        return (self._data.__array_interface__["data"][0]
                - self._alloc.base.__array_interface__["data"][0]) // self._data.itemsize

    @property
    def partition_start(self) -> int:
        """First partition this view touches (on-chip tensors; 0 for HBM)."""
        base = self._alloc.base
        if self.buffer not in ONCHIP or not base.shape or base.strides[0] == 0:
            return 0
        return self.offset * self._data.itemsize // base.strides[0]

    @property
    def partition_step(self) -> int:
        """Partitions between consecutive rows of this view (1 = contiguous)."""
        base = self._alloc.base
        if self.buffer not in ONCHIP or not self.shape or not base.shape or base.strides[0] == 0:
            return 1
        return self._data.strides[0] // base.strides[0] if self.shape[0] > 1 else 1

    def get_pattern(self):
        """Access pattern ``[[step, num], ...]`` (in elements) of this view."""
        isz = self._data.itemsize
        return [[s // isz, n] for s, n in zip(self._data.strides, self.shape)]

    def __repr__(self):
        return (f"NkiTensor(shape={self.shape}, dtype={_dt.name(self.dtype)}, "
                f"buffer={self.buffer.value}{', name=' + repr(self.name) if self.name else ''})")

    def __len__(self):
        return self.shape[0]

    def __bool__(self):
        raise TypeError("the truth value of an NkiTensor is not defined at trace time")

    def __iter__(self):
        raise TypeError("NkiTensor is not iterable; index it with slices or nl.ds")

    # -- views --------------------------------------------------------------------------------------
    def _view(self, data, dtype=None):
        return NkiTensor(data, self.dtype if dtype is None else dtype, self.buffer, self._alloc, self.name)

    def __getitem__(self, key):
        if type(key) is not tuple:
            key = (key,)
        shape = self.shape
        nd = len(shape)
        n_ell = sum(1 for k in key if k is Ellipsis)
        if n_ell > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if n_ell:
            i = next(j for j, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (nd - len(key) + 1) + key[i + 1:]
        if len(key) > nd:
            raise IndexError(f"too many indices ({len(key)}) for tensor of shape {shape}")
        idx = []
        for d, k in enumerate(key):
            n = shape[d]
            if type(k) is slice:
                start, stop, step = k.start, k.stop, k.step
                step = 1 if step is None else operator.index(step)
                if step <= 0:
                    raise NkiUnsupportedError("negative or zero slice steps are not supported")
                start = 0 if start is None else operator.index(start)
                stop = n if stop is None else operator.index(stop)
                if start < 0:
                    start += n
                if stop < 0:
                    stop += n
                if start < 0 or stop > n or start > stop:
                    _oob(self, f"slice {start}:{stop} out of range for dim {d} of size {n}")
                idx.append(slice(start, stop, step))
            elif type(k) is DynSlice:
                stop = k.start + (k.size - 1) * k.step + 1
                if k.start < 0 or k.size < 0 or stop > n or k.step <= 0:
                    _oob(self, f"nl.ds({k.start}, {k.size}) out of range for dim {d} of size {n}")
                idx.append(slice(k.start, k.start + k.size * k.step, k.step))
            elif isinstance(k, (numbers.Integral, np.integer)):
                k = int(k)
                if k < 0:
                    k += n
                if not 0 <= k < n:
                    _oob(self, f"index {k} out of range for dim {d} of size {n}")
                idx.append(k)
            elif isinstance(k, NkiTensor):
                raise NkiUnsupportedError(
                    "tensor-valued (dynamic) indexing is not emulated; use .ap(vector_offset=...) for DMA")
            else:
                raise TypeError(f"unsupported index {k!r}")
        return self._view(self._data[tuple(idx)])

    def __setitem__(self, key, value):
        raise NkiRuleError(
            "tensor.setitem", "NkiTensor.__setitem__",
            "NKI 0.3.0 tensors are written only by instructions (dst=...); use nisa.tensor_copy, "
            "nisa.dma_copy, nisa.memset or an nl.* op writing a new tile", {"tensor": self.shape})

    def reshape(self, *shape):
        """View with a new shape (same element count, no copy). On-chip: partition dim unchanged."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(int(s) for s in shape)
        if prod(shape) != self.size:
            raise NkiRuleError("reshape.size", "reshape",
                               f"cannot reshape {self.size} elements into {shape}",
                               {"tensor": self.shape, "new": shape})
        if self.buffer in ONCHIP and shape[0] != self.shape[0]:
            raise NkiRuleError("reshape.partition", "reshape",
                               "reshape of an SBUF/PSUM tensor must keep the partition dim "
                               f"({self.shape[0]} -> {shape[0]}); reshapes across partition/free dims are illegal",
                               {"tensor": self.shape, "new": shape})
        try:
            data = np.reshape(self._data, shape, copy=False)
        except ValueError:
            raise NkiRuleError("reshape.noncontiguous", "reshape",
                               "this view cannot be reshaped without a copy", {"tensor": self.shape, "new": shape}) from None
        return self._view(data)

    def view(self, dtype):
        """Reinterpret the bits as another dtype (last dim rescaled by the item-size ratio)."""
        dt = _dt.normalize(dtype, "view")
        try:
            data = self._data.view(_dt.storage(dt))
        except ValueError as e:
            raise NkiRuleError("view.dtype", "view", str(e), {"tensor": self.shape}) from None
        return self._view(data, dt)

    def ap(self, pattern, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
        """Access-pattern view: ``pattern=[[step, num], ...]`` (outermost first, in elements);
        element ``(i0, i1, ...)`` of the view is ``flat[offset + sum(i_k * step_k)]`` of the tensor."""
        if scalar_offset is not None or vector_offset is not None:
            raise NkiUnsupportedError("indirect .ap(scalar_offset=/vector_offset=) is not emulated")
        if dtype is not None and _dt.normalize(dtype, "ap") != self.dtype:
            raise NkiUnsupportedError(".ap(dtype=...) reinterpretation is not emulated; use .view()")
        d = self._data
        if not d.flags.c_contiguous or self.offset != 0 or d.size != self._alloc.base.size:
            raise NkiRuleError("ap.indexed_tensor", "ap",
                               ".ap applies only to an unsliced nl.ndarray (nki-aps.rst), not to an indexed "
                               "view; call it on the tensor itself and fold the slice into offset= and the pattern",
                               {"tensor": self.shape})
        try:
            steps = [int(p[0]) for p in pattern]
            nums = [int(p[1]) for p in pattern]
        except (TypeError, IndexError, ValueError):
            raise NkiRuleError("ap.pattern", "ap", f"pattern must be a list of [step, num] pairs, got {pattern!r}",
                               {"tensor": self.shape}) from None
        offset = int(offset)
        lo = offset + sum(s * (n - 1) for s, n in zip(steps, nums) if s < 0)
        hi = offset + sum(s * (n - 1) for s, n in zip(steps, nums) if s > 0)
        if any(n <= 0 for n in nums) or lo < 0 or hi >= d.size:
            _oob(self, f".ap pattern {pattern} offset {offset} addresses elements outside [0, {d.size})")
        if self.buffer in ONCHIP:
            per_part = d.size // self.shape[0]
            if steps[0] != per_part and nums[0] > 1:
                raise NkiRuleError("ap.partition_step", "ap",
                                   f"the first (partition) pattern step must be the per-partition element count "
                                   f"{per_part}, got {steps[0]}", {"tensor": self.shape})
            if nums[0] > 128:
                raise NkiRuleError("partition.max", "ap", f"partition dim {nums[0]} exceeds 128",
                                   {"tensor": self.shape})
        flat = d.reshape(-1)
        isz = d.itemsize
        view = as_strided(flat[offset:], shape=tuple(nums), strides=tuple(s * isz for s in steps))
        return self._view(view)

    # -- helpers for the emulator (not NKI API) -------------------------------------------------------
    def _np(self) -> np.ndarray:
        """A copy of the contents as a NumPy array (for tests and debugging)."""
        return np.array(self._data)


def allocate(shape, dtype, buffer, name="", address=None, inst="nl.ndarray", fill=None):
    """Create a fresh tensor; NaN/4 sentinel-filled unless ``fill`` is given. Checks capacity."""
    if isinstance(buffer, str):
        raise NkiRemovedAPIError("buffer.string", inst,
                                 f"string buffer names ({buffer!r}) are rejected in NKI 0.3.0; use nl.{buffer}",
                                 {"shape": tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)})
    if not isinstance(buffer, MemoryRegion):
        raise TypeError(f"{inst}: buffer must be nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or nl.shared_hbm, got {buffer!r}")
    if isinstance(shape, (numbers.Integral, np.integer)):
        shape = (int(shape),)
    shape = tuple(int(s) for s in shape)
    dt = _dt.normalize(dtype, inst)
    if any(s <= 0 for s in shape):
        raise NkiRuleError("shape.positive", inst, "all dimensions must be positive", {"shape": shape})
    launch = _rt.current()
    if buffer is SHARED_HBM and launch.num_programs > 1:
        i = launch.shared_idx
        launch.shared_idx += 1
        if launch.program_id > 0 and i < len(launch.shared):
            prev = launch.shared[i]
            if prev.shape != shape or prev.dtype != dt:
                raise NkiRuleError("lnc.shared_hbm", inst, "programs of an LNC grid must allocate the same "
                                   "shared_hbm tensors in the same order", {"shape": shape, "program0": prev.shape})
            return prev
    if buffer in ONCHIP:
        if shape[0] > launch.target.partitions:
            raise NkiRuleError("partition.max", inst,
                               f"Size of partition dimension {shape[0]} exceeds architecture limitation of "
                               f"{launch.target.partitions}", {"shape": shape})
    fv = _dt.fill_value(dt) if fill is None else fill
    base = np.full(shape, fv, dtype=_dt.storage(dt))
    alloc = Allocation(buffer, base, name)
    if buffer is SBUF:
        launch.mem.alloc_sbuf(alloc, (base.size // shape[0]) * dt.itemsize, inst)
    elif buffer is PSUM:
        bank = None
        if address is not None:
            free = int(address[1]) if isinstance(address, (tuple, list)) else int(address)
            if free % launch.target.psum_bank_bytes:
                raise NkiRuleError("psum.address_alignment", inst,
                                   f"explicit PSUM address {address} must start at a 2 KiB bank boundary",
                                   {"shape": shape})
            bank = free // launch.target.psum_bank_bytes
        launch.mem.alloc_psum(alloc, (base.size // shape[0]) * dt.itemsize, inst, bank)
        alloc.mask = np.zeros(shape, dtype=np.bool_)
    out = NkiTensor(base, dt, buffer, alloc, name)
    if buffer is SHARED_HBM and launch.num_programs > 1 and launch.program_id == 0:
        launch.shared.append(out)
    return out


def wrap_input(arr, buffer=PRIVATE_HBM, name="input"):
    """Wrap a NumPy kernel argument as an HBM tensor (written back in place after the launch)."""
    a = np.asarray(arr)
    dt = _dt.normalize(a.dtype, "kernel argument")
    base = np.ascontiguousarray(a)
    alloc = Allocation(buffer, base, name)
    if base is not arr and isinstance(arr, np.ndarray):
        alloc.orig = arr
    return NkiTensor(base, dt, buffer, alloc, name)
