"""Memory budget and block sizes.

The budget (MB, 10⁶ bytes) is ``--memory``, else ``PYSCF_MAX_MEMORY``, else 60 % of the memory the
machine has available. The plan chooses how many auxiliary functions go into one AO-integral block,
how many occupied orbitals into one pair block, and whether the (P|ia)/B tensors stay in memory or
go to a temporary HDF5 file. A budget too small for the smallest block is a ResourceError raised
before any heavy work.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import threading
import weakref
from dataclasses import asdict, dataclass
from typing import Iterator

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
# the gradient's fitting-basis and JK-fit derivative passes: the same kind of cap, counted in one nao² fp64
# square per fitting function, at half the energy's, since their blocks hold about eight such squares per
# function (integrals, the AO 2PDM and its symmetrised copy, three derivative components;
# :func:`ao_block_cap`). Inosine/cc-pVDZ's gradient on 2 cores (`mp2trn run --gradient`, this constant
# varied): one block of the whole budget (1105 RI and 1606 JK-fit functions at the default 14 GB) took
# 13.4 s and 16.9 s in the two passes, blocks of 301 functions 10.4 and 9.1 s, of 150 functions 7.4 and
# 9.0 s (docs/benchmarks.md, "Analytic gradients"); on a 16-core host the cap made no difference either way
# (docs/benchmarks.md, GPU section)
MAX_GRADIENT_BLOCK_BYTES = 128e6


def ao_block_cap(nao: int, max_shell: int, cap_bytes: float = _MAX_AO_BLOCK_BYTES) -> int:
    """Fitting functions per block of AO integrals at most (one nao² fp64 square each): ``cap_bytes`` of
    them, or one shell where a shell is larger."""
    return max(max_shell, int(cap_bytes // (nao * nao * 8)))


def eighth_step_size(n: int, minimum_step: int = 1) -> int:
    """``n`` rounded up in steps of an eighth of its power of two (≤ 12.5 % padding), the step at least
    ``minimum_step``: the sizes a kernel is launched with, few of them per run (each distinct size is a
    compile on Trainium) and little padding (the collectives' buffers, the SCF's density factors)."""
    n = max(1, minimum_step, int(n))
    step = max(minimum_step, 1 << max(0, n.bit_length() - 4))
    return -(-n // step) * step


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


#: glibc's mallopt parameter, its starting value (128 kB) and its largest (32 MB on 64-bit systems)
_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MIN, _MMAP_THRESHOLD_MAX = -3, 128 * 1024, 32 * 1024 * 1024
#: the share of the run's budget below which freed blocks may stay in glibc's heap
_HEAP_SHARE = 0.01


def return_freed_memory(budget: float | None = None) -> bool:
    """Have the C library give large freed blocks back to the system at once, so that the peak RSS follows
    the arrays alive at once, which is what the memory plan budgets.

    glibc serves blocks from its heap up to a threshold and keeps freed heap memory for reuse; after a
    large block is freed it raises that threshold (up to 32 MB), so later arrays of up to 32 MB come from
    the heap and the memory they leave stays in the process. Benzene/cc-pVDZ with --gradient --memory 30
    peaked at 198 MB that way, 188 MB with the threshold fixed at glibc's starting 128 kB (water's fixed
    cost: 147 MB). But every larger array then has a mapping of its own, whose pages the system supplies
    afresh: on the 2-core VM an 8 MB NumPy elementwise step took 2.7 ms against 1.3 ms from the heap
    (``python scripts/bench_scf_costs.py --only heap``). So the threshold is fixed at 1 % of the run's budget
    ``budget`` (MB), between 128 kB and 32 MB: a small budget gets the tight behaviour, a production one the
    heap's speed, with at most blocks of 1 % of its budget left in the heap. No budget: 128 kB.
    Process-wide; False where the C library is not glibc."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    size = _MMAP_THRESHOLD_MIN if budget is None else \
        int(min(_MMAP_THRESHOLD_MAX, max(_MMAP_THRESHOLD_MIN, _HEAP_SHARE * budget * MB)))
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, size))
    except (OSError, AttributeError):   # pragma: no cover - a glibc without mallopt
        return False


#: arrays smaller than this come from np.zeros: their first touch costs little either way
_PREFAULT_MIN_BYTES = 64e6


def prefaulted_empty(shape: tuple[int, ...], dtype=np.float64) -> np.ndarray:
    """A new C-contiguous array of ``shape`` (uninitialised in meaning, zero in fact) whose memory is
    already mapped, in small pages, by one thread per core at once — carved from the active
    :class:`Arena` (:func:`carving`) where it fits there.

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
    arena = _ACTIVE_ARENA
    carved = None if arena is None else arena.carve(shape, dtype)
    if carved is not None:
        return carved
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_NOHUGEPAGE)
    _zero_on_every_core(np.frombuffer(buf, dtype=np.uint8))
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def _zero_on_every_core(flat: np.ndarray) -> None:
    """Fill the bytes ``flat`` with zeros, a page-aligned part per core, each on a thread of its own (NumPy
    releases the GIL for the fill, so the parts run at once and so do their page faults)."""
    nbytes = flat.size
    nthreads = max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 8))
    edges = [nbytes * k // nthreads // 4096 * 4096 for k in range(nthreads)] + [nbytes]

    def fill(k: int) -> None:
        flat[edges[k] : edges[k + 1]] = 0

    workers = [threading.Thread(target=fill, args=(k,)) for k in range(1, nthreads)]
    for w in workers:
        w.start()
    fill(0)
    for w in workers:
        w.join()


class Arena:
    """One anonymous mapping (small pages) that :func:`prefaulted_empty` carves arrays from while it is active
    (:func:`carving`), each in the first gap between the live ones where it fits: the space of arrays that
    are gone is the next ones', so that a stage's arrays take the pages an earlier stage faulted in.

    Why: this VM reports freed memory to its host (free page reporting), so memory a stage frees and the
    next one maps again is faulted in afresh, at about a second per GB late in a run, against a memset of
    pages still mapped (``python scripts/bench_scf_costs.py --only refault``). The gradient's stages each make
    their large arrays at their start and drop them at their end (Γ̄ and the fitting-basis pass's block
    buffers, the response's MO blocks, scratch, W and fp32 copy, the JK-fit pass's (P|iμ), c and block
    buffers), so one mapping serves them in turn.

    What stays mapped is what was faulted in. Between stages :meth:`trim` gives back the pages past what the
    next stage carves (and past every live array), so that no stage holds more than the plan counts for it.

    An array is carved only where no live array lies: whether an array is alive is whether any view of it
    is (each is made over a buffer object of its own, watched by a weak reference), so memory is never
    handed out twice. Carving is safe from any thread."""

    def __init__(self, nbytes: int):
        self.size = _pages(nbytes) or 4096
        self._map = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._map.madvise(mmap.MADV_NOHUGEPAGE)
        self._lock = threading.Lock()
        self._ends: dict[int, int] = {}      # live pieces: offset → end (bytes)
        # offsets of pieces gone, appended by their finalizers (which may run inside carve, when the garbage
        # collector runs there) and taken off the live pieces under the lock
        self._gone: list[int] = []
        self.carves = 0                      # arrays handed out in all (tests)

    def _live_ends(self) -> dict[int, int]:
        """The live pieces (call with the lock held)."""
        while self._gone:
            self._ends.pop(self._gone.pop(), None)
        return self._ends

    def carve(self, shape: tuple[int, ...], dtype=np.float64) -> np.ndarray | None:
        """A zero-filled C-contiguous array of ``shape`` in the first gap between live arrays that holds it,
        or None where none does."""
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes == 0:
            return None
        with self._lock:
            offset = 0
            for start, end in sorted(self._live_ends().items()):
                if start - offset >= nbytes:
                    break
                offset = max(offset, _pages(end))
            if offset + nbytes > self.size:
                return None
            self._ends[offset] = offset + nbytes
        try:
            piece = _piece_type(nbytes).from_buffer(self._map, offset)
            weakref.finalize(piece, self._gone.append, offset)
        except BaseException:
            with self._lock:
                self._ends.pop(offset, None)
            raise
        self.carves += 1
        flat = np.frombuffer(piece, dtype=np.uint8)
        _zero_on_every_core(flat)
        return flat.view(dtype)[:count].reshape(shape)

    @property
    def live(self) -> int:
        """Carved arrays alive (each with its views)."""
        with self._lock:
            return len(self._live_ends())

    def trim(self, keep: int = 0) -> int:
        """Give back to the system the pages past the first ``keep`` bytes and past every live array (they read
        as zeros when touched again); returns the offset from which they were given back."""
        with self._lock:
            start = _pages(max(int(keep), max(self._live_ends().values(), default=0)))
            if start < self.size and hasattr(mmap, "MADV_DONTNEED"):
                self._map.madvise(mmap.MADV_DONTNEED, start, self.size - start)
            return start


def _pages(nbytes: float) -> int:
    """``nbytes`` rounded up to whole 4 KB pages."""
    return -(-max(0, int(nbytes)) // 4096) * 4096


@functools.lru_cache(maxsize=None)
def _piece_type(nbytes: int) -> type:
    """The buffer type of an arena's piece of ``nbytes``: a ctypes byte array that takes weak references
    (the arrays carved over it, and all their views, keep it alive)."""
    return type("_ArenaPiece", (ctypes.c_ubyte * nbytes,), {})


def carved_bytes(*nbytes: float) -> int:
    """What an arena holds for arrays of ``nbytes`` each (:func:`prefaulted_empty` carves only arrays of at
    least ``_PREFAULT_MIN_BYTES``; each starts on a page): for the trims between the gradient's stages."""
    return sum(_pages(n) for n in nbytes if n >= _PREFAULT_MIN_BYTES)


#: the arena :func:`prefaulted_empty` carves from (:func:`carving`), None: each array its own mapping
_ACTIVE_ARENA: Arena | None = None


@contextlib.contextmanager
def carving(nbytes: float) -> Iterator[Arena | None]:
    """Inside the block :func:`prefaulted_empty` carves its arrays from one :class:`Arena` of ``nbytes``
    (where it fits; yields it, or None where the arena cannot be made: small pages unsupported, the mapping
    refused, or ``nbytes`` < one array's minimum). On leaving, its pages go back to the system (the arrays
    still alive keep theirs until they go). Not nested: an inner block leaves the outer arena active. Entered by one
    thread (the gradient's); while it is active, arrays made ahead on other threads are carved from it too."""
    global _ACTIVE_ARENA
    if _ACTIVE_ARENA is not None or nbytes < _PREFAULT_MIN_BYTES or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        yield None
        return
    try:
        arena = Arena(int(nbytes))
    except OSError:       # no room to map it (it is only ever a speed-up): each array its own mapping, as before
        arena = None
    if arena is None:
        yield None
        return
    _ACTIVE_ARENA = arena
    try:
        yield arena
    finally:
        _ACTIVE_ARENA = None
        arena.trim(0)


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
    nao: int, naux: int, spins: list[SpinShape], max_aux_shell: int, budget_mb: float, itemsize: int = 8,
    beside_bytes: float = 0.0,
) -> BlockPlan:
    """Choose block sizes that fit ``budget_mb``; raise ResourceError if nothing fits.

    ``beside_bytes``: an array that lives in memory beside B whenever B does (the gradient's Γ̄, the size of B
    in fp64): B stays in memory only when both fit, and the blocks are planned around both."""
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
    incore = b_bytes + beside_bytes <= _INCORE_SHARE * free
    if incore:
        free -= b_bytes + beside_bytes
    nocc_max = max(s.nocc for s in spins)
    nvir_max = max(s.nvir for s in spins)

    # one AO block: (P|μν) fp64 (+ PySCF's own buffer), half-transformed (P|μi), result (P|ia)
    per_aux = 2 * nao * nao * 8 + nao * nocc_max * 8 + nocc_max * nvir_max * (8 + itemsize)
    aux_block = int(free // per_aux)
    if aux_block < max_aux_shell:
        need = (max_aux_shell * per_aux + fixed + (b_bytes + beside_bytes if incore else 0)) / (1 - _RESERVE)
        raise ResourceError(
            f"memory budget {_mb(budget_mb * MB)} is too small for one block of AO integrals "
            f"({_mb(need)} needed at least); raise --memory"
        )
    aux_block = min(aux_block, naux, ao_block_cap(nao, max_aux_shell))

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
            f"({_mb((pair_bytes(1) + fixed + (b_bytes + beside_bytes if incore else 0)) / (1 - _RESERVE))} needed at least); "
            "raise --memory"
        )
    metric_cols = max(1, int(free // (3 * naux * itemsize)))
    return BlockPlan(budget_mb, aux_block, occ_block, metric_cols, incore, b_bytes / MB)


#: share of the budget the MP2 step's 3-index blocks made during the SCF may hold (mp2trn.transform's
#: EarlyIntegrals), beside the resident SCF tensor's :data:`SCF_TENSOR_SHARE`
EARLY_BLOCKS_SHARE = 0.25


def early_blocks_mb(nao: int, naux: int, spins: list[SpinShape], max_aux_shell: int, budget_mb: float,
                    itemsize: int) -> float:
    """MB of the MP2 step's 3-index integral blocks that may be made while the SCF runs and wait for the
    energy: at most :data:`EARLY_BLOCKS_SHARE` of the budget, and no more than the energy's plan leaves
    unused when it starts with them still alive — planned with the budget a held SCF tensor leaves (at most
    :data:`SCF_TENSOR_SHARE`), its B in memory or not and its AO block the same with them as without. 0 when
    the budget has no such room."""
    base = budget_mb * (1 - SCF_TENSOR_SHARE)

    def same_plan(early: float) -> bool:
        try:
            plan = plan_blocks(nao, naux, spins, max_aux_shell, base - early, itemsize)
        except (ResourceError, InputError):
            return False
        return (plan.incore, plan.aux_block) == (reference.incore, reference.aux_block)

    try:
        reference = plan_blocks(nao, naux, spins, max_aux_shell, base, itemsize)
    except (ResourceError, InputError):
        return 0.0
    lo, hi = 0.0, EARLY_BLOCKS_SHARE * budget_mb
    if same_plan(hi):
        return hi
    for _ in range(30):      # the plan's blocks only grow with the budget: the largest room that keeps them
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if same_plan(mid) else (lo, mid)
    return lo


def check_budget_before_scf(nao: int, nelec: tuple[int, int], naux: int, max_aux_shell: int, budget: float,
                            itemsize: int) -> None:
    """Raise ResourceError before any heavy work when no block of the MP2 step can fit ``budget`` MB.

    Uses the all-electron orbital counts (an upper bound: frozen orbitals only shrink the work).
    """
    plan_blocks(nao, naux, all_electron_shapes(nao, nelec), max_aux_shell, budget, itemsize=itemsize)


def all_electron_shapes(nao: int, nelec: tuple[int, int]) -> list[SpinShape]:
    """The MP2 step's spin channels before the SCF, from the electron counts (all electrons correlated, no
    orbital dropped: an upper bound of the work): one for a closed shell, two for an open one."""
    return [SpinShape(max(1, n), max(1, nao - n)) for n in sorted(set(nelec))]


# -- the gradient's plan ------------------------------------------------------------------------------------
#: columns of B_ov scaled and multiplied at a time for the Z-vector preconditioner's naux × naux matrix
#: (:meth:`mp2trn.grad.cpks.ResponseJK.preconditioner`)
PRECONDITIONER_COLUMNS = 4096
#: JK-fit rows the response's tensor is solved in at most (MB of one row chunk of its integrals)
_FACTOR_CHUNK_MB = 256.0


@dataclass(frozen=True)
class ChannelShape:
    """Orbital counts of one gradient channel (a spin; RHF: one channel): every occupied orbital (frozen
    core included), the active (correlated) ones and the virtual ones."""

    nocc: int
    nact: int
    nvir: int

    @property
    def nmo(self) -> int:
        return self.nocc + self.nvir


@dataclass(frozen=True)
class GradientSizes:
    """What the gradient's plan needs to know of a run: basis functions, the MP2 (RI) and SCF (JK) fitting
    bases' sizes and largest shells, the channels and the bytes per stored B element."""

    nao: int
    naux: int
    max_aux_shell: int
    naux_jk: int
    max_jk_shell: int
    channels: tuple[ChannelShape, ...]
    itemsize: int = 8
    #: bytes per element of a reduced-precision copy of the response's MO blocks the device would keep beside
    #: the fp64 ones in host memory for the Z-vector's inner solves (0: none; Device.reduced_response_itemsize)
    reduced_response_itemsize: int = 0


@dataclass(frozen=True)
class GradientPlan:
    """Block sizes and residency of every gradient stage, all from one budget (MB).

    ``b_blocks``: the B build (as the energy's); ``stores_incore``: B and Γ̄ in memory (else HDF5 files in
    the run's scratch directory); ``strip_block``: occupied orbitals k per strip of the sweep;
    ``pair_block``: 0 when a strip reads one spin's whole B, else the occupied orbitals i per block when B
    is streamed in pairs of such blocks; ``metric_cols``: columns per metric solve of Γ̄; ``ri_aux_block``:
    fitting functions per block of the fitting-basis pass; ``response_factors``: the response's MO blocks of
    the JK-fit tensor in memory (else generic J/K builds, which resident-or-stream the tensor by the SCF's
    own plan), ``factor_chunk_mb``: the row chunk their tensor is solved in; ``response_reduced``: room beside
    the blocks for their reduced-precision copy (the Z-vector's inner solves, refined in fp64);
    ``jk_half_incore``: the JK-fit pass's (P|iμ) per channel in memory (else HDF5), ``jk_columns``: occupied
    orbitals per column block of its metric solve, ``jk_aux_block``: JK-fit functions per derivative-integral
    block; ``stage_mb``: the planned peak of each stage (MB, arrays mp2trn allocates)."""

    budget_mb: float
    b_blocks: BlockPlan
    stores_incore: bool
    strip_block: int
    pair_block: int
    metric_cols: int
    ri_aux_block: int
    response_factors: bool
    factor_chunk_mb: float
    jk_half_incore: bool
    jk_columns: int
    jk_aux_block: int
    stage_mb: dict
    response_reduced: bool = False

    def residency(self, response_factors: bool | None = None) -> dict[str, str]:
        """Which arrays stayed in memory and which were streamed, by name (what-ran); ``response_factors``:
        whether the response made its MO blocks after all (None: as planned)."""
        made = self.response_factors if response_factors is None else response_factors
        place = {True: "in memory", False: "streamed from an HDF5 file in the scratch directory"}
        sweep = ("one spin's whole B per strip" if self.pair_block == 0 else
                 f"B streamed in pairs of {self.pair_block}-orbital occupied blocks")
        return {"B": place[self.stores_incore], "Gamma": place[self.stores_incore],
                "pair_sweep": f"{sweep}, {self.strip_block} occupied orbitals per strip",
                "response_jkfit_mo_blocks": ("in memory (B_oo, B_vo, B_vv and the packed JK-fit tensor"
                                             + (", with an fp32 copy of the blocks for the Z-vector's inner "
                                                "solves)" if self.response_reduced else ")")
                                             if made else
                                             "not made: J/K builds of the SCF's tensor (resident or streamed by "
                                             "the SCF's plan)"),
                "jkfit_half_transformed": place[self.jk_half_incore],
                "fitting_basis_block": f"{self.ri_aux_block} RI functions",
                "derivative_block": f"{self.jk_aux_block} JK-fit functions",
                "planned_peak_mb": {k: round(v, 1) for k, v in self.stage_mb.items()}}

    def as_dict(self) -> dict:
        return asdict(self)


def plan_gradient(sizes: GradientSizes, budget_mb: float, device_mb: float | None = None) -> GradientPlan:
    """Choose the gradient's block sizes and residency so that every stage fits ``budget_mb`` (MB, the budget
    of the whole run, less the same reserve as the energy's); ``device_mb``: the memory of a device that
    computes in its own memory (None: it computes in host memory, counted in the budget). Raises
    ResourceError, naming the stage and the smallest budget that works, when some stage cannot fit."""
    plan = _plan_gradient(sizes, budget_mb, device_mb)
    if isinstance(plan, GradientPlan):
        return plan
    smallest = smallest_budget_mb(lambda mb: isinstance(_plan_gradient(sizes, mb, device_mb), GradientPlan))
    raise ResourceError(f"memory budget {_mb(budget_mb * MB)} is too small for the gradient's {plan}; the smallest "
                        f"budget this gradient fits is {smallest:.0f} MB: raise --memory")


def strip_cap(naux: int, nact: int, nvir: int, budget_mb: float) -> int:
    """Occupied orbitals k per strip of the pair sweep at most: the strip's Γ̄ rows and a k column of
    amplitudes within a tenth of the budget (larger strips gain nothing); the plan lowers it where the rest
    of the sweep needs the room."""
    return min(nact, max(1, int(0.1 * budget_mb * MB // (naux * nvir * 16))))


def smallest_budget_mb(fits, start_mb: float = 1.0, ceiling_mb: float = 1e8) -> float:
    """The smallest budget (MB, to 1 %) for which ``fits(budget_mb)`` holds (a plan that fits a budget fits
    every larger one)."""
    hi = start_mb
    while not fits(hi):
        hi *= 2
        if hi > ceiling_mb:
            raise ResourceError(f"no memory budget up to {ceiling_mb / 1e6:.0f} TB fits this run")
    lo = hi / 2
    while hi - lo > 0.01 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def _plan_gradient(sizes: GradientSizes, budget_mb: float, device_mb: float | None) -> GradientPlan | str:
    """The plan, or the name of the first stage that does not fit (for the error)."""
    if budget_mb <= 0:
        raise InputError(f"memory budget must be positive, got {budget_mb} MB")
    f8, item = 8, sizes.itemsize
    nao, naux, naux_jk = sizes.nao, sizes.naux, sizes.naux_jk
    chans = sizes.channels
    nocc, nact = max(c.nocc for c in chans), max(c.nact for c in chans)
    nvir, nmo = max(c.nvir for c in chans), max(c.nmo for c in chans)
    avail = budget_mb * MB * (1 - _RESERVE)
    # held by every stage: the RI metric's factor, orbitals, densities and Lagrangians (a few nmo² per
    # channel), the nao² work of the one-electron terms, the relaxed density and the Molden orbitals
    small = naux * naux * f8 + (12 * len(chans) * nmo * nmo + 12 * nao * nao) * f8
    # held by the JK-fit derivative stage: its metric factor and γ, (P|Q)^R of the metric gradient (3×)
    jk_fixed = 5 * naux_jk * naux_jk * f8
    b_bytes = naux * sum(c.nact * c.nvir for c in chans) * item
    g_bytes = naux * sum(c.nact * c.nvir for c in chans) * f8
    stage: dict[str, float] = {}

    # 1. B (the energy's build), with Γ̄ beside it in memory when both fit
    try:
        b_plan = plan_blocks(nao, naux, [SpinShape(c.nact, c.nvir) for c in chans], sizes.max_aux_shell, budget_mb,
                             itemsize=item, beside_bytes=g_bytes)
    except ResourceError:
        return "build of B (one block of AO integrals)"
    incore = b_plan.incore
    stores = b_bytes + g_bytes if incore else 0.0
    free = avail - small - stores
    if free <= 0:
        return "B and Γ̄ stores"

    # 2. the pair sweep: a strip is every i against a block of k (b_k, its Γ̄ rows out and summed, and the
    # amplitudes of one k: τ, t̃ and their reordered copies); B of every i is a view of the store, one spin's
    # read from the file, or a pair of i blocks read into one buffer (plus the block being read)
    per_k = naux * nvir * (item + 3 * f8)

    def amplitudes(ni: int) -> float:
        return 5 * ni * nvir * nvir * f8

    def on_device(ni: int, nk: int) -> bool:   # the device's copy of a strip's arrays, when it has its own memory
        return device_mb is None or naux * ni * nvir * item + nk * per_k + amplitudes(ni) <= 0.9 * device_mb * MB

    whole = 0.0 if incore else naux * nact * nvir * item
    nk_cap = strip_cap(naux, nact, nvir, budget_mb)
    strip, pair = 0, 0
    if whole + per_k + amplitudes(nact) <= free and on_device(nact, 1):
        strip = max(k for k in range(1, nk_cap + 1) if k == 1 or
                    (whole + k * per_k + amplitudes(nact) <= free and on_device(nact, k)))
        stage["pair_sweep"] = stores + small + whole + strip * per_k + amplitudes(nact)
    else:
        def pair_bytes(ni: int, nk: int) -> float:
            return 3 * naux * ni * nvir * item + nk * per_k + amplitudes(2 * ni)

        fitting = [n for n in range(1, max(1, nact // 2) + 1) if pair_bytes(n, 1) <= free and on_device(2 * n, 1)]
        if not fitting:
            return "pair sweep (two blocks of one occupied orbital of B and one strip)"
        pair = max(fitting)
        strip = max(k for k in range(1, nk_cap + 1) if k == 1 or (pair_bytes(pair, k) <= free and on_device(2 * pair, k)))
        stage["pair_sweep"] = stores + small + pair_bytes(pair, strip)

    # Γ̄'s metric density and solve: the (naux, naux) sums and solves, and column blocks of Γ̄ and B
    metric_work = 4 * naux * naux * f8
    if free - metric_work < 4 * naux * f8:
        return "metric density of Γ̄ (four naux² arrays and one column)"
    metric_cols = max(1, int((free - metric_work) // (4 * naux * f8)))
    stage["metric_density"] = stores + small + metric_work + min(metric_cols, naux * nact * nvir) * 4 * naux * f8

    # 3. the fitting-basis pass (B is closed by then): integrals (and their packed part as computed), the AO 2PDM,
    # its symmetrised copy, three derivative components, the block's Γ rows and their half-transforms
    per_aux = (8 * nao * nao + 4 * nmo * nao + nact * nvir) * f8
    free_ri = avail - small - (g_bytes if incore else 0.0)
    ri_block = int(free_ri // per_aux) if free_ri > 0 else 0
    if ri_block < sizes.max_aux_shell:
        return f"fitting-basis pass (one block of {sizes.max_aux_shell} RI functions)"
    ri_block = min(ri_block, naux, ao_block_cap(nao, sizes.max_aux_shell, MAX_GRADIENT_BLOCK_BYTES))
    stage["fitting_basis_pass"] = small + (g_bytes if incore else 0.0) + ri_block * per_aux

    # 4. the orbital response: the MO blocks of the JK-fit tensor (with the packed tensor, its Z-vector
    # temporaries and a solve chunk while it is built) when they fit, else generic J/K builds
    npair = nao * (nao + 1) // 2
    chunk_mb = max(1.0, min(_FACTOR_CHUNK_MB, 0.05 * avail / MB))
    tensor = naux_jk * npair * f8
    blocks = naux_jk * sum(c.nocc ** 2 + c.nvir * c.nocc + c.nvir ** 2 for c in chans) * f8   # B_oo, B_ov, B_vv
    rows = min(naux_jk, max(1, int(64e6 // (nao * nao * f8))))   # unpacked rows per chunk (grad.cpks)
    # beside the blocks: the products' scratch of naux_jk·nocc·nmo (grad.cpks._Scratch: the Z-vector's M and Y,
    # the G[X] columns' second product and W's reordered halves) and W itself (as large), the preconditioner's
    # S⁻¹ (naux_jk², with S while inverting it and the identity it is solved against), and three unpacked row
    # chunks while the blocks are made
    factors = tensor + max(chunk_mb * MB, blocks + 2 * naux_jk * nocc * nmo * f8
                           + (3 * naux_jk + PRECONDITIONER_COLUMNS) * naux_jk * f8 + 3 * rows * nao * nao * f8)
    response_factors = factors <= avail - small
    # their reduced copy, which every layout the Z-vector's products read views (B_vv, B_ov and B_oo once each),
    # held during the solve only, where it fits beside them (its M and Y are in the scratch)
    copies = naux_jk * sum(c.nvir ** 2 + c.nvir * c.nocc + c.nocc ** 2 for c in chans) \
        * sizes.reduced_response_itemsize
    response_reduced = response_factors and copies > 0 and factors + copies <= avail - small
    # (else: J/K builds of the SCF's tensor, resident where it fits its share of the budget, and their buffers)
    stage["response"] = small + (factors + (copies if response_reduced else 0.0) if response_factors else
                                 min(tensor, SCF_TENSOR_SHARE * budget_mb * MB) + JK_WORK_SHARE * budget_mb * MB)

    # 5. the JK-fit derivative pass: (P|iμ) per channel, in memory when it fits; its metric solve in column
    # blocks of occupied orbitals (the block read, V⁻¹ of it, Z times that); the integral and derivative
    # blocks as in the fitting-basis pass
    half = naux_jk * nao * sum(c.nocc for c in chans) * f8
    free_jk = avail - small - jk_fixed
    if free_jk <= 0:
        return "JK-fit derivative pass (its metric factor and density)"
    half_incore = half <= _INCORE_SHARE * free_jk
    free_jk -= half if half_incore else 0.0
    per_col = 4 * naux_jk * nao * f8
    per_jk_aux = (7 * nao * nao + 2 * nao * nocc) * f8
    if free_jk < max(per_col, sizes.max_jk_shell * per_jk_aux):
        return f"JK-fit derivative pass (one block of {sizes.max_jk_shell} JK-fit functions)"
    jk_columns = min(nocc, int(free_jk // per_col))
    jk_block = min(naux_jk, int(free_jk // per_jk_aux), ao_block_cap(nao, sizes.max_jk_shell, MAX_GRADIENT_BLOCK_BYTES))
    stage["derivative_integrals"] = small + jk_fixed + (half if half_incore else 0.0) + \
        max(jk_columns * per_col, jk_block * per_jk_aux)
    return GradientPlan(budget_mb, b_plan, incore, strip, pair, metric_cols, ri_block, response_factors, chunk_mb,
                        half_incore, jk_columns, jk_block, {k: v / MB for k, v in stage.items()}, response_reduced)


@dataclass(frozen=True)
class ScfTensorPlan:
    """Where the SCF's fitted 3-index tensor lives while the J/K builds read it (:func:`plan_scf_tensor`).

    resident: made once per SCF and kept (the host's fp64 rows, and the device's copy of them in device
    memory where the device has its own) — else streamed block by block at every build; copy_left_out:
    resident without the device's optional copy (the CPU's fp32 one); block_rows: auxiliary rows per
    block; why: one line for what-ran."""

    resident: bool
    copy_left_out: bool
    block_rows: int
    why: str


#: share of the memory budget the resident SCF tensor (host rows and a host-memory copy) may use
SCF_TENSOR_SHARE = 0.5
#: share of the memory budget the J/K builds' work buffers may hold, all parts of a build together
#: (:meth:`mp2trn.devices.Device.limit_jk_work`): beside the SCF tensor's half of the budget in the SCF, and
#: counted by the gradient's plan for a response of J/K builds (:func:`plan_gradient`)
JK_WORK_SHARE = 0.1
#: share of a device's own memory its copy of the SCF tensor may use (the rest: the MP2 stages' arrays)
SCF_DEVICE_SHARE = 0.5


def plan_scf_tensor(naux: int, elements_per_row: int, copy_itemsize: int, copy_optional: bool,
                    unpacked_per_row: int, budget_mb: float, device_mb: float | None,
                    host_copy_itemsize: int = 0) -> ScfTensorPlan:
    """Resident or streamed SCF tensor for one device and budget.

    naux: this rank's auxiliary rows; elements_per_row: per row in the device's layout (nao(nao+1)/2 packed,
    nao² unpacked); copy_itemsize: bytes per element of the device's copy for these builds
    (``Device.jk_copy_itemsize``); unpacked_per_row: elements a streamed row is unpacked into (0 when the
    device reads packed rows); device_mb: the device's own memory (``Device.memory_mb``; None: it computes
    in host memory, and its copy counts against the budget); host_copy_itemsize: bytes per element that a
    device with memory of its own still keeps in host memory for its copy (``Device.jk_host_copy_itemsize``).
    Resident when the fp64 host rows (and a host-memory copy) fit :data:`SCF_TENSOR_SHARE` of the budget and
    a device-memory copy fits :data:`SCF_DEVICE_SHARE` of the device's memory.
    """
    rows_bytes = naux * elements_per_row
    copy_bytes = rows_bytes * copy_itemsize
    host_copy = copy_bytes if device_mb is None else rows_bytes * host_copy_itemsize
    host_ok = rows_bytes * 8 + host_copy <= SCF_TENSOR_SHARE * budget_mb * MB
    device_ok = device_mb is None or copy_bytes <= SCF_DEVICE_SHARE * device_mb * MB
    resident, left_out = host_ok and device_ok, False
    if not resident and copy_optional and copy_itemsize and rows_bytes * 8 <= SCF_TENSOR_SHARE * budget_mb * MB:
        resident, left_out, copy_itemsize = True, True, 0
    # a streamed block: its fp64 rows, unpacked rows, the copy (none where it is optional: a streamed block's
    # copy would be made again at every build, mp2trn.jk.JKTensor.blocks); two alive at once (in use and
    # read ahead)
    per_aux = elements_per_row * (8 + (0 if copy_optional else copy_itemsize)) + unpacked_per_row * 8
    rows = int(max(1, min(naux, 256, (0.1 * budget_mb * MB) // per_aux)))
    need = f"{_mb(rows_bytes * 8 + host_copy)} of the {budget_mb:.0f} MB budget"
    if device_mb is not None:
        need += f", {_mb(copy_bytes)} of the device's {device_mb / 1e3:.0f} GB"
    if resident:
        why = f"resident: {need}" + ("; the device's copy left out" if left_out else "")
    else:
        why = f"streamed: resident would need {need} (at most {SCF_TENSOR_SHARE:.0%} of the budget" + \
              (f", {SCF_DEVICE_SHARE:.0%} of the device's memory)" if device_mb is not None else ")")
    return ScfTensorPlan(resident, left_out, rows, why)
