#!/usr/bin/env python
"""The SCF energy of a device's J/K precision schedule against PySCF's fp64 DF-SCF (docs/precision.md).

    python scripts/scf_schedule_errors.py --device sim water:cc-pvdz hydroxyl:cc-pvdz benzene:cc-pvdz \\
        heavy/stannane:def2-svp

Each molecule (molecules/<name>.xyz, with its orbital basis) runs PySCF's density-fitted RHF/UHF with its
own fp64 J/K and mp2trn's device J/K under the device's default schedule (mp2trn.jk.device_schedule: on
sim/neuron fp32 difference-density builds, then fp32x3 on the device), both to conv_tol 1e-10. Prints
|ΔE|, the cycles per precision, the incremental builds and the builds on the host. A benchmark: it
prints measurements and asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pyscf import scf  # noqa: E402

from mp2trn.jk import density_fit_jk, precision_runs  # noqa: E402
from mp2trn.machine import machine_description  # noqa: E402
from mp2trn.molecule import build_mole  # noqa: E402


def one(name: str, basis: str, device: str, precision: str | None) -> str:
    mol = build_mole(str(ROOT / "molecules" / f"{name}.xyz"), basis=basis)

    def fresh():
        return (scf.RHF(mol) if mol.spin == 0 else scf.UHF(mol)).density_fit()

    ref = fresh()
    ref.conv_tol, ref.verbose = 1e-10, 0
    ref.kernel()
    mf = density_fit_jk(fresh(), device=device, precision=precision)
    mf.conv_tol, mf.verbose = 1e-10, 0
    t0 = time.perf_counter()
    mf.kernel()
    seconds = time.perf_counter() - t0
    record = mf.with_df.jk_record()
    mf.with_df.release()
    return (f"| {name}/{basis} | {mol.nao_nr()} | {abs(mf.e_tot - ref.e_tot):.1e} | "
            f"{precision_runs(record['precision_per_cycle'])} ({ref.cycles} in fp64) | {record['jk_builds']} | "
            f"{record['incremental_builds']} | {record['builds_on_host']} | {seconds:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("molecules", nargs="+", help="name:basis, the name under molecules/ without .xyz")
    ap.add_argument("--device", default="sim")
    ap.add_argument("--precision", default=None)
    args = ap.parse_args()
    print(f"device {args.device}; {machine_description()}")
    print("| molecule | nao | abs(ΔE) (Eh) | cycles | J/K builds | incremental | on the host | SCF (s) |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for item in args.molecules:
        name, _, basis = item.partition(":")
        print(one(name, basis or "cc-pvdz", args.device, args.precision), flush=True)


if __name__ == "__main__":
    main()
