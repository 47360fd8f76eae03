"""Whole runs from 20 to 66 atoms: mp2trn fp64/fp32 against a thread-tuned PySCF, with the cost exponent.

    python scripts/bench_scaling.py                          # the five molecules below, cc-pVDZ
    python scripts/bench_scaling.py --only vitaminc,inosine  # a subset
    python scripts/bench_scaling.py --memory 6000            # one budget (MB) for every run
    python scripts/bench_scaling.py --repeat 2               # each code twice per molecule, the faster kept
    python scripts/bench_scaling.py --only inosine --records scaling.jsonl   # re-measure one molecule, then
                                                             # table, fit and plot over every stored row
    python scripts/bench_scaling.py --report --records docs/scaling.jsonl   # only table, fits and plot

Every run is a fresh process. PySCF (scripts/pyscf_whole_run.py: DF-RHF + DFMP2, the same bases) runs with
OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4, the fair peer; mp2trn runs as it comes. Each run reports
its wall time per stage, SCF cycles, peak resident memory (ru_maxrss of its own process) and whether the
SCF tensor stayed resident or was streamed. Prints a Markdown table, fits t ∝ nao^k per code (least squares
on log t against log nao), says how much each fit hangs on single runs (each molecule left out in turn;
every code's slowest run instead of its fastest) and writes a log-log plot (``--plot``, default docs/scaling.png). A benchmark,
not a test: ratios measured in one run. On a noisy machine ``--repeat N`` runs the three codes N times per
molecule, interleaved (PySCF, fp64, fp32, PySCF, ...), and keeps each code's fastest run (``runs`` in the
records holds every time).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from mp2trn.benchmark import THREAD_ENV
from mp2trn.machine import machine_description
from mp2trn.memory import default_memory_mb

ROOT = Path(__file__).resolve().parents[1]
ORGANIC = ROOT / "molecules" / "gpu4pyscf" / "organic"
MOLECULES = {
    "vitaminc": ORGANIC / "020_Vitamin_C.xyz",
    "inosine": ORGANIC / "031_Inosine.xyz",
    "penicillin": ORGANIC / "042_Penicillin_V.xyz",
    "cetirizine": ORGANIC / "052_Cetirizine.xyz",
    "raffinose": ORGANIC / "066_Raffinose.xyz",
}

#: one mp2trn whole run in a child process: its JSON record on the last line
_CHILD = """
import json, sys, time
from mp2trn.memory import peak_rss_mb
from mp2trn.pipeline import run
t0 = time.perf_counter()
res = run(sys.argv[1], basis=sys.argv[2], precision=sys.argv[3], max_memory=float(sys.argv[4]))
scf = res.scf or {}
print(json.dumps({"seconds": time.perf_counter() - t0, "stages": res.timings, "cycles": scf.get("cycles"),
                  "tensor": scf.get("tensor"), "jk_seconds_per_build": scf.get("jk_seconds_per_build"),
                  "peak_rss_mb": peak_rss_mb(), "nao": res.sizes["nao"], "e_tot": res.e_tot, "e_scf": res.e_hf}))
"""


def _env(tuned: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    if tuned:
        env.update(THREAD_ENV)
    return env


def run_mp2trn(path: Path, basis: str, precision: str, memory: float) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), basis, precision, repr(memory)],
                          env=_env(False), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"mp2trn {path.name} {precision}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_pyscf(path: Path, basis: str, memory: float) -> dict:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "pyscf_whole_run.py"), str(path), basis,
                           "--max-memory", repr(memory)], env=_env(True), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"PySCF {path.name}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def exponent(naos: list[int], seconds: list[float]) -> float:
    """k of t ∝ nao^k by least squares on the logarithms."""
    return float(np.polyfit(np.log(naos), np.log(seconds), 1)[0])


CODES = (("PySCF tuned", "pyscf"), ("mp2trn fp64", "fp64"), ("mp2trn fp32", "fp32"))


def by_nao(rows) -> list[dict]:
    return sorted(rows, key=lambda r: r["fp64"]["nao"])


def load(path: Path) -> list[dict]:
    """The stored rows of a records file (JSON lines), sorted by the number of basis functions."""
    return by_nao(json.loads(line) for line in path.read_text().splitlines() if line.strip())


def fits(rows: list[dict], seconds=lambda r, key: r[key]["seconds"]) -> dict[str, float]:
    """Each code's exponent k over ``rows``, from ``seconds(row, code)`` (default: its kept, fastest run)."""
    naos = [r["fp64"]["nao"] for r in rows]
    return {label: exponent(naos, [seconds(r, key) for r in rows]) for label, key in CODES}


def robustness(rows: list[dict]) -> str:
    """How much the exponents depend on single runs: k with each molecule left out in turn (min–max), and
    k from every code's slowest run per molecule (the ``runs`` of the records) instead of its fastest."""
    lines = []
    if len(rows) >= 3:
        left_out = [fits(rows[:i] + rows[i + 1:]) for i in range(len(rows))]
        lines.append("k with one molecule left out: " + ", ".join(
            f"{label} {min(f[label] for f in left_out):.2f}–{max(f[label] for f in left_out):.2f}" for label, _ in CODES))
    if all(r.get("runs") for r in rows):
        slow = fits(rows, lambda r, key: max(r["runs"][key]))
        lines.append("k from each code's slowest run: " + ", ".join(f"{k} {v:.2f}" for k, v in slow.items()))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated names: " + ", ".join(MOLECULES))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--memory", type=float, default=default_memory_mb(), help="budget in MB for every run")
    ap.add_argument("--repeat", type=int, default=1, help="runs per code and molecule, interleaved; the "
                    "fastest is kept")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "scaling.png")
    ap.add_argument("--records", type=Path, help="JSON lines of measured rows: new rows replace stored ones of "
                    "the same molecule, and the table, fit and plot cover every stored row")
    ap.add_argument("--report", action="store_true", help="run nothing: table, fits and plot from --records")
    args = ap.parse_args()
    names = [] if args.report else args.only.split(",") if args.only else list(MOLECULES)
    stored = {r["name"]: r for r in load(args.records)} if args.records and args.records.exists() else {}
    for name in names:
        path = MOLECULES[name]
        runs: dict[str, list[dict]] = {"pyscf": [], "fp64": [], "fp32": []}
        for _ in range(args.repeat):
            runs["pyscf"].append(run_pyscf(path, args.basis, args.memory))
            for precision in ("fp64", "fp32"):
                runs[precision].append(run_mp2trn(path, args.basis, precision, args.memory))
        row = {"name": name, **{code: min(rs, key=lambda r: r["seconds"]) for code, rs in runs.items()}}
        row["runs"] = {code: [r["seconds"] for r in rs] for code, rs in runs.items()}
        stored[name] = row
        if args.records:
            args.records.write_text("".join(json.dumps(r) + "\n" for r in stored.values()))
        print(f"done {name}", file=sys.stderr, flush=True)
    rows = by_nao(stored.values())
    repeats = sorted({len(r.get("runs", {}).get("pyscf", [0])) for r in rows})
    print(f"\n{args.basis}, budget {args.memory:.0f} MB, fastest of {'/'.join(map(str, repeats))} run(s) per code. "
          f"Machine: {machine_description()}\n")
    print(table(rows))
    if len(rows) >= 2:
        plot(rows, fits(rows), args.plot)
        print(f"plot: {args.plot}")


def table(rows: list[dict]) -> str:
    """The Markdown table of the stored rows (sorted by nao), the fitted exponents and how robust they are."""
    lines = ["| molecule | nao | PySCF tuned (s) | mp2trn fp64 (s) | mp2trn fp32 (s) | speed-up fp64 / fp32 "
             "| SCF s: PySCF / fp64 / fp32 | cycles PySCF / fp64 / fp32 | peak RSS GB: PySCF / fp64 / fp32 "
             "| SCF tensor (fp64 run) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        p, a, b = r["pyscf"], r["fp64"], r["fp32"]
        lines.append(f"| {r['name']} | {a['nao']} | {p['seconds']:.1f} | {a['seconds']:.1f} | {b['seconds']:.1f} "
                     f"| {p['seconds'] / a['seconds']:.2f}× / {p['seconds'] / b['seconds']:.2f}× "
                     f"| {p['scf_seconds']:.1f} / {a['stages']['scf']:.1f} / {b['stages']['scf']:.1f} "
                     f"| {p['cycles']} / {a['cycles']} / {b['cycles']} "
                     f"| {p['peak_rss_mb'] / 1e3:.2f} / {a['peak_rss_mb'] / 1e3:.2f} / {b['peak_rss_mb'] / 1e3:.2f} "
                     f"| {a['tensor']} |")
    if len(rows) >= 2:
        lines += ["", "cost exponent k (t ∝ nao^k): " + ", ".join(f"{k} {v:.2f}" for k, v in fits(rows).items())]
        lines.append(robustness(rows))
    return "\n".join(lines)


def plot(rows: list[dict], fits: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    naos = [r["fp64"]["nao"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    for (label, key), marker in zip((("PySCF tuned", "pyscf"), ("mp2trn fp64", "fp64"), ("mp2trn fp32", "fp32")),
                                    "os^"):
        ax.loglog(naos, [r[key]["seconds"] for r in rows], marker=marker, label=f"{label} (k = {fits[label]:.2f})")
    for n, r in zip(naos, rows):
        ax.annotate(r["name"], (n, r["pyscf"]["seconds"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("basis functions (cc-pVDZ)")
    ax.set_ylabel("whole run (s)")
    ax.set_title("Whole DF-MP2 runs on the 2-core machine")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
