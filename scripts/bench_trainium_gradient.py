#!/usr/bin/env python
"""MODELED Trainium cost of the analytic gradient's pair sweep (the ``mp2_density`` kernel), written into
docs/benchmarks_trainium.md between its markers.

    python scripts/bench_trainium_gradient.py                 # Inosine/cc-pVDZ and Vitamin C/cc-pVTZ shapes
    python scripts/bench_trainium_gradient.py --print-only

Everything here is a MODEL (the NKI emulator's cost model, docs/emulator.md), not a measurement. The sweep
launches ``mp2_density`` once per strip (every i × a block of k); the strip size is the host's
(:func:`mp2trn.memory.strip_cap` with a 16 GB budget), shorter last strips are padded to one
signature, and the kernel has no data-dependent control flow, so ONE launch per shape is emulated on random
tensors of that shape and counted as often as the sweep launches it (as scripts/bench_trainium_model.py
does for the energy). RHF: one strip case with t̃ = 2τ − τᵀ.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from mp2trn.devices.nki_device import SimDevice
from mp2trn.memory import strip_cap
from mp2trn.files import replace_marked_block

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks_trainium.md"
BEGIN, END = "<!-- BEGIN bench_trainium_gradient -->", "<!-- END bench_trainium_gradient -->"
#: (title, naux, nocc, nvir): sizes of the molecules with their RI bases (as in bench_trainium_model.py)
SHAPES = {
    "inosine-dz": ("031_Inosine / cc-pVDZ (cc-pVDZ-RI)", 1232, 70, 256),
    "vitaminc-tz": ("020_Vitamin_C / cc-pVTZ (cc-pVTZ-RI)", 1212, 46, 426),
}


def model(naux: int, nocc: int, nvir: int, budget_mb: float = 16000.0) -> dict:
    """The sweep's modeled cost on one NeuronCore: strips, one emulated launch, totals per target."""
    nk = strip_cap(naux, nocc, nvir, budget_mb)
    strips = -(-nocc // nk)
    rng = np.random.default_rng(5)
    dev = SimDevice(precision="fp32", target="trn1")
    b_all = (rng.standard_normal((naux, nocc, nvir)) * 0.02).astype(np.float32)
    e_occ = -np.sort(rng.uniform(0.3, 1.5, nocc))
    e_vir = np.sort(rng.uniform(0.1, 6.0, nvir))
    t0 = time.perf_counter()
    dev.pair_densities(b_all, b_all[:, :nk], e_occ, e_occ[:nk], e_vir, e_vir, 2.0, 1.0, False)
    wall = time.perf_counter() - t0
    cost = dev.cost_report()
    stage = cost["stages"]["grad_pairs"]
    flops = 2 * naux * nocc * nk * nvir * nvir * 2 + 2 * nocc * nk * nvir ** 3 + 2 * nocc ** 2 * nk * nvir ** 2
    return {"strips": strips, "nk": nk, "wall": wall, "stage": stage, "launch_flops": flops,
            "t1": stage["trn1"]["modeled_time_s"] * strips, "t2": stage["trn2"]["modeled_time_s"] * strips}


def table(results: dict) -> str:
    rows = ["| case | strips × k | trn1 modeled ms | trn2 modeled ms | TensorE % of fp32 peak (trn1) | bottleneck (trn1) |",
            "|---|---|---:|---:|---:|---|"]
    for key, r in results.items():
        st = r["stage"]["trn1"]
        te = st.get("tensor_peak_pct_fp32")
        rows.append(f"| {SHAPES[key][0]} | {r['strips']} × {r['nk']} | {r['t1'] * 1e3:.2f} | {r['t2'] * 1e3:.2f} | "
                    f"{te:.1f} | {st.get('bottleneck', '')} |" if isinstance(te, (int, float)) else
                    f"| {SHAPES[key][0]} | {r['strips']} × {r['nk']} | {r['t1'] * 1e3:.2f} | {r['t2'] * 1e3:.2f} | – | |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    parser.add_argument("--print-only", action="store_true")
    args = parser.parse_args()
    results = {}
    for key in args.shapes:
        _, naux, nocc, nvir = SHAPES[key]
        results[key] = model(naux, nocc, nvir)
        print(f"{key}: emulated one launch in {results[key]['wall']:.1f} s")
    block = "\n".join([BEGIN, "## The gradient's pair sweep: `mp2_density` (MODELED, not measured)", "",
                       "By `python scripts/bench_trainium_gradient.py`: the analytic gradient's O(N⁵) step on one "
                       "NeuronCore, fp32 (RHF, t̃ = 2τ − τᵀ). One strip launch emulated per shape and counted per "
                       "strip; its engine busy times and the TensorE share of the fp32 peak are the cost model's.",
                       "", table(results), END])
    print(block)
    if args.print_only:
        return
    replace_marked_block(DOC, BEGIN, END, block)
    print(f"updated {DOC}")


if __name__ == "__main__":
    main()
