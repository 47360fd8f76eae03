"""On-chip memory accounting: SBUF bytes per partition and PSUM banks, per target generation.

Every SBUF/PSUM tensor created by ``nl.ndarray``/``zeros``/... is one :class:`Allocation`. Views
(slices, ``.reshape``, ``.ap``) share it. An allocation is *live* from creation until the last
``NkiTensor`` referring to it is garbage-collected (CPython reference counting frees a per-iteration
tile when the loop variable is rebound, so a tiled loop does not accumulate). Capacity is checked at
allocation time against the generation's limits:

* SBUF: the sum over live allocations of (free-size bytes per partition) must stay within
  ``nl.tile_size.total_available_sbuf_size`` (180224 B trn1, 212984 B trn2, 245752 B trn3).
* PSUM: 8 banks x 2 KiB per partition. An allocation takes ``ceil(bytes/2048)`` whole, consecutive banks
  starting at a bank boundary (first fit).

Exceeding either raises :class:`NkiCapacityError` listing the largest live allocations.
"""

from __future__ import annotations

import gc

import numpy as np

from .errors import NkiCapacityError

__all__ = ["Memory", "Allocation"]

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

    def __init__(self, target):
        self.target = target
        self.sbuf_live = 0
        self.sbuf_peak = 0
        self.psum_owner = [None] * target.psum_banks  # bank -> (uid, name, shape)
        self.psum_peak_banks = 0
        self.live = {}  # uid -> (buffer name, bytes/partition, name, shape)

    # -- SBUF ---------------------------------------------------------------------------------------
    def alloc_sbuf(self, alloc: Allocation, nbytes: int, inst: str):
        cap = self.target.sbuf_usable_bytes
        if self.sbuf_live + nbytes > cap:
            gc.collect()  # reference cycles may hold dead tiles
        if self.sbuf_live + nbytes > cap:
            raise NkiCapacityError(
                "capacity.sbuf", inst,
                f"allocating {nbytes} B/partition for '{alloc.name or 'tensor'}' would make live SBUF "
                f"{self.sbuf_live + nbytes} B/partition, over the {cap} B/partition available on "
                f"{self.target.name} (live: {self._describe('sbuf')})",
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
        else:
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
