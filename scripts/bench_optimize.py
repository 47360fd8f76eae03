"""A real geometry optimisation: wall time and SCF cycles per step, with and without the density re-use,
against what central-difference gradients would cost.

    python scripts/bench_optimize.py                           # Vitamin C/cc-pVDZ from its file geometry
    python scripts/bench_optimize.py --xyz molecules/water.xyz --max-steps 20

Runs `mp2trn optimize --json` twice in fresh processes (density re-use on, then --fresh-guess). The
central-difference estimate is, per step, 6·natm energy runs at the measured cost of one energy run
(the step-0 SCF + MP2 time of the optimisation, an extrapolation printed as such). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from mp2trn.machine import machine_description

ROOT = Path(__file__).resolve().parents[1]
VITAMIN_C = ROOT / "molecules" / "gpu4pyscf" / "organic" / "020_Vitamin_C.xyz"


def optimise(xyz: Path, args, fresh: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "opt.json"
        cmd = [sys.executable, "-m", "mp2trn", "optimize", str(xyz), "--basis", args.basis, "--json", str(out),
               "--max-steps", str(args.max_steps), "-q", *(["--fresh-guess"] if fresh else [])]
        subprocess.run(cmd, check=True, cwd=ROOT)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xyz", type=Path, default=VITAMIN_C)
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--max-steps", type=int, default=50)
    args = parser.parse_args()
    reuse = optimise(args.xyz, args, fresh=False)
    fresh = optimise(args.xyz, args, fresh=True)
    print(f"machine: {machine_description()}")
    natm = len(reuse["final_molecule"]["symbols"])
    print(f"{args.xyz.name}, {args.basis}, {natm} atoms, mp2trn optimize (geomeTRIC, gau), cpu fp64\n")
    print("| run | steps | wall (s) | s per step | SCF cycles per step (mean) | converged | final energy (Eh) |")
    print("|---|---|---|---|---|---|---|")
    for label, doc in (("density re-used (default)", reuse), ("fresh guess each step", fresh)):
        ex = doc["extras"]["mp2trn"]
        secs, cycles = ex["seconds"], ex["scf_cycles"]
        print(f"| {label} | {len(secs)} | {sum(secs):.1f} | {sum(secs) / len(secs):.1f} | "
              f"{sum(cycles) / len(cycles):.1f} ({cycles[0]} at step 0, {sum(cycles[1:]) / max(1, len(cycles) - 1):.1f} after) | "
              f"{doc['success']} | {doc['energies'][-1]:.8f} |")
    first = reuse["trajectory"][0]["extras"]["mp2trn"]["timings"]
    energy_run = first["scf"] + first["mp2"]
    steps = len(reuse["energies"])
    fd = steps * 6 * natm * energy_run
    total = sum(reuse["extras"]["mp2trn"]["seconds"])
    print(f"\ncentral differences: {steps} steps × 6·{natm} energy runs × {energy_run:.1f} s (step 0's SCF + MP2, "
          f"extrapolated) = {fd:.0f} s, {fd / total:.0f}× the analytic optimisation")
    per_step = [t["extras"]["mp2trn"]["timings"] for t in reuse["trajectory"]]
    print("gradient share per step (mean): " + ", ".join(
        f"{k} {sum(t.get(k, 0) for t in per_step) / len(per_step):.2f} s"
        for k in ("scf", "mp2", "gradient_pairs", "gradient_ri", "gradient_response", "gradient_integrals")))


if __name__ == "__main__":
    main()
