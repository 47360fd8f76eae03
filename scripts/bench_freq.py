"""Frequencies benchmark: water MP2/cc-pVDZ at its MP2 minimum against the experimental fundamentals (scaled
harmonic frequencies), and the cost of a frequency run (wall time, seconds per displaced gradient, the
speed-up from two torchrun ranks) on Vitamin C/cc-pVDZ.

    python scripts/bench_freq.py --water                 # ~1 min on a 2-core VM
    python scripts/bench_freq.py --vitamin-c             # 120 displaced gradients on 1 rank, then on 2 ranks
    python scripts/bench_freq.py --vitamin-c --two-rank-minutes 25   # the two-rank run measured over 25 min
    python scripts/bench_freq.py --water --write-docs    # the tables into docs/benchmarks.md

Every calculation is `mp2trn optimize`/`mp2trn freq --json` in a fresh process; the tables are built from
their JSON documents. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mp2trn.machine import machine_description

ROOT = Path(__file__).resolve().parents[1]
VITAMIN_C = ROOT / "molecules" / "gpu4pyscf" / "organic" / "020_Vitamin_C.xyz"
#: water's fundamentals (cm⁻¹): ν2 bend, ν1 symmetric and ν3 antisymmetric stretch (NIST CCCBDB, from
#: T. Shimanouchi, Tables of Molecular Vibrational Frequencies, NSRDS-NBS 39 (1972))
WATER_FUNDAMENTALS = (1595.0, 3657.0, 3756.0)
#: the MP2/cc-pVDZ (frozen core) scaling factor of harmonic frequencies to fundamentals, 0.953 (NIST CCCBDB,
#: "vibrational frequency scaling factors"; 0.9537 in P. Sinha et al., J. Phys. Chem. A 108, 9213 (2004))
MP2_CCPVDZ_SCALING = 0.953
BEGIN, END = "<!-- BEGIN bench_freq -->", "<!-- END bench_freq -->"
RECORDS = ROOT / "docs" / "records" / "bench_freq_vitaminc.jsonl"


def mp2trn(*args: str, ranks: int = 1) -> float:
    """Run one mp2trn command in a fresh process (over ``ranks`` torchrun ranks); its wall time (s)."""
    launch = [sys.executable, "-m", "mp2trn"] if ranks == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), "-m", "mp2trn"]
    t0 = time.perf_counter()
    subprocess.run([*launch, *args], check=True, cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return time.perf_counter() - t0


def water(basis: str) -> list[str]:
    """Optimise water (gau_tight), frequencies at the minimum with --frozen-core auto; the table rows."""
    with tempfile.TemporaryDirectory() as tmp:
        opt = Path(tmp) / "opt.json"
        wall = mp2trn("optimize", "molecules/water.xyz", "--basis", basis, "--frozen-core", "auto", "--convergence",
                      "gau_tight", "--freq", "--json", str(opt), "-q")
        doc = json.loads(opt.read_text())
    freq = doc["extras"]["mp2trn"]["frequencies"]["extras"]["mp2trn"]
    harmonic = freq["vibrations"]["frequencies_cm1"]
    hess, thermo = freq["hessian"], freq["thermochemistry"]
    rows = [f"Water MP2/{basis} (frozen core) at its MP2 minimum (`mp2trn optimize --convergence gau_tight --freq`, "
            f"{wall:.0f} s in all; the Hessian: {hess['displacements']} displaced gradients, "
            f"{hess['seconds_per_displacement']:.2f} s each, max |H − Hᵀ| {hess['asymmetry_eh_bohr2']:.1e} Eh/bohr²):",
            "", f"| mode | harmonic (cm⁻¹) | × {MP2_CCPVDZ_SCALING} | experimental fundamental (cm⁻¹) | scaled − exp. | "
                "IR (km/mol) |", "|---|---:|---:|---:|---:|---:|"]
    names = ("ν2 bend", "ν1 sym. stretch", "ν3 antisym. stretch")
    for name, w, exp, ir in zip(names, harmonic, WATER_FUNDAMENTALS, freq["vibrations"]["ir_intensities_km_per_mol"]):
        rows.append(f"| {name} | {w:.1f} | {w * MP2_CCPVDZ_SCALING:.1f} | {exp:.0f} | "
                    f"{w * MP2_CCPVDZ_SCALING - exp:+.1f} | {ir:.1f} |")
    rows += ["", f"ZPE {thermo['corrections_kcal_per_mol']['zpe']:.3f} kcal/mol (unscaled); at 298.15 K, 1 atm: "
                 f"H − E0 {thermo['corrections_kcal_per_mol']['thermal_enthalpy']:.3f} kcal/mol, S "
                 f"{thermo['entropy_cal_per_mol_k']:.3f} cal/(mol·K), G − E0 "
                 f"{thermo['corrections_kcal_per_mol']['thermal_gibbs']:.3f} kcal/mol (σ = {thermo['symmetry_number']})."]
    return rows


def vitamin_c(basis: str, two_rank_minutes: float | None = None) -> list[str]:
    """Vitamin C frequencies on one rank and on two; wall time, s per displacement, speed-up. Each finished
    phase is a line of RECORDS (a later call skips the phases recorded for this basis: delete the file to
    measure again); ``two_rank_minutes`` stops the two-rank run after that long and measures it over the
    displacements it finished (their points kept in a --displacements store, each with its file's time)."""
    done = {r["ranks"]: r for r in _records() if r["basis"] == basis}
    for ranks in (1, 2):
        if ranks in done:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            if ranks == 2 and two_rank_minutes:
                record = _bounded_run(basis, ranks, Path(tmp) / "points", two_rank_minutes * 60.0)
            else:
                out = Path(tmp) / f"freq{ranks}.json"
                wall = mp2trn("freq", str(VITAMIN_C), "--basis", basis, "--json", str(out), "-q", ranks=ranks)
                hess = json.loads(out.read_text())["extras"]["mp2trn"]["hessian"]
                record = {"ranks": ranks, "basis": basis, "complete": True, "wall_s": wall,
                          "displacements_done": hess["displacements"], "displacements": hess["displacements"],
                          "wall_per_displacement_s": wall / hess["displacements"],
                          "seconds_per_displacement": hess["seconds_per_displacement"]}
        record["machine"] = machine_description()
        with RECORDS.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        done[ranks] = record
    one = done[1]
    rows = ["| ranks | displaced gradients | wall (s) | s per displaced gradient, each on its rank | wall per "
            "displacement (s) | speed-up |", "|---:|---:|---:|---:|---:|---:|"]
    for ranks, r in sorted(done.items()):
        wall = f"{r['wall_s']:.0f}" if r["complete"] else f"({r['displacements_done']} done in {r['window_s']:.0f})"
        rows.append(f"| {ranks} | {r['displacements_done']} of {r['displacements']} | {wall} | "
                    f"{r['seconds_per_displacement']:.1f} | {r['wall_per_displacement_s']:.1f} | "
                    f"{one['wall_per_displacement_s'] / r['wall_per_displacement_s']:.2f}x |")
    notes = [f"Machine: {r['machine']} ({'one' if k == 1 else 'two'} rank{'s' if k > 1 else ''})." for k, r in sorted(done.items())]
    if not done[2]["complete"]:
        notes.append("The two-rank run was stopped after its bounded time: its wall per displacement is the time "
                     "from the reference point to the last finished displacement over the displacements finished.")
    return [f"Vitamin C/{basis} frequencies (`mp2trn freq`, fresh processes; two ranks under torchrun, gloo; "
            "records docs/records/bench_freq_vitaminc.jsonl):", "", *rows, "", *notes]


def _records() -> list[dict]:
    return [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()] if RECORDS.exists() else []


def _bounded_run(basis: str, ranks: int, store: Path, budget_s: float) -> dict:
    """``mp2trn freq`` over ``ranks`` ranks with its points in ``store``, stopped after ``budget_s``
    seconds (or at its end); measured over the displaced points it finished."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
              "-m", "mp2trn", "freq", str(VITAMIN_C), "--basis", basis, "--displacements", str(store), "-q"]
    t0 = time.time()
    proc = subprocess.Popen(launch, cwd=ROOT, start_new_session=True,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    while proc.poll() is None and time.time() - t0 < budget_s:
        time.sleep(1.0)
    complete = proc.poll() == 0
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    wall = time.time() - t0
    points = list(store.glob("d*.json"))
    if not points:
        raise SystemExit(f"the {ranks}-rank run finished no displacement in {budget_s / 60:.1f} minutes")
    start = (store / "reference.json").stat().st_mtime
    last = max(f.stat().st_mtime for f in points)
    seconds = [json.loads(f.read_text())["seconds"] for f in points]
    return {"ranks": ranks, "basis": basis, "complete": complete, "wall_s": wall, "window_s": last - start,
            "displacements_done": len(points), "displacements": 6 * _natoms(),
            "wall_per_displacement_s": (last - start) / len(points),
            "seconds_per_displacement": sum(seconds) / len(seconds)}


def _natoms() -> int:
    return int(VITAMIN_C.read_text().split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--water", action="store_true")
    parser.add_argument("--vitamin-c", action="store_true")
    parser.add_argument("--two-rank-minutes", type=float, default=None,
                        help="stop the Vitamin C two-rank run after this long; measure it over what it finished")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--write-docs", action="store_true", help="put the tables into docs/benchmarks.md")
    args = parser.parse_args()
    rows = [f"Machine: {machine_description()}. Command: `python scripts/bench_freq.py "
            f"{'--water ' if args.water else ''}{'--vitamin-c ' if args.vitamin_c else ''}"
            f"{f'--two-rank-minutes {args.two_rank_minutes:g}' if args.two_rank_minutes else ''}".rstrip() + "`", ""]
    if args.water:
        rows += water(args.basis) + [""]
    if args.vitamin_c:
        rows += vitamin_c(args.basis, args.two_rank_minutes) + [""]
    text = "\n".join(rows)
    print(text)
    if args.write_docs:
        from mp2trn.files import replace_marked_block

        replace_marked_block(ROOT / "docs" / "benchmarks.md", BEGIN, END, f"{BEGIN}\n{text}\n{END}")


if __name__ == "__main__":
    main()
