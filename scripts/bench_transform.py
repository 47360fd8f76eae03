"""Time the cpu device's AO→MO transform of packed 3-index integrals against PySCF's C transform.

    python scripts/bench_transform.py                                     # Inosine/cc-pVDZ, RI basis
    python scripts/bench_transform.py --xyz molecules/benzene.xyz --basis cc-pvtz --repeat 5

One block of (P|μν) rows (μ ≥ ν packed, as the MP2 stage makes them; ``--rows`` of them, default all)
and the SCF's canonical orbitals with the frozen core left out, as a run uses them. Timed in turn, best of
``--repeat``: the cpu device's transform (:meth:`mp2trn.devices.cpu.CpuDevice._packed_ao_to_mo`, the rows
split over the cores, a few unpacked at a time), PySCF's ``_ao2mo.nr_e2`` on the same packed rows (what the
device ran before), and the device's transform in one part with NumPy's pool in each GEMM. Prints seconds,
GFLOP/s of the two half-transforms (2·p·nao·no·(nao + nv)), the share of this run's DGEMM rate and the
largest difference from PySCF's result. A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from pyscf import df, scf
from pyscf.ao2mo import _ao2mo

from mp2trn.devices.cpu import CpuDevice
from mp2trn.machine import machine_description
from mp2trn.molecule import build_mole
from mp2trn.roofline import measure_gemm_rate

INOSINE = "molecules/gpu4pyscf/organic/031_Inosine.xyz"


def pyscf_transform(ao: np.ndarray, c_occ: np.ndarray, c_vir: np.ndarray) -> np.ndarray:
    no, nv = c_occ.shape[1], c_vir.shape[1]
    coeff = np.asarray(np.hstack([c_occ, c_vir]), order="F")
    out = _ao2mo.nr_e2(np.ascontiguousarray(ao), coeff, (0, no, no, no + nv), aosym="s2", mosym="s1")
    return out.reshape(ao.shape[0], no, nv)


def best_of(fn, repeat: int) -> tuple[float, np.ndarray]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xyz", default=INOSINE)
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--rows", type=int, default=0, help="fitting functions in the block (0: all)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    mol = build_mole(args.xyz, basis=args.basis)
    mol.verbose = 0
    auxmol = df.make_auxmol(mol, df.make_auxbasis(mol, mp2fit=True))
    mf = scf.RHF(mol).density_fit()
    mf.max_cycle, mf.conv_tol = 2, 1e-4      # orbitals of the right shape; their values do not change the timing
    mf.kernel()
    ncore = sum(1 for z in mol.atom_charges() if z > 2)
    nocc = mol.nelectron // 2
    c_occ, c_vir = mf.mo_coeff[:, ncore:nocc], mf.mo_coeff[:, nocc:]
    nbas, naux = mol.nbas, auxmol.nao_nr()
    loc = auxmol.ao_loc_nr()
    s1 = auxmol.nbas if not args.rows else int(np.searchsorted(loc, args.rows, side="right")) - 1
    s1 = max(1, s1)
    ao = (mol + auxmol).intor("int3c2e", aosym="s2ij", shls_slice=(0, nbas, 0, nbas, nbas, nbas + s1)).T
    p, nao, no, nv = ao.shape[0], mol.nao_nr(), c_occ.shape[1], c_vir.shape[1]
    flops = 2.0 * p * nao * no * (nao + nv)
    split, one = CpuDevice("fp64"), CpuDevice("fp64")
    one.split_over_cores = False
    rows = []
    ref = pyscf_transform(ao, c_occ, c_vir)     # also the warm-up
    for name, fn in [("cpu device (rows split over the cores)", lambda: split._packed_ao_to_mo(ao, c_occ, c_vir)),
                     ("PySCF `_ao2mo.nr_e2` (before)", lambda: pyscf_transform(ao, c_occ, c_vir)),
                     ("cpu device in one part, NumPy's pool in each GEMM",
                      lambda: one._packed_ao_to_mo(ao, c_occ, c_vir))]:
        t, out = best_of(fn, args.repeat)
        rows.append((name, t, float(np.abs(out - ref).max())))
    t_ref = rows[1][1]
    rate = measure_gemm_rate(np.float64)
    print(f"{args.xyz}, {args.basis}: nao {nao}, {p} of {naux} fitting functions, {no} active occupied, {nv} "
          f"virtual; {flops / 1e9:.1f} GFLOP; DGEMM {rate:.0f} GFLOP/s; {machine_description()}\n")
    print("| transform | s | GFLOP/s | of DGEMM | vs PySCF | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, t, diff in rows:
        print(f"| {name} | {t:.3f} | {flops / t / 1e9:.0f} | {flops / t / 1e9 / rate:.0%} | {t_ref / t:.2f}× | "
              f"{diff:.1e} |")


if __name__ == "__main__":
    main()
