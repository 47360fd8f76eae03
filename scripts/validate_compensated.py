#!/usr/bin/env python3
"""Measure how far compensated low-precision pair GEMMs move E_corr, to set `mp2trn validate`'s
tolerance for compensated precisions (docs/accuracy.md).

Trainium's Tensor engine multiplies bf16 (or fp32, at a quarter of the rate) with fp32 accumulation in
PSUM, and has no fp64. A compensated mode splits each fp32 B block into bf16 terms,
B ≈ B1 + B2 + B3 (B1 = bf16(B), B2 = bf16(B − B1), B3 = bf16(B − B1 − B2)), and sums the cross
products that matter: 3 terms (B1B1 + B1B2 + B2B1) or 6 terms (+ B1B3 + B2B2 + B3B1). bf16 × bf16
products are exact in fp32, so the error comes from the dropped terms and the fp32 accumulation.

This script emulates that on the CPU: a Device whose AO→MO transform and metric solve run in fp32 (as
on Trainium) and whose pair step forms T from the bf16 split with fp32 accumulation, then reduces it
like the fp32 CPU device (per-pair sums in fp64). It runs every molecule of a validation set through
this device (modes fp32, bf16, bf16x3, bf16x6) and through PySCF's fp64 DF-MP2 on the same SCF, and
prints |ΔE_corr| per molecule and mode.

    python scripts/validate_compensated.py                 # the default set
    python scripts/validate_compensated.py --json out.json --only water,benzene

It measures an emulation, not the `sim` device itself: when that device has a compensated mode, run
`mp2trn validate --device sim --precision <mode>` for the real thing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import ml_dtypes
import numpy as np

from mp2trn import DFMP2
from mp2trn.devices.cpu import CpuDevice, _as_matrix, _reduce_row
from mp2trn.molecule import build_mole
from mp2trn.scf import ScfOptions, run_scf
from mp2trn.validate import load_set, pyscf_dfmp2, select_entries, tolerance_for

BF16 = ml_dtypes.bfloat16
TERMS = {"bf16": [(0, 0)], "bf16x3": [(0, 0), (0, 1), (1, 0)],
         "bf16x6": [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0)]}


def bf16_split(x: np.ndarray, n: int) -> list[np.ndarray]:
    """x (fp32) → n bf16 parts (returned as fp32 arrays holding bf16 values), x ≈ Σ parts."""
    parts, rest = [], x.astype(np.float32)
    for _ in range(n):
        p = rest.astype(BF16).astype(np.float32)
        parts.append(p)
        rest = rest - p
    return parts


class SplitDevice(CpuDevice):
    """fp32 AO→MO and metric solve; pair GEMMs from a bf16 split with fp32 accumulation."""

    name = "cpu-emulated"
    supported_precisions = ("bf16", "bf16x3", "bf16x6")

    def __init__(self, precision: str):
        super().__init__("fp32")
        self.precision = precision
        self.terms = TERMS[precision]
        self.nparts = 1 + max(max(t) for t in self.terms)

    @property
    def storage_dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    def _t(self, xi: np.ndarray, xj: np.ndarray) -> np.ndarray:
        pi, pj = bf16_split(xi, self.nparts), bf16_split(xj, self.nparts)
        out = np.zeros((xi.shape[1], xj.shape[1]), dtype=np.float32)
        for a, b in self.terms:
            out += pi[a].T @ pj[b]  # fp32 GEMM on exact bf16 values: the PSUM accumulation
        return out

    def pair_energies(self, b_i, b_j, e_i, e_j, ev_a, ev_b, exchange):
        same = b_j is None
        naux, ni, nva = b_i.shape
        x_i = _as_matrix(b_i, np.float32)
        os_ = np.zeros((ni, ni if same else b_j.shape[1]))
        xx = np.zeros_like(os_) if exchange else None
        e_ab = (ev_a[:, None] + (ev_a if same else ev_b)[None, :]).astype(np.float32)
        if same:
            for i in range(ni):
                m = self._t(x_i[:, i * nva:(i + 1) * nva], x_i[:, i * nva:]).reshape(nva, ni - i, nva)
                _reduce_row(m, e_i[i], e_j[i:], e_ab, os_[i, i:], None if xx is None else xx[i, i:])
        else:
            nj, nvb = b_j.shape[1], b_j.shape[2]
            m = self._t(x_i, _as_matrix(b_j, np.float32)).reshape(ni, nva, nj, nvb)
            for i in range(ni):
                _reduce_row(m[i], e_i[i], e_j, e_ab, os_[i], None if xx is None else xx[i])
        return os_, xx


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="default")
    ap.add_argument("--only", default=None)
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args(argv)
    from pyscf import df

    modes = ["fp32", "bf16", "bf16x3", "bf16x6"]
    mset = load_set(args.set)
    rows = []
    print("| molecule | atoms | " + " | ".join(f"{m} |Δ| (µEh)" for m in modes) + " |")
    print("|---|---|" + "---|" * len(modes))
    for entry in select_entries(mset, args.only):
        mol = build_mole(entry.path, basis=entry.basis)
        mf = run_scf(mol, ScfOptions())
        frozen = entry.options.get("frozen", "none")
        aux = df.make_auxbasis(mol, mp2fit=True)
        from mp2trn.validate import _nfrozen

        ref = pyscf_dfmp2(mf, aux, _nfrozen(mf, frozen)).e_corr
        row = {"key": entry.key, "natm": mol.natm}
        for mode in modes:
            device = "cpu" if mode == "fp32" else SplitDevice(mode)
            t0 = time.perf_counter()
            pt = DFMP2(mf, auxbasis=aux, frozen=frozen, device=device, precision="fp32" if mode == "fp32" else None).run()
            row[mode] = abs(pt.e_corr - ref)
            row[f"t_{mode}"] = time.perf_counter() - t0
        rows.append(row)
        print(f"| {entry.key} | {mol.natm} | " + " | ".join(f"{row[m] * 1e6:.3g}" for m in modes) + " |", flush=True)
    print("| **max** | | " + " | ".join(f"**{max(r[m] for r in rows) * 1e6:.3g}**" for m in modes) + " |")
    print(f"\ntolerances in mp2trn.validate: fp32 {tolerance_for('fp32'):g} Eh, compensated {tolerance_for('bf16x3'):g} Eh")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"set": mset.name, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
