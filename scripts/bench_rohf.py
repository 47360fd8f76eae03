"""ROHF-MBPT(2) against UMP2 on one radical: whole energy runs and whole gradient runs, cpu device.

    python scripts/bench_rohf.py                          # TEMPO (molecules/tempo.xyz, 29 atoms), cc-pVDZ
    python scripts/bench_rohf.py --xyz molecules/hydroxyl.xyz --no-record

Each run is `mp2trn run ... --json` in a fresh process, in the order UHF energy, ROHF energy, UHF gradient,
ROHF gradient, so the two references' runs of a kind follow each other under the same machine load. The
1-minute load average is read before and after every run and recorded with it (the ratios printed are
measured in this one invocation; a loaded machine stretches the wall times, not the energies). Prints
Markdown tables: wall time per stage, the energies (singles, same-spin, opposite-spin, total), UHF's ⟨S²⟩
and the ROHF − UHF differences. With --record (default for the TEMPO run) the tables go to
docs/records/bench_rohf.json, which docs/benchmarks.md must quote verbatim (tests/test_accuracy_records.py).
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy_records import record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEMPO = ROOT / "molecules" / "tempo.xyz"
REFERENCES = ("uhf", "rohf")
ENERGY_STAGES = [("scf", "SCF (DF J/K on the device)"), ("df_setup", "DF setup (3-index integrals, metric)"),
                 ("ao_to_mo", "AO→MO transform"), ("metric", "metric solve"), ("pairs", "pair step"),
                 ("mp2", "MP2 stage (all of the above after the SCF)")]
GRADIENT_STAGES = [("gradient_pairs", "pair sweep (P_ij, P_ab, Γ)"), ("gradient_ri", "RI pass (Lagrangian, RI derivatives)"),
                   ("gradient_response", "Z-vector and G[P]"), ("gradient_integrals", "derivative integrals"),
                   ("gradient", "gradient stage")]


def run_once(xyz: Path, reference: str, args: argparse.Namespace, gradient: bool) -> dict[str, Any]:
    """One `mp2trn run` in a fresh process; its QCSchema JSON with the load averages around it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "mp2trn", "run", str(xyz), "--basis", args.basis, "--device", args.device,
               "--reference", reference, "--frozen-core", args.frozen_core, "--json", str(out), "-q"]
        if gradient:
            cmd.append("--gradient")
        load_before = os.getloadavg()[0]
        subprocess.run(cmd, check=True, cwd=ROOT)
        result = json.loads(out.read_text())
    result["load"] = (load_before, os.getloadavg()[0])
    return result


def ran(result: dict[str, Any]) -> dict[str, Any]:
    return result["extras"]["mp2trn"]


def timing_table(runs: dict[tuple[str, str], dict[str, Any]]) -> str:
    """Wall seconds per stage for each reference, energy and gradient runs, with ROHF/UHF ratios."""
    lines = ["| stage | UHF (s) | ROHF (s) | ROHF / UHF |", "|---|---|---|---|"]

    def row(label: str, uhf: float, rohf: float) -> None:
        lines.append(f"| {label} | {uhf:.1f} | {rohf:.1f} | {rohf / uhf:.2f} |")

    for kind in ("energy", "gradient"):
        uhf, rohf = ran(runs["uhf", kind]), ran(runs["rohf", kind])
        stages = ENERGY_STAGES if kind == "energy" else GRADIENT_STAGES
        for key, label in stages:
            row(f"{kind} run: {label}", uhf["timings"][key], rohf["timings"][key])
        row(f"**{kind} run: whole**", uhf["timings"]["total"], rohf["timings"]["total"])
    uhf_e, rohf_e = ran(runs["uhf", "energy"]), ran(runs["rohf", "energy"])
    lines.append(f"| SCF cycles | {uhf_e['scf']['cycles']} | {rohf_e['scf']['cycles']} | |")
    lines.append(f"| Z-vector iterations | {ran(runs['uhf', 'gradient'])['zvector_iterations']} | "
                 f"{ran(runs['rohf', 'gradient'])['zvector_iterations']} | |")
    loads = ", ".join(f"{ref.upper()} {kind} {a:.1f}→{b:.1f}" for (ref, kind), r in runs.items() for a, b in [r["load"]])
    return "\n".join(lines) + f"\n\n1-minute load average before→after each run: {loads}."


def energy_table(runs: dict[tuple[str, str], dict[str, Any]]) -> tuple[str, dict[str, float]]:
    """Energies (Eh) of both references, UHF's ⟨S²⟩, and the ROHF − UHF differences (mEh)."""
    keys = [("scf_total_energy", "SCF"), ("mp2_singles_energy", "singles"),
            ("mp2_same_spin_correlation_energy", "same-spin doubles"),
            ("mp2_opposite_spin_correlation_energy", "opposite-spin doubles"),
            ("mp2_correlation_energy", "correlation"), ("mp2_total_energy", "total")]
    uhf, rohf = runs["uhf", "energy"]["properties"], runs["rohf", "energy"]["properties"]
    lines = ["| energy (Eh) | UHF-based (UMP2) | ROHF-based (ROHF-MBPT(2)) | ROHF − UHF (mEh) |", "|---|---|---|---|"]
    for key, label in keys:
        lines.append(f"| {label} | {uhf[key]:.8f} | {rohf[key]:.8f} | {1e3 * (rohf[key] - uhf[key]):+.3f} |")
    spin = [ran(runs[ref, "energy"])["reference_spin_square"] for ref in REFERENCES]
    lines.append(f"| reference ⟨S²⟩ (S(S+1) = 0.75) | {spin[0]:.4f} | {spin[1]:.4f} | |")
    grad_uhf = np.asarray(runs["uhf", "gradient"]["return_result"])
    grad_rohf = np.asarray(runs["rohf", "gradient"]["return_result"])
    lines.append(f"| max abs gradient component difference (Eh/bohr) | | | {np.abs(grad_rohf - grad_uhf).max():.2e} |")
    figures = {"uhf_spin_square": spin[0], "rohf_minus_uhf_total_meh": 1e3 * (rohf["mp2_total_energy"] - uhf["mp2_total_energy"]),
               "rohf_minus_uhf_scf_meh": 1e3 * (rohf["scf_total_energy"] - uhf["scf_total_energy"]),
               "max_gradient_difference": float(np.abs(grad_rohf - grad_uhf).max())}
    return "\n".join(lines), figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xyz", type=Path, default=TEMPO)
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--frozen-core", default="auto")
    parser.add_argument("--record", action=argparse.BooleanOptionalAction, default=None,
                        help="store the tables in docs/records/bench_rohf.json (default: only for the TEMPO run)")
    args = parser.parse_args()
    runs = {(ref, kind): run_once(args.xyz, ref, args, kind == "gradient")
            for kind in ("energy", "gradient") for ref in REFERENCES}
    uhf = ran(runs["uhf", "energy"])
    header = (f"{args.xyz.name}, {args.basis}, frozen core {uhf['frozen']}, device {args.device} {uhf['precision']}; "
              f"sizes {uhf['sizes']}")
    timings = timing_table(runs)
    energies, figures = energy_table(runs)
    print(header + "\n\n" + timings + "\n\n" + energies)
    if args.record or (args.record is None and args.xyz.resolve() == TEMPO):
        key = f"{args.xyz.stem} {args.basis} {args.device}"
        path = record("bench_rohf", key, "docs/benchmarks.md", {"header": header, **figures}, [timings, energies])
        print(f"\nrecorded in {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
