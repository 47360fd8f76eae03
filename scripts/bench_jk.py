"""Time one J/K build: PySCF's density-fitted ``get_jk`` against mp2trn's device J/K, same density.

    python scripts/bench_jk.py                      # Inosine/cc-pVDZ (JK-fit), cpu fp64 and fp32
    python scripts/bench_jk.py --xyz molecules/benzene.xyz --basis cc-pvtz --repeat 5

Prints seconds per build (best of --repeat), GFLOP/s of the exchange build (counted as
4·naux·nao²·nocc: the half-transform B_P C and the rank update, as PySCF counts none of the syrk saving),
the speed-up over PySCF and max |ΔJ|, |ΔK|. A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from pyscf import scf

from mp2trn.jk import density_fit_jk
from mp2trn.machine import machine_description
from mp2trn.memory import default_memory_mb
from mp2trn.molecule import build_mole

ROOT = Path(__file__).resolve().parents[1]


def best(fn, repeat):
    out, t_best = None, float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t0)
    return out, t_best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xyz", default=str(ROOT / "molecules/gpu4pyscf/organic/031_Inosine.xyz"))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", nargs="+", default=["fp64", "fp32"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    mol = build_mole(args.xyz, basis=args.basis)
    ref = scf.RHF(mol).density_fit()
    ref.with_df.build()
    # a converged-like density: the superposition-of-atoms guess, tagged with orbitals as make_rdm1 does
    mo_energy, mo_coeff = ref.eig(ref.get_hcore() + ref.get_veff(mol, ref.get_init_guess()), ref.get_ovlp())
    dm = ref.make_rdm1(mo_coeff, ref.get_occ(mo_energy, mo_coeff))
    nao, naux, nocc = mol.nao_nr(), ref.with_df.get_naoaux(), mol.nelectron // 2
    flops = 4.0 * naux * nao * nao * nocc
    (vj0, vk0), t_ref = best(lambda: ref.get_jk(mol, dm), args.repeat)
    print(f"{Path(args.xyz).stem}/{args.basis}: nao {nao}, naux {naux}, nocc {nocc}; {machine_description()}")
    print("| code | s per J/K build | GFLOP/s (K) | speed-up vs PySCF | max abs dJ | max abs dK |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| PySCF get_jk (fp64) | {t_ref:.3f} | {flops / t_ref / 1e9:.0f} | 1.00 | 0 | 0 |")
    for precision in args.precision:
        mf = density_fit_jk(scf.RHF(mol).density_fit(), device=args.device, precision=precision,
                            max_memory=default_memory_mb())   # the budget of a run: the tensor stays resident
        mf.with_df._cderi = ref.with_df._cderi
        mf.get_jk(mol, dm)  # the first build moves the tensor to the device (once per SCF)
        (vj, vk), t = best(lambda: mf.get_jk(mol, dm), args.repeat)
        where = "resident" if not mf.with_df.streamed else "streamed"
        print(f"| mp2trn {args.device} {precision} ({where}) | {t:.3f} | {flops / t / 1e9:.0f} | {t_ref / t:.2f} | "
              f"{np.abs(vj - vj0).max():.1e} | {np.abs(vk - vk0).max():.1e} |")
        mf.with_df.release()


if __name__ == "__main__":
    main()
