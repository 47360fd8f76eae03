#!/usr/bin/env python
"""Why mp2trn holds every BLAS pool but one to a single thread (mp2trn/threads.py), measured:

    python scripts/bench_blas_pools.py                # eigh after a GEMM, then the Inosine/cc-pVDZ SCF
    python scripts/bench_blas_pools.py --only eigh

1. ``eigh``  a 326×326 SciPy ``eigh`` (the size of Inosine/cc-pVDZ's Fock matrix) right after a NumPy
             GEMM, with SciPy's BLAS pool as it comes and held to one thread (``one_blas_pool``);
2. ``scf``   mp2trn's SCF of Inosine/cc-pVDZ (cpu device J/K, fp64, the
             memory budget of a run) with and without ``one_blas_pool``
             around it, taking turns: seconds of the SCF, of its J/K builds, and of everything else.

A benchmark: it prints measurements and asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import numpy as np
import scipy.linalg

import mp2trn.scf
from mp2trn.benchmark import default_memory_mb
from mp2trn.devices import get_device
from mp2trn.machine import machine_description
from mp2trn.molecule import build_mole
from mp2trn.threads import one_blas_pool, pool_note

ROOT = Path(__file__).resolve().parents[1]


def eigh_after_gemm(rounds: int = 12) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((326, 326))
    fock = a + a.T
    big = rng.standard_normal((3000, 3000))
    for label, ctx in (("SciPy's pool as it comes", contextlib.nullcontext), ("one_blas_pool()", one_blas_pool)):
        times = []
        with ctx():
            for _ in range(rounds):
                big @ big
                t0 = time.perf_counter()
                scipy.linalg.eigh(fock)
                times.append((time.perf_counter() - t0) * 1e3)
        print(f"eigh 326x326 after a NumPy GEMM, {label}: median {statistics.median(times):.0f} ms, "
              f"min {min(times):.0f} ms, max {max(times):.0f} ms ({rounds} rounds)")


def scf(rounds: int = 2) -> None:
    mol = build_mole(ROOT / "molecules/gpu4pyscf/organic/031_Inosine.xyz", basis="cc-pvdz")
    held = mp2trn.scf.one_blas_pool
    for rnd in range(rounds):
        for label, policy in (("without one_blas_pool", contextlib.nullcontext), ("with one_blas_pool", held)):
            mp2trn.scf.one_blas_pool = lambda policy=policy: policy()
            try:
                device = get_device("cpu", "fp64")
                t0 = time.perf_counter()
                mf = mp2trn.scf.run_scf(mol, max_memory=default_memory_mb(), device=device)
                t = time.perf_counter() - t0
            finally:
                mp2trn.scf.one_blas_pool = held
            builds = mf.with_df.log.builds
            later = sum(b["seconds"] for b in builds[1:])
            print(f"SCF round {rnd + 1}, {label}: {t:.2f} s; first J/K build (makes the tensor) "
                  f"{builds[0]['seconds']:.2f} s, {len(builds) - 1} later builds {later:.2f} s, "
                  f"the rest {t - builds[0]['seconds'] - later:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=["eigh", "scf"], default=["eigh", "scf"])
    args = ap.parse_args()
    print(f"Machine: {machine_description()}")
    print(f"BLAS: {pool_note()}")
    if "eigh" in args.only:
        eigh_after_gemm()
    if "scf" in args.only:
        scf()


if __name__ == "__main__":
    main()
