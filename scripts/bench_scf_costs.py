#!/usr/bin/env python
"""What bounds the whole-run speed-up of issue 11 (docs/benchmarks.md, "Whole runs"), measured:

    python scripts/bench_scf_costs.py                  # Inosine/cc-pVDZ, all four measurements
    python scripts/bench_scf_costs.py --only tensor touch

1. ``tensor``  the SCF's 3-index tensor: mp2trn's direct build (``df.cholesky_tensor``) against PySCF's
               ``cholesky_eri`` plus the unpack the J/K builds need (two rounds, the second warm);
2. ``touch``   this machine's cost of touching fresh memory: filling a new array the size of the tensor,
               NumPy's against ``mp2trn.memory.prefaulted_empty``'s (a VM backs new guest pages on
               first touch, slowly for huge pages);
3. ``rank``    the rank of ΔD = D_k − D_ref over PySCF's fp64 SCF (eigenvalues above 1e-6 / 1e-8 of
               |ΔD|): why incremental fp32 ΔK builds cost as much as fp64 K builds on a CPU;
4. ``guess``   SCF cycles of PySCF's DF-RHF from each initial guess (minao is the default).

A benchmark: it prints measurements and asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from pyscf import df, lib, scf

from mp2trn.df import cholesky_tensor
from mp2trn.machine import machine_description
from mp2trn.memory import prefaulted_empty
from mp2trn.molecule import build_mole

ROOT = Path(__file__).resolve().parents[1]


def tensor(mol) -> None:
    auxmol = df.addons.make_auxmol(mol, df.make_auxbasis(mol))
    for rnd in (1, 2):
        t0 = time.perf_counter()
        packed = df.incore.cholesky_eri(mol, auxmol=auxmol, max_memory=16000)
        t1 = time.perf_counter()
        full = lib.unpack_tril(packed)
        t2 = time.perf_counter()
        del packed, full
        t3 = time.perf_counter()
        ours = cholesky_tensor(mol, auxmol)
        t4 = time.perf_counter()
        del ours
        print(f"tensor round {rnd}: PySCF cholesky_eri {t1 - t0:.2f} s + unpack {t2 - t1:.2f} s = {t2 - t0:.2f} s; "
              f"mp2trn cholesky_tensor {t4 - t3:.2f} s (naux {auxmol.nao_nr()}, nao {mol.nao_nr()})")


def touch(mol) -> None:
    """Fill a new array the size of the tensor: NumPy's (huge pages advised) against
    :func:`mp2trn.memory.prefaulted_empty` (small pages, faulted in by one thread per core), twice each in
    turn, with a pause between for the freed pages to be handed back to the host."""
    naux = df.addons.make_auxmol(mol, df.make_auxbasis(mol)).nao_nr()
    shape = (naux, mol.nao_nr(), mol.nao_nr())
    gb = np.prod(shape) * 8 / 1e9
    makers = {"np.empty": np.empty, "prefaulted_empty": prefaulted_empty}
    for rnd in (1, 2):
        for label, make in makers.items():
            time.sleep(5)
            t0 = time.perf_counter()
            a = make(shape)
            a[...] = 1.0
            print(f"touch round {rnd}: {label} of {gb:.2f} GB, then filled: {time.perf_counter() - t0:.2f} s")
            del a


def rank(mol) -> None:
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.verbose = 1e-10, 0
    dms = []
    mf.callback = lambda env: dms.append(np.array(env["dm"]))
    mf.kernel()
    nocc = mol.nelectron // 2
    for ref in (6, 8, 10):
        if ref + 1 >= len(dms):
            continue
        w = np.abs(np.linalg.eigvalsh(dms[-1] - dms[ref]))
        print(f"rank: ΔD between cycle {ref} and the last ({len(dms)}): max |λ| {w.max():.1e}, "
              f"{int(np.sum(w > 1e-6))} / {int(np.sum(w > 1e-8))} eigenvalues above 1e-6 / 1e-8 of 2·nocc = {2 * nocc}")


def guess(mol) -> None:
    for name in ("minao", "atom", "huckel", "sap"):
        mf = scf.RHF(mol).density_fit()
        mf.conv_tol, mf.verbose, mf.init_guess = 1e-10, 0, name
        t0 = time.perf_counter()
        mf.kernel()
        print(f"guess {name}: {mf.cycles} cycles, {time.perf_counter() - t0:.1f} s, E = {mf.e_tot:.10f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xyz", default=str(ROOT / "molecules/gpu4pyscf/organic/031_Inosine.xyz"))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--only", nargs="+", default=["tensor", "touch", "rank", "guess"],
                    choices=["tensor", "touch", "rank", "guess"])
    args = ap.parse_args()
    mol = build_mole(args.xyz, basis=args.basis)
    print(f"{Path(args.xyz).stem}/{args.basis}; {machine_description()}")
    for what in args.only:
        globals()[what](mol)


if __name__ == "__main__":
    main()
