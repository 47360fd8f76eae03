#!/usr/bin/env python
"""The emulator's cost MODEL against every kernel latency AWS publishes in the Neuron 2.29 NKI docs.

    python scripts/cost_model_vs_published.py                  # all points; writes the table into docs/emulator.md
    python scripts/cost_model_vs_published.py --quick --print-only
    python scripts/cost_model_vs_published.py --sdk /path/to/aws-neuron-sdk   # also AWS's own kernel files, unchanged
    python scripts/cost_model_vs_published.py --cache DIR --print-only --only KEY ...   # parallel shares, then
    python scripts/cost_model_vs_published.py --cache DIR                               # the table from DIR

Published figures (aws-neuron-sdk at tag v2.29.1, the last 2.29 docs; each point names its page):
the Fused Mamba tutorial's latencies (nki/guides/tutorials/fused_mamba.rst; fp32; the page names no
instance — its VectorE times fit NeuronCore-v2 clocks, so trn1), the kernel-optimization tutorial's four
matmul versions (nki/guides/tutorials/kernel-optimization.rst; fp32 4096x8192 @ 8192x8192 on trn2; totals
read off its profiler screenshots), the DMA overview's transfer durations
(nki/get-started/about/nki-dma-overview.rst; trn2) and the perf guide's initiation interval of dependent
one-element ScalarE instructions (nki/deep-dives/nki_perf_guide.rst; NeuronCore-v2). Also, marked as older
docs, the trn1 bf16 matmul table the matrix-multiplication tutorial carried until v2.26.0.

Kernels: our own implementations of those tutorials' algorithms (tests/nkiemu/conformance/mamba.py and
matmul.py — own code, following the tutorials' text, loop structure and block sizes). ``--sdk DIR`` also
runs AWS's example files from a checkout of the SDK unchanged (nki/examples/fused_mamba/mamba_nki_kernels.py,
nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py) and adds their column.
The model time compared is the dependency-aware scheduled time (docs/emulator.md, item 5) of the target.

Fitted and checked: the docs publish no DMA descriptor time, so trn1's (mp2trn/nkiemu/targets.py) is FITTED
to the two points of :data:`DESCRIPTOR_FIT` — the trn1 bf16 tiled and hoisted matmuls, the DMA-bound points
with the most descriptors — so that the geometric mean of their model/published ratios is 1; a full run
re-fits it and prints the value beside the one the model uses. Every other point CHECKS the model: the
other two trn1 matmuls (one DMA-bound with fewer descriptors, one TensorE-bound), the 19 trn1 Fused Mamba
points and the ScalarE chain (trn1), and every trn2 point, which has no descriptor time.
Not compared, with the reason in the output: the profiling guide's MLP screenshot (a whole torch graph,
target not stated) and the NKI-library RMSNorm-Quant spec (targets, not measurements; code not in the SDK).
"""

from __future__ import annotations

import argparse
import importlib.util
import pickle
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mp2trn.nkiemu as nki  # noqa: E402
from mp2trn.nkiemu.cost import CostReport, LaunchTrace, instruction_seconds, default_params  # noqa: E402
from mp2trn.nkiemu.targets import get_target  # noqa: E402
from mp2trn.files import atomic_write, replace_marked_block  # noqa: E402

DOC = ROOT / "docs" / "emulator.md"
BEGIN, END = "<!-- BEGIN cost_model_vs_published -->", "<!-- END cost_model_vs_published -->"
CONFORMANCE = ROOT / "tests" / "nkiemu" / "conformance"
MAMBA_DOC = "nki/guides/tutorials/fused_mamba.rst"
MATMUL_DOC = "nki/guides/tutorials/kernel-optimization.rst"
DMA_DOC = "nki/get-started/about/nki-dma-overview.rst"
PERF_DOC = "nki/deep-dives/nki_perf_guide.rst"
OLD_MATMUL_DOC = "general/nki/tutorials/matrix_multiplication.rst (v2.26.0; removed before 2.29)"

#: the points the trn1 DMA descriptor time (mp2trn/nkiemu/targets.py, TRN1.dma_descriptor_s) is fitted to:
#: the two DMA-bound trn1 matmuls with the most descriptors; every other point checks it
DESCRIPTOR_FIT = ("matmul-trn1-mm_tiled", "matmul-trn1-mm_hoisted")

#: own kernel -> the AWS example file and function that implement the same tutorial step
AWS = {
    "scan_per_state": ("nki/examples/fused_mamba/mamba_nki_kernels.py", "mamba_v1"),
    "scan_hoisted": ("nki/examples/fused_mamba/mamba_nki_kernels.py", "mamba_v2"),
    "scan_time_tiled": ("nki/examples/fused_mamba/mamba_nki_kernels.py", "mamba_v3"),
    "mm_tiled": ("nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py", "nki_matmul_tiled_"),
    "mm_hoisted": ("nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py", "nki_matmul_hoist_load_"),
    "mm_block_free": ("nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py",
                      "nki_matmul_block_free_dimension_"),
    "mm_blocked": ("nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py",
                   "nki_matmul_fully_optimized_"),
}


@dataclass
class Point:
    """One published figure and how to reproduce it in the emulator."""

    key: str
    what: str
    doc: str
    published_s: float
    target: str
    module: str          # conformance module
    kernel: str          # its function
    args: tuple          # shape description, made into arrays by ``inputs``
    metric: str = "scheduled"      # scheduled | dma_transfer | chain_ii
    heavy: bool = False            # left out by --quick
    group: str = ""                # points of a group must keep the published order
    note: str = ""
    result: dict = field(default_factory=dict)


def _mamba_points() -> list[Point]:
    pts = [Point("mamba-v1-c256", "mamba v1, C=256, L=512", MAMBA_DOC, 172.93e-6, "trn1", "mamba",
                 "scan_per_state", ("mamba", 256, 512)),
           Point("mamba-v1-c4096", "mamba v1, C=4096, L=512", MAMBA_DOC, 2.34e-3, "trn1", "mamba",
                 "scan_per_state", ("mamba", 4096, 512), group="mamba L=512"),
           Point("mamba-v2-c4096", "mamba v2, C=4096, L=512", MAMBA_DOC, 1.61e-3, "trn1", "mamba",
                 "scan_hoisted", ("mamba", 4096, 512), group="mamba L=512")]
    v2 = (4.4, 8.9, 13.1, 17.6, 23.7, 27.5, 41.3, 52.2)   # the page's scaling table, ms, L = 1024..8192
    v3 = (3.3, 6.6, 10.1, 13.3, 17.3, 19.6, 24.2, 27.8)
    for i, (a, b) in enumerate(zip(v2, v3)):
        L = 1024 * (i + 1)
        pts.append(Point(f"mamba-v2-l{L}", f"mamba v2, C=4096, L={L}", MAMBA_DOC, a * 1e-3, "trn1", "mamba",
                         "scan_hoisted", ("mamba", 4096, L), heavy=True, group=f"mamba L={L}"))
        pts.append(Point(f"mamba-v3-l{L}", f"mamba v3, C=4096, L={L}", MAMBA_DOC, b * 1e-3, "trn1", "mamba",
                         "scan_time_tiled", ("mamba", 4096, L), heavy=True, group=f"mamba L={L}"))
    return pts


def _matmul_points() -> list[Point]:
    pts = []
    for name, kernel, ms in (("tiled", "mm_tiled", 39.89), ("hoisted loads", "mm_hoisted", 28.20),
                             ("blocked M,N", "mm_block_free", 28.41), ("blocked M,N,K", "mm_blocked", 28.30)):
        pts.append(Point(f"matmul-trn2-{kernel}", f"matmul {name}, fp32 4096x8192x8192", MATMUL_DOC, ms * 1e-3,
                         "trn2", "matmul", kernel, ("matmul", 4096, 8192, 8192, "float32"), heavy=True,
                         group="matmul trn2 fp32", note="total read off the profiler screenshot"))
    for name, kernel, ms in (("tiled", "mm_tiled", 51.80), ("hoisted loads", "mm_hoisted", 42.96),
                             ("blocked M,N", "mm_block_free", 22.07), ("blocked M,N,K", "mm_blocked", 6.97)):
        pts.append(Point(f"matmul-trn1-{kernel}", f"matmul {name}, bf16 4096x8192x8192 (pre-2.29 docs)",
                         OLD_MATMUL_DOC, ms * 1e-3, "trn1", "matmul", kernel, ("matmul", 4096, 8192, 8192, "bfloat16"),
                         heavy=True, group="matmul trn1 bf16",
                         note="fits the trn1 DMA descriptor time" if f"matmul-trn1-{kernel}" in DESCRIPTOR_FIT
                         else ""))
    return pts


def all_points() -> list[Point]:
    return _mamba_points() + _matmul_points() + [
        Point("dma-32k", "one 32 KiB transfer on one DMA queue (A[4,4096] bf16)", DMA_DOC, 1416e-9, "trn2", "mamba",
              "dma_exp", ("dma", 4, 4096), metric="dma_transfer"),
        Point("dma-2k", "one 2 KiB transfer per queue (A[128,128] bf16)", DMA_DOC, 97e-9, "trn2", "mamba", "dma_exp",
              ("dma", 128, 128), metric="dma_transfer", note="duration read off the profiler screenshot"),
        Point("scalar-chain", "interval of dependent one-element ScalarE instructions", PERF_DOC, 189e-9, "trn1",
              "mamba", "dependent_chain", ("chain",), metric="chain_ii"),
    ]


# -- running a point ------------------------------------------------------------------------------------

def load_module(path: Path, name: str):
    with nki.as_nki():
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return mod


def inputs(args: tuple, rng) -> tuple:
    kind = args[0]
    if kind == "mamba":
        _, c, L = args
        s = 16
        return (rng.random((1, c, L), dtype=np.float32), rng.random((1, c, L), dtype=np.float32),
                -rng.random((c, s), dtype=np.float32), rng.random((1, s, L), dtype=np.float32),
                rng.random((1, s, L), dtype=np.float32))
    if kind == "matmul":
        _, m, k, n, dtype = args
        dt = np.float32 if dtype == "float32" else np.dtype("bfloat16")
        return ((rng.random((k, m), dtype=np.float32) - 0.5).astype(dt),
                (rng.random((k, n), dtype=np.float32) - 0.5).astype(dt))
    if kind == "dma":
        return ((rng.random(args[1:], dtype=np.float32) * 0.1).astype(np.dtype("bfloat16")),)
    raise ValueError(kind)


def _profile(fn, args, target):
    with nki.profile() as prof:
        nki.simulate(fn, target=target)(*args)
    return prof.launches


def measure(p: Point, fn, rng) -> dict:
    """The model's figure for point ``p`` with kernel ``fn``: seconds, bound engine, engine busy times."""
    t0 = time.perf_counter()
    if p.metric == "chain_ii":   # the difference of two chain lengths: the interval per instruction
        x = rng.random((128, 1), dtype=np.float32)
        reps = [CostReport(_profile(fn, (x, steps), p.target), p.target) for steps in (64, 128)]
        seconds = (reps[1].scheduled_time_s - reps[0].scheduled_time_s) / 64
        rep = reps[1]
    else:
        launches = _profile(fn, inputs(p.args, rng), p.target)
        rep = CostReport(launches, p.target)
        if p.metric == "dma_transfer":   # the first load's time on its queue(s)
            rec = next(r for r in launches[0].records if r[0] == "dma")
            seconds = instruction_seconds("dma", rec[2], get_target(p.target), default_params())
        else:
            seconds = rep.scheduled_time_s
    busy = rep.engine_busy_s
    out = {"seconds": seconds, "bound": max(busy, key=busy.get) if busy else "", "modeled_s": rep.modeled_time_s,
           "busy": dict(busy), "wall": time.perf_counter() - t0}
    if p.key in DESCRIPTOR_FIT:
        out["launches"] = rep.launches     # re-priced by fit_descriptor_time
    spilled = sum(tr.spill_save_bytes + tr.spill_reload_bytes for tr in rep.launches)
    if spilled:   # what the same instructions cost without the model's spill traffic
        out["spill_gb"] = spilled / 1e9
        plain = [LaunchTrace(tr.kernel, tr.target, tr.records, tr.grid, psum_spill_bytes=tr.psum_spill_bytes,
                             psum_spill_events=tr.psum_spill_events) for tr in rep.launches]
        out["without_spills_s"] = CostReport(plain, p.target).scheduled_time_s
    return out


def fit_descriptor_time(points: list[Point]) -> float | None:
    """The trn1 queue time per DMA descriptor that makes the geometric mean of model / published over the
    :data:`DESCRIPTOR_FIT` points 1 (bisection; the model time grows with it). None when a fit point was
    not run."""
    fit = [p for p in points if p.key in DESCRIPTOR_FIT and "launches" in p.result.get("own", {})]
    if len(fit) < len(DESCRIPTOR_FIT):
        return None

    def log_ratio(t_desc: float) -> float:
        prm = default_params().replace(dma_descriptor_s=t_desc)
        return sum(np.log(CostReport(p.result["own"]["launches"], p.target, prm).scheduled_time_s / p.published_s)
                   for p in fit) / len(fit)

    lo, hi = 0.0, 2e-6
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if log_ratio(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def run(points: list[Point], sdk: Path | None, cache: Path | None = None) -> None:
    """Emulate every point (with ``sdk``, AWS's kernel too). ``cache``: a folder of results by point key —
    a point found there is not emulated again, a point emulated is stored (so that several processes
    can share the heavy points and one last run writes the table)."""
    own = {}
    aws = {}
    for p in points:
        stored = cache / f"{p.key}.pickle" if cache is not None else None
        if stored is not None and stored.exists():
            p.result = pickle.loads(stored.read_bytes())
            if sdk is None or "aws" in p.result or p.kernel not in AWS:
                continue
        rng = np.random.default_rng(7)     # each point's inputs independent of which points ran before
        if p.module not in own:
            own[p.module] = load_module(CONFORMANCE / f"{p.module}.py", f"published_{p.module}")
        p.result["own"] = measure(p, getattr(own[p.module], p.kernel), rng)
        if sdk is not None and p.kernel in AWS:
            rel, fname = AWS[p.kernel]
            if rel not in aws:
                aws[rel] = load_module(sdk / rel, "aws_" + Path(rel).stem)
            p.result["aws"] = measure(p, getattr(aws[rel], fname), rng)
        r = p.result["own"]
        if stored is not None:
            data = pickle.dumps(p.result)
            atomic_write(stored, lambda tmp, data=data: tmp.write_bytes(data))
        print(f"{p.key:24s} published {p.published_s * 1e6:10.2f} us  model {r['seconds'] * 1e6:10.2f} us  "
              f"ratio {r['seconds'] / p.published_s:5.2f}  ({r['wall']:.1f} s)", flush=True)


# -- the table ------------------------------------------------------------------------------------------

def _fmt(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s >= 1e-4 else f"{s * 1e6:.2f} µs" if s >= 1e-6 else f"{s * 1e9:.0f} ns"


def orderings(points: list[Point], column: str = "own") -> list[tuple[str, bool]]:
    """Per group: does the model order the points as the published figures do (ties within 2 % of the
    published spread count as either order)?"""
    groups: dict[str, list[Point]] = {}
    for p in points:
        if p.group and column in p.result:
            groups.setdefault(p.group, []).append(p)
    out = []
    for name, ps in groups.items():
        ok = True
        for a in ps:
            for b in ps:
                if a.published_s > b.published_s * 1.02:
                    ok &= a.result[column]["seconds"] > b.result[column]["seconds"]
        out.append((name, ok))
    return out


def table(points: list[Point], fitted_s: float | None = None) -> str:
    """The markdown table of ``points`` (run first) and its summary lines; ``fitted_s``: the trn1 descriptor
    time fitted to :data:`DESCRIPTOR_FIT` in this run (None: not all of them ran)."""
    with_aws = any("aws" in p.result for p in points)
    head = "| figure | target | page | published | model (our kernel) | model / published | bound |"
    rule = "|---|---|---|---:|---:|---:|---|"
    if with_aws:
        head += " AWS kernel, unchanged: model | ratio |"
        rule += "---:|---:|"
    rows = [head, rule]
    for p in points:
        if "own" not in p.result:
            continue
        r = p.result["own"]
        ratio = r["seconds"] / p.published_s
        flag = "" if 1 / 1.5 <= ratio <= 1.5 else " **outside 1.5×**"
        bound = r["bound"]
        if "spill_gb" in r:
            bound += (f"; the model spills {r['spill_gb']:.1f} GB — without: {_fmt(r['without_spills_s'])}, "
                      f"{r['without_spills_s'] / p.published_s:.2f}")
        row = (f"| {p.what}{' (' + p.note + ')' if p.note else ''} | {p.target} | {p.doc} | {_fmt(p.published_s)} | "
               f"{_fmt(r['seconds'])} | {ratio:.2f}{flag} | {bound} |")
        if with_aws:
            a = p.result.get("aws")
            row += (f" {_fmt(a['seconds'])} | {a['seconds'] / p.published_s:.2f} |" if a else " – | – |")
        rows.append(row)
    inside = [p for p in points if "own" in p.result]
    n_in = sum(1 for p in inside if 1 / 1.5 <= p.result["own"]["seconds"] / p.published_s <= 1.5)
    rows.append("")
    rows.append(f"Within 1.5× of the published figure: {n_in} of {len(inside)} points (our kernels).")
    used = get_target("trn1").dma_descriptor_s
    fit = (f"fitted in this run: {fitted_s * 1e9:.1f} ns" if fitted_s is not None
           else "not re-fitted in this run (its fit points did not run)")
    rows.append(f"trn1 DMA descriptor time: the model uses {used * 1e9:.0f} ns per descriptor per queue; "
                f"{fit}, to {' and '.join(DESCRIPTOR_FIT)} (the geometric mean of their ratios 1); "
                "every other trn1 point checks it.")
    rows.append("Orderings (our kernels): " + "; ".join(f"{g} {'kept' if ok else '**not kept**'}"
                                                        for g, ok in orderings(points)))
    if with_aws:
        rows.append("Orderings (AWS kernels): " + "; ".join(f"{g} {'kept' if ok else '**not kept**'}"
                                                             for g, ok in orderings(points, "aws")))
    return "\n".join(rows)


def write_doc(text: str, quick: bool) -> None:
    block = (f"{BEGIN}\nProduced by `python scripts/cost_model_vs_published.py{' --quick' if quick else ''}` "
             f"(the model: MODELED, the published figures: measured by AWS on hardware).\n\n{text}\n{END}")
    replace_marked_block(DOC, BEGIN, END, block)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the points that emulate in seconds")
    parser.add_argument("--print-only", action="store_true")
    parser.add_argument("--sdk", type=Path, help="a checkout of aws-neuron-sdk (v2.29.1) to run its kernels too")
    parser.add_argument("--only", nargs="*", help="point keys")
    parser.add_argument("--cache", type=Path, help="a folder of point results to reuse and fill (runs in parallel "
                        "processes with --only and --print-only, then one run over all points writes the table)")
    args = parser.parse_args(argv)
    points = [p for p in all_points() if (not args.quick or not p.heavy) and (not args.only or p.key in args.only)]
    if args.cache is not None:
        args.cache.mkdir(parents=True, exist_ok=True)
    run(points, args.sdk, args.cache)
    text = table(points, fit_descriptor_time(points))
    print(text)
    if not args.print_only:
        write_doc(text, args.quick)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
