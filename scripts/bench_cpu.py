"""Run the CPU benchmark (mp2trn vs PySCF DFMP2, same SCF) and write its table into docs/benchmarks.md.

    python scripts/bench_cpu.py                 # all cases (about 5 minutes on 2 cores)
    python scripts/bench_cpu.py --quick         # water, benzene, Vitamin C/cc-pVDZ

The table between the BEGIN/END markers in docs/benchmarks.md is replaced; nothing else is touched.
Run it on an otherwise idle machine: the numbers are wall times.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from pathlib import Path

from mp2trn.benchmark import CASES, QUICK, bench_case, rows_markdown
from mp2trn.machine import machine_description

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
BEGIN, END = "<!-- BEGIN bench_cpu -->", "<!-- END bench_cpu -->"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print only, leave docs/benchmarks.md alone")
    args = parser.parse_args()
    names = QUICK if args.quick else list(CASES)
    rows = []
    for name in names:
        print(f"running {name} ...", flush=True)
        rows.extend(bench_case(name, ["fp64", "fp32"], repeat=args.repeat))
    table = rows_markdown(rows)
    stamp = dt.date.today().isoformat()
    block = (f"{BEGIN}\nMeasured {stamp} on {machine_description()} with "
             f"`python scripts/bench_cpu.py{' --quick' if args.quick else ''}{f' --repeat {args.repeat}' if args.repeat > 1 else ''}`:\n\n"
             f"{table}\n{END}")
    print(block)
    if not args.no_write:
        text = DOC.read_text()
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _m: block, text, flags=re.S)
        DOC.write_text(text)
        print(f"updated {DOC}")


if __name__ == "__main__":
    main()
