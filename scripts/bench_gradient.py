"""The whole gradient run against the whole energy run and against central finite differences.

    python scripts/bench_gradient.py                                  # Inosine/cc-pVDZ, cpu, fp64
    python scripts/bench_gradient.py --xyz molecules/benzene.xyz --displaced 2

Each run is `mp2trn run ... --json` in a fresh process (the energy run, the gradient run, then
``--displaced`` energy runs at displaced geometries). With ``--repeat N`` the energy and gradient runs take
turns N times and each keeps its fastest (the stages' table is the fastest gradient run's), as the whole-run
benchmarks do: this VM's speed moves by several per cent between runs. Central finite differences need 6·natm energy runs;
their cost is estimated as 6·natm × the mean whole-run time of the energy runs measured here (an
extrapolation, printed as such). Prints a Markdown table and where the gradient's time goes. A
benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from mp2trn.machine import machine_description

ROOT = Path(__file__).resolve().parents[1]
INOSINE = ROOT / "molecules" / "gpu4pyscf" / "organic" / "031_Inosine.xyz"
STAGES = [("gradient_b", "B: the energy's taken over (else built again: AO→MO transform, metric solve)", "device"),
          ("gradient_pairs", "pair sweep: P_ij, P_ab, Γ (O(N⁵))", "device"),
          ("gradient_ri", "RI pass: Lagrangian X and RI derivative integrals", "host/device"),
          ("gradient_response", "Z-vector and G[P] (occupied-factor J/K products)", "device: see the Z-vector line"),
          ("gradient_integrals", "JK-fit and one-electron derivative integrals", "host (libcint)")]


def run(xyz: Path, args, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "mp2trn", "run", str(xyz), "--basis", args.basis, "--device", args.device,
               "--json", str(out), "-q", *extra]
        if args.precision:
            cmd += ["--precision", args.precision]
        subprocess.run(cmd, check=True, cwd=ROOT, env=dict(os.environ))
        return json.loads(out.read_text())


def displaced(xyz: Path, k: int, tmp: Path) -> Path:
    """The molecule with atom k moved by +1e-3 Å along x (an XYZ file in ``tmp``)."""
    lines = xyz.read_text().splitlines()
    n = int(lines[0])
    rows = lines[2 : 2 + n]
    parts = rows[k].split()
    parts[1] = f"{float(parts[1]) + 1e-3:.8f}"
    rows[k] = " ".join(parts)
    path = tmp / f"displaced_{k}.xyz"
    path.write_text("\n".join([lines[0], lines[1], *rows]) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xyz", type=Path, default=INOSINE)
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--displaced", type=int, default=2, help="displaced energy runs measured for the FD estimate")
    parser.add_argument("--repeat", type=int, default=1, help="energy and gradient runs taking turns; fastest kept")
    args = parser.parse_args()
    energies, gradients = [], []
    for _ in range(max(1, args.repeat)):
        energies.append(run(args.xyz, args, []))
        gradients.append(run(args.xyz, args, ["--gradient"]))
    energy, gradient = (min(runs, key=lambda r: r["extras"]["mp2trn"]["timings"]["total"])
                        for runs in (energies, gradients))
    with tempfile.TemporaryDirectory() as tmp:
        fd_runs = [run(displaced(args.xyz, k, Path(tmp)), args, []) for k in range(args.displaced)]
    natm = len(gradient["return_result"]) // 3
    t_energy = energy["extras"]["mp2trn"]["timings"]["total"]
    timings = gradient["extras"]["mp2trn"]["timings"]
    t_grad = timings["total"]
    per_energy = float(np.mean([t_energy] + [r["extras"]["mp2trn"]["timings"]["total"] for r in fd_runs]))
    t_fd = 6 * natm * per_energy
    print(f"machine: {machine_description()}")
    print(f"molecule {args.xyz.name}, {args.basis}, device {args.device} "
          f"{args.precision or ''}, {natm} atoms; sizes {gradient['extras']['mp2trn']['sizes']}\n")
    if args.repeat > 1:
        print(f"each run {args.repeat} times, taking turns; the fastest kept. Energy runs "
              + " / ".join(f"{r['extras']['mp2trn']['timings']['total']:.1f}" for r in energies) + " s, gradient runs "
              + " / ".join(f"{r['extras']['mp2trn']['timings']['total']:.1f}" for r in gradients) + " s\n")
    print("| run | wall (s) | ratio |")
    print("|---|---|---|")
    print(f"| energy (SCF + DF-MP2) | {t_energy:.1f} | 1.00 |")
    print(f"| gradient (SCF + DF-MP2 + gradient) | {t_grad:.1f} | {t_grad / t_energy:.2f} × energy |")
    print(f"| central finite differences, 6·natm = {6 * natm} energy runs (extrapolated from "
          f"{1 + args.displaced} measured, {per_energy:.1f} s each) | {t_fd:.0f} | {t_fd / t_grad:.1f} × gradient |")
    print("\n| gradient stage | s | share of the gradient stage | where |")
    print("|---|---|---|---|")
    total_stage = timings["gradient"]
    for key, label, where in STAGES:
        print(f"| {label} | {timings[key]:.2f} | {timings[key] / total_stage:.0%} | {where} |")
    ran = gradient["extras"]["mp2trn"]
    print(f"\nZ-vector: {ran['zvector_iterations']} iterations with {ran['gradient_jk']}; "
          f"SCF: {ran['scf']['cycles']} cycles")
    if "gradient_reused" in ran:
        print("taken over, not built again: " + ", ".join(f"{k}: {v}" for k, v in ran["gradient_reused"].items())
              + (f" (SCF tensor kept: {ran['scf_tensor_kept_mb']} MB)" if "scf_tensor_kept_mb" in ran else ""))
        # what building them again would have cost, as this run measured them the first time
        b_s = timings["ao_to_mo"] + timings["metric"]
        tensor_s = ran["scf"].get("tensor_seconds", 0.0)
        print(f"their first builds in this run: B {b_s:.1f} s (the energy's AO→MO transform and metric solve), "
              f"the SCF's JK-fit tensor {tensor_s:.1f} s")
    cost = ran.get("cost")
    if cost and cost.get("kind") == "model":
        print("modeled device time (trn1): " + ", ".join(f"{k} {v['trn1']['modeled_time_s']:.3f} s"
                                                       for k, v in cost.get("stages", {}).items()))


if __name__ == "__main__":
    main()
