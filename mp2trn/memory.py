"""Memory budget and block sizes.

The budget (MB, 10⁶ bytes) is ``--memory``, else ``PYSCF_MAX_MEMORY``, else 60 % of the memory the
machine has available. The plan chooses how many auxiliary functions go into one AO-integral block,
how many occupied orbitals into one pair block, and whether the (P|ia)/B tensors stay in memory or
go to a temporary HDF5 file. A budget too small for the smallest block is a ResourceError raised
before any heavy work.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import asdict, dataclass

import numpy as np

from .errors import InputError, ResourceError

MB = 1e6
# keep this share of the budget for PySCF, Python and small temporaries
_RESERVE = 0.15
# B tensors stay in memory when they use at most this share of the budget
_INCORE_SHARE = 0.45
# past this many rows (ni·nv) a pair-block GEMM gains nothing and the T block only costs memory
_MAX_PAIR_ROWS = 4096
# AO-integral blocks beyond this size only cost page faults and cache misses (measured: one 2 GB block
# made the transform of Vitamin C/cc-pVTZ 3x slower than blocks of ~200 MB)
_MAX_AO_BLOCK_BYTES = 256e6


def _mb(nbytes: float) -> str:
    mb = nbytes / MB
    return f"{mb:.2f} MB" if mb < 10 else f"{mb:.0f} MB"


def budget_mb(max_memory: float | None) -> float:
    """The budget of a run: ``max_memory`` if given, else :func:`default_memory_mb`."""
    return float(max_memory) if max_memory is not None else default_memory_mb()


def default_memory_mb() -> float:
    """PYSCF_MAX_MEMORY if set, else 60 % of available RAM (MB)."""
    env = os.environ.get("PYSCF_MAX_MEMORY")
    if env:
        try:
            return float(env)
        except ValueError:
            raise InputError(f"PYSCF_MAX_MEMORY={env!r} is not a number of MB") from None
    return 0.6 * _available_bytes() / MB


def _available_bytes() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 4e9


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB; Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB


#: arrays smaller than this come from np.zeros: their first touch costs little either way
_PREFAULT_MIN_BYTES = 64e6


def prefaulted_empty(shape: tuple[int, ...], dtype=np.float64) -> np.ndarray:
    """A new C-contiguous array of ``shape`` (uninitialised in meaning, zero in fact) whose memory is
    already mapped, in small pages, by one thread per core at once.

    Why: the first write to fresh memory is what a large array costs most on a virtual machine, and NumPy
    advises the kernel to back arrays ≥ 4 MB with 2 MB huge pages, which such a machine maps slowly. On
    the 2-core machine of docs/benchmarks.md, filling a new 1.37 GB array (Inosine's SCF tensor) in a fresh
    process took 2.3–3.1 s with NumPy's huge pages and 0.3–0.7 s with 4 KB pages faulted in by two threads;
    2.12 GB (Vitamin C/cc-pVTZ): 3.5–4.7 s against 1.1–1.3 s (``python scripts/bench_scf_costs.py --only
    touch``). Elsewhere (no ``MADV_NOHUGEPAGE``, or a small array) this is ``np.zeros``.
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes < _PREFAULT_MIN_BYTES or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_NOHUGEPAGE)
    flat = np.frombuffer(buf, dtype=np.uint8)
    nthreads = max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 8))
    edges = [nbytes * k // nthreads // 4096 * 4096 for k in range(nthreads)] + [nbytes]

    def fault_in(k: int) -> None:  # NumPy releases the GIL for the fill, so the threads run at once
        flat[edges[k] : edges[k + 1]] = 0

    workers = [threading.Thread(target=fault_in, args=(k,)) for k in range(1, nthreads)]
    for w in workers:
        w.start()
    fault_in(0)
    for w in workers:
        w.join()
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


@dataclass(frozen=True)
class SpinShape:
    """Active orbital counts of one spin channel."""

    nocc: int
    nvir: int


@dataclass(frozen=True)
class BlockPlan:
    """Block sizes for one run (itemsize: bytes per stored element)."""

    budget_mb: float
    aux_block: int  # aux functions per AO-integral block
    occ_block: int  # occupied orbitals per pair block
    metric_cols: int  # columns of (P|ia) per metric solve when out of core
    incore: bool  # B tensors in memory (else a temporary HDF5 file)
    b_tensor_mb: float  # size of all B tensors

    def as_dict(self) -> dict:
        return asdict(self)


def plan_blocks(
    nao: int, naux: int, spins: list[SpinShape], max_aux_shell: int, budget_mb: float, itemsize: int = 8
) -> BlockPlan:
    """Choose block sizes that fit ``budget_mb``; raise ResourceError if nothing fits."""
    if budget_mb <= 0:
        raise InputError(f"memory budget must be positive, got {budget_mb} MB")
    budget = budget_mb * MB * (1 - _RESERVE)
    fixed = naux * naux * 8  # Cholesky factor of the metric (fp64); the metric itself is freed
    b_bytes = sum(naux * s.nocc * s.nvir * itemsize for s in spins)
    free = budget - fixed
    if free <= 0:
        raise ResourceError(
            f"memory budget {_mb(budget_mb * MB)} is too small: the auxiliary metric alone needs "
            f"{_mb(fixed / (1 - _RESERVE))}; raise --memory"
        )
    incore = b_bytes <= _INCORE_SHARE * free
    if incore:
        free -= b_bytes
    nocc_max = max(s.nocc for s in spins)
    nvir_max = max(s.nvir for s in spins)

    # one AO block: (P|μν) fp64 (+ PySCF's own buffer), half-transformed (P|μi), result (P|ia)
    per_aux = 2 * nao * nao * 8 + nao * nocc_max * 8 + nocc_max * nvir_max * (8 + itemsize)
    aux_block = int(free // per_aux)
    if aux_block < max_aux_shell:
        need = (max_aux_shell * per_aux + fixed + (b_bytes if incore else 0)) / (1 - _RESERVE)
        raise ResourceError(
            f"memory budget {_mb(budget_mb * MB)} is too small for one block of AO integrals "
            f"({_mb(need)} needed at least); raise --memory"
        )
    aux_block = min(aux_block, naux, max(max_aux_shell, int(_MAX_AO_BLOCK_BYTES // (nao * nao * 8))))

    # one pair block: B_I and B_J (+ working copies) and the T block ni·nv × nj·nv
    def pair_bytes(n: int) -> float:
        return 4 * naux * n * nvir_max * itemsize + 2 * (n * nvir_max) ** 2 * itemsize

    occ_block = 0
    while occ_block < nocc_max and pair_bytes(occ_block + 1) <= free and (occ_block + 1) * nvir_max <= _MAX_PAIR_ROWS:
        occ_block += 1
    if occ_block == 0 and pair_bytes(1) <= free:
        occ_block = 1
    if occ_block == 0:
        raise ResourceError(
            f"memory budget {_mb(budget_mb * MB)} is too small for one pair block "
            f"({_mb((pair_bytes(1) + fixed + (b_bytes if incore else 0)) / (1 - _RESERVE))} needed at least); raise --memory"
        )
    metric_cols = max(1, int(free // (3 * naux * itemsize)))
    return BlockPlan(budget_mb, aux_block, occ_block, metric_cols, incore, b_bytes / MB)


def check_budget_before_scf(nao: int, nelec: tuple[int, int], naux: int, max_aux_shell: int, budget: float,
                            itemsize: int) -> None:
    """Raise ResourceError before any heavy work when no block of the MP2 step can fit ``budget`` MB.

    Uses the all-electron orbital counts (an upper bound: frozen orbitals only shrink the work).
    """
    spins = [SpinShape(max(1, n), max(1, nao - n)) for n in sorted(set(nelec))]
    plan_blocks(nao, naux, spins, max_aux_shell, budget, itemsize=itemsize)


def prefetched(blocks, depth: int = 1):
    """Yield the items of the iterable ``blocks``, each made by a reader thread while the caller works on
    the one before (at most ``depth`` made ahead): a streamed J/K build reads its next tensor block from
    memory or HDF5 (and unpacks it) while the device computes on the current one. Errors of the reader
    are raised in the caller; a caller that stops early stops the reader at its next item."""
    import queue

    done = object()
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def read() -> None:
        try:
            for item in blocks:
                while not stop.is_set():
                    try:
                        q.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(("end", done))
        except BaseException as exc:  # handed to the caller
            q.put(("error", exc))

    reader = threading.Thread(target=read, name="mp2trn-prefetch", daemon=True)
    reader.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        reader.join(timeout=5)
