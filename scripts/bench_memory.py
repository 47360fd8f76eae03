"""Peak resident memory against ``--memory``: energy and gradient runs at several budgets, and what each costs.

    python scripts/bench_memory.py                                   # Inosine/cc-pVDZ, 500/1000/2000/4000 MB
    python scripts/bench_memory.py --budgets 500 4000 --modes gradient
    python scripts/bench_memory.py --report                          # the table from the records so far

Every run is ``mp2trn run XYZ --memory MB [--gradient] --json ...`` in a fresh process; its peak resident
set (the kernel's ru_maxrss of that child, from ``os.wait4``) and wall time are measured here, and the
run's own JSON says which arrays were resident and which streamed. The fixed cost of the interpreter and
the libraries (Python, NumPy, SciPy, PySCF, h5py) is measured the same way on water/cc-pVDZ at the same
budget and mode, where mp2trn's own arrays are a few MB: "over baseline" is peak minus that. Records are
appended to docs/memory_bench.jsonl (one line per run; a later run of the same case replaces the earlier
in the report), so a slow machine can measure the grid in several sittings; ``--report`` rewrites the
table in docs/benchmarks.md between its markers. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mp2trn.files import replace_marked_block, write_text_atomic
from mp2trn.machine import machine_description

ROOT = Path(__file__).resolve().parents[1]
INOSINE = ROOT / "molecules" / "gpu4pyscf" / "organic" / "031_Inosine.xyz"
WATER = ROOT / "molecules" / "water.xyz"
RECORDS = ROOT / "docs" / "memory_bench.jsonl"
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- BEGIN bench_memory -->", "<!-- END bench_memory -->"


def measure(xyz: Path, basis: str, budget_mb: float, gradient: bool) -> dict:
    """One run in a fresh process: peak RSS (MB), wall (s) and what its JSON says about memory."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "mp2trn", "run", str(xyz), "--basis", basis, "--memory", str(budget_mb),
               "--json", str(out), "-q"] + (["--gradient"] if gradient else [])
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
        err = child.stderr.read()
        child.stderr.close()
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {err.strip()[-500:]}")
        extras = json.loads(out.read_text())["extras"]["mp2trn"]
    what = extras
    return {"peak_mb": usage.ru_maxrss * 1024 / 1e6, "wall_s": wall, "timings": extras.get("timings", {}),
            "out_of_core": what.get("out_of_core"), "scf_tensor": (extras.get("scf") or {}).get("tensor"),
            "gradient_memory": what.get("gradient_memory"), "gradient_jk": what.get("gradient_jk")}


def records(path: Path = RECORDS) -> dict[tuple, dict]:
    """The latest record of every (molecule, basis, mode, budget)."""
    out: dict[tuple, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out[(r["molecule"], r["basis"], r["mode"], r["budget_mb"])] = r
    return out


def append(record: dict, path: Path = RECORDS) -> None:
    text = path.read_text() if path.exists() else ""
    write_text_atomic(path, text + json.dumps(record) + "\n")


def streamed(r: dict) -> str:
    """What did not stay in memory, in a few words."""
    parts = []
    if r.get("scf_tensor", "").startswith("streamed"):
        parts.append("SCF tensor")
    if r.get("out_of_core"):
        parts.append("B")
    g = r.get("gradient_memory") or {}
    if g:
        if "HDF5" in g.get("Gamma", ""):
            parts += (["B"] if "B" not in parts else []) + ["Γ̄"]
        if "pairs" in g.get("pair_sweep", ""):
            parts.append("B in block pairs")
        if g.get("response_jkfit_mo_blocks", "").startswith("not made"):
            parts.append("response: J/K builds")
        if "HDF5" in g.get("jkfit_half_transformed", ""):
            parts.append("(P\\|iμ)")   # escaped for the Markdown table
    return ", ".join(parts) or "nothing"


def table(recs: dict[tuple, dict]) -> str:
    rows = ["| molecule / basis | run | --memory (MB) | peak RSS (MB) | baseline (MB) | over baseline (MB) | "
            "over baseline ≤ budget | peak ≤ 1.1·(baseline + budget) | wall (s) | streamed |",
            "|---|---|---:|---:|---:|---:|---|---|---:|---|"]
    for (mol, basis, mode, budget), r in sorted(recs.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][3])):
        if mol == "water":
            continue
        base = recs.get(("water", "cc-pvdz", mode, budget))
        over = r["peak_mb"] - base["peak_mb"] if base else None
        rows.append(f"| {mol} / {basis} | {mode} | {budget:.0f} | {r['peak_mb']:.0f} | "
                    f"{base['peak_mb']:.0f} | {over:.0f} | {'yes' if over <= budget else 'NO'} | "
                    f"{'yes' if r['peak_mb'] <= 1.1 * (base['peak_mb'] + budget) else 'NO'} | "
                    if base else f"| {mol} / {basis} | {mode} | {budget:.0f} | {r['peak_mb']:.0f} | – | – | – | – | ")
        rows[-1] += f"{r['wall_s']:.1f} | {streamed(r)} |"
    machines = sorted({r["machine"] for r in recs.values()})
    return "\n".join(rows) + "\n\nMachine: " + "; ".join(machines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--xyz", type=Path, default=INOSINE)
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--budgets", type=float, nargs="+", default=[500, 1000, 2000, 4000])
    ap.add_argument("--modes", nargs="+", choices=["energy", "gradient"], default=["energy", "gradient"])
    ap.add_argument("--report", action="store_true", help="only rewrite the docs table from the records")
    ap.add_argument("--records", type=Path, default=RECORDS, help="the records file (one JSON line per run)")
    args = ap.parse_args()
    if not args.report:
        machine = machine_description()
        name = args.xyz.stem.split("_", 1)[-1]
        for mode in args.modes:
            for budget in args.budgets:
                for label, xyz, basis in (("water", WATER, "cc-pvdz"), (name, args.xyz, args.basis)):
                    got = measure(xyz, basis, budget, mode == "gradient")
                    rec = {"molecule": label, "basis": basis, "mode": mode, "budget_mb": budget, "machine": machine,
                           **got}
                    append(rec, args.records)
                    print(f"{label:>10} {mode:>8} {budget:6.0f} MB: peak {got['peak_mb']:7.0f} MB, "
                          f"{got['wall_s']:7.1f} s, streamed: {streamed(got)}", flush=True)
    text = table(records(args.records))
    print(text)
    if DOC.exists() and BEGIN in DOC.read_text():
        replace_marked_block(DOC, BEGIN, END, f"{BEGIN}\n{text}{END}")


if __name__ == "__main__":
    main()
