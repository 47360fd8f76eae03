"""A double-hybrid whole run, mp2trn against PySCF's own double-hybrid route, each in a fresh process.

    python scripts/bench_double_hybrid.py                                  # B2PLYP, Inosine/cc-pVDZ
    python scripts/bench_double_hybrid.py --method dsd-pbep86 --xyz molecules/water.xyz --basis cc-pvdz

PySCF: scripts/pyscf_double_hybrid_run.py (DF-RKS with the functional's DFT part, DFMP2 on the Kohn–Sham
orbitals, scaled; PySCF alone), as it comes and thread-tuned (OMP_WAIT_POLICY=PASSIVE
OPENBLAS_THREAD_TIMEOUT=4). mp2trn: `mp2trn run --method ... --json` (fp64, cpu). Both use the same JK-fit
and RI bases (mp2trn's rules: the cc-pVDZ partners here), grid level and conv_tol. Prints a Markdown table:
whole run, SCF, of which the grid XC work (PySCF's numint in both codes) and the J/K builds, the MP2 step,
cycles, speed-ups and |ΔE|. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mp2trn.benchmark import THREAD_ENV
from mp2trn.machine import machine_description
from mp2trn.memory import default_memory_mb
from mp2trn.methods import get_method

ROOT = Path(__file__).resolve().parents[1]
INOSINE = ROOT / "molecules" / "gpu4pyscf" / "organic" / "031_Inosine.xyz"


def _env(tuned: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    if tuned:
        env.update(THREAD_ENV)
    return env


def pyscf_run(xyz: Path, basis: str, method, jkbasis: str, rifit: str, grid: int, tuned: bool) -> dict:
    cmd = [sys.executable, str(ROOT / "scripts" / "pyscf_double_hybrid_run.py"), str(xyz), basis, "--xc", method.xc,
           "--c-os", repr(method.c_os), "--c-ss", repr(method.c_ss), "--jkbasis", jkbasis, "--rifit", rifit,
           "--grid", str(grid), "--max-memory", repr(default_memory_mb())]
    if method.dispersion:
        cmd += ["--d3", method.dispersion[1]]
    done = subprocess.run(cmd, env=_env(tuned), capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def mp2trn_run(xyz: Path, basis: str, method: str, grid: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dh.json"
        subprocess.run([sys.executable, "-m", "mp2trn", "run", str(xyz), "--basis", basis, "--method", method,
                        "--grid", str(grid), "--memory", repr(default_memory_mb()), "--json", str(out), "--quiet"],
                       env=_env(False), check=True)
        doc = json.loads(out.read_text())
    ran = doc["extras"]["mp2trn"]
    t = ran["timings"]
    scf = ran["scf"]
    return {"seconds": t["total"], "scf_seconds": t["scf"], "jk_seconds": scf["jk_seconds"],
            "mp2_seconds": t["mp2"], "cycles": scf["cycles"], "e_tot": doc["return_result"],
            "e_ks": doc["properties"]["scf_total_energy"], "jkbasis": ran["jkbasis"], "rifit": ran["auxbasis"],
            "grid_points": scf["grid"]["points"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xyz", type=Path, default=INOSINE)
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--method", default="b2plyp")
    ap.add_argument("--grid", type=int, default=3)
    args = ap.parse_args()
    method = get_method(args.method)
    ours = mp2trn_run(args.xyz, args.basis, method.name, args.grid)
    ref = pyscf_run(args.xyz, args.basis, method, ours["jkbasis"], ours["rifit"], args.grid, tuned=False)
    tuned = pyscf_run(args.xyz, args.basis, method, ours["jkbasis"], ours["rifit"], args.grid, tuned=True)
    print(f"\n{method.name} on {args.xyz.name}/{args.basis}, grid level {args.grid} ({ours['grid_points']} points), "
          f"JK fit {ours['jkbasis']}, RI fit {ours['rifit']}\nMachine: {machine_description()}\n")
    print("| code | whole run (s) | SCF (s) | of which XC on the grid (s) | of which J/K builds (s) | MP2 step (s) "
          "| cycles | speed-up vs PySCF as it comes / tuned | abs(ΔE) vs PySCF (µEh) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in (("PySCF as it comes", ref), ("PySCF threads tuned", tuned)):
        print(f"| {label} | {r['seconds']:.1f} | {r['scf_seconds']:.1f} | {r['xc_seconds']:.1f} | – "
              f"| {r['mp2_seconds']:.1f} | {r['cycles']} | – | – |")
    print(f"| mp2trn cpu fp64 | {ours['seconds']:.1f} | {ours['scf_seconds']:.1f} | "
          f"{ours['scf_seconds'] - ours['jk_seconds']:.1f} (rest of the SCF: XC + driver) | {ours['jk_seconds']:.1f} "
          f"| {ours['mp2_seconds']:.1f} | {ours['cycles']} | {ref['seconds'] / ours['seconds']:.2f}× / "
          f"{tuned['seconds'] / ours['seconds']:.2f}× | {abs(ours['e_tot'] - ref['e_tot']) * 1e6:.3f} |")


if __name__ == "__main__":
    main()
