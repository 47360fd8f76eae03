"""Whole runs (molecule → SCF → DF-MP2): PySCF's density-fitted RHF + DFMP2 against mp2trn per precision.

    python scripts/bench_end_to_end.py                          # Inosine/cc-pVDZ and Vitamin C/cc-pVTZ
    python scripts/bench_end_to_end.py --case inosine-dz -p fp64 fp32
    python scripts/bench_end_to_end.py --repeat 2              # runs take turns, each keeps its best
    python scripts/bench_end_to_end.py --tuned-mp2trn          # mp2trn with the tuned environment too

Same bases on both sides (the JK-fit basis for the SCF, the RI basis for MP2), conv_tol 1e-10, the same
memory budget; every run in a fresh process of its own. PySCF runs twice: as a new user runs it
(scripts/pyscf_whole_run.py, PySCF alone, default environment) and "threads tuned" (OMP_WAIT_POLICY=PASSIVE
OPENBLAS_THREAD_TIMEOUT=4, which spares it the BLAS/OpenMP thread contention mp2trn avoids by itself, see
mp2trn/threads.py). Prints a Markdown table: whole-run seconds, SCF and MP2 seconds, SCF cycles and the
precision of each, the speed-up over both PySCF runs and the energy differences. Goals on the 2-core CPU:
fp64 ≥ 1.5×, fp32 (mixed) ≥ 2×. A benchmark, not a test: it prints ratios measured in one run.
"""

from __future__ import annotations

import argparse

from mp2trn.benchmark import END_TO_END, end_to_end_case, whole_run_markdown
from mp2trn.machine import machine_description


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="+", default=list(END_TO_END), choices=list(END_TO_END))
    ap.add_argument("-p", "--precision", nargs="+", default=["fp64", "fp32"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=1, help="turns per run (the fastest is kept)")
    ap.add_argument("--tuned-mp2trn", action="store_true", help="also run mp2trn with the tuned environment")
    args = ap.parse_args()
    rows = []
    for name in args.case:
        rows.extend(end_to_end_case(name, args.precision, device=args.device, repeat=args.repeat,
                                    tuned_mp2trn=args.tuned_mp2trn))
        print(f"done {name}", flush=True)
    print(f"\nMachine: {machine_description()}\n")
    print(whole_run_markdown(rows))


if __name__ == "__main__":
    main()
