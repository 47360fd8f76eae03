"""The emulator's cost MODEL: per-engine busy time, modeled kernel time, FLOPs, % of TensorE peak.

Every instruction a kernel executes is recorded once, with the *inputs* of its cost formula (elements
per partition, operand sizes, dtype class, bytes), not with a price. A :class:`CostReport` prices the
records for a target generation, so one emulated run can be priced for trn1 and trn2
(``report.priced_for("trn1")``). Formulas are the "estimated instruction cost" of the NKI ISA
documentation (the "Estimated instruction cost" notes of the NKI ISA stubs, aws-neuron-sdk nki/api/nki/isa/__init__.py); clocks and DMA bandwidths per generation are in :mod:`.targets`. Every
assumption is listed in docs/emulator.md. This is a model, not a measurement.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import dataclass

from .targets import ENGINES, Target, get_target

__all__ = ["CostParams", "LaunchTrace", "CostReport", "Profile", "default_params", "set_cost_params",
           "instruction_seconds"]


@dataclass(frozen=True)
class CostParams:
    """Tunable constants of the cost model (see docs/emulator.md, "Cost model assumptions")."""

    min_ii: int = 64                 # MIN_II: minimum instruction initiation interval (engine cycles)
    gpsimd_start: int = 150          # GpSimd fixed start cost for iota/affine_select (cycles)
    #: queue time per dma_copy beyond its bytes: the docs publish none — a 32 KiB transfer on one queue
    #: lasts 1416 ns = its bytes at 23 B/ns (nki/get-started/about/nki-dma-overview.rst, trn2)
    dma_fixed_s: float = 0.0
    #: delay before a dma_copy's data moves: "~1300 ns" semaphore-to-start latency
    #: (nki/deep-dives/nki-dma-bandwidth-guide.rst) plus "about 600 ns" per DGE-based DMA instruction
    #: (nki/guides/architecture/trainium2_arch.rst); overlapped across outstanding transfers, so it enters
    #: the dependency schedule, not the queues' busy time
    dma_latency_s: float = 1.9e-6
    #: an instruction on the Vector/Scalar/GpSimd engine that reads the previous instruction's output on the
    #: same engine pays "a static instruction overhead of 100 engine cycles" plus the ~60-cycle "tensor
    #: access overhead" (nki/guides/architecture/trainium_inferentia2_arch.rst, VectorE cost model and
    #: "Tensor access overhead"): it cannot overlap its start with the previous instruction
    dependent_static_cycles: int = 100
    access_overhead_cycles: int = 60
    dma_partitions_per_queue: int = 8  # one DMA queue (engine) serves 8 partitions of a transfer
    #: queue time per DMA descriptor; None: the target's figure (:attr:`.targets.Target.dma_descriptor_s`)
    dma_descriptor_s: float | None = None
    launch_overhead_s: float = 15e-6  # fixed cost per kernel launch, seconds
    #: fixed cost per collective: "the latency term is of 10^0 to 10^1 us magnitude", per-hop 1-2 us
    #: (neuron-runtime/explore/intranode-collective-comm.rst); the upper end, for a ring over several chips
    collective_latency_s: float = 10e-6

    def replace(self, **kw) -> "CostParams":
        return dataclasses.replace(self, **kw)


_params = [CostParams()]


def default_params() -> CostParams:
    return _params[0]


def set_cost_params(params: CostParams | None = None, **kw) -> CostParams:
    """Replace the default cost parameters (e.g. ``set_cost_params(launch_overhead_s=50e-6)``)."""
    base = params if params is not None else _params[0]
    _params[0] = base.replace(**kw) if kw else base
    return _params[0]


def _queues(P: int, target: Target, prm: CostParams) -> int:
    return max(1, min(target.dma_queues, -(-P // prm.dma_partitions_per_queue)))


def instruction_seconds(engine: str, params: tuple, target: Target, prm: CostParams) -> float:
    """Duration (seconds) of one recorded instruction on ``target`` (the ISA docs' estimated-cost formulas)."""
    kind = params[0]
    m = prm.min_ii
    if kind == "dma":  # ("dma", bytes, partitions, source, destination[, descriptors])
        nbytes, P = params[1], params[2]
        q = _queues(P, target, prm)
        per_descriptor = target.dma_descriptor_s if prm.dma_descriptor_s is None else prm.dma_descriptor_s
        descriptors = params[5] if len(params) > 5 else 0
        return prm.dma_fixed_s + -(-descriptors // q) * per_descriptor + nbytes / (q * target.dma_queue_bw)
    if kind == "cc":  # ("cc", bytes this rank sends): collectives, over the rank's share of the links
        return prm.collective_latency_s + params[1] / target.link_bw
    if kind == "mm":  # ("mm", K, M, N, fp32, onezero)
        c = max(min(64, params[2]), params[3])
        if params[4]:
            c *= 2 if params[5] else 4
    elif kind == "mmx":  # ("mmx", K, M, N): MX matmul, the cycles of a bf16 tile of the same code shape
        c = max(min(64, params[2]), params[3])
    elif kind == "pet":  # TensorE transpose ("pet", P, F)
        c = max(params[1], min(64, params[2]))
    elif kind == "simple":  # ("simple", N, perfdiv(v3+ VectorE), alwaysdiv)
        n = params[1] / params[3]
        if params[2] > 1 and engine == "vector" and target.vector_bf16_perf_mode:
            n = n / params[2]
        c = max(m, n)
    elif kind == "tt":  # ("tt", N, cheap, perfdiv)
        n = params[1] if params[2] else 2 * params[1]
        if params[3] > 1 and target.vector_bf16_perf_mode and not params[2]:
            n = n / params[3]
        c = max(m, n)
    elif kind == "act":  # ("act", N, n_extra)
        c = max(m, params[1]) + params[2] * m
    elif kind == "red":  # ("red", N, half)
        c = max(1, params[1] / 2 if params[2] else params[1])
    elif kind == "recip":
        c = max(m, 8 * params[1])
    elif kind == "gp":
        c = prm.gpsimd_start + params[1]
    else:  # pragma: no cover
        raise ValueError(f"unknown cost kind {kind}")
    return c / target.clock_hz[engine]


class LaunchTrace:
    """What one kernel launch executed (target-independent)."""

    __slots__ = ("kernel", "target", "records", "grid", "peak_sbuf_bytes", "peak_psum_banks", "wall_s",
                 "spill_save_bytes", "spill_reload_bytes", "spill_events", "psum_spill_bytes", "psum_spill_events",
                 "spill_transfers")

    def __init__(self, kernel, target, records, grid=1, peak_sbuf_bytes=0, peak_psum_banks=0, wall_s=0.0,
                 spill_save_bytes=0, spill_reload_bytes=0, spill_events=0, psum_spill_bytes=0, psum_spill_events=0,
                 spill_transfers=()):
        #: the SBUF spill DMAs, (record index, "save" | "reload", bytes, partitions, uid, core), in order
        self.spill_transfers = tuple(spill_transfers)
        self.spill_save_bytes = spill_save_bytes        # modeled compiler spills (memory.spill_analysis)
        self.spill_reload_bytes = spill_reload_bytes
        self.spill_events = spill_events
        self.psum_spill_bytes = psum_spill_bytes        # PSUM accumulators moved to SBUF and back
        self.psum_spill_events = psum_spill_events
        self.kernel = kernel
        self.target = target
        self.records = records
        self.grid = grid
        self.peak_sbuf_bytes = peak_sbuf_bytes
        self.peak_psum_banks = peak_psum_banks
        self.wall_s = wall_s


#: engines whose dependent back-to-back instructions pay the static and tensor-access overheads
_CHAINED_ENGINES = ("vector", "scalar", "gpsimd")


def _ekey(engine, core):
    return engine if core == 0 else f"{engine}.{core}"


def _on_queues(qs: list, q: int, ready_s: float, d: float) -> tuple[float, float]:
    """Start and end of a transfer of ``d`` seconds on the ``q`` earliest-free of the queues ``qs``."""
    qs.sort()
    t0 = max(ready_s, qs[q - 1])
    t1 = t0 + d
    for i in range(q):
        qs[i] = t1
    return t0, t1


def _price_launch(tr: LaunchTrace, target: Target, prm: CostParams, timeline=False):
    """Busy seconds per engine, max/sum/scheduled time of one launch (+ optional timeline).

    SBUF spills are DMA transfers on the same queues as the kernel's own: a save starts when the evicted
    piece was last written, a reload after its save (SBUF reuse, a write-after-read hazard, is not
    tracked, as for the kernel's own instructions); the instruction at the spill's record index waits for
    both (the freed space, the reloaded data)."""
    cache = {}
    busy = defaultdict(float)
    nq = target.dma_queues
    ready = {}
    free = defaultdict(float)
    qfree = defaultdict(lambda: [0.0] * nq)
    last_writes: dict = {}
    saved: dict = {}
    chained = prm.dependent_static_cycles + prm.access_overhead_cycles
    tl = [] if timeline else None
    end_all = 0.0
    spills = tr.spill_transfers
    si = 0
    for i, (engine, name, params, reads, writes, core) in enumerate(tr.records):
        gate = 0.0
        while si < len(spills) and spills[si][0] <= i:
            _t, kind, nbytes, parts, uid, score = spills[si]
            si += 1
            sparams = ("dma", nbytes, parts, "sbuf", "hbm", parts)   # one descriptor per partition
            d = instruction_seconds("dma", sparams, target, prm)
            q = _queues(parts, target, prm)
            busy[_ekey("dma", score)] += d * q / nq
            # a save follows the piece's last write; a refill its save, or (a clean copy of HBM data, never
            # saved) that last write
            after = ready.get(uid, 0.0) if kind == "save" else saved.get(uid, ready.get(uid, 0.0))
            t0, t1 = _on_queues(qfree[score], q, after + prm.dma_latency_s, d)
            if kind == "save":
                saved[uid] = t1
            elif t1 > ready.get(uid, 0.0):
                ready[uid] = t1
            if score == core and t1 > gate:
                gate = t1
            if t1 > end_all:
                end_all = t1
            if tl is not None:
                tl.append((_ekey("dma", score), f"spill {kind}", t0, t1))
        key = (engine, params)
        d = cache.get(key)
        if d is None:
            d = cache[key] = instruction_seconds(engine, params, target, prm)
        ek = _ekey(engine, core)
        if engine in _CHAINED_ENGINES:
            prev = last_writes.get(ek)
            if prev and any(u in prev for u in reads):
                d += chained / target.clock_hz[engine]
            last_writes[ek] = writes
        dep = gate
        for u in reads:
            r = ready.get(u)
            if r is not None and r > dep:
                dep = r
        for u in writes:
            r = ready.get(u)
            if r is not None and r > dep:
                dep = r
        if engine == "dma":
            q = _queues(params[2], target, prm)
            busy[ek] += d * q / nq
            t0, t1 = _on_queues(qfree[core], q, dep + prm.dma_latency_s, d)
        else:
            busy[ek] += d
            t0 = max(dep, free[ek])
            t1 = free[ek] = t0 + d
        for u in writes:
            ready[u] = t1
        if t1 > end_all:
            end_all = t1
        if tl is not None:
            tl.append((ek, name, t0, t1))
    if tr.psum_spill_bytes:  # PSUM <-> SBUF copies on the Vector Engine: max(MIN_II, elements/partition) each
        per_event = tr.psum_spill_bytes / max(tr.psum_spill_events, 1) / 4 / 128
        d = tr.psum_spill_events * max(prm.min_ii, per_event) / target.clock_hz["vector"]
        busy["vector"] += d
        end_all += d
    return dict(busy), end_all, tl


class CostReport:
    """Cost-model report of one or more kernel launches, priced for one target generation.

    ``kind == "model"``: all times are modeled from instruction counts and documented per-instruction
    cycle formulas, never measured.
    """

    kind = "model"

    def __init__(self, launches, target=None, params: CostParams | None = None):
        self.launches = list(launches)
        if target is None:
            names = {tr.target for tr in self.launches}
            target = names.pop() if len(names) == 1 else "trn2"
        self.target = get_target(target)
        self.params = params or default_params()
        self._priced = None

    # -- pricing ------------------------------------------------------------------------------------
    def priced_for(self, target, params: CostParams | None = None, **overrides) -> "CostReport":
        """The same launches priced for another generation and/or other cost parameters."""
        prm = (params or self.params)
        if overrides:
            prm = prm.replace(**overrides)
        return CostReport(self.launches, target, prm)

    def _price(self):
        if self._priced is None:
            per = []
            for tr in self.launches:
                busy, sched, _ = _price_launch(tr, self.target, self.params)
                per.append((busy, sched))
            self._priced = per
        return self._priced

    def __add__(self, other: "CostReport") -> "CostReport":
        return CostReport(self.launches + other.launches, self.target, self.params)

    # -- aggregate numbers --------------------------------------------------------------------------
    @property
    def n_launches(self) -> int:
        return len(self.launches)

    @property
    def engine_busy_s(self) -> dict:
        out = defaultdict(float)
        for busy, _ in self._price():
            for k, v in busy.items():
                out[k] += v
        return {k: out[k] for k in sorted(out, key=_engine_order)}

    @property
    def launch_overhead_s(self) -> float:
        return self.params.launch_overhead_s * len(self.launches)

    @property
    def modeled_time_s(self) -> float:
        """Engines overlap: sum over launches of (max over engines of busy time + launch overhead)."""
        return sum((max(b.values()) if b else 0.0) for b, _ in self._price()) + self.launch_overhead_s

    @property
    def pessimistic_time_s(self) -> float:
        """No overlap at all: sum of all engines' busy time, every DMA's latency and the launch overheads."""
        n_dma = sum(1 for tr in self.launches for rec in tr.records if rec[0] == "dma")
        return (sum(sum(b.values()) for b, _ in self._price()) + n_dma * self.params.dma_latency_s
                + self.launch_overhead_s)

    @property
    def scheduled_time_s(self) -> float:
        """In-order-per-engine list schedule with read-after-write/write-after-write dependencies."""
        return sum(s for _, s in self._price()) + self.launch_overhead_s

    @property
    def bottleneck(self) -> str:
        busy = self.engine_busy_s
        return max(busy, key=busy.get) if busy else ""

    @property
    def flops(self) -> int:
        f = 0
        for tr in self.launches:
            for rec in tr.records:
                p = rec[2]
                if p[0] == "mm":
                    f += 2 * p[1] * p[2] * p[3]
                elif p[0] == "mmx":   # four contraction elements per packed element
                    f += 8 * p[1] * p[2] * p[3]
        return f

    def tensor_peak_pct(self, dtype: str = "bf16", time: str = "modeled") -> float:
        """Achieved matmul FLOP/s over the target's TensorE peak for ``dtype`` ("fp32" or "bf16"), %."""
        t = {"modeled": self.modeled_time_s, "scheduled": self.scheduled_time_s,
             "pessimistic": self.pessimistic_time_s}[time]
        if t <= 0:
            return 0.0
        return 100.0 * self.flops / t / self.target.peak_flops[dtype]

    @property
    def instruction_counts(self) -> dict:
        """{engine: {instruction name: count}}."""
        out = defaultdict(lambda: defaultdict(int))
        for tr in self.launches:
            for engine, name, _, _, _, core in tr.records:
                out[_ekey(engine, core)][name] += 1
        return {e: dict(sorted(out[e].items())) for e in sorted(out, key=_engine_order)}

    @property
    def n_instructions(self) -> int:
        return sum(len(tr.records) for tr in self.launches)

    def _dma_bytes(self):
        h2s = s2h = other = 0
        for tr in self.launches:
            for rec in tr.records:
                p = rec[2]
                if p[0] == "dma":
                    if p[3] == "hbm" and p[4] == "sbuf":
                        h2s += p[1]
                    elif p[3] == "sbuf" and p[4] == "hbm":
                        s2h += p[1]
                    else:
                        other += p[1]
        return h2s, s2h, other

    @property
    def bytes_hbm_to_sbuf(self) -> int:
        return self._dma_bytes()[0]

    @property
    def bytes_sbuf_to_hbm(self) -> int:
        return self._dma_bytes()[1]

    @property
    def peak_sbuf_bytes(self) -> int:
        """Peak live SBUF bytes per partition (max over launches)."""
        return max((tr.peak_sbuf_bytes for tr in self.launches), default=0)

    @property
    def spill_save_bytes(self) -> int:
        """Bytes the compiler would save from SBUF to HBM (modeled spills; neuron-profile's spill_save_bytes)."""
        return sum(tr.spill_save_bytes for tr in self.launches)

    @property
    def spill_reload_bytes(self) -> int:
        """Bytes reloaded from HBM into SBUF after spills (neuron-profile's spill_reload_bytes)."""
        return sum(tr.spill_reload_bytes for tr in self.launches)

    @property
    def peak_psum_bytes(self) -> int:
        return max((tr.peak_psum_banks for tr in self.launches), default=0) * self.target.psum_bank_bytes

    @property
    def emulation_wall_s(self) -> float:
        return sum(tr.wall_s for tr in self.launches)

    def per_kernel(self) -> dict:
        """{kernel name: {launches, modeled_time_s, engine_busy_s}} breakdown."""
        out = {}
        for tr, (busy, sched) in zip(self.launches, self._price()):
            k = out.setdefault(tr.kernel, {"launches": 0, "modeled_time_s": 0.0, "scheduled_time_s": 0.0,
                                           "engine_busy_s": defaultdict(float)})
            k["launches"] += 1
            k["modeled_time_s"] += (max(busy.values()) if busy else 0.0) + self.params.launch_overhead_s
            k["scheduled_time_s"] += sched + self.params.launch_overhead_s
            for e, v in busy.items():
                k["engine_busy_s"][e] += v
        for k in out.values():
            k["engine_busy_s"] = dict(k["engine_busy_s"])
        return out

    def timeline(self):
        """[(launch, engine, instruction, start_s, end_s)] of the list schedule (launches back to back)."""
        out = []
        t = 0.0
        for i, tr in enumerate(self.launches):
            _, sched, tl = _price_launch(tr, self.target, self.params, timeline=True)
            t += self.params.launch_overhead_s
            out.extend((i, e, n, t + a, t + b) for e, n, a, b in tl)
            t += sched
        return out

    # -- output ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        h2s, s2h, other = self._dma_bytes()
        return {
            "kind": "model",
            "note": "modeled from per-instruction cycle formulas (NKI ISA docs) and engine clocks; not measured",
            "target": self.target.name,
            "core": self.target.core,
            "kernels": sorted({tr.kernel for tr in self.launches}),
            "launches": self.n_launches,
            "instructions": self.n_instructions,
            "instruction_counts": self.instruction_counts,
            "engine_busy_s": self.engine_busy_s,
            "launch_overhead_s": self.launch_overhead_s,
            "modeled_time_s": self.modeled_time_s,
            "scheduled_time_s": self.scheduled_time_s,
            "pessimistic_time_s": self.pessimistic_time_s,
            "bottleneck": self.bottleneck,
            "flops": self.flops,
            "tensor_peak_pct": {"fp32": self.tensor_peak_pct("fp32"), "bf16": self.tensor_peak_pct("bf16")},
            "bytes_hbm_to_sbuf": h2s,
            "bytes_sbuf_to_hbm": s2h,
            "bytes_dma_other": other,
            "peak_sbuf_bytes_per_partition": self.peak_sbuf_bytes,
            "spill_save_bytes": self.spill_save_bytes,
            "spill_reload_bytes": self.spill_reload_bytes,
            "sbuf_capacity_bytes_per_partition": self.target.sbuf_usable_bytes,
            "peak_psum_bytes_per_partition": self.peak_psum_bytes,
            "per_kernel": self.per_kernel(),
            "params": dataclasses.asdict(self.params),
            "emulation_wall_s": self.emulation_wall_s,
        }

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)

    def table(self) -> str:
        """Plain-text table (a header line says this is a MODEL)."""
        d = self.to_dict()
        kern = ", ".join(d["kernels"])
        lines = [
            f"NKI emulator cost MODEL (not a measurement) - {kern} on {self.target.name} ({self.target.core}), "
            f"{d['launches']} launch(es), {d['instructions']} instructions",
            f"{'engine':<10} {'instr':>8} {'busy (us)':>12} {'% of modeled':>13}",
        ]
        mt = d["modeled_time_s"]
        counts = d["instruction_counts"]
        for e, b in d["engine_busy_s"].items():
            n = sum(counts.get(e, {}).values())
            lines.append(f"{e:<10} {n:>8} {b * 1e6:>12.2f} {100 * b / mt if mt else 0:>12.1f}%")
        lines += [
            f"modeled time   (max over engines + launch): {mt * 1e6:12.2f} us   [bottleneck: {d['bottleneck']}]",
            f"scheduled time (dependency list schedule):  {d['scheduled_time_s'] * 1e6:12.2f} us",
            f"pessimistic    (sum over engines + launch): {d['pessimistic_time_s'] * 1e6:12.2f} us",
            f"launch overhead: {d['launch_overhead_s'] * 1e6:.2f} us",
            f"matmul FLOPs: {d['flops']:.4g}   TensorE peak: {d['tensor_peak_pct']['fp32']:.1f}% of fp32, "
            f"{d['tensor_peak_pct']['bf16']:.1f}% of bf16",
            f"DMA bytes: HBM->SBUF {d['bytes_hbm_to_sbuf']:,}  SBUF->HBM {d['bytes_sbuf_to_hbm']:,}",
            f"peak SBUF {d['peak_sbuf_bytes_per_partition']:,} / {d['sbuf_capacity_bytes_per_partition']:,} B/partition, "
            f"peak PSUM {d['peak_psum_bytes_per_partition']:,} / {self.target.psum_partition_bytes:,} B/partition",
            "instructions: " + "; ".join(f"{e}: " + ", ".join(f"{n} x{c}" for n, c in v.items())
                                         for e, v in counts.items()),
        ]
        return "\n".join(lines)

    def __str__(self):
        return self.table()

    def print(self, console=None):
        """Print as a rich table when rich is installed, else plain text."""
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:  # pragma: no cover
            print(self.table())
            return
        d = self.to_dict()
        console = console or Console()
        t = Table(title=f"NKI emulator cost MODEL - {', '.join(d['kernels'])} on {self.target.name}",
                  caption="modeled, not measured")
        t.add_column("engine")
        t.add_column("instructions", justify="right")
        t.add_column("busy (us)", justify="right")
        for e, b in d["engine_busy_s"].items():
            t.add_row(e, str(sum(d["instruction_counts"].get(e, {}).values())), f"{b * 1e6:.2f}")
        console.print(t)
        console.print("\n".join(self.table().splitlines()[2 + len(d["engine_busy_s"]):]))


def _engine_order(e):
    base = e.split(".")[0]
    return (ENGINES.index(base) if base in ENGINES else 99, e)


class Profile:
    """Collects every launch inside ``with nkiemu.profile() as prof:``; ``prof.report`` aggregates them."""

    def __init__(self, target=None, params=None):
        self.launches = []
        self._target = target
        self._params = params

    @property
    def report(self) -> CostReport:
        return CostReport(self.launches, self._target, self._params)

    def priced_for(self, target, **kw) -> CostReport:
        return self.report.priced_for(target, **kw)
