"""How fast an fp32 (mixed) whole run can be against the fp64 one on this machine: measured, and bounded.

    python scripts/bench_fp32_bound.py                                  # Inosine/cc-pVDZ
    python scripts/bench_fp32_bound.py --xyz molecules/gpu4pyscf/organic/052_Cetirizine.xyz --repeat 2

Runs ``mp2trn run XYZ --precision fp64|fp32 --json`` in fresh processes (taking turns ``--repeat`` times,
each keeping its fastest) and splits each run with its own cost report (the cpu device's roofline, which
times every J/K build, the metric solve and the pair step per precision):

- V64: what the fp64 run spends on the work the fp32 run does in fp32 — as many fp64 J/K builds (at the
  fp64 run's mean build) as the fp32 run has fp32 builds, and the fp64 run's seconds in every other stage
  the fp32 run runs in fp32 (the metric solve, the pair step);
- F64 = T64 − V64: what both runs do in fp64 — the SCF tensor (integrals and triangular solve), the fp64
  builds that finish the mixed SCF, PySCF's SCF driver, the MP2 stage's integrals and AO→MO transform;
- V32 and F32 = T32 − V32 the same for the fp32 run (F32 − F64: what only the fp32 run pays, such as its
  fp32 copy of the SCF tensor);
- r: SGEMM over DGEMM rate on this machine (the roofline's cached GEMM rates).

The bound T64 / (F64 + V64/r) is the ratio the fp32 run would reach if its fp32 work ran exactly r times
faster than the same work in fp64 and everything else took what it takes in the fp64 run. ``F64 for 1.6×``
is the largest shared cost that would still let that ideal run reach 1.6× (issue 36's goal): F with
(F + V64) / (F + V64/r) = 1.6. A benchmark, not a test: every number comes from the runs it makes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mp2trn.machine import machine_description  # noqa: E402

GOAL = 1.6


def one_run(xyz: str, basis: str, precision: str) -> dict:
    """One whole run in a fresh process; its what-ran record (the JSON's extras)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        done = subprocess.run([sys.executable, "-m", "mp2trn", "run", xyz, "--basis", basis, "--precision", precision,
                               "-q", "--json", str(out)], capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"mp2trn run {precision} failed: {done.stderr.strip().splitlines()[-1:]}")
        record = json.loads(out.read_text())
    return {"energy": record["return_result"], **record["extras"]["mp2trn"]}


def fp32_stages(run32: dict) -> set[str]:
    """The stages the fp32 run ran in fp32 (its roofline's ``stage:fp32`` entries)."""
    return {key.split(":")[0] for key in run32["cost"]["stages"] if key.endswith(":fp32")}


def split_fp64(run64: dict, stages: set[str], builds_in_fp32: int) -> tuple[float, float]:
    """(V64, F64) of the fp64 run: its seconds on the work the fp32 run does in fp32 (``builds_in_fp32`` J/K
    builds at the run's mean build, and every other stage in ``stages``), and the rest."""
    v = 0.0
    for name in stages:
        s = run64["cost"]["stages"].get(f"{name}:fp64")
        if s is not None:
            v += builds_in_fp32 * s["seconds"] / s["calls"] if name == "scf_jk" else s["seconds"]
    return v, run64["timings"]["total"] - v


def split_fp32(run32: dict) -> tuple[float, float]:
    """(V32, F32) of the fp32 run: its seconds in fp32 stages, and the rest."""
    v = sum(s["seconds"] for key, s in run32["cost"]["stages"].items() if key.endswith(":fp32"))
    return v, run32["timings"]["total"] - v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xyz", default="molecules/gpu4pyscf/organic/031_Inosine.xyz")
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--repeat", type=int, default=1, help="turns per precision (the fastest run is kept)")
    args = ap.parse_args()
    best: dict[str, dict] = {}
    for _ in range(max(1, args.repeat)):
        for precision in ("fp64", "fp32"):
            got = one_run(args.xyz, args.basis, precision)
            if precision not in best or got["timings"]["total"] < best[precision]["timings"]["total"]:
                best[precision] = got
            print(f"{precision}: {got['timings']['total']:.2f} s", flush=True)
    r64, r32 = best["fp64"], best["fp32"]
    if r64["cost"].get("kind") != "roofline" or r32["cost"].get("kind") != "roofline":
        raise SystemExit("the runs have no roofline (cpu device only)")
    n32 = r32["cost"]["stages"].get("scf_jk:fp32", {}).get("calls", 0)
    v64, f64 = split_fp64(r64, fp32_stages(r32), n32)
    v32, f32 = split_fp32(r32)
    rates = r32["cost"]["gemm_rates"]
    r = rates["fp32_gflops"] / rates["fp64_gflops"]
    t64, t32 = r64["timings"]["total"], r32["timings"]["total"]
    bound = t64 / (f64 + v64 / r)
    f_goal = v64 * (1 - GOAL / r) / (GOAL - 1)
    builds = r32["scf"]["build_precisions"]
    print(f"\n{Path(args.xyz).stem}/{args.basis}; {machine_description()}")
    print(f"SCF builds: fp64 run {r64['scf']['jk_builds']}; fp32 run {builds.count('fp32')} fp32 + "
          f"{builds.count('fp64')} fp64")
    print("| quantity | fp64 run | fp32 run |\n|---|---:|---:|")
    print(f"| whole run T (in-run total), s | {t64:.2f} | {t32:.2f} |")
    print(f"| V: the work the fp32 run does in fp32, s | {v64:.2f} | {v32:.2f} |")
    print(f"| F: the rest, s | {f64:.2f} | {f32:.2f} |")
    print(f"| of F: SCF tensor (integrals, solve), s | {r64['scf']['tensor_seconds']:.2f} | "
          f"{r32['scf']['tensor_seconds']:.2f} |")
    print(f"| of F: the tensor's device blocks (the cpu device's fp32 copy), s | "
          f"{r64['scf'].get('device_blocks_seconds', 0.0):.2f} | {r32['scf'].get('device_blocks_seconds', 0.0):.2f} |")
    print(f"| of F: SCF outside the J/K builds, s | {r64['scf']['seconds'] - r64['scf']['jk_seconds']:.2f} | "
          f"{r32['scf']['seconds'] - r32['scf']['jk_seconds']:.2f} |")
    print(f"| of F: MP2 integrals and AO→MO transform, s | {r64['timings']['ao_to_mo']:.2f} | "
          f"{r32['timings']['ao_to_mo']:.2f} |")
    print(f"\n- measured: fp32 run {t64 / t32:.2f}× the fp64 run; "
          f"its fp32 work {v64 / v32:.2f}× the same work in fp64")
    print(f"- r = SGEMM/DGEMM = {rates['fp32_gflops']:.0f}/{rates['fp64_gflops']:.0f} GFLOP/s = {r:.2f}")
    print(f"- bound T64 / (F64 + V64/r) = {bound:.2f}×: the fp32 run with its fp32 work exactly r× faster "
          "and nothing else changed")
    print(f"- {GOAL}× needs, with that ideal fp32 work, F64 ≤ {max(f_goal, 0.0):.2f} s (it is {f64:.2f} s)")
    e64, e32 = r64["energy"], r32["energy"]
    print(f"- E_MP2 total: fp64 {e64:.10f}, fp32 {e32:.10f} Eh (|Δ| {abs(e32 - e64) * 1e6:.3f} µEh)")


if __name__ == "__main__":
    main()
