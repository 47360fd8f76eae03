#!/usr/bin/env python
"""Cost-model table of the NKI matmul progression (emulated with mp2trn.nkiemu).

    python scripts/emu_matmul_report.py            # 2048^3, bf16 and fp32, priced for trn1 and trn2
    python scripts/emu_matmul_report.py --size 4096 --json out.json

Runs each kernel of tests/nkiemu/conformance/matmul.py once per dtype (the run is target-independent),
checks the result against NumPy, prices the same instruction trace for trn1 and trn2, and prints the
MODELED TensorE utilisation. Finally times the emulation of the 1024x1024x2048 fp32 tiled kernel.
All times except the wall times are a MODEL, not measurements.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mp2trn.nkiemu as nki  # noqa: E402


def load_matmul():
    with nki.as_nki():
        spec = importlib.util.spec_from_file_location("conformance_matmul",
                                                      ROOT / "tests" / "nkiemu" / "conformance" / "matmul.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=2048, help="M = K = N (multiple of 2048 for the blocked kernel)")
    ap.add_argument("--json", help="also write all numbers to this JSON file")
    args = ap.parse_args(argv)
    mm = load_matmul()
    S = args.size
    rng = np.random.default_rng(0)
    rows = []
    print(f"NKI emulator cost MODEL - matmul progression, M = K = N = {S} (modeled, not measured)")
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"numpy {np.__version__}")
    hdr = (f"{'variant':<11} {'dtype':<9} {'target':<6} {'modeled us':>11} {'sched us':>10} "
           f"{'TensorE %':>10} {'sched %':>8}  {'bottleneck':<10} {'busy us (tensor/vector/scalar/gpsimd/dma)':<44} "
           f"{'emu wall s':>10}")
    print(hdr)
    print("-" * len(hdr))
    for dt, peak in ((ml_dtypes.bfloat16, "bf16"), (np.float32, "fp32")):
        a = rng.standard_normal((S, S)).astype(dt)
        b = rng.standard_normal((S, S)).astype(dt)
        ref = a.astype(np.float32) .T @ b.astype(np.float32)
        for name, kern in mm.VARIANTS.items():
            t0 = time.perf_counter()
            out = kern(a, b)
            wall = time.perf_counter() - t0
            err = float(np.max(np.abs(out.astype(np.float32) - ref) / (1 + np.abs(ref))))
            assert err < 2e-2, (name, err)
            for tg in ("trn1", "trn2"):
                r = kern.last_report.priced_for(tg)
                busy = r.engine_busy_s
                bs = "/".join(f"{busy.get(e, 0) * 1e6:.0f}" for e in ("tensor", "vector", "scalar", "gpsimd", "dma"))
                row = dict(variant=name, dtype=peak, target=tg, modeled_us=r.modeled_time_s * 1e6,
                           scheduled_us=r.scheduled_time_s * 1e6, tensor_pct=r.tensor_peak_pct(peak),
                           scheduled_pct=r.tensor_peak_pct(peak, "scheduled"), bottleneck=r.bottleneck,
                           busy_us={k: v * 1e6 for k, v in busy.items()}, emu_wall_s=wall,
                           instructions=r.n_instructions, max_rel_err=err)
                rows.append(row)
                print(f"{name:<11} {peak:<9} {tg:<6} {row['modeled_us']:>11.1f} {row['scheduled_us']:>10.1f} "
                      f"{row['tensor_pct']:>9.1f}% {row['scheduled_pct']:>7.1f}%  {r.bottleneck:<10} {bs:<44} "
                      f"{wall:>10.2f}")
    print("TensorE % = matmul FLOPs / modeled time / TensorE peak of the dtype (trn1 92/23, trn2 79/20 TFLOPS "
          "bf16/fp32); modeled = max over engines + 15 us launch; sched = dependency-aware in-order list schedule.")

    a = rng.standard_normal((1024, 1024)).astype(np.float32)
    b = rng.standard_normal((1024, 2048)).astype(np.float32)
    mm.mm_tiled(a, b)  # warm-up
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        mm.mm_tiled(a, b)
        walls.append(time.perf_counter() - t0)
    print(f"emulation wall time, 1024x1024x2048 fp32 mm_tiled ({mm.mm_tiled.last_report.n_instructions} "
          f"instructions): best {min(walls):.3f} s of 3 (median {sorted(walls)[1]:.3f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({"size": S, "rows": rows, "tiled_1024x1024x2048_fp32_wall_s": walls},
                                              indent=1))


if __name__ == "__main__":
    main()
