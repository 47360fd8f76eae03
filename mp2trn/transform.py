"""Transform step: (P|μν) → (P|ia) → B = L⁻¹ (P|ia), per spin channel.

B is stored aux-major as a 2-D array ``(naux, nocc·nvir)`` (B[Q, i·nvir + a]), in memory or, when the
plan says it does not fit, in a temporary HDF5 file. The device does the GEMMs and the triangular
solve; this module owns the blocking and the storage.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import tempfile
import time

import h5py
import numpy as np

from .devices.base import Device
from .df import DFIntegrals, largest_shell, make_auxmol, metric_cholesky
from .errors import ResourceError
from .memory import BlockPlan, SpinShape, all_electron_shapes, early_blocks_mb, plan_blocks, prefaulted_empty
from .orbitals import SpinOrbitals
from .overlap import EarlyBlocks, made_ahead, overlaps
from .parallel import Comm, balanced_counts, offsets, weighted_split
from .progress import Progress
from .scratch import check_stopped



#: auxiliary rows of a file read at a time into part of a larger buffer (a temporary of this many rows)
_READ_ROWS = 64


class BStore:
    """Holds one 2-D (naux, nocc·nvir) array per spin: NumPy in memory or datasets in a temp HDF5."""

    def __init__(self, naux: int, spins: list[SpinOrbitals], dtype: np.dtype, incore: bool, tmpdir: str | None = None,
                 made_ahead: bool = False):
        """``made_ahead``: in memory, each array in pages mapped ahead by every core
        (:func:`mp2trn.memory.prefaulted_empty`: carved from the gradient's arena while one is active), zeros;
        else ``np.empty``."""
        self.incore = incore
        self.dtype = np.dtype(dtype)
        self._file = None
        self._path = None
        self.arrays: list = []
        if incore:
            make = prefaulted_empty if made_ahead else np.empty
            self.arrays = [make((naux, s.nocc * s.nvir), dtype=dtype) for s in spins]
        else:
            fd, self._path = tempfile.mkstemp(prefix="mp2trn-B-", suffix=".h5", dir=tmpdir)
            os.close(fd)
            self._file = h5py.File(self._path, "w")
            for k, s in enumerate(spins):
                n = s.nocc * s.nvir
                chunk = (min(naux, 64), min(n, max(s.nvir, 4096)))
                self.arrays.append(self._file.create_dataset(f"B{k}", (naux, n), dtype=dtype, chunks=chunk))

    def occ_block(self, spin: int, nvir: int, i0: int, i1: int) -> np.ndarray:
        """B for occupied orbitals i0:i1 as (naux, i1−i0, nvir) (a view when in memory)."""
        arr = self.arrays[spin]
        block = arr[:, i0 * nvir : i1 * nvir]
        block = np.asarray(block)
        return block.reshape(block.shape[0], i1 - i0, nvir)

    def read_occ_block(self, spin: int, nvir: int, i0: int, i1: int, out: np.ndarray) -> None:
        """B for occupied orbitals i0:i1 into ``out`` (naux, i1−i0, nvir) (a part of a larger buffer): read
        straight from the file when out of core, with no array of its own."""
        arr = self.arrays[spin]
        if isinstance(arr, np.ndarray):
            out[...] = arr[:, i0 * nvir : i1 * nvir].reshape(out.shape)
            return
        for row in range(0, out.shape[0], _READ_ROWS):   # h5py reads into a contiguous destination
            stop = min(out.shape[0], row + _READ_ROWS)
            out[row:stop] = arr[row:stop, i0 * nvir : i1 * nvir].reshape(stop - row, i1 - i0, nvir)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._path and os.path.exists(self._path):
            os.remove(self._path)
        self.arrays = []

    def __enter__(self) -> BStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class KeptB:
    """The energy's B handed to the gradient of the same run, so that the gradient does not build it again.

    The energy stage (:func:`mp2trn.dfmp2.kernel` with ``keep_b``) leaves its fitting integrals (the
    auxiliary molecule and L) and its :class:`BStore` here instead of closing them; the gradient takes them
    (:meth:`take`) when they were made for its orbitals, fitting basis and storage dtype, in memory or in
    the HDF5 file as its own plan wants them (moving B between the two when the plans differ: a copy, far
    cheaper than the integrals and the metric solve). Whatever is not taken is closed with the holder."""

    def __init__(self) -> None:
        self.dfi: DFIntegrals | None = None
        self.spins: list[SpinOrbitals] = []
        self.store: BStore | None = None
        #: whether the energy keeps its 3-index integrals too (:attr:`DFIntegrals.rows`, for the gradient's RI
        #: pass): set by the caller whose budget holds them (:func:`mp2trn.pipeline.ri_rows_held_mb`)
        self.keep_rows = False

    def keep(self, dfi: DFIntegrals, spins: list[SpinOrbitals], store: BStore) -> None:
        """Hold the energy's fitting integrals and its filled B ``store`` (closing anything held before)."""
        self.close()
        self.dfi, self.spins, self.store = dfi, spins, store

    def matches(self, auxbasis, spins: list[SpinOrbitals], dtype: np.dtype) -> bool:
        """Whether the kept B is the one the gradient would build: the same fitting basis, storage dtype and
        active orbitals (coefficients equal to the bit)."""
        if self.store is None or self.dfi is None or np.dtype(dtype) != self.store.dtype:
            return False
        if auxbasis is not None and self.dfi.auxbasis != auxbasis:
            return False
        return len(spins) == len(self.spins) and all(
            np.array_equal(a.c_occ, b.c_occ) and np.array_equal(a.c_vir, b.c_vir) for a, b in zip(spins, self.spins))

    def take(self, incore: bool) -> tuple[DFIntegrals, BStore]:
        """The fitting integrals and B, in memory when ``incore`` else in an HDF5 file; the holder is empty
        afterwards (the caller closes the store)."""
        dfi, store = self.dfi, self.store
        self.dfi, self.spins, self.store = None, [], None
        if store.incore != incore:
            store = _moved(store, incore)
        return dfi, store

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        self.dfi, self.spins, self.store = None, [], None

    def __enter__(self) -> KeptB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _moved(store: BStore, incore: bool) -> BStore:
    """A copy of ``store``'s arrays in memory (``incore``) or in a new HDF5 file, copied _READ_ROWS auxiliary
    rows at a time; ``store`` is closed."""
    naux = store.arrays[0].shape[0]
    out = BStore(naux, [SpinShape(a.shape[1], 1) for a in store.arrays], store.dtype, incore)
    try:
        with scratch_writes("the energy's B moved to the scratch file", sum(a.size for a in store.arrays)
                            * store.dtype.itemsize):
            for src, dst in zip(store.arrays, out.arrays):
                for row in range(0, naux, _READ_ROWS):
                    dst[row : row + _READ_ROWS] = np.asarray(src[row : row + _READ_ROWS])
    except BaseException:
        out.close()
        raise
    finally:
        store.close()
    return out


class SharedB:
    """This rank's share of B when a run is spread over ranks: per spin, all auxiliary rows for this
    rank's range of occupied orbitals, ``(naux, nocc_r·nvir)`` in memory. Occupied indices are global."""

    def __init__(self, naux: int, spins: list[SpinOrbitals], dtype: np.dtype, comm: Comm):
        self.naux, self.dtype, self.comm = naux, np.dtype(dtype), comm
        self.counts = [balanced_counts(s.nocc, comm.size) for s in spins]   # occupied orbitals per rank
        self.starts = [offsets(c) for c in self.counts]
        self.arrays: list[np.ndarray] = []

    def occ_range(self, spin: int, rank: int) -> tuple[int, int]:
        return self.starts[spin][rank], self.starts[spin][rank + 1]

    def occ_block(self, spin: int, nvir: int, i0: int, i1: int) -> np.ndarray:
        """B for this rank's occupied orbitals i0:i1 (global) as (naux, i1−i0, nvir), a view."""
        lo, hi = self.occ_range(spin, self.comm.rank)
        if not lo <= i0 <= i1 <= hi:
            raise IndexError(f"occupied orbitals {i0}:{i1} are not on rank {self.comm.rank} ({lo}:{hi})")
        return self.arrays[spin][:, (i0 - lo) * nvir : (i1 - lo) * nvir].reshape(self.naux, i1 - i0, nvir)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


def build_shared_b(
    dfi: DFIntegrals,
    spins: list[SpinOrbitals],
    device: Device,
    aux_block: int,
    comm: Comm,
    progress: Progress | None = None,
) -> tuple[SharedB, dict[str, float]]:
    """B shared over ranks: each rank makes (P|ia) for its auxiliary shells, an all-to-all hands every rank
    all auxiliary rows of its occupied range, and the metric solve runs there. Returns the share and stage
    wall times (s): 'ao_to_mo' (including the all-to-all), 'metric'."""
    t0 = time.perf_counter()
    ao_loc = dfi.auxmol.ao_loc_nr()
    shells = weighted_split(np.diff(ao_loc), comm.size)
    rows = [int(ao_loc[s1] - ao_loc[s0]) for s0, s1 in shells]
    p_start = int(ao_loc[shells[comm.rank][0]])
    store = SharedB(dfi.naux, spins, device.storage_dtype, comm)
    half = [np.empty((rows[comm.rank], s.nocc * s.nvir), dtype=device.storage_dtype) for s in spins]
    nblocks = dfi.block_count(aux_block, shells[comm.rank])
    for k, (p0, p1, ao) in enumerate(dfi.ao_blocks(aux_block, packed=device.ao_packed, shells=shells[comm.rank])):
        for s, orb in enumerate(spins):
            half[s][p0 - p_start : p1 - p_start] = device.ao_to_mo(ao, orb.c_occ, orb.c_vir).reshape(p1 - p0, -1)
        check_stopped()
        if progress:
            progress("ao_to_mo", k + 1, nblocks)
    for s, orb in enumerate(spins):
        cols = [c * orb.nvir for c in store.counts[s]]
        store.arrays.append(comm.rows_to_cols(half[s], rows, cols, "ao_to_mo"))
        half[s] = None  # the auxiliary-row share is no longer needed
    t1 = time.perf_counter()
    for s in range(len(spins)):
        if store.arrays[s].shape[1]:
            store.arrays[s] = np.asarray(device.metric_solve(dfi.l_chol, store.arrays[s]), dtype=device.storage_dtype)
        if progress:
            progress("metric", s + 1, len(spins))
    return store, {"ao_to_mo": t1 - t0, "metric": time.perf_counter() - t1}


def disk_full(exc: BaseException) -> bool:
    """True for the errors a full disk raises (h5py reports ENOSPC inside its message)."""
    return isinstance(exc, OSError) and (exc.errno == errno.ENOSPC or "No space left" in str(exc))


@contextlib.contextmanager
def scratch_writes(what: str, nbytes: float):
    """A full disk while writing ``what`` becomes a ResourceError saying where and how much."""
    try:
        yield
    except OSError as exc:
        if not disk_full(exc):
            raise
        raise ResourceError(f"the scratch disk ({tempfile.gettempdir()}) is full while writing {what} "
                            f"({nbytes / 1e9:.2f} GB in all); free space there or point --scratch at a larger "
                            "disk (or raise --memory to keep it in memory)") from None


class EarlyIntegrals:
    """The MP2 step's fitting integrals made while the SCF's builds run on a device that computes off the
    host's cores (they depend on no orbitals): a thread (:class:`mp2trn.overlap.EarlyBlocks`, begun by
    :meth:`start` when the builds begin) makes the metric's factor, then the first ``blocks`` 3-index AO
    blocks of ``aux_block`` functions (:func:`plan_early_integrals`). :meth:`take` stops it and keeps what it
    made; the energy plans around those blocks and :func:`build_b` uses them first and makes the rest."""

    def __init__(self, mol, auxmol, aux, aux_block: int, packed: bool, blocks: int):
        self.dfi = DFIntegrals(mol, auxmol, aux, None)    # the factor: the thread's first job (or take()'s)
        self.aux_block = aux_block
        self.packed = packed
        self.ranges = self.dfi.shell_ranges(aux_block)
        dfi = self.dfi

        def factor() -> None:
            dfi.l_chol = metric_cholesky(auxmol, aux)

        makers = itertools.chain([factor], (lambda s0=s0, s1=s1: dfi.ao_block(s0, s1, packed)
                                            for s0, s1 in self.ranges[:blocks]))
        self.blocks = EarlyBlocks(makers, name="mp2trn-early-integrals", start=False)
        self.made: list[tuple[int, int, np.ndarray]] = []
        self.record: dict = {}

    def start(self) -> None:
        """Begin (the SCF's device builds are beginning)."""
        self.blocks.start()

    def take(self) -> float:
        """Stop the thread after the block it is making and keep the blocks made (:attr:`made`, in order; the
        metric's factor made now if the thread had not); the record says how many and the thread's seconds.
        Returns the MB they hold."""
        made = self.blocks.take()[1:]      # the factor's job returns nothing
        if self.dfi.l_chol is None:
            self.dfi.l_chol = metric_cholesky(self.dfi.auxmol, self.dfi.auxbasis)
        self.made = made
        mb = sum(a.nbytes for *_, a in made) / 1e6
        self.record = {"blocks": len(made), "of": len(self.ranges), "mb": round(mb, 1), "seconds": self.blocks.seconds}
        return mb

    @property
    def first_left(self) -> int:
        """The first fitting shell of the blocks not made."""
        return self.ranges[len(self.made) - 1][1] if self.made else 0

    def close(self) -> None:
        self.blocks.close()
        self.made = []

    def __enter__(self) -> "EarlyIntegrals":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def plan_early_integrals(mol, auxmol, itemsize: int, packed: bool, budget_mb: float) -> tuple[int, int]:
    """(AO block, blocks) of the MP2 step's 3-index integrals that may be made during the SCF within
    ``budget_mb``: as many of the first blocks of ``auxmol``'s fitting shells as fit
    :func:`mp2trn.memory.early_blocks_mb`'s room (planned with the all-electron orbital counts, both spins
    of an open shell) beside the metric's factor, blocks of half the plan's AO block (the blocks
    :func:`build_b` makes ahead of such a device); (0, 0) when the budget has no room."""
    nao, naux, shell = mol.nao_nr(), auxmol.nao_nr(), largest_shell(auxmol)
    spins = all_electron_shapes(nao, mol.nelec)
    room = early_blocks_mb(nao, naux, spins, shell, budget_mb, itemsize) * 1e6 - naux * naux * 8
    if room <= 0:
        return 0, 0
    aux_block = max(shell, plan_blocks(nao, naux, spins, shell, budget_mb, itemsize).aux_block // 2)
    dfi, loc = DFIntegrals(mol, auxmol, None, None), auxmol.ao_loc_nr()
    per_aux = dfi.per_aux(packed) * 8
    sizes = np.cumsum([(loc[s1] - loc[s0]) * per_aux for s0, s1 in dfi.shell_ranges(aux_block)])
    return aux_block, int(np.searchsorted(sizes, room, side="right"))


def prepare_early_integrals(mol, auxbasis, device: Device, budget_mb: float) -> EarlyIntegrals | None:
    """The MP2 step's integrals to make during the SCF (begun by :meth:`EarlyIntegrals.start`), where
    ``device`` computes off the host's cores (:func:`mp2trn.overlap.overlaps`) and the budget has room for
    blocks held until the energy (:func:`plan_early_integrals`); else None."""
    if not overlaps(device):
        return None
    auxmol, aux = make_auxmol(mol, auxbasis)
    aux_block, blocks = plan_early_integrals(mol, auxmol, device.storage_dtype.itemsize, device.ao_packed,
                                             budget_mb)
    return EarlyIntegrals(mol, auxmol, aux, aux_block, device.ao_packed, blocks) if blocks else None


def build_b(
    dfi: DFIntegrals,
    spins: list[SpinOrbitals],
    device: Device,
    plan: BlockPlan,
    store: BStore,
    progress: Progress | None = None,
    early: EarlyIntegrals | None = None,
    keep_rows: bool = False,
) -> dict[str, float]:
    """Fill ``store`` with B for every spin. Returns stage wall times (s): 'ao_to_mo', 'metric'.
    ``early``: 3-index blocks made during the SCF (their fitting integrals must be ``dfi``), taken first.
    ``keep_rows``: every block's 3-index integrals stay in ``dfi.rows`` (:meth:`DFIntegrals.keep_rows`) for the
    gradient's RI pass of the same run (the caller's budget holds them)."""
    with scratch_writes("the out-of-core B tensor", plan.b_tensor_mb * 1e6):
        return _build_b(dfi, spins, device, plan, store, progress, early, keep_rows)


def _handed_over(made: list):
    """The blocks of ``made`` in order, each dropped from the list as it is handed over (freed once used)."""
    while made:
        yield made.pop(0)


def _build_b(dfi, spins, device, plan, store, progress, early, keep_rows=False) -> dict[str, float]:
    t0 = time.perf_counter()
    # where the device computes off the host's cores, the next block's integrals are made while it transforms
    # this one (mp2trn.overlap): two blocks alive, each half the planned block so that both fit its room
    ahead = overlaps(device)
    aux_block = max(dfi.max_aux_shell, plan.aux_block // 2) if ahead else plan.aux_block
    made, first = [], 0
    if early is not None:   # taken (EarlyIntegrals.take) by the caller, who planned around them
        if early.dfi is not dfi or early.packed != device.ao_packed:
            raise ValueError("build_b: the early blocks are of other fitting integrals or layout")
        made, first, early.made = early.made, early.first_left, []
        aux_block = min(aux_block, early.aux_block)   # one block shape (one kernel signature) where it fits
    nshell = dfi.auxmol.nbas
    nblocks = len(made) + dfi.block_count(aux_block, (first, nshell))
    if keep_rows and early is not None:
        raise ValueError("build_b: kept rows are planned without blocks made during the SCF")
    rows = dfi.keep_rows(device.ao_packed) if keep_rows else None
    blocks = dfi.ao_blocks(aux_block, packed=device.ao_packed, shells=(first, nshell), buffers=2 if ahead else 1,
                           into=rows)
    rest = made_ahead(blocks) if ahead else blocks
    for k, (p0, p1, ao) in enumerate(itertools.chain(_handed_over(made), rest)):
        for s, orb in enumerate(spins):
            v = device.ao_to_mo(ao, orb.c_occ, orb.c_vir)
            store.arrays[s][p0:p1] = v.reshape(p1 - p0, -1)
        check_stopped()
        if progress:
            progress("ao_to_mo", k + 1, nblocks)
    t1 = time.perf_counter()
    for s, _orb in enumerate(spins):
        arr = store.arrays[s]
        if store.incore:
            arr[...] = device.metric_solve(dfi.l_chol, arr)
            if progress:
                progress("metric", s + 1, len(spins))
        else:
            ncol = arr.shape[1]
            step = max(1, plan.metric_cols)
            for c0 in range(0, ncol, step):
                c1 = min(ncol, c0 + step)
                arr[:, c0:c1] = device.metric_solve(dfi.l_chol, np.asarray(arr[:, c0:c1]))
                if progress:
                    progress("metric", c1, ncol)
    return {"ao_to_mo": t1 - t0, "metric": time.perf_counter() - t1}
