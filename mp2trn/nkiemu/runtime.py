"""Per-launch emulator state: the active target, memory accounting and the instruction trace."""

from __future__ import annotations

import numpy as np

from .memory import Memory
from .targets import current_target

__all__ = ["Launch", "current", "set_current"]


class Launch:
    """State of one kernel launch (one program of an LNC grid at a time is active)."""

    __slots__ = ("target", "mems", "mem", "records", "program_id", "num_programs", "kernel_name",
                 "regs", "detached", "shared", "shared_idx")

    def __init__(self, target, kernel_name="<detached>", num_programs=1, detached=False, strict=False):
        self.target = target
        self.kernel_name = kernel_name
        self.num_programs = num_programs
        self.mems = [Memory(target, strict, clock=self._clock) for _ in range(num_programs)]
        for mem in self.mems:
            mem.track_accesses = not detached
        self.program_id = 0
        self.mem = self.mems[0]
        self.records = []
        self.regs = [np.zeros(target.partitions, np.float32) for _ in range(num_programs)]
        self.detached = detached
        self.shared = []      # shared_hbm tensors of program 0 (LNC: same allocation order -> same tensor)
        self.shared_idx = 0

    def _clock(self) -> int:
        return len(self.records)

    def set_program(self, pid: int):
        self.program_id = pid
        self.mem = self.mems[pid]
        self.shared_idx = 0

    def record(self, engine, name, params, reads, writes):
        """Append one instruction: ``reads``/``writes`` are the tensors (views) it touches; the record keeps
        their allocations' uids, and the memory of this program notes the SBUF byte ranges (for spills)."""
        t, mem = len(self.records), self.mem
        reads = tuple(mem.touch(x, t, False) for x in reads)
        writes = tuple(mem.touch(x, t, True) for x in writes)
        self.records.append((engine, name, params, reads, writes, self.program_id))
        if self.detached and len(self.records) > 100000:
            del self.records[:50000]

    @property
    def reduce_regs(self):
        return self.regs[self.program_id]


_current = [None]
_detached = {}


def current() -> Launch:
    """The running launch, or a detached one (ops used outside a kernel) for the current target."""
    cur = _current[0]
    if cur is not None:
        return cur
    t = current_target()
    d = _detached.get(t.name)
    if d is None:
        d = _detached[t.name] = Launch(t, detached=True)
    return d


def set_current(launch):
    prev = _current[0]
    _current[0] = launch
    return prev
