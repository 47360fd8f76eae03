"""The CPU's GEMM rates and how close each stage of a run came to them (the cpu device's cost report).

A stage's achieved rate is the arithmetic it did (its GEMM-like work, counted as below) over the seconds
the device spent in it; its share is that rate over the machine's GEMM rate in the stage's precision
(DGEMM for fp64, SGEMM for fp32). The GEMM rates are measured once per machine — a short timed square
GEMM of :data:`GEMM_N` on NumPy's BLAS with its threads — and cached in a small JSON file under the user
cache directory (``$XDG_CACHE_HOME/mp2trn/gemm_rates.json``, else ``~/.cache/mp2trn/…``), keyed by the CPU
model, the BLAS library and its thread count, so the first run on a machine pays about a second and
later runs read the file. A rate measured while the machine was busy is low, and the shares then high:
the cache records the load average at the measurement, and :func:`gemm_rates` ``(refresh=True)`` (or
deleting the file) measures again. A new measurement keeps the higher of the old and new rate per precision
(load only ever slows the timed GEMM; the key names the CPU model, the BLAS and its threads, so another
machine has an entry of its own), and a report whose stage ran faster than the cached rate — a share above
1, which says the cached rate was taken on a busy machine — measures again before it is made
(:meth:`StageMeter.report`), once per entry: a stage that beats even an idle square GEMM (a small fp32
GEMM can) then reports its share above 1 instead of measuring at every run. The same entry keeps which form
of the Z-vector's long-inner products this machine runs faster (:func:`long_inner_transposed`).

Counted arithmetic per stage (flops; elementwise work, unpacking and copies not counted, so that their
time shows as a lower share): SCF J/K per block of p rows: Z = Cᵀ B_P 2·p·nao²·n, the exchange syrk
p·n·nao(nao+1), J's two GEMVs 4·p·(stored elements per row); ao_to_mo two half-transforms
2·p·nao²·no + 2·p·nao·no·nv; metric solve naux²·n; pair step the T GEMMs 2·naux·(ni·nva)·(nj·nvb)
(i ≤ j on a diagonal block); gradient pairs its five GEMMs per column of pairs.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from .files import write_json_atomic
from .machine import cpu_name

#: the side of the timed GEMM: large enough for the BLAS to reach its rate on a few cores (7 GFLOP in
#: fp64), short enough to cost well under a second on an idle laptop
GEMM_N = 1536
#: timed repetitions of the GEMM (the best counts), after one untimed warm-up
_REPEATS = 3
#: the cache file's schema; a file with another is measured again
_VERSION = 1


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/mp2trn/gemm_rates.json``, else ``~/.cache/mp2trn/gemm_rates.json``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "mp2trn" / "gemm_rates.json"


def blas_threads() -> int:
    """Threads of NumPy's BLAS pool now (1 when threadpoolctl cannot tell); the libraries as
    :mod:`mp2trn.threads` finds them, once per process."""
    from .threads import current_blas_threads

    return current_blas_threads()


def machine_key() -> str:
    """What the cached rates belong to: CPU model, NumPy's BLAS and its thread count."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        blas_name = f"{blas.get('name', 'blas')} {blas.get('version', '')}".strip()
    except Exception:  # pragma: no cover - depends on the NumPy build
        blas_name = "blas"
    return f"{cpu_name()} | {blas_name} | {blas_threads()} threads"


def measure_gemm_rate(dtype, n: int = GEMM_N, repeats: int = _REPEATS, clock=time.perf_counter) -> float:
    """GFLOP/s of an n×n×n GEMM in ``dtype`` on NumPy's BLAS pool (best of ``repeats``, after a warm-up),
    timed by ``clock`` (wall time; ``time.thread_time`` with a one-thread BLAS on a loaded machine)."""
    from .threads import one_blas_pool

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    out = np.empty((n, n), dtype)
    best = float("inf")
    with one_blas_pool("numpy"):
        np.matmul(a, b, out=out)
        for _ in range(repeats):
            t0 = clock()
            np.matmul(a, b, out=out)
            best = min(best, clock() - t0)
    return 2.0 * n**3 / best / 1e9


def gemm_rates(refresh: bool = False) -> dict[str, Any]:
    """This machine's DGEMM and SGEMM rates: {"fp64": GFLOP/s, "fp32": GFLOP/s, "key", "measured" (UTC),
    "load_average", "n", "cache"}; read from the cache, else measured now and added to it (atomically).
    ``refresh`` measures again and keeps, per precision, the higher of that and the cached rate; the entry
    then says it was measured again after a stage beat it (``remeasured``)."""
    path, key = cache_path(), machine_key()
    cached = _read_cache(path)
    entry = cached.get("machines", {}).get(key)
    if entry is None or refresh:
        old = entry if entry is not None and entry.get("n") == GEMM_N else {}
        entry = {"fp64": max(measure_gemm_rate(np.float64), old.get("fp64", 0.0)),
                 "fp32": max(measure_gemm_rate(np.float32), old.get("fp32", 0.0)), "n": GEMM_N,
                 "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                 **({"remeasured": True} if old else {}),
                 # the long-inner forms' timing is not redone by a refresh of the rates
                 **({"long_inner": entry["long_inner"]} if entry and "long_inner" in entry else {})}
        machines = {**cached.get("machines", {}), key: entry}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, {"version": _VERSION, "machines": machines})
        except OSError as err:   # an unwritable cache costs a measurement per run, not the run
            entry = {**entry, "cache_error": f"{path}: {err}"}
    return {**entry, "key": key, "cache": str(path)}


#: the long-inner product timed by :func:`long_inner_transposed`: (K, M, N) of a_tᵀ b with a_t (K, M), b (K, N) —
#: the Z-vector's exchange products' shape (Inosine/cc-pVDZ: K = 4·10⁵ or 10⁵, M = nvir = 256, N = nocc = 70)
#: at a K whose operands take ~80 MB (fp64) and whose product ~10 ms. N is not a power of two on purpose: on
#: the 2-core AMD EPYC VM the two forms tied at N = 64 and differed at N = 70 as at Inosine's own shape
#: (``python scripts/bench_zvector.py --gemms`` prints all three)
LONG_INNER_SHAPE = (1 << 15, 256, 70)
#: the transposed form is taken only when it is this much faster (a tie keeps the plain form)
_LONG_INNER_MARGIN = 1.05
#: this process's answers by (machine key, precision): the cache file is read once
_long_inner: dict[tuple[str, str], bool] = {}
#: one timing at a time (threads of one process would time against each other)
_LONG_INNER_LOCK = threading.Lock()


def measure_long_inner(dtype, shape: tuple[int, int, int] = LONG_INNER_SHAPE,
                       repeats: int = _REPEATS) -> dict[str, float]:
    """GFLOP/s of a_tᵀ b over a long inner dimension (``shape`` = (K, M, N)) in ``dtype`` on NumPy's BLAS pool,
    as it is written ("plain") and as (bᵀ a_t)ᵀ ("transposed"), best of ``repeats`` each after a warm-up,
    the two taking turns."""
    from .threads import one_blas_pool

    k, m, n = shape
    rng = np.random.default_rng(1)
    a_t = rng.standard_normal((k, m)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    forms = {"plain": lambda: a_t.T @ b, "transposed": lambda: np.ascontiguousarray((b.T @ a_t).T)}
    best = dict.fromkeys(forms, float("inf"))
    with one_blas_pool("numpy"):
        for fn in forms.values():
            fn()
        for _ in range(repeats):
            for name, fn in forms.items():
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
    return {name: 2.0 * k * m * n / t / 1e9 for name, t in best.items()}


def long_inner_transposed(precision: str) -> bool:
    """Whether a (M, N) product a_tᵀ b over a long inner dimension (K ≫ M > N: the Z-vector's exchange
    products, :meth:`mp2trn.devices.cpu.CpuDevice.response_gemm`) runs faster on this machine as (bᵀ a_t)ᵀ.
    The BLAS picks other kernels for the two forms, and which wins depends on the machine: (bᵀ a_t)ᵀ ran
    1.2-1.4× faster where it was first adopted, 0.8× on the 2-core AMD EPYC VM of docs/benchmarks.md
    (``python scripts/bench_zvector.py --gemms``). Timed once per machine (:func:`measure_long_inner`, a few
    tenths of a second) and kept in its entry of the rates' cache, once per process after that. Where NumPy's
    pool is held below its threads (inside :func:`mp2trn.threads.one_thread_each`, whose parts time against
    each other), the plain form without a timing."""
    from .threads import blas_threads as pool_threads

    if blas_threads() != pool_threads():
        return False
    with _LONG_INNER_LOCK:
        return _long_inner_transposed(machine_key(), precision)


def _long_inner_transposed(key: str, precision: str) -> bool:
    if (key, precision) in _long_inner:
        return _long_inner[(key, precision)]
    path = cache_path()
    cached = _read_cache(path)
    if key not in cached.get("machines", {}):     # the machine's entry first (the cost report reads it too)
        gemm_rates()
        cached = _read_cache(path)
    entry = cached.get("machines", {}).get(key)
    rates = (entry or {}).get("long_inner", {}).get(precision)
    if rates is None:
        rates = measure_long_inner(np.float32 if precision == "fp32" else np.float64)
        if entry is not None:      # kept beside the GEMM rates
            entry = {**entry, "long_inner": {**entry.get("long_inner", {}), precision: rates}}
            try:
                write_json_atomic(path, {"version": _VERSION, "machines": {**cached["machines"], key: entry}})
            except OSError:        # an unwritable cache costs a measurement per process, not the run
                pass
    _long_inner[(key, precision)] = rates["transposed"] > _LONG_INNER_MARGIN * rates["plain"]
    return _long_inner[(key, precision)]


def _read_cache(path: Path) -> dict[str, Any]:
    """The cache document, or an empty one when it is missing, unreadable or of another schema."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) and doc.get("version") == _VERSION else {}


class StageMeter:
    """Seconds, counted flops and calls per (stage, precision) of a device's work."""

    def __init__(self) -> None:
        self.totals: dict[tuple[str, str], list[float]] = {}

    def add(self, stage: str, precision: str, seconds: float, flops: float) -> None:
        entry = self.totals.setdefault((stage, precision), [0.0, 0.0, 0])
        entry[0] += seconds
        entry[1] += flops
        entry[2] += 1

    def checkpoint(self) -> dict[tuple[str, str], tuple[float, float, int]]:
        """The totals now (pass to :meth:`report` as ``since``)."""
        return {k: tuple(v) for k, v in self.totals.items()}

    def report(self, since: dict | None = None, rates: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The roofline report of the work since ``since`` (None: everything), or None when there was none."""
        since = since or {}
        stages = {}
        for (stage, precision), (seconds, flops, calls) in self.totals.items():
            s0, f0, c0 = since.get((stage, precision), (0.0, 0.0, 0))
            if calls > c0:
                stages[(stage, precision)] = (seconds - s0, flops - f0, calls - c0)
        if not stages:
            return None
        if rates is None:
            rates = gemm_rates()
            if not rates.get("remeasured") and any(_faster_than(rates, precision, seconds, flops)
                                                   for (_, precision), (seconds, flops, _) in stages.items()):
                rates = {**gemm_rates(refresh=True), "remeasured_because": "a stage ran faster than the cached rate"}
        return roofline_report(stages, rates)


def _faster_than(rates: dict[str, Any], precision: str, seconds: float, flops: float) -> bool:
    """Whether a stage's achieved rate exceeds the GEMM rate of its precision in ``rates``."""
    peak = rates["fp32"] if precision == "fp32" else rates["fp64"]
    return seconds > 0 and flops / seconds / 1e9 > peak


def roofline_report(stages: dict[tuple[str, str], tuple[float, float, int]], rates: dict[str, Any]) -> dict[str, Any]:
    """The cost report of the cpu device: per (stage, precision) its seconds, counted GFLOP, achieved
    GFLOP/s and share of the GEMM rate of its precision; JSON-able (``extras.mp2trn.cost``)."""
    out: dict[str, Any] = {
        "kind": "roofline",
        "gemm_rates": {"fp64_gflops": rates["fp64"], "fp32_gflops": rates["fp32"], "n": rates.get("n"),
                       "measured": rates.get("measured"), "load_average": rates.get("load_average"),
                       "machine": rates.get("key"), "cache": rates.get("cache"),
                       **({"remeasured": rates["remeasured_because"]} if "remeasured_because" in rates else {})},
        "counted": ("GEMM-like arithmetic only (mp2trn.roofline); unpacking, copies and elementwise work "
                    "lower the share"),
        "stages": {},
    }
    for (stage, precision), (seconds, flops, calls) in stages.items():
        rate = flops / seconds / 1e9 if seconds > 0 else 0.0
        peak = rates["fp32"] if precision == "fp32" else rates["fp64"]
        out["stages"][f"{stage}:{precision}"] = {
            "stage": stage, "precision": precision, "calls": calls, "seconds": seconds, "gflop": flops / 1e9,
            "gflops_per_s": rate, "gemm": "SGEMM" if precision == "fp32" else "DGEMM", "gemm_gflops_per_s": peak,
            "share_of_gemm": rate / peak if peak > 0 else 0.0,
        }
    return out


__all__ = ["GEMM_N", "LONG_INNER_SHAPE", "StageMeter", "blas_threads", "cache_path", "gemm_rates", "long_inner_transposed",
           "machine_key", "measure_gemm_rate", "measure_long_inner",
           "roofline_report"]
