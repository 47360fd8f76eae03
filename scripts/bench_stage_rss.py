"""Resident memory per gradient stage, sampled: where a gradient run's peak RSS lies against ``--memory``.

    python scripts/bench_stage_rss.py molecules/benzene.xyz 60          # benzene/cc-pVDZ at 60 MB
    python scripts/bench_stage_rss.py molecules/water.xyz 60            # the fixed cost at the same budget

One ``mp2trn.pipeline.run(..., gradient=True)`` in this process; a thread reads the resident set
(/proc/self/statm) every 2 ms and keeps its largest value per stage: the gradient's pair sweep, metric
density, RI pass, response (``relax``) and JK-fit/one-electron terms, and "before" for the SCF and the
energy before them. The stages are found by wrapping those functions of mp2trn.grad for this run. Compare a
stage's peak with water's at the same budget (the interpreter's and libraries' fixed cost) and with what-ran's
``gradient_memory.planned_peak_mb``. Linux only. A diagnostic, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
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
    args = ap.parse_args()
    current, peaks = ["before"], {}

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 1e6

    def sample() -> None:
        while True:
            peaks[current[0]] = max(peaks.get(current[0], 0.0), rss_mb())
            time.sleep(0.002)

    def wrapped(fn, name):
        def stage(*a, **k):
            current[0] = name
            try:
                return fn(*a, **k)
            finally:
                current[0] = "between stages"
        return stage

    for module, name in STAGES:
        setattr(module, name, wrapped(getattr(module, name), name))
    threading.Thread(target=sample, daemon=True).start()
    result = run(args.xyz, basis=args.basis, max_memory=args.memory, gradient=True)
    time.sleep(0.01)
    print(f"{Path(args.xyz).name}/{args.basis} at --memory {args.memory:g} MB: peak RSS per stage (MB)")
    for name, mb in peaks.items():
        print(f"  {name:20s} {mb:8.1f}")
    print("planned_peak_mb:", json.dumps(result.what_ran["gradient_memory"].get("planned_peak_mb")))


if __name__ == "__main__":
    main()
