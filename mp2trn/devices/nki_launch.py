"""How NKI kernel launches happen for the ``sim`` and ``neuron`` devices, and what they cost.

Three launchers share one interface, ``launch(stage, kernel, args, kwargs) -> NumPy outputs``; with
``stay=True`` the outputs stay in device memory as the next launches' inputs (the host only slices them
and hands them on):

* :class:`EmulatorLauncher` — ``sim`` with the built-in emulator (``mp2trn.nkiemu``): every launch is
  recorded, and :meth:`cost_report` prices the recorded instruction streams with the emulator's cost
  MODEL for trn1 and trn2 (one emulated run, two prices).
* :class:`RealSimLauncher` — ``sim`` when a real NKI 0.3.0 is installed: ``nki.simulate(kernel)`` with
  ``NEURON_PLATFORM_TARGET_OVERRIDE`` set to the target. The official simulator has no cost model.
* :class:`NeuronLauncher` — ``neuron``: the same ``@nki.jit`` kernel objects called on torch-neuronx
  XLA tensors (inputs moved once per launch, outputs back once per launch); it measures wall time.

Any error a kernel raises because it broke a hardware/API rule is re-raised as
:class:`mp2trn.errors.KernelConstraintError` (the message keeps the rule, the instruction and the shapes).
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections import defaultdict
from typing import Any

import numpy as np

from ..errors import DeviceUnavailableError, KernelConstraintError
from .base import root_array

#: pipeline stage -> kernel(s) that implement it
STAGES = ("scf_jk", "ao_to_mo", "metric", "pairs", "comm",   # comm: collectives between ranks
          "grad_pairs",                                   # the gradient's pair sweep (mp2_density)
          "zvector", "grad_gamma")                        # the response's GEMMs, Γ's AO back-transformation
TARGETS = ("trn1", "trn2")

NEURON_INSTALL = (
    "install the AWS Neuron SDK on a Trainium instance (trn1/trn2) with the Neuron driver: "
    "pip install 'mp2trn[neuron]' --extra-index-url https://pip.repos.neuron.amazonaws.com "
    "(brings nki>=0.3.0 and torch-neuronx); or use --device sim to run the same kernels in the emulator"
)


def _nki():
    from ..kernels import _nki

    return _nki


class CompileCache:
    """A persistent on-disk index of compiled kernel signatures (one small file per signature).

    On ``neuron`` the directory is also handed to the Neuron compiler as its NEFF cache
    (``NEURON_COMPILE_CACHE_URL``), so a signature seen before is a compile the next run skips; the
    index is how mp2trn counts those hits and misses per stage. Default directory:
    ``$MP2TRN_COMPILE_CACHE``, else ``~/.cache/mp2trn/neuron-compile-cache``.
    """

    ENV = "MP2TRN_COMPILE_CACHE"

    def __init__(self, directory: str | os.PathLike | None = None):
        from pathlib import Path

        default = Path.home() / ".cache" / "mp2trn" / "neuron-compile-cache"
        self.directory = Path(directory or os.environ.get(self.ENV) or default)
        self.hits: dict[str, int] = defaultdict(int)
        self.misses: dict[str, int] = defaultdict(int)

    def key(self, signature: tuple, target: str) -> str:
        import hashlib

        from ..kernels import _nki

        text = repr((signature, target, _nki.NKI_IMPL, getattr(_nki.nki, "__version__", "")))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def check(self, stage: str, signature: tuple, target: str) -> bool:
        """True (a hit) when the signature was compiled before; records it otherwise (atomically)."""
        path = self.directory / f"{self.key(signature, target)}.sig"
        if path.exists():
            self.hits[stage] += 1
            return True
        self.misses[stage] += 1
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(repr(signature) + "\n")
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache still counts; the compiler's own cache decides what is reused
        return False

    def report(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "hits": sum(self.hits.values()), "misses": sum(self.misses.values()),
                "hits_by_stage": dict(self.hits), "misses_by_stage": dict(self.misses)}


class Launcher:
    """Base: counts launches per stage and distinct compile signatures (optionally against a
    persistent :class:`CompileCache`)."""

    impl = "abstract"

    def __init__(self, target: str, cache: CompileCache | None = None):
        self.target = target
        self.cache = cache
        self.launches: dict[str, int] = defaultdict(int)
        self.kernels: dict[str, set] = defaultdict(set)
        self.wall_s: dict[str, float] = defaultdict(float)
        #: distinct compile signatures per stage: an ``@nki.jit`` kernel is compiled once per kernel, input
        #: shapes and dtypes, and value of every other argument (a new NEFF on Trainium)
        self.signatures: dict[str, set] = defaultdict(set)
        #: host<->device bytes of each launch per stage: (to the device as launched, to the host, to the
        #: device counting an array passed again — the same object: the SCF tensor's blocks — only once)
        self.transfers: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        self._on_device: dict[tuple, weakref.ref] = {}
        #: arrays the device keeps in its memory across launches (the SCF tensor's blocks): id -> weakref
        self._kept: dict[int, weakref.ref] = {}
        #: outputs of ``stay`` launches, in device memory (id of the root array -> weakref): inputs made of them
        #: travel nowhere
        self._made: dict[int, weakref.ref] = {}
        #: launch arguments the device makes from a kept 2-D array's columns (:meth:`derive`):
        #: id -> (weakref to the argument, the kept array, first column, columns)
        self._derived: dict[int, tuple[weakref.ref, np.ndarray, int, int]] = {}
        self.walls: dict[str, list[float]] = defaultdict(list)   # wall seconds of each launch per stage

    def launch(self, stage: str, kernel, args: tuple, kwargs: dict | None = None, stay: bool = False):
        """Run ``kernel`` on ``args`` for pipeline ``stage``; its outputs come to the host, or with ``stay``
        remain in device memory (the neuron launcher returns its device tensors) for later launches."""
        kwargs = kwargs or {}
        name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "func", None), "__name__", "kernel")
        t0 = time.perf_counter()
        try:
            out = self._run(stage, kernel, args, kwargs, stay)
        except KernelConstraintError:
            raise
        except Exception as exc:
            wrapped = self._wrap(exc, name, stage)
            if wrapped is None:
                raise
            raise wrapped from exc
        self.launches[stage] += 1
        self.kernels[stage].add(name)
        self._count_transfers(stage, list(args) + list(kwargs.values()), out, stay)
        signature = compile_signature(name, args, kwargs)
        if signature not in self.signatures[stage]:
            self.signatures[stage].add(signature)
            if self.cache is not None:
                self.cache.check(stage, signature, self.target)
        dt = time.perf_counter() - t0
        self.wall_s[stage] += dt
        self.walls[stage].append(dt)
        return out

    def _run(self, stage, kernel, args, kwargs, stay=False):  # pragma: no cover - abstract
        raise NotImplementedError

    def _made_on_device(self, a: np.ndarray) -> bool:
        root = root_array(a)
        ref = self._made.get(id(root))
        return ref is not None and ref() is root

    def keep(self, *arrays: np.ndarray) -> None:
        """Keep these host arrays in device memory from their first launch until :meth:`drop_kept` (or until
        the host drops them): later launches reuse the device copy instead of sending them again. The
        ``neuron`` launcher holds the device tensor; every launcher counts the bytes to the device once."""
        for a in map(root_array, arrays):    # a view is kept as the array it shows
            self._kept[id(a)] = weakref.ref(a, lambda _r, k=id(a): self._kept.pop(k, None))
            # what an earlier launch sent of it is no copy to keep (the host may have written the array
            # since, as B's metric solve does in place): the first launch from now on sends it
            for key in [k for k in list(self._on_device) if k[0] == id(a)]:   # a snapshot: a reader thread
                self._on_device.pop(key, None)                                 # may keep while a launch counts

    def drop_kept(self) -> None:
        """Free the arrays kept in device memory (after the SCF)."""
        self._kept.clear()

    def drop(self, *arrays: np.ndarray) -> None:
        """Free these kept arrays only (B when the gradient is done with it)."""
        for a in map(root_array, arrays):
            ref = self._kept.get(id(a))
            if ref is not None and ref() is a:
                del self._kept[id(a)]

    def derive(self, arg: np.ndarray, kept: np.ndarray, col0: int, ncols: int) -> None:
        """Say that the launch argument ``arg`` (2-D, C-contiguous) is columns [col0, col0 + ncols) of the
        kept 2-D array ``kept``, zero-padded on the right to ``arg``'s width: the device makes it from its
        copy of ``kept`` (a slice in device memory) instead of receiving it from the host. The emulator runs
        on ``arg`` itself; the transfer records count ``kept``'s bytes once, at its first such launch."""
        if not self.is_kept(kept) or kept.ndim != 2 or arg.ndim != 2 or arg.shape[0] != kept.shape[0] \
                or not 0 <= col0 <= col0 + ncols <= min(kept.shape[1], col0 + arg.shape[1]):
            raise ValueError("derive: the argument must be a column range of a kept 2-D array")
        derived = self._derived   # the callback closes over the dict, not the launcher
        derived[id(arg)] = (weakref.ref(arg, lambda _r, k=id(arg): derived.pop(k, None)), kept, col0, ncols)

    def _derivation(self, a: np.ndarray) -> tuple[np.ndarray, int, int] | None:
        """(kept array, first column, columns) when ``a`` is made on the device from a kept array."""
        entry = self._derived.get(id(a))
        if entry is None or entry[0]() is not a or not self.is_kept(entry[1]):
            return None
        return entry[1:]

    def is_kept(self, a: np.ndarray) -> bool:
        """Whether ``a`` (or the array it views) is kept in device memory (:meth:`keep`)."""
        root = root_array(a)
        ref = self._kept.get(id(root))
        return ref is not None and ref() is root

    def _count_transfers(self, stage: str, inputs: list, out, stay: bool = False) -> None:
        """Add a launch's host->device bytes (its array inputs; a kept array only at its first launch, an
        output of a ``stay`` launch never) and device->host bytes (its outputs, unless they stay)."""
        to_device = to_host = first_use = 0
        for a in inputs:
            if isinstance(a, np.ndarray) and self._made_on_device(a):
                continue
            if isinstance(a, np.ndarray):
                made = self._derivation(a)
                if made is not None:   # sliced from its kept array in device memory: that array is sent once
                    a = made[0]
                root = root_array(a)
                key = (id(root), a.__array_interface__["data"][0], a.nbytes)
                ref = self._on_device.get(key)
                seen = ref is not None and ref() is root
                to_device += 0 if seen and self.is_kept(a) else a.nbytes
                if not seen:
                    first_use += a.nbytes
                    self._on_device[key] = weakref.ref(root, lambda _r, k=key: self._on_device.pop(k, None))
        made = self._made   # the callback closes over the dict, not the launcher
        for o in out if isinstance(out, tuple) else (out,):
            if isinstance(o, np.ndarray) and stay:
                root = root_array(o)
                made[id(root)] = weakref.ref(root, lambda _r, k=id(root): made.pop(k, None))
            elif isinstance(o, np.ndarray):
                to_host += o.nbytes
        self.transfers[stage].append((to_device, to_host, first_use))

    def launch_wall_s(self, since: dict | None = None) -> dict[str, float]:
        """Wall seconds spent inside :meth:`launch` per stage (emulation, checks, copies), of all launches or
        those after ``since``: on the sim device, time that is not host work on a Trainium instance."""
        start = (since or {}).get("walls", {})
        return {s: float(sum(v[start.get(s, 0):])) for s, v in self.walls.items()}

    def checkpoint(self) -> dict[str, dict[str, int]]:
        """Where each stage's records stand now: pass to :meth:`cost_report` or :meth:`transfer_record` as
        ``since`` to count only what follows."""
        return {"transfers": {s: len(v) for s, v in self.transfers.items()},
                "walls": {s: len(v) for s, v in self.walls.items()}}

    def transfer_record(self, since: dict | None = None) -> dict[str, dict[str, int]]:
        """Host<->device bytes per stage (see :attr:`transfers`), of all launches or those after ``since``."""
        start = (since or {}).get("transfers", {})
        out = {}
        for stage, moves in self.transfers.items():
            part = moves[start.get(stage, 0):]
            if part:
                out[stage] = {key: int(sum(m[i] for m in part))
                              for i, key in enumerate(("to_device", "to_host", "to_device_reusing"))}
        return out

    def _wrap(self, exc: Exception, name: str, stage: str) -> Exception | None:
        return None

    @property
    def total_launches(self) -> int:
        return sum(self.launches.values())

    @property
    def total_compiles(self) -> int:
        """Distinct compile signatures over the run (a signature used by two stages compiles once)."""
        return len(set().union(*self.signatures.values())) if self.signatures else 0

    def cost_report(self, precision: str, since: dict | None = None) -> dict[str, Any] | None:
        return None

    def compile_record(self) -> dict[str, Any]:
        """Distinct signatures per stage and in all, and the persistent cache's hits/misses when there is one."""
        out: dict[str, Any] = {"compiles": self.total_compiles,
                               "compiles_by_stage": {s: len(v) for s, v in self.signatures.items()}}
        if self.cache is not None:
            out["compile_cache"] = self.cache.report()
        return out


class EmulatorLauncher(Launcher):
    """``nki.simulate(kernel, target=...)`` of the built-in emulator, with every launch traced."""

    impl = "emulator"

    def __init__(self, target: str):
        super().__init__(target)
        import mp2trn.nkiemu as emu

        self._emu = emu
        self.traces: dict[str, list] = defaultdict(list)

    def _run(self, stage, kernel, args, kwargs, stay=False):
        with self._emu.profile() as prof:
            out = self._emu.simulate(kernel, target=self.target, strict=True)(*args, **kwargs)
        self.traces[stage].extend(prof.launches)
        return out

    def _wrap(self, exc, name, stage):
        if isinstance(exc, self._emu.NkiError) or isinstance(exc, AssertionError):
            return KernelConstraintError(f"NKI kernel {name} ({stage} stage, target {self.target}) broke a rule: {exc}")
        return None

    def checkpoint(self) -> dict[str, dict[str, int]]:
        return {**super().checkpoint(), "traces": {s: len(v) for s, v in self.traces.items()}}

    def cost_report(self, precision: str, since: dict | None = None) -> dict[str, Any] | None:
        """The MODELED cost of the launches so far, or of those after ``since`` (a :meth:`checkpoint`)."""
        start = (since or {}).get("traces", {})
        traces_now = {s: tr[start.get(s, 0):] for s, tr in self.traces.items()}
        if not any(traces_now.values()):
            return None
        from mp2trn.nkiemu.cost import CostReport

        stages = {}
        totals = {t: defaultdict(float) for t in TARGETS}
        peak_tensor = {}
        launch_walls = self.launch_wall_s(since)
        for stage in STAGES:
            traces = traces_now.get(stage)
            if not traces:
                continue
            entry = {"kernels": sorted(self.kernels[stage]), "launches": len(traces),
                     "compiles": len(self.signatures[stage]),
                     "emulation_wall_s": sum(tr.wall_s for tr in traces),
                     "launch_wall_s": launch_walls.get(stage, 0.0)}
            for t in TARGETS:
                rep = CostReport(traces, t)
                s = _summary(rep)
                entry[t] = s
                for k in ("modeled_time_s", "scheduled_time_s", "pessimistic_time_s", "flops",
                          "bytes_hbm_to_sbuf", "bytes_sbuf_to_hbm"):
                    totals[t][k] += s[k]
                for e, v in s["engine_busy_s"].items():
                    totals[t]["busy:" + e] += v
                peak_tensor[t] = rep.target.peak_flops["fp32"]
            stages[stage] = entry
        total = {}
        for t in TARGETS:
            d = totals[t]
            busy = {k[5:]: v for k, v in d.items() if k.startswith("busy:")}
            mt = d["modeled_time_s"]
            total[t] = {
                "modeled_time_s": mt,
                "scheduled_time_s": d["scheduled_time_s"],
                "pessimistic_time_s": d["pessimistic_time_s"],
                "engine_busy_s": busy,
                "engine_utilization": {e: (v / mt if mt else 0.0) for e, v in busy.items()},
                "flops": d["flops"],
                "tensor_peak_pct_fp32": 100.0 * d["flops"] / mt / peak_tensor[t] if mt else 0.0,
                "bytes_hbm_to_sbuf": d["bytes_hbm_to_sbuf"],
                "bytes_sbuf_to_hbm": d["bytes_sbuf_to_hbm"],
            }
        return {
            "kind": "model",
            "note": ("modeled by the NKI emulator's cost model (per-instruction cycle formulas of the NKI ISA "
                     "docs, engine clocks, DMA bandwidth, 15 us per launch); not a measurement"),
            "nki": "emulator",
            "target": self.target,
            "precision": precision,
            "launches": sum(e["launches"] for e in stages.values()),
            "launches_by_stage": {s: e["launches"] for s, e in stages.items()},
            **self.compile_record(),
            "stages": stages,
            "total": total,
            "host_device_bytes": self.transfer_record(since),
            "emulation_wall_s": sum(e["emulation_wall_s"] for e in stages.values()),
            "launch_wall_s": sum(e["launch_wall_s"] for e in stages.values()),
        }


def compile_signature(name: str, args: tuple, kwargs: dict) -> tuple:
    """What the NKI compiler specialises a kernel on: array shapes and dtypes, and the other arguments'
    values (compile-time constants)."""

    def key(v):
        if isinstance(v, np.ndarray):
            return ("array", v.shape, str(v.dtype))
        if hasattr(v, "shape") and hasattr(v, "dtype"):  # torch/XLA tensors on the neuron device
            return ("array", tuple(v.shape), str(v.dtype))
        return ("value", repr(v))

    return (name, tuple(key(a) for a in args), tuple(sorted((k, key(v)) for k, v in kwargs.items())))


def _summary(rep) -> dict[str, Any]:
    busy = rep.engine_busy_s
    mt = rep.modeled_time_s
    return {
        "modeled_time_s": mt,
        "scheduled_time_s": rep.scheduled_time_s,
        "pessimistic_time_s": rep.pessimistic_time_s,
        "launch_overhead_s": rep.launch_overhead_s,
        "bottleneck": rep.bottleneck,
        "engine_busy_s": busy,
        "engine_utilization": {e: (v / mt if mt else 0.0) for e, v in busy.items()},
        "flops": rep.flops,
        "tensor_peak_pct_fp32": rep.tensor_peak_pct("fp32"),
        "bytes_hbm_to_sbuf": rep.bytes_hbm_to_sbuf,
        "bytes_sbuf_to_hbm": rep.bytes_sbuf_to_hbm,
        "peak_sbuf_bytes_per_partition": rep.peak_sbuf_bytes,
        "peak_psum_bytes_per_partition": rep.peak_psum_bytes,
        "instructions": rep.n_instructions,
    }


class RealSimLauncher(Launcher):
    """The official CPU simulator of a real NKI 0.3.0 install (no cost model)."""

    impl = "real"

    def _run(self, stage, kernel, args, kwargs, stay=False):
        nki = _nki().nki
        with _env("NEURON_PLATFORM_TARGET_OVERRIDE", self.target):
            return nki.simulate(kernel)(*args, **kwargs)

    def _wrap(self, exc, name, stage):
        if isinstance(exc, (AssertionError, ValueError, TypeError, RuntimeError)):
            return KernelConstraintError(f"NKI kernel {name} ({stage} stage, target {self.target}) failed in "
                                         f"nki.simulate: {type(exc).__name__}: {exc}")
        return None


class NeuronLauncher(Launcher):
    """``@nki.jit`` kernels on torch-neuronx XLA tensors: one host->device copy of the inputs and one
    device->host copy of the outputs per launch, nothing in between (no per-pair launches); kept inputs are
    copied once, and the outputs of a ``stay`` launch are returned as the device tensors they are."""

    impl = "real"

    def __init__(self, target: str, cache: CompileCache | None = None):
        cache = cache or CompileCache()
        super().__init__(target, cache)
        # the Neuron compiler keeps its NEFFs in the same directory (its persistent compile cache)
        os.environ.setdefault("NEURON_COMPILE_CACHE_URL", str(cache.directory))
        import torch
        import torch_xla.core.xla_model as xm

        self._torch = torch
        self._xm = xm
        self._dev = xm.xla_device()
        #: device tensors of the kept host arrays (id of the host array -> tensor), made at their first launch
        self._resident: dict[int, Any] = {}
        #: how a kernel is invoked on device tensors (a seam for tests without a NeuronCore)
        self.call = lambda kernel, args, kwargs: kernel(*args, **kwargs)

    def drop_kept(self) -> None:
        super().drop_kept()
        self._resident.clear()

    def keep(self, *arrays: np.ndarray) -> None:
        """As :meth:`Launcher.keep`; a device tensor left from an earlier array with the same id (freed on the
        host since) is forgotten, so this array is copied at its first launch; the device tensor is freed
        when the host array is (an SCF block the precision switch does not reuse, say), not only at
        :meth:`drop` or :meth:`drop_kept`."""
        resident = self._resident   # the finaliser holds the dict, not the launcher
        for a in map(root_array, arrays):
            resident.pop(id(a), None)
            weakref.finalize(a, resident.pop, id(a), None)
        super().keep(*arrays)

    def drop(self, *arrays: np.ndarray) -> None:
        """As :meth:`Launcher.drop`, and the device tensors of these arrays are freed."""
        for a in map(root_array, arrays):
            ref = self._kept.get(id(a))
            if ref is not None and ref() is a:
                self._resident.pop(id(a), None)
        super().drop(*arrays)

    def _to_device(self, a):
        if not isinstance(a, np.ndarray):
            return a
        made = self._derivation(a)
        if made is not None:   # columns of a kept array, sliced and zero-padded in HBM: no host transfer
            kept, c0, n = made
            part = self._to_device(kept)[:, c0:c0 + n]
            if a.shape[1] > n:
                part = self._torch.nn.functional.pad(part, (0, a.shape[1] - n))
            return part.contiguous()
        if not self.is_kept(a):
            return self._copy_to_device(a)
        root = root_array(a)
        if not (a.flags.c_contiguous and root.flags.c_contiguous):
            return self._copy_to_device(a)   # a strided part of a kept array: sent as it is
        if id(root) not in self._resident:   # HBM keeps it: the kept array's only host -> device copy
            self._resident[id(root)] = self._copy_to_device(root)
        # a contiguous part (a reshape, a range of rows): the same elements of the device tensor
        first = (a.__array_interface__["data"][0] - root.__array_interface__["data"][0]) // root.itemsize
        return self._resident[id(root)].reshape(-1)[first:first + a.size].reshape(a.shape)

    def _copy_to_device(self, a: np.ndarray):
        torch = self._torch
        if a.dtype.name == "bfloat16":
            t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.ascontiguousarray(a))
        return t.to(self._dev)

    def _run(self, stage, kernel, args, kwargs, stay=False):
        targs = [self._to_device(a) for a in args]          # host -> HBM per launch, kept arrays once
        out = self.call(kernel, targs, kwargs)
        self._xm.mark_step()
        if stay:                                             # device tensors: the next launches' inputs
            return out
        if isinstance(out, tuple):                           # HBM -> host once per launch
            return tuple(self._to_host(o) for o in out)
        return self._to_host(out)

    def _to_host(self, t):
        t = t.cpu()
        if t.dtype == self._torch.bfloat16:
            return t.view(self._torch.int16).numpy().view(np.dtype("bfloat16"))
        return t.numpy()

    def _wrap(self, exc, name, stage):
        return KernelConstraintError(f"NKI kernel {name} ({stage} stage) failed on the NeuronCore: "
                                     f"{type(exc).__name__}: {exc}")

    def cost_report(self, precision: str, since: dict | None = None) -> dict[str, Any] | None:
        return {
            "kind": "measured",
            "note": "wall time per stage on the NeuronCore including host<->device copies (torch-xla)",
            "nki": "real",
            "target": self.target,
            "precision": precision,
            "launches": self.total_launches,
            "launches_by_stage": dict(self.launches),
            **self.compile_record(),
            "stages": {s: {"kernels": sorted(self.kernels[s]), "launches": n, "compiles": len(self.signatures[s]),
                           "wall_s": self.wall_s[s]}
                       for s, n in self.launches.items()},
            "host_device_bytes": self.transfer_record(since),
        }


def neuron_missing() -> str | None:
    """None when the real NKI and torch-neuronx are present, else why not."""
    import importlib.util

    n = _nki()
    if n.NKI_IMPL != "real":
        return f"no real NKI 0.3.0 is installed (the kernels are bound to the emulator: {n.describe()})"
    for mod in ("torch_neuronx", "torch_xla"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
    return None


def make_launcher(kind: str, target: str) -> Launcher:
    """``kind``: "sim" or "neuron"."""
    n = _nki()
    if kind == "neuron":
        why = neuron_missing()
        if why:
            raise DeviceUnavailableError(f"device 'neuron' is not available: {why}; {NEURON_INSTALL}")
        return NeuronLauncher(target)
    if n.NKI_IMPL == "real":
        return RealSimLauncher(target)
    return EmulatorLauncher(target)


@contextlib.contextmanager
def _env(key: str, value: str):
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old
