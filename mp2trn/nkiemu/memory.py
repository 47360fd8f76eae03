"""On-chip memory accounting: SBUF bytes per partition and PSUM banks, per target generation.

Every SBUF/PSUM tensor created by ``nl.ndarray``/``zeros``/... is one :class:`Allocation`. Views
(slices, ``.reshape``, ``.ap``) share it.

* SBUF: an allocation is *live* from its creation to its last use by an instruction, as the compiler
  sees it. If the live bytes per partition exceed ``nl.tile_size.total_available_sbuf_size`` (180224 B
  trn1, 212984 B trn2, 245752 B trn3) the compiler inserts spills and refills to HBM
  (get-started/about/memory-hierarchy-overview.rst): :func:`spill_analysis` replays the launch with the
  furthest-next-use eviction rule, counts the bytes saved and reloaded (neuron-profile's
  ``spill_save_bytes`` / ``spill_reload_bytes``), the cost model prices them as DMA, and the launch
  warns (:class:`~.errors.NkiSpillWarning`). A single tile larger than a partition's SBUF, or the
  operands of one instruction not fitting together, are errors. **Strict mode** (``simulate(...,
  strict=True)``, used for mp2trn's own kernels, which must never spill) refuses at allocation time
  when the tiles still referenced exceed the capacity (:class:`NkiCapacityError`).
* PSUM: 8 banks x 2 KiB per partition. An allocation takes ``ceil(bytes/2048)`` whole, consecutive banks
  starting at a bank boundary (first fit), for as long as a Python reference to it exists. When none are
  free, strict mode refuses; the default lets the tile live outside the 8 banks and the same replay (in
  banks, by last use) counts the accumulators the compiler would move to SBUF and back.
"""

from __future__ import annotations

import gc
from bisect import bisect_left, bisect_right
from collections import defaultdict
from heapq import heappop, heappush

import numpy as np

from dataclasses import dataclass, field

from .errors import NkiCapacityError

__all__ = ["Memory", "Allocation", "SpillResult", "spill_analysis"]

_uid = [0]


def next_uid() -> int:
    _uid[0] += 1
    return _uid[0]


class Allocation:
    """Storage shared by a tensor and all its views."""

    __slots__ = ("uid", "buffer", "base", "mask", "mem", "nbytes", "bank0", "nbanks", "name",
                 "shape", "written", "orig", "__weakref__")

    def __init__(self, buffer, base: np.ndarray, name: str, mem=None, nbytes=0, bank0=-1, nbanks=0):
        self.uid = next_uid()
        self.buffer = buffer
        self.base = base
        self.mask = None          # PSUM: per-element "written by nc_matmul" flags (accumulate=None rule)
        self.mem = mem
        self.nbytes = nbytes      # bytes per partition (on-chip)
        self.bank0 = bank0
        self.nbanks = nbanks
        self.name = name
        self.shape = base.shape
        self.written = False
        self.orig = None          # kernel input array to write back to (HBM inputs)

    def __del__(self):
        mem = self.mem
        if mem is not None:
            self.mem = None
            try:
                mem.release(self)
            except Exception:  # pragma: no cover - interpreter shutdown
                pass


class Memory:
    """SBUF/PSUM accounting of one NeuronCore during one kernel launch."""

    def __init__(self, target, strict=False, clock=None):
        self.target = target
        self.strict = strict
        self.clock = clock or (lambda: 0)   # index of the next instruction record
        self.intervals = {}                 # uid -> (first record index, bytes/partition, partitions, name, shape)
        self.psum_intervals = {}            # the same for PSUM tiles, size in banks
        self.sbuf_live = 0
        self.sbuf_peak = 0
        self.psum_owner = [None] * target.psum_banks  # bank -> (uid, name, shape)
        self.psum_peak_banks = 0
        self.live = {}  # uid -> (buffer name, bytes/partition, name, shape)
        self.accesses = []                  # (record index, uid, first byte, end byte, write) of SBUF views
        self.track_accesses = True          # off for detached launches (ops outside a kernel)

    # -- instruction operands -------------------------------------------------------------------------
    def touch(self, tensor, t: int, write: bool) -> int:
        """The allocation uid of an instruction operand; for an SBUF tensor of this launch, note the bytes
        of a partition it addresses (record ``t``) for the spill replay."""
        alloc = tensor._alloc
        uid = alloc.uid
        if self.track_accesses and uid in self.intervals:
            lo, hi = _partition_byte_range(tensor._data, alloc)
            self.accesses.append((t, uid, lo, hi, write))
        return uid

    # -- SBUF ---------------------------------------------------------------------------------------
    def alloc_sbuf(self, alloc: Allocation, nbytes: int, inst: str):
        cap = self.target.sbuf_usable_bytes
        if nbytes > cap:
            raise NkiCapacityError(
                "capacity.sbuf_tile", inst,
                f"'{alloc.name or 'tensor'}' needs {nbytes} B/partition, more than the {cap} B/partition of SBUF "
                f"on {self.target.name}: no spill can hold one tile larger than a partition", {"new": alloc.shape})
        self.intervals[alloc.uid] = (self.clock(), nbytes, alloc.shape[0], alloc.name, alloc.shape)
        if self.strict and self.sbuf_live + nbytes > cap:
            gc.collect()  # reference cycles may hold dead tiles
        if self.strict and self.sbuf_live + nbytes > cap:
            raise NkiCapacityError(
                "capacity.sbuf", inst,
                f"allocating {nbytes} B/partition for '{alloc.name or 'tensor'}' would make live SBUF "
                f"{self.sbuf_live + nbytes} B/partition, over the {cap} B/partition available on "
                f"{self.target.name} (live: {self._describe('sbuf')}; strict mode: the compiler would spill)",
                {"new": alloc.shape})
        self.sbuf_live += nbytes
        if self.sbuf_live > self.sbuf_peak:
            self.sbuf_peak = self.sbuf_live
        alloc.mem = self
        alloc.nbytes = nbytes
        self.live[alloc.uid] = ("sbuf", nbytes, alloc.name, alloc.shape)

    # -- PSUM ---------------------------------------------------------------------------------------
    def alloc_psum(self, alloc: Allocation, nbytes: int, inst: str, bank=None):
        t = self.target
        nb = max(1, -(-nbytes // t.psum_bank_bytes))
        if nb > t.psum_banks:
            raise NkiCapacityError(
                "capacity.psum", inst,
                f"'{alloc.name or 'tensor'}' needs {nbytes} B/partition = {nb} PSUM banks, more than the "
                f"{t.psum_banks} x {t.psum_bank_bytes} B banks per partition", {"new": alloc.shape})
        start = self._find_banks(nb, bank)
        if start is None:
            gc.collect()
            start = self._find_banks(nb, bank)
        self.psum_intervals[alloc.uid] = (self.clock(), nb, alloc.shape[0], alloc.name, alloc.shape)
        if start is None and bank is None and not self.strict:
            # over the 8 banks while Python still holds older tiles: the compiler would spill (its
            # liveness ends at the last use); the launch replays that afterwards (spill_analysis)
            alloc.mem = self
            alloc.nbytes = nbytes
            alloc.bank0, alloc.nbanks = -1, nb
            self.live[alloc.uid] = ("psum", nbytes, alloc.name, alloc.shape)
            return
        if start is None:
            where = f"at bank {bank}" if bank is not None else "anywhere"
            raise NkiCapacityError(
                "capacity.psum", inst,
                f"no {nb} free consecutive PSUM bank(s) {where} for '{alloc.name or 'tensor'}' "
                f"({nbytes} B/partition); {self.psum_banks_used()}/{t.psum_banks} banks live: "
                f"{self._describe('psum')}", {"new": alloc.shape})
        for b in range(start, start + nb):
            self.psum_owner[b] = alloc.uid
        used = self.psum_banks_used()
        if used > self.psum_peak_banks:
            self.psum_peak_banks = used
        alloc.mem = self
        alloc.nbytes = nbytes
        alloc.bank0 = start
        alloc.nbanks = nb
        self.live[alloc.uid] = ("psum", nbytes, alloc.name, alloc.shape)

    def _find_banks(self, nb, bank):
        own = self.psum_owner
        starts = [bank] if bank is not None else range(0, len(own) - nb + 1)
        for s in starts:
            if s + nb <= len(own) and all(own[b] is None for b in range(s, s + nb)):
                return s
        return None

    def psum_banks_used(self) -> int:
        return sum(1 for o in self.psum_owner if o is not None)

    # -- release --------------------------------------------------------------------------------------
    def release(self, alloc: Allocation):
        info = self.live.pop(alloc.uid, None)
        if info is None:
            return
        if info[0] == "sbuf":
            self.sbuf_live -= info[1]
        elif alloc.bank0 >= 0:
            for b in range(alloc.bank0, alloc.bank0 + alloc.nbanks):
                if self.psum_owner[b] == alloc.uid:
                    self.psum_owner[b] = None

    def _describe(self, kind: str, n: int = 5) -> str:
        items = sorted((v for v in self.live.values() if v[0] == kind), key=lambda v: -v[1])
        if not items:
            return "none"
        s = ", ".join(f"{name or '?'}{tuple(shape)}={nb}B" for _, nb, name, shape in items[:n])
        if len(items) > n:
            s += f", ... {len(items) - n} more"
        return s

    @property
    def psum_peak_bytes(self) -> int:
        return self.psum_peak_banks * self.target.psum_bank_bytes


def _partition_byte_range(view: np.ndarray, alloc: Allocation) -> tuple[int, int]:
    """[first, end) byte offsets within one partition that ``view`` of ``alloc`` covers; the whole
    partition when the view does not keep partitions on its axis 0."""
    whole = (0, alloc.nbytes)
    base = alloc.base
    if view.ndim == 0 or base.ndim == 0 or view.size == 0:
        return whole
    row = base.strides[0]
    off = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    if (row <= 0 or (view.shape[0] > 1 and view.strides[0] % row)
            or any(st < 0 and n > 1 for n, st in zip(view.shape[1:], view.strides[1:]))):
        return whole
    lo = off % row
    hi = lo + view.itemsize + sum((n - 1) * st for n, st in zip(view.shape[1:], view.strides[1:]) if n > 1)
    return (lo, hi) if hi <= row else whole


@dataclass
class SpillResult:
    """Peak live SBUF by last use (bytes/partition) and the spill traffic it implies (total bytes).

    ``transfers``: the spill DMAs in program order, ``(record index, "save" | "reload", total bytes,
    partitions, allocation uid)`` — a save runs when the piece is evicted (before the instruction at that
    index), a reload before the instruction that reads the piece again."""

    peak: int = 0
    capacity: int = 0
    save_bytes: int = 0
    reload_bytes: int = 0
    spill_events: int = 0
    spilled: list = field(default_factory=list)   # names of the tiles spilled at least once
    transfers: list = field(default_factory=list)

    @property
    def over(self) -> int:
        return max(0, self.peak - self.capacity)


def spill_analysis(mem: "Memory", records, core: int = 0, psum: bool = False) -> SpillResult:
    """Replay a launch's SBUF tiles (or, ``psum``, its PSUM tiles in banks) with liveness from creation to
    last use; when the live size exceeds the capacity, evict what the current instruction does not touch
    and is used again furthest in the future, saving it (SBUF → HBM, PSUM → SBUF) if it holds data, and
    reload it before an instruction reads it again. SBUF is replayed in *pieces*: the byte ranges of a
    partition that the kernel's instructions address (an accumulator tile of which one instruction
    touches a 2 KiB column block spills that block, not the whole tile); PSUM in whole tiles (banks).
    Sizes are per partition (bytes, or banks for PSUM); the byte counts of the result are totals over
    partitions."""
    cap = mem.target.psum_banks if psum else mem.target.sbuf_usable_bytes
    iv = mem.psum_intervals if psum else mem.intervals
    uses = defaultdict(list)                     # uid -> [(t, reads)]
    for t, rec in enumerate(records):
        if rec[5] != core:
            continue
        for u in rec[3]:
            if u in iv:
                uses[u].append((t, True))
        for u in rec[4]:
            if u in iv:
                uses[u].append((t, False))
    iv = {u: v for u, v in iv.items() if uses[u]}   # a tile no instruction touches is dropped by the compiler
    last = {u: max([iv[u][0]] + [t for t, _ in uses[u]]) for u in iv}
    delta = defaultdict(int)
    for u, (start, nb, *_rest) in iv.items():
        delta[start] += nb
        delta[last[u] + 1] -= nb
    peak = live = 0
    for t in sorted(delta):
        live += delta[t]
        peak = max(peak, live)
    res = SpillResult(peak=peak, capacity=cap)
    if peak <= cap:
        return res
    if psum:
        unit = mem.target.psum_bank_bytes
        pieces = {u: (u, iv[u][0], last[u], iv[u][1], iv[u][1] * iv[u][2] * unit) for u in iv}
        piece_uses = {u: uses[u] for u in iv}
    else:
        pieces, piece_uses = _sbuf_pieces(mem, iv, last, uses)
    loads = set() if psum else {t for t, rec in enumerate(records)
                                if rec[5] == core and rec[0] == "dma" and rec[2][3] == "hbm"}
    _replay(pieces, piece_uses, cap, res, mem.target.name, psum, loads)
    res.spilled = sorted({iv[pieces[k][0]][3] or f"tile{pieces[k][0]}" for k in res.spilled})
    return res


def _sbuf_pieces(mem, iv, last, uses):
    """Cut every SBUF allocation at the byte offsets (within a partition) its accesses start and end at.
    Returns ``{piece: (uid, start, last, bytes/partition, total bytes)}`` and ``{piece: [(t, reads)]}``;
    a piece lives as long as its allocation."""
    ranges = defaultdict(list)                   # uid -> [(t, lo, hi, reads)]
    for t, u, lo, hi, write in mem.accesses:
        if u in iv:
            ranges[u].append((t, lo, hi, not write))
    pieces, piece_uses = {}, {}
    for u, (start, nbytes, parts, *_rest) in iv.items():
        acc = ranges.get(u) or [(t, 0, nbytes, r) for t, r in uses[u]]
        cuts = sorted({0, nbytes} | {c for _, lo, hi, _ in acc for c in (lo, hi) if 0 < c < nbytes})
        for k in range(len(cuts) - 1):
            width = cuts[k + 1] - cuts[k]
            pieces[(u, k)] = (u, start, last[u], width, width * parts)
            piece_uses[(u, k)] = []
        for t, lo, hi, reads in acc:
            for k in range(bisect_right(cuts, lo) - 1, bisect_left(cuts, hi)):
                piece_uses[(u, k)].append((t, reads))
    for key in [k for k, v in piece_uses.items() if not v]:
        del piece_uses[key], pieces[key]
    for v in piece_uses.values():
        v.sort(key=lambda e: (e[0], not e[1]))   # within one instruction: its reads before its writes
    return pieces, piece_uses


def _replay(pieces, uses, cap, res: SpillResult, target_name: str, psum: bool, loads=frozenset()) -> None:
    """Furthest-next-use replay of ``pieces`` (see :func:`_sbuf_pieces`) under ``cap``; fills ``res``.

    ``loads``: the record indices of DMAs from HBM. A piece such a DMA wrote last is a copy of HBM data:
    evicting it saves nothing, and its refill reads the same HBM source again (the compiler re-issues the
    load instead of spilling)."""
    starts, used_at = defaultdict(list), defaultdict(list)
    for k, (_u, start, *_rest) in pieces.items():
        starts[start].append(k)
    for k, lst in uses.items():
        for t, reads in lst:
            used_at[t].append((k, reads))
    pos = {k: 0 for k in pieces}
    expiry: list = []                              # heap of (last use, piece)
    resident, written, dirty, spilled = {}, set(), set(), set()
    size = 0
    for t in sorted(set(starts) | set(used_at)):
        for k in starts.get(t, ()):
            resident[k] = True
            size += pieces[k][3]
            heappush(expiry, (pieces[k][2], k))
        needed = {k for k, _ in used_at.get(t, ())}
        for k, reads in used_at.get(t, ()):
            if k not in resident:                 # refill before use (a pure write needs only the space)
                resident[k] = True
                size += pieces[k][3]
                if reads and k in written:
                    _transfer(res, t, "reload", pieces[k])
        while size > cap:
            victims = [k for k in resident if k not in needed]
            if not victims:
                what = f"{size} PSUM banks" if psum else f"{size} B/partition of SBUF"
                raise NkiCapacityError(
                    "capacity.psum" if psum else "capacity.sbuf", f"instruction {t}",
                    f"the operands of one instruction need {what}, over the {cap} available on "
                    f"{target_name}; no spill can help")
            far = max(victims, key=lambda v: _next_use(uses[v], pos[v], t))
            del resident[far]
            size -= pieces[far][3]
            if far in dirty:
                _transfer(res, t, "save", pieces[far])
                dirty.discard(far)
            spilled.add(far)
        for k, reads in used_at.get(t, ()):
            if not reads:
                written.add(k)
                if t in loads:
                    dirty.discard(k)
                else:
                    dirty.add(k)
            lst = uses[k]
            while pos[k] < len(lst) and lst[pos[k]][0] <= t:
                pos[k] += 1
        while expiry and expiry[0][0] <= t:
            k = heappop(expiry)[1]
            if resident.pop(k, None):
                size -= pieces[k][3]
    res.spilled = sorted(spilled)


def _transfer(res: SpillResult, t: int, kind: str, piece) -> None:
    uid, _start, _last, width, total = piece
    if kind == "save":
        res.save_bytes += total
    else:
        res.reload_bytes += total
    res.spill_events += 1
    res.transfers.append((t, kind, total, total // width if width else 1, uid))


def _next_use(lst, p, t) -> float:
    while p < len(lst) and lst[p][0] <= t:
        p += 1
    return lst[p][0] if p < len(lst) else float("inf")
