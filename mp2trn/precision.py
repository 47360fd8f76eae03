"""The precision registry: every arithmetic mode mp2trn knows, in one table.

A :class:`Precision` says how the host stores the intermediates between stages (``storage``), in which
dtype the GEMM operands are handed to a device (``compute``), how a kernel operand is split into
planes (:meth:`Precision.split_operand`) and how a kernel's output planes are combined on the host
(:meth:`Precision.combine`), plus the accuracy it must deliver against PySCF (``tolerance``, Eh of
correlation energy; rationale in docs/accuracy.md). Devices list the names they run
(``Device.supported_precisions``) and consult this table instead of comparing names.

``fp64``   everything in double precision (cpu, cuda).
``fp32``   operands rounded once to float32, fp32 accumulation; sums over pairs in fp64.
``fp32x3`` compensated (NKI devices): an fp64 operand X is split along the contraction axis into

    hi = X rounded to a power-of-two grid g constant along that axis (g = 2^(e−β), 2^e > max |X|),
         so hi/g is an integer with |hi/g| ≤ 2^β — exact in bfloat16 (β ≤ 8);
    lo = fp32(X − hi)          (|lo| ≤ g/2, 2^-β smaller than X)
    x  = fp32(X)               (moving operands only)

and a kernel accumulates hi·hi (bf16, exact) + hi·lo + lo·x (fp32) in PSUM (kernels/gemm.py). The
hi·hi partial sums stay below 2^24 grid units when K·2^(2β) ≤ 2^24: β = ⌊(24 − ⌈log2 K⌉)/2⌋.
``bf16``   registered so the table has its place (bfloat16 operands, fp32 accumulation); no device
runs it yet, and asking for it is an error naming the precisions the device has.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import InputError

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def beta_for(k: int) -> int:
    """Bits of the hi part for contraction length ``k`` (K·2^(2β) ≤ 2^24, β ≤ 8 for bfloat16)."""
    if k < 1:
        raise ValueError("contraction length must be positive")
    return int(max(1, min(8, (24 - math.ceil(math.log2(max(k, 2)))) // 2)))


def host_threads() -> int:
    """Threads for the host's elementwise work on kernel planes: ``OMP_NUM_THREADS`` when set (how the
    benchmarks pin a run to one core), else every core."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return os.cpu_count() or 1


#: arrays smaller than this many elements are split or combined on the calling thread
_THREADED_SIZE = 1 << 20


def _in_parts(shape: tuple[int, ...], skip: int, fn, most: int | None = None) -> None:
    """Call ``fn(index)`` for the parts of an array of ``shape`` cut along its longest axis other than
    ``skip``, on :func:`host_threads` threads, at most ``most`` (NumPy's ufuncs release the GIL: the parts
    run at once)."""
    threads = min(host_threads(), most or host_threads())
    axes = [a for a in range(len(shape)) if a != skip % len(shape)]
    if threads == 1 or not axes or int(np.prod(shape)) < _THREADED_SIZE:
        fn((slice(None),) * len(shape))
        return
    cut = max(axes, key=lambda a: shape[a])
    bounds = np.linspace(0, shape[cut], min(threads, shape[cut]) + 1).astype(int)
    parts = [tuple(slice(b0, b1) if a == cut else slice(None) for a in range(len(shape)))
             for b0, b1 in zip(bounds[:-1], bounds[1:]) if b1 > b0]
    with ThreadPoolExecutor(len(parts)) as pool:
        for _ in pool.map(fn, parts):
            pass


def split(x: np.ndarray, axis: int, beta: int, with_full: bool = False):
    """Split fp64 ``x`` along the contraction ``axis`` into (hi bf16, lo fp32[, x fp32]).

    hi is rounded to the grid from fp32(x) in fp32 (power-of-two scalings, exact): any point of the grid
    within about g/2 of x will do, since lo = fp32(x − hi) is taken from the fp64 x. hi/g is an integer of
    at most β ≤ 8 bits, so its fp32 bit pattern's upper half is its bfloat16 one (no rounding), cheaper than
    NumPy's bfloat16 cast of fp64. A large array is split in parts along another axis on :func:`host_threads`
    threads: the SCF's compensated builds split the whole tensor, twice, and every build's Z on the host
    (``python scripts/bench_scf_costs.py --only planes`` times that host work)."""
    from .memory import prefaulted_empty   # large planes: small pages, faulted in by every core

    x = np.asarray(x, dtype=np.float64)
    hi16 = prefaulted_empty(x.shape, BF16)                    # each plane owns its memory
    lo, x32 = prefaulted_empty(x.shape, np.float32), prefaulted_empty(x.shape, np.float32)

    def part(index: tuple) -> None:
        xs, x32s = x[index], x32[index]
        np.copyto(x32s, xs, casting="same_kind")
        m = np.max(np.abs(x32s), axis=axis, keepdims=True)
        _, e = np.frexp(np.where(m > 0, m, np.float32(1.0)))      # m = f·2^e, 0.5 ≤ f < 1  ->  2^e > m
        g = np.ldexp(np.float32(1.0), (e - beta).astype(np.int32)).astype(np.float32)
        hi = np.multiply(x32s, np.ldexp(np.float32(1.0), (beta - e).astype(np.int32)).astype(np.float32))
        np.rint(hi, out=hi)
        hi *= g
        np.subtract(xs, hi, out=lo[index], casting="same_kind")    # in fp64, rounded once to fp32
        np.right_shift(hi.view(np.uint32), 16, out=hi16[index].view(np.uint16), casting="unsafe")

    _in_parts(x.shape, axis, part)
    if with_full:
        return hi16, lo, x32
    return hi16, lo


def _unpacked_shape(x: np.ndarray, rows: int | None) -> tuple[int, ...]:
    """The shape of ``x``'s copy with ``rows`` rows: (rows, nao, nao) for packed rows (p, nao(nao+1)/2)."""
    from .packed import nao_of_pairs

    tail = (nao_of_pairs(x.shape[1]),) * 2 if x.ndim == 2 else x.shape[1:]
    return (max(rows or 0, x.shape[0]), *tail)


#: the unpacked rows' buffers of all threads together (:func:`_by_parts`): each holds at least a row
_UNPACK_BUFFERS_BYTES = 256e6


def _by_parts(x: np.ndarray, fn) -> None:
    """``fn(index, values)`` over parts of fp64 ``x`` on :func:`host_threads` threads: ``values`` is
    ``x[index]``, or for packed rows ``x`` (p, nao(nao+1)/2) rows ``index`` = (slice(r0, r1),) unpacked, a
    few at a time in a buffer of each thread's own (as many threads as keep those buffers within
    :data:`_UNPACK_BUFFERS_BYTES`); ``index`` indexes the (unpacked) copy either way."""
    if x.ndim != 2:
        _in_parts(x.shape, -1, lambda index: fn(index, x[index]))
        return
    from .packed import each_unpacked_chunk, nao_of_pairs

    def part(index: tuple) -> None:
        start, stop, _ = index[0].indices(x.shape[0])
        each_unpacked_chunk(x[start:stop], lambda r0, r1, u: fn((slice(start + r0, start + r1),), u))

    row_bytes = 8 * nao_of_pairs(x.shape[1]) ** 2
    _in_parts(x.shape, -1, part, most=max(1, int(_UNPACK_BUFFERS_BYTES // row_bytes)))


def converted_copy(x: np.ndarray, dtype) -> np.ndarray:
    """``x`` (any layout, e.g. a transposed view) as a new C-contiguous array of ``dtype``
    (``np.ascontiguousarray(x, dtype)``), in small pages faulted in by every core
    (:func:`mp2trn.memory.prefaulted_empty`) and filled in parts on :func:`host_threads` threads: NumPy's own
    conversion fills fresh huge pages from one thread, whose faults cost this VM more than the copy."""
    from .memory import prefaulted_empty

    x = np.asarray(x)
    out = prefaulted_empty(x.shape, dtype)
    _in_parts(x.shape, -1, lambda index: np.copyto(out[index], x[index], casting="same_kind"))
    return out


def fp32_copy(x: np.ndarray, rows: int | None = None) -> np.ndarray:
    """``x`` rounded to fp32 (as ``x.astype(np.float32)``), with zero rows appended along axis 0 up to
    ``rows``: the SCF tensor as an NKI device's fp32 builds keep it. Packed rows ``x`` (p, nao(nao+1)/2)
    (:mod:`mp2trn.packed`) give their unpacked copy (rows, nao, nao). New memory in small pages faulted in
    by every core (:func:`mp2trn.memory.prefaulted_empty`), filled in parts on :func:`host_threads` threads:
    NumPy's own conversion fills fresh huge pages from one thread (``python scripts/bench_scf_costs.py
    --only copy`` times both)."""
    from .memory import prefaulted_empty

    x = np.asarray(x, dtype=np.float64) if np.ndim(x) == 2 else np.asarray(x)   # PySCF unpacks fp64 rows
    out = prefaulted_empty(_unpacked_shape(x, rows), np.float32)
    out[x.shape[0]:] = 0.0
    filled = out[: x.shape[0]]
    _by_parts(x, lambda index, v: np.copyto(filled[index], v, casting="same_kind"))
    return out


def fp32_pair(x: np.ndarray, rows: int | None = None,
              hi: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """fp64 ``x`` as two fp32 arrays (fp32(x), fp32(x − fp32(x))): 48 of its 53 bits in 8 bytes per element,
    the form in which the SCF tensor goes to an NKI device that makes its compensated planes itself
    (kernels/resplit.py); zero rows appended along axis 0 up to ``rows``; in parts on :func:`host_threads`
    threads. Packed rows ``x`` (p, nao(nao+1)/2) give the pair of their unpacked (rows, nao, nao). ``hi``:
    fp32(x) already made (:func:`fp32_copy` of x with as many rows), taken as the first array: only the
    second is made."""
    from .memory import prefaulted_empty

    x = np.asarray(x, dtype=np.float64)
    shape = _unpacked_shape(x, rows)
    made_hi = hi is None
    if made_hi:
        hi = prefaulted_empty(shape, np.float32)
    elif hi.shape != shape or hi.dtype != np.float32:
        raise ValueError(f"fp32_pair: hi is {hi.dtype} {hi.shape}, not float32 {shape}")
    lo = prefaulted_empty(shape, np.float32)
    for a in (hi, lo) if made_hi else (lo,):
        a[x.shape[0]:] = 0.0
    hi_x, lo_x = hi[: x.shape[0]], lo[: x.shape[0]]

    def part(index: tuple, v: np.ndarray) -> None:
        if made_hi:
            np.copyto(hi_x[index], v, casting="same_kind")
        np.subtract(v, hi_x[index], out=lo_x[index], casting="same_kind")

    _by_parts(x, part)
    return hi, lo


def combine_planes(exact: np.ndarray, rest: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """exact + rest in fp64 (a compensated kernel's two output planes), in parts on :func:`host_threads`;
    into ``out`` (fp64, the planes' shape) when given: a buffer kept between builds is not new memory."""
    out = np.empty(np.shape(exact), np.float64) if out is None else out

    def part(index: tuple) -> None:
        np.add(exact[index], rest[index], out=out[index], dtype=np.float64)

    _in_parts(out.shape, -1 if out.ndim > 1 else 0, part)
    return out


def check_exact_hi(hi16: np.ndarray, hi: np.ndarray) -> bool:
    """True when the bf16 plane holds ``hi`` exactly (used by tests)."""
    return bool(np.array_equal(hi16.astype(np.float64), hi))


@dataclass(frozen=True)
class Precision:
    """One arithmetic mode.

    name: the label users pass (``--precision``) and results report.
    storage: dtype of (P|ia) and B on the host between stages.
    compute: dtype of GEMM operands handed to a device (fp32x3: the fp32 planes; hi is bf16).
    planes: kernel operand planes (1: a plain cast; 3: hi, lo and the full fp32 value).
    tolerance: allowed |E_corr − PySCF| in Eh (docs/accuracy.md), None when no device runs it.
    description: one line for the what-ran record.
    """

    name: str
    storage: np.dtype
    compute: np.dtype
    planes: int
    tolerance: float | None
    description: str

    @property
    def compensated(self) -> bool:
        """True when operands are split into several planes whose products are summed."""
        return self.planes > 1

    def split_operand(self, x: np.ndarray, axis: int, moving: bool) -> tuple[np.ndarray, ...]:
        """The planes of kernel operand ``x`` (contraction along ``axis``), C-contiguous.

        One plane: ``x`` cast to ``compute``. Compensated: (hi, lo) for a stationary operand and
        (hi, lo, x) for a moving one, on a grid chosen for contraction length ``x.shape[axis]``.
        """
        if not self.compensated:
            return (np.ascontiguousarray(x, dtype=self.compute),)
        return split(x, axis, beta_for(x.shape[axis]), with_full=moving)

    def grid_args(self, k: int) -> tuple[int, ...]:
        """Compile-time scalars a compensated kernel needs to re-split an intermediate on chip
        (the grid bits β for contraction length ``k``); empty for single-plane modes."""
        return (beta_for(k),) if self.compensated else ()

    def combine(self, out) -> np.ndarray:
        """A kernel's result as one host array: a plane pair (exact, rest) is added in fp64."""
        if isinstance(out, tuple):
            return combine_planes(out[0], out[1])
        return out


#: |E_corr(mp2trn) − E_corr(PySCF)| allowed per precision (Hartree); measurements in docs/accuracy.md.
#: fp64: both codes do the same double-precision arithmetic; measured ≤ 1.1e-16 Eh on the default set
#: and ≤ 3.6e-15 Eh on S22 (up to 30 atoms, 321 basis functions), so 1e-8 Eh leaves many orders of
#: magnitude for other BLAS builds, blockings and GPUs, and for much larger molecules.
#: fp32 (storage, transforms and pair GEMMs in single precision, pair sums in fp64): measured ≤ 0.045 µEh
#: on the default set (worst of 5 runs with rotated orbitals), 0.2–1.7 µEh reported elsewhere for whole
#: fp32 pipelines on ≤ 30 atoms; 1 µEh is the project's figure.
#: fp32x3: measured on the sim device ≤ 0.012 µEh on the default set (worst of 5 runs with rotated
#: orbitals) and ≤ 0.018 µEh on S22 complexes up to 30 atoms, while the same device in plain fp32 is off
#: by 0.001–0.5 µEh per run; 0.1 µEh keeps a 5× margin over the worst sample, and a silent drop to
#: plain fp32 would fail about half the default set.
PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp64", F64, F64, 1, 1e-8, "fp64 throughout"),
        Precision("fp32", F32, F32, 1, 1e-6,
                  "fp32 operands, fp32 accumulation; pair totals in fp64 on the host"),
        Precision("fp32x3", F64, F32, 3, 1e-7,
                  "compensated: operands split hi (bf16-exact power-of-two grid) + lo (fp32); "
                  "hi*hi exact in PSUM, hi*lo and lo*x corrections in fp32 (3 matmuls per tile)"),
        Precision("bf16", F32, BF16, 1, None,
                  "bfloat16 operands, fp32 accumulation (registered; no device runs it yet)"),
    )
}

#: Any other label is taken to be a compensated mode (e.g. B split into bf16 terms, fp32 accumulation),
#: which must deliver fp32-class accuracy. Measured with an emulation (scripts/validate_compensated.py,
#: default set, worst of 5 runs per molecule): 3-term bf16 split ≤ 0.99 µEh, 6-term ≤ 0.05 µEh, while
#: plain bf16 is off by 22–392 µEh. 2 µEh is twice the worst 3-term sample and still fails plain bf16
#: by a factor of 10 or more.
COMPENSATED_TOLERANCE = 2e-6


def get_precision(name: str) -> Precision:
    """The registry entry for ``name`` (an InputError for names nobody knows)."""
    try:
        return PRECISIONS[str(name).lower()]
    except KeyError:
        raise InputError(f"unknown precision {name!r}: choose one of {', '.join(PRECISIONS)}") from None


def tolerance_for(name: str | None) -> float:
    """The pass/fail threshold (Eh) of a precision label as reported by the device that ran."""
    entry = PRECISIONS.get(str(name).lower())
    return entry.tolerance if entry is not None and entry.tolerance is not None else COMPENSATED_TOLERANCE
