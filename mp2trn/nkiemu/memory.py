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

import numpy as np

from collections import defaultdict
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


@dataclass
class SpillResult:
    """Peak live SBUF by last use (bytes/partition) and the spill traffic it implies (total bytes)."""

    peak: int = 0
    capacity: int = 0
    save_bytes: int = 0
    reload_bytes: int = 0
    spill_events: int = 0
    spilled: list = field(default_factory=list)   # names of the tiles spilled at least once

    @property
    def over(self) -> int:
        return max(0, self.peak - self.capacity)


def spill_analysis(mem: "Memory", records, core: int = 0, psum: bool = False) -> SpillResult:
    """Replay a launch's SBUF tiles (or, ``psum``, its PSUM tiles in banks) with liveness from creation to
    last use; when the live size exceeds the capacity, evict the tiles (not used by the current
    instruction) whose next use is furthest, saving them (SBUF → HBM, PSUM → SBUF) if they hold data,
    and reload them before an instruction reads them again. Sizes are per partition (bytes, or banks
    for PSUM); the byte counts of the result are totals over partitions."""
    cap = mem.target.psum_banks if psum else mem.target.sbuf_usable_bytes
    unit = mem.target.psum_bank_bytes if psum else 1
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
    starts = defaultdict(list)
    for u, (start, *_rest) in iv.items():
        starts[start].append(u)
    used_at = defaultdict(list)
    for u, lst in uses.items():
        for t, reads in lst:
            used_at[t].append((u, reads))
    pos = {u: 0 for u in iv}
    resident, written, spilled = {}, set(), set()
    nbytes = {u: iv[u][1] for u in iv}
    total = {u: iv[u][1] * iv[u][2] * unit for u in iv}
    size = 0
    for t in sorted(set(starts) | set(used_at)):
        for u in starts.get(t, ()):
            resident[u] = True
            size += nbytes[u]
        needed = {u for u, _ in used_at.get(t, ())}
        for u, reads in used_at.get(t, ()):
            if u not in resident:                # refill before use (a pure write needs only the space)
                resident[u] = True
                size += nbytes[u]
                if reads and u in written:
                    res.reload_bytes += total[u]
                    res.spill_events += 1
        while size > cap:
            victims = [u for u in resident if u not in needed]
            if not victims:
                what = f"{size} PSUM banks" if psum else f"{size} B/partition of SBUF"
                raise NkiCapacityError(
                    "capacity.psum" if psum else "capacity.sbuf", f"instruction {t}",
                    f"the operands of one instruction need {what}, over the {cap} available on "
                    f"{mem.target.name}; no spill can help")
            far = max(victims, key=lambda v: _next_use(uses[v], pos[v], t))
            del resident[far]
            size -= nbytes[far]
            if far in written:
                res.save_bytes += total[far]
                res.spill_events += 1
            spilled.add(iv[far][3] or f"tile{far}")
        for u, reads in used_at.get(t, ()):
            if not reads:
                written.add(u)
            while pos[u] < len(uses[u]) and uses[u][pos[u]][0] <= t:
                pos[u] += 1
        for u in [u for u in resident if last[u] <= t]:
            del resident[u]
            size -= nbytes[u]
    res.spilled = sorted(spilled)
    return res


def _next_use(lst, p, t) -> float:
    while p < len(lst) and lst[p][0] <= t:
        p += 1
    return lst[p][0] if p < len(lst) else float("inf")
