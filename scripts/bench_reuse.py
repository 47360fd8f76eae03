#!/usr/bin/env python
"""What the gradient saves by taking over the energy's B, its 3-index integrals and the SCF's JK-fit tensor
(issue 33, "nothing built twice"): one process, one SCF, the gradient stage timed round robin — as a run does
it (the energy's B and, where the budget holds them, its integrals for the RI pass; the SCF's tensor kept for
the response) and building them all again — with the gradients compared.

    python scripts/bench_reuse.py --xyz molecules/gpu4pyscf/organic/020_Vitamin_C.xyz --repeats 2

Each "reused" round runs the energy (which keeps B) and then the gradient; each "rebuilt" round runs the
gradient kernel on the same SCF with nothing handed over. Prints the gradient stage's seconds per round,
the B stage, the RI pass (where the integrals are read or made) and the response stage (where the tensor and
its MO blocks are made), and the largest gradient
difference. A benchmark, not a test (the equality is tests/test_reuse.py's).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mp2trn import dfmp2  # noqa: E402
from mp2trn.grad import kernel as gradient_kernel  # noqa: E402
from mp2trn.machine import machine_description  # noqa: E402
from mp2trn.memory import budget_mb  # noqa: E402
from mp2trn.options import RunOptions  # noqa: E402
from mp2trn.pipeline import open_device, ri_rows_held_mb, scf_stage, scf_tensor_held_mb  # noqa: E402
from mp2trn.transform import KeptB  # noqa: E402

STAGES = ("gradient_b", "gradient_ri", "gradient_response", "gradient")


def reused_round(stage, options, device) -> tuple[dict, np.ndarray, dict]:
    """Energy then gradient as a run does them: B and (where the budget holds them) the 3-index integrals kept
    by the energy, the SCF's tensor kept (re-made here for the round, outside the timing, as the SCF would
    have left it)."""
    mf, molecule = stage.mf, stage.molecule
    mf.with_df.tensor.full = _scf_rows(mf)
    held = scf_tensor_held_mb(stage, options, device)
    rows = ri_rows_held_mb(stage, options, device, held)
    budget = budget_mb(options.max_memory) - held - rows
    with KeptB() as kept:
        kept.keep_rows = rows > 0
        dfmp2.kernel(mf, device, budget, molecule.ri_auxbasis, options.frozen, keep_b=kept)
        g = gradient_kernel(mf, device, budget, molecule.ri_auxbasis, options.frozen, kept_b=kept)
    return g.timings, g.gradient, g.what_ran["gradient_reused"]


def rebuilt_round(stage, options, device) -> tuple[dict, np.ndarray, dict]:
    mf, molecule = stage.mf, stage.molecule
    g = gradient_kernel(mf, device, budget_mb(options.max_memory), molecule.ri_auxbasis, options.frozen,
                        reuse_scf_tensor=False)
    return g.timings, g.gradient, g.what_ran["gradient_reused"]


def _scf_rows(mf) -> np.ndarray:
    from mp2trn.df import cholesky_tensor

    return cholesky_tensor(mf.mol, mf.with_df.auxmol, packed=mf.with_df.device.jk_packed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xyz", type=Path, default=ROOT / "molecules" / "benzene.xyz")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    options = RunOptions.build(None, basis=args.basis, device=args.device, gradient=True)
    print(f"machine: {machine_description()}")
    with open_device(options) as device:
        stage = scf_stage(str(args.xyz), options, device, keep_tensor=True)
        rows, grads = [], {}
        for r in range(args.repeats):
            for name, fn in (("reused", reused_round), ("rebuilt", rebuilt_round)):
                t0 = time.perf_counter()
                timings, grad, what = fn(stage, options, device)
                rows.append((name, r, timings, what))
                grads.setdefault(name, grad)
                print(f"{name} round {r}: {time.perf_counter() - t0:.1f} s wall", flush=True)
    print(f"\n{args.xyz.name}/{args.basis}, device {args.device}\n")
    print("| round | B stage s | RI pass s | response s | gradient stage s | what was handed over |")
    print("|---|---:|---:|---:|---:|---|")
    for name, r, t, what in rows:
        print(f"| {name} {r} | {t['gradient_b']:.2f} | {t['gradient_ri']:.2f} | {t['gradient_response']:.2f} | "
              f"{t['gradient']:.2f} | "
              f"{'; '.join(f'{k}: {v}' for k, v in what.items())} |")
    print(f"\nlargest gradient difference, reused − rebuilt: "
          f"{np.max(np.abs(grads['reused'] - grads['rebuilt'])):.1e} Eh/bohr")


if __name__ == "__main__":
    main()
