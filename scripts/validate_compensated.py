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

The rounding error of a low-precision run is effectively random: it depends on the exact numbers in
B, which change between SCF runs that agree in every energy (degenerate orbitals, such as benzene's
e1g pair, rotate freely; convergence to 1e-10 Eh leaves ~1e-6 freedom in the orbitals). So each
molecule is run ``--repeats`` times; after the first, the orbitals are rotated (a random rotation
within every degenerate set, |Δε| < 1e-6 Eh, and a small random rotation, ~1e-4 rad, among the
occupied and among the virtual orbitals). PySCF's fp64 DF-MP2 runs on the same rotated orbitals, so
the reference moves with them; the largest |ΔE_corr| over the runs is reported.

It measures an emulation. Real device modes can be sampled the same way with ``--devices``
(default: ``sim:fp32,sim:fp32x3`` when the ``sim`` device is present), e.g. the NKI kernels' own
compensated ``fp32x3`` mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import ml_dtypes
import numpy as np

from mp2trn import DFMP2, RunOptions
from mp2trn.devices.cpu import CpuDevice
from mp2trn.pipeline import open_device, scf_stage
from mp2trn.precision import tolerance_for
from mp2trn.validation import load_set, pyscf_reference, select_entries

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

    def contract_aux(self, xi: np.ndarray, xj: np.ndarray) -> np.ndarray:
        pi, pj = bf16_split(xi, self.nparts), bf16_split(xj, self.nparts)
        out = np.zeros((xi.shape[1], xj.shape[1]), dtype=np.float32)
        for a, b in self.terms:
            out += pi[a].T @ pj[b]  # fp32 GEMM on exact bf16 values: the PSUM accumulation
        return out


def rotate_orbitals(mf, rng: np.random.Generator, tol: float = 1e-6, small: float = 1e-4):
    """A shallow copy of ``mf`` with randomly rotated orbitals (see the module docstring)."""
    import copy

    uhf = np.asarray(mf.mo_energy).ndim == 2
    coeffs = [np.array(c) for c in (mf.mo_coeff if uhf else [mf.mo_coeff])]
    energies = [np.asarray(e) for e in (mf.mo_energy if uhf else [mf.mo_energy])]
    occs = [np.asarray(o) for o in (mf.mo_occ if uhf else [mf.mo_occ])]
    for c, e, o in zip(coeffs, energies, occs):
        start = 0
        for p in range(1, len(e) + 1):  # degenerate sets: any rotation is equally canonical
            if p == len(e) or e[p] - e[p - 1] > tol or o[p] != o[p - 1]:
                if p - start > 1:
                    q, _ = np.linalg.qr(rng.standard_normal((p - start, p - start)))
                    c[:, start:p] = c[:, start:p] @ q
                start = p
        for block in (o > 0, o == 0):  # a small rotation within the occupied and the virtual space
            idx = np.flatnonzero(block)
            g = rng.standard_normal((len(idx), len(idx)))
            q, r = np.linalg.qr(np.eye(len(idx)) + small * (g - g.T) / 2)
            c[:, idx] = c[:, idx] @ (q * np.sign(np.diag(r)))
    new = copy.copy(mf)
    new.mo_coeff = np.asarray(coeffs) if uhf else coeffs[0]
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", default="default")
    ap.add_argument("--only", default=None)
    ap.add_argument("--json", default=None, help="write the numbers here")
    ap.add_argument("--repeats", type=int, default=5, help="runs per molecule (orbitals rotated after the first)")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--devices", default=None,
                    help="extra device:precision modes to sample (default: sim:fp32,sim:fp32x3 if present; '' for none)")
    args = ap.parse_args(argv)
    from pyscf import df

    from mp2trn.devices import get_device
    from mp2trn.errors import Mp2trnError

    modes = ["fp32", "bf16", "bf16x3", "bf16x6"]
    wanted = "sim:fp32,sim:fp32x3" if args.devices is None else args.devices
    for item in filter(None, (w.strip() for w in wanted.split(","))):
        name, _, prec = item.partition(":")
        try:
            get_device(name, prec or None).close()
        except Mp2trnError as exc:
            print(f"(skipping {item}: {exc})")
            continue
        modes.append(item)
    mset = load_set(args.set)
    rows = []
    rng = np.random.default_rng(args.seed)
    print(f"max |E_corr - E_corr(PySCF fp64)| over {args.repeats} runs per molecule\n")
    print("| molecule | atoms | runs | " + " | ".join(f"{m} \\|Δ\\| (µEh)" for m in modes) + " |")
    print("|---|---|---|" + "---|" * len(modes))
    for entry in select_entries(mset, args.only):
        options = RunOptions(basis=entry.basis, frozen=entry.options.get("frozen", "none"))
        with open_device(options) as dev:
            mf = scf_stage(entry.path, options, dev).mf
        mol, frozen = mf.mol, options.frozen
        aux = df.make_auxbasis(mol, mp2fit=True)
        row = {"key": entry.key, "natm": mol.natm, **{m: 0.0 for m in modes}, **{f"t_{m}": 0.0 for m in modes}}
        runs = row["runs"] = args.repeats
        for rep in range(runs):
            mf_rep = mf if rep == 0 else rotate_orbitals(mf, rng)
            ref = pyscf_reference(mf_rep, options).e_corr
            for mode in modes:
                if ":" in mode:  # a real device and precision
                    device, precision = mode.split(":", 1)
                elif mode == "fp32":
                    device, precision = "cpu", "fp32"
                else:
                    device, precision = SplitDevice(mode), None
                t0 = time.perf_counter()
                pt = DFMP2(mf_rep, auxbasis=aux, frozen=frozen, device=device, precision=precision).run()
                row[mode] = max(row[mode], abs(pt.e_corr - ref))
                row[f"t_{mode}"] += time.perf_counter() - t0
        rows.append(row)
        print(f"| {entry.key} | {mol.natm} | {runs} | " + " | ".join(f"{row[m] * 1e6:.3g}" for m in modes) + " |", flush=True)
    print("| **max** | | | " + " | ".join(f"**{max(r[m] for r in rows) * 1e6:.3g}**" for m in modes) + " |")
    print(f"\ntolerances in mp2trn.precision: fp32 {tolerance_for('fp32'):g} Eh, compensated {tolerance_for('bf16x3'):g} Eh")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"set": mset.name, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
