"""How long the cores sit idle inside the cpu device's split work: each part's start and end, per call.

    python scripts/bench_idle_cores.py jk                       # an fp32 J/K build, Inosine/cc-pVDZ
    python scripts/bench_idle_cores.py jk --blocks              # the same with the plan's 256-row blocks (before)
    python scripts/bench_idle_cores.py pairs                    # the energy's pair step, random B
    python scripts/bench_idle_cores.py pairs --ranges           # rows in two contiguous ranges (before)
    python scripts/bench_idle_cores.py pairs --nocc 44 --nvir 400 --naux 1100

Wraps ``CpuDevice._over_cores`` so that every part (or row) records when it started and ended, runs the
work ``--repeat`` times after one warm-up, and prints for the best run: its wall time, the device calls
(J/K blocks or pair blocks), the parts' busy core-seconds against cores × wall (the rest is idle: hand-overs
between calls, parts that end before others) and the first calls' timelines. ``--blocks`` and ``--ranges``
bring back the behaviour before 2026-11-27's third session (``Device.jk_resident_one_block`` off; rows
in one contiguous range per core) for a before/after in one process. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import mp2trn.devices.cpu as cpu  # noqa: E402
from mp2trn.machine import machine_description  # noqa: E402
from mp2trn.threads import blas_threads  # noqa: E402


def record_parts(by_row_off: bool) -> list[tuple[int, float, float]]:
    """Make ``_over_cores`` log (part, start, end) of every part or row; ``by_row_off``: ranges as before."""
    log: list[tuple[int, float, float]] = []
    original = cpu.CpuDevice._over_cores

    def over(self, work, run, parts=None, by_row=False):
        def timed(k, i0, i1):
            t0 = time.perf_counter()
            run(k, i0, i1)
            log.append((k, t0, time.perf_counter()))
        return original(self, work, timed, parts, by_row and not by_row_off)

    cpu.CpuDevice._over_cores = over
    return log


def jk_work(args):
    """An fp32 J/K build of Inosine/cc-pVDZ (JK-fit), as bench_jk.py makes it; returns the build and its
    device calls' counter."""
    from pyscf import df, gto, scf

    from bench_jk import _guess_density
    from mp2trn.devices import get_device
    from mp2trn.df import cholesky_tensor
    from mp2trn.jk import density_fit_jk
    from mp2trn.memory import default_memory_mb

    if args.blocks:
        cpu.CpuDevice.jk_resident_one_block = False
    mol = gto.M(atom=str(ROOT / "molecules/gpu4pyscf/organic/031_Inosine.xyz"), basis="cc-pvdz", verbose=0)
    auxmol = df.addons.make_auxmol(mol, df.make_auxbasis(mol))
    dm = _guess_density(mol)
    mf = density_fit_jk(scf.RHF(mol).density_fit(), device=get_device("cpu", args.precision),
                        max_memory=default_memory_mb())
    mf.with_df.tensor.full = cholesky_tensor(mol, auxmol, packed=True)
    return lambda: mf.get_jk(mol, dm), "J/K blocks"


def pairs_work(args):
    """The energy's pair step on random B (bench_pairs.py's sizes and blocks)."""
    from bench_pairs import pair_step, random_orbitals
    from mp2trn.memory import SpinShape, plan_blocks

    b, e_occ, e_vir = random_orbitals(args.nocc, args.nvir, args.naux)
    block = plan_blocks(args.nvir + args.nocc, args.naux, [SpinShape(args.nocc, args.nvir)], 50, 4000).occ_block
    dev = cpu.CpuDevice(args.precision)
    return lambda: pair_step(dev, b.astype(dev._dtype), e_occ, e_vir, block), "pair blocks"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work", choices=["jk", "pairs"])
    ap.add_argument("--precision", default=None, help="fp32 for jk, fp64 for pairs unless given")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--blocks", action="store_true", help="jk: the resident tensor in the plan's blocks")
    ap.add_argument("--ranges", action="store_true", help="pairs: rows in one contiguous range per core")
    ap.add_argument("--nocc", type=int, default=24)
    ap.add_argument("--nvir", type=int, default=300)
    ap.add_argument("--naux", type=int, default=900)
    args = ap.parse_args()
    args.precision = args.precision or ("fp32" if args.work == "jk" else "fp64")
    log = record_parts(args.ranges)
    calls: list[float] = []
    original_call = cpu.CpuDevice.jk_block if args.work == "jk" else cpu.CpuDevice.pair_energies
    name = "jk_block" if args.work == "jk" else "pair_energies"

    def counted(self, *a, **k):
        calls.append(time.perf_counter())
        return original_call(self, *a, **k)

    setattr(cpu.CpuDevice, name, counted)
    run, what = (jk_work if args.work == "jk" else pairs_work)(args)
    run()                                  # warm-up: the fp32 copy, the buffers
    cores = blas_threads()
    best = None
    for _ in range(args.repeat):
        log.clear()
        calls.clear()
        t0 = time.perf_counter()
        run()
        wall = time.perf_counter() - t0
        if best is None or wall < best[0]:
            best = (wall, t0, list(log), len(calls))
    wall, t0, parts, ncalls = best
    busy = sum(e - s for _, s, e in parts)
    print(f"{args.work} ({args.precision}{', --blocks' if args.blocks else ''}{', --ranges' if args.ranges else ''}); "
          f"{machine_description()}; best of {args.repeat}")
    print(f"wall {wall:.3f} s, {ncalls} {what}, {len(parts)} parts/rows on {cores} cores: busy {busy:.3f} "
          f"core-s of {cores * wall:.3f} ({busy / (cores * wall):.0%}), idle {cores * wall - busy:.3f} core-s")
    print("first parts (part, start s, end s after the call began):")
    for k, s, e in sorted(parts, key=lambda p: p[1])[:8]:
        print(f"  {k}  {s - t0:.3f}  {e - t0:.3f}")


if __name__ == "__main__":
    main()
