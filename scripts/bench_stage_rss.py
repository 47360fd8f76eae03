"""Resident memory per gradient stage, sampled: where a gradient run's peak RSS lies against ``--memory``.

    python scripts/bench_stage_rss.py molecules/benzene.xyz 60          # benzene/cc-pVDZ at 60 MB
    python scripts/bench_stage_rss.py molecules/water.xyz 60            # the fixed cost at the same budget
    python scripts/bench_stage_rss.py molecules/benzene.xyz 60 --sites relax   # what a stage leaves allocated

One ``mp2trn.pipeline.run(..., gradient=True)`` in this process; a thread reads the resident set
(/proc/self/statm) every 2 ms and keeps its largest value per stage: the gradient's pair sweep, metric
density, RI pass, response (``relax``) and JK-fit/one-electron terms, and "before" for the SCF and the
energy before them. The stages are found by wrapping those functions of mp2trn.grad for this run. Compare a
stage's peak with water's at the same budget (the interpreter's and libraries' fixed cost) and with what-ran's
``gradient_memory.planned_peak_mb``. ``--sites STAGE`` also traces NumPy's and Python's allocations
(tracemalloc) and prints, by allocation site (mp2trn's frames), what that stage left allocated when it
returned: arrays it made and no plan counts show there. Linux only. A diagnostic, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mp2trn.grad.densities as densities  # noqa: E402
import mp2trn.grad.dfmp2 as gradient  # noqa: E402
import mp2trn.grad.ri as ri  # noqa: E402
from mp2trn.pipeline import run  # noqa: E402

STAGES = [(densities, "sweep"), (ri, "metric_density"), (ri, "ri_pass"), (gradient, "relax"),
          (gradient, "_derivative_terms")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xyz")
    ap.add_argument("memory", type=float, help="--memory (MB)")
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--sites", choices=[name for _, name in STAGES],
                    help="print what this stage left allocated, by allocation site")
    args = ap.parse_args()
    current, peaks = ["before"], {}

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 1e6

    def sample() -> None:
        while True:
            peaks[current[0]] = max(peaks.get(current[0], 0.0), rss_mb())
            time.sleep(0.002)

    left: list[str] = []

    def wrapped(fn, name):
        def stage(*a, **k):
            current[0] = name
            before = tracemalloc.take_snapshot() if name == args.sites else None
            try:
                return fn(*a, **k)
            finally:
                current[0] = "between stages"
                if before is not None:
                    left.extend(_left_allocated(before, tracemalloc.take_snapshot()))
        return stage

    for module, name in STAGES:
        setattr(module, name, wrapped(getattr(module, name), name))
    if args.sites:
        tracemalloc.start(40)
    threading.Thread(target=sample, daemon=True).start()
    result = run(args.xyz, basis=args.basis, max_memory=args.memory, gradient=True)
    time.sleep(0.01)
    print(f"{Path(args.xyz).name}/{args.basis} at --memory {args.memory:g} MB: peak RSS per stage (MB)")
    for name, mb in peaks.items():
        print(f"  {name:20s} {mb:8.1f}")
    print("planned_peak_mb:", json.dumps(result.what_ran["gradient_memory"].get("planned_peak_mb")))
    if args.sites:
        print(f"left allocated by {args.sites} when it returned (MB, by allocation site, innermost mp2trn frames):")
        print("\n".join(left) or "  nothing of 0.5 MB or more")


def _left_allocated(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, at_least: float = 0.5e6) -> list[str]:
    """One line per allocation site whose live bytes grew by ``at_least`` between the snapshots."""
    lines = []
    for stat in after.compare_to(before, "traceback"):
        if stat.size_diff < at_least:
            continue
        frames = [f"{Path(f.filename).name}:{f.lineno}" for f in stat.traceback if "mp2trn" in f.filename]
        lines.append(f"  {stat.size_diff / 1e6:7.1f}  " + " <- ".join(frames[-4:][::-1]))
    return lines


if __name__ == "__main__":
    main()
