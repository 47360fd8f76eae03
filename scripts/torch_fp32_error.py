"""The torch (``cuda``) device's fp32 DF-MP2 correlation energy against the cpu device's fp64 one, on the same
converged DF-RHF orbitals (docs/precision.md). Runs on CPU torch (or a GPU with ``--torch-device cuda``).

    python scripts/torch_fp32_error.py
"""

from __future__ import annotations

import argparse

import mp2trn
from mp2trn.devices.torch_backend import TorchDevice
from mp2trn.molecule import build_mole
from mp2trn.scf import ScfOptions, run_scf

CASES = [("formaldehyde", "cc-pvtz"), ("benzene", "6-31g"), ("benzene", "cc-pvdz")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch-device", default="cpu")
    args = ap.parse_args()
    print("| molecule / basis | E_corr fp32 − fp64 (µEh) |\n|---|---:|")
    for name, basis in CASES:
        mf = run_scf(build_mole(f"molecules/{name}.xyz", basis=basis), ScfOptions(density_fit=True))
        e64 = mp2trn.DFMP2(mf).run().e_corr
        e32 = mp2trn.DFMP2(mf, device=TorchDevice("fp32", args.torch_device)).run().e_corr
        print(f"| {name} / {basis} | {(e32 - e64) * 1e6:+.4f} |")


if __name__ == "__main__":
    main()
