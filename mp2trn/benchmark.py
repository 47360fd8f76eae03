"""Speed of the MP2 step: mp2trn against PySCF's DFMP2 after the same SCF (``mp2trn bench``).

Same process, same converged SCF object, same explicitly set MP2 aux basis on both sides. Reports wall
time, GFLOP/s (counted flops of the transforms, the metric solve and the pair GEMMs), the speed ratio
and the energy difference. A benchmark, not a test: it prints ratios and asserts nothing about speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rich.table import Table

from .memory import default_memory_mb
from .options import RunOptions

ROOT = Path(__file__).resolve().parents[1]
ORGANIC = ROOT / "molecules" / "gpu4pyscf" / "organic"

#: name → (xyz path, basis)
CASES: dict[str, tuple[Path, str]] = {
    "water-tz": (ROOT / "molecules" / "water.xyz", "cc-pvtz"),
    "benzene-tz": (ROOT / "molecules" / "benzene.xyz", "cc-pvtz"),
    "vitaminc-dz": (ORGANIC / "020_Vitamin_C.xyz", "cc-pvdz"),
    "vitaminc-tz": (ORGANIC / "020_Vitamin_C.xyz", "cc-pvtz"),
}
QUICK = ["water-tz", "benzene-tz", "vitaminc-dz"]
#: whole runs (SCF + MP2): name → (xyz path, basis)
END_TO_END: dict[str, tuple[Path, str]] = {
    "inosine-dz": (ORGANIC / "031_Inosine.xyz", "cc-pvdz"),
    "vitaminc-tz": (ORGANIC / "020_Vitamin_C.xyz", "cc-pvtz"),
}


def mp2_flops(nao: int, naux: int, nocc: int, nvir: int) -> float:
    """Flops of one closed-shell DF-MP2: two half-transforms, the triangular solve, i ≤ j pair GEMMs."""
    transform = 2.0 * naux * nao * nao * nocc + 2.0 * naux * nao * nocc * nvir
    metric = 1.0 * naux * naux * nocc * nvir
    pairs = nocc * (nocc + 1) / 2 * 2.0 * nvir * nvir * naux
    return transform + metric + pairs


@dataclass
class BenchRow:
    case: str
    basis: str
    natm: int
    nao: int
    naux: int
    nocc: int
    nvir: int
    code: str  # "pyscf" or "mp2trn <device> <precision>"
    seconds: float
    gflops: float
    speedup: float  # PySCF time / this time
    delta_uEh: float  # |e_corr − PySCF e_corr| in µEh


def bench_case(name: str, precisions: list[str], device: str = "cpu", repeat: int = 1) -> list[BenchRow]:
    """Run one case: the SCF once, then PySCF's DFMP2 and mp2trn (each precision), best of ``repeat``."""
    from .dfmp2 import DFMP2
    from .pipeline import open_device, scf_stage
    from .scratch import run_scratch
    from .validation.pyscf_reference import pyscf_reference

    path, basis = CASES[name]
    options = RunOptions(basis=basis, device=device, max_memory=default_memory_mb())
    with run_scratch(), open_device(replace(options, precision=precisions[0])) as dev:
        mf = scf_stage(path, options, dev).mf
    refs = [pyscf_reference(mf, options) for _ in range(max(1, repeat))]
    t_ref, e_ref = min(r.seconds for r in refs), refs[0].e_corr
    results = []
    for precision in precisions:
        run = lambda p=precision: DFMP2(mf, device=device, precision=p, max_memory=options.max_memory).run()  # noqa: E731
        pt, t = _best(run, repeat)
        results.append((precision, pt, t))
    sizes = results[0][1].result.sizes
    flops = mp2_flops(sizes["nao"], sizes["naux"], sizes["nocc"], sizes["nvir"])
    common = dict(case=name, basis=basis, natm=sizes["natm"], nao=sizes["nao"], naux=sizes["naux"],
                  nocc=sizes["nocc"], nvir=sizes["nvir"])
    rows = [BenchRow(**common, code="pyscf DFMP2", seconds=t_ref, gflops=flops / t_ref / 1e9, speedup=1.0, delta_uEh=0.0)]
    for precision, pt, t in results:
        rows.append(BenchRow(**common, code=f"mp2trn {pt.result.what_ran['device']} {precision}", seconds=t,
                             gflops=flops / t / 1e9, speedup=t_ref / t, delta_uEh=abs(pt.e_corr - e_ref) * 1e6))
    return rows


def _best(fn, repeat: int):
    best, value = float("inf"), None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return value, best


def rows_table(rows: list[BenchRow]) -> Table:
    table = Table(title="MP2 step after the same SCF: mp2trn vs PySCF DFMP2", title_justify="left")
    for col in ("case", "nao/naux/nocc/nvir", "code", "time (s)", "GFLOP/s", "speedup vs PySCF", "|Δe_corr| (µEh)"):
        table.add_column(col, justify="right" if col not in ("case", "code") else "left")
    for r in rows:
        table.add_row(f"{r.case} ({r.basis})", f"{r.nao}/{r.naux}/{r.nocc}/{r.nvir}", r.code, f"{r.seconds:.2f}",
                      f"{r.gflops:.3g}", f"{r.speedup:.2f}×", f"{r.delta_uEh:.2e}")
    return table


def rows_markdown(rows: list[BenchRow]) -> str:
    lines = ["| case | basis | nao/naux/nocc/nvir | code | time (s) | GFLOP/s | speedup vs PySCF | abs. diff e_corr (µEh) |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.case} | {r.basis} | {r.nao}/{r.naux}/{r.nocc}/{r.nvir} | {r.code} | {r.seconds:.2f} | "
                     f"{r.gflops:.3g} | {r.speedup:.2f}× | {r.delta_uEh:.1e} |")
    return "\n".join(lines)


#: the environment of a "threads tuned" run: OpenMP threads sleep when idle, OpenBLAS workers almost at once
#: after a call (each of the process's BLAS pools stops competing for the cores with the next one)
THREAD_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}


@dataclass
class WholeRunRow:
    case: str
    code: str  # "pyscf" or "mp2trn <device> <precision>"
    env: str  # "default" (as a new user runs it) or "threads tuned" (THREAD_ENV)
    seconds: float  # the whole run: molecule → SCF → DF-MP2
    scf_seconds: float
    mp2_seconds: float
    scf_cycles: int
    scf_precisions: str  # e.g. "fp32 ×9 → fp64 ×4"
    speedup: float  # whole-run time of PySCF as a new user runs it / this time
    speedup_tuned: float  # the same against PySCF with THREAD_ENV
    delta_scf_uEh: float  # |E_SCF − PySCF| in µEh
    delta_mp2_uEh: float  # |E_MP2 total − PySCF| in µEh


def end_to_end_case(name: str, precisions: list[str], device: str = "cpu", conv_tol: float = 1e-10,
                    repeat: int = 1, tuned_mp2trn: bool = False) -> list[WholeRunRow]:
    """Whole runs of PySCF (density-fitted RHF + DFMP2, the same bases) and of ``mp2trn.run`` per precision,
    each in a fresh process of its own: PySCF as a new user runs it (no mp2trn imported, the environment
    without THREAD_ENV) and with THREAD_ENV; mp2trn as it comes (and with THREAD_ENV when ``tuned_mp2trn``).
    With ``repeat`` > 1 the runs take turns that many times and each keeps its fastest."""
    runs = [("pyscf", False), ("pyscf", True), *((p, False) for p in precisions),
            *(((p, True) for p in precisions) if tuned_mp2trn else ())]
    best: dict[tuple, dict] = {}
    for _ in range(max(1, repeat)):
        for run in runs:
            got = _whole_run_in_child(name, *run, device, conv_tol)
            if run not in best or got["seconds"] < best[run]["seconds"]:
                best[run] = got
    ref, ref_tuned = best[("pyscf", False)], best[("pyscf", True)]
    rows = []
    for (code, tuned), got in best.items():
        rows.append(WholeRunRow(
            name, "pyscf" if code == "pyscf" else f"mp2trn {device} {code}", "threads tuned" if tuned else "default",
            got["seconds"], got["scf_seconds"], got["mp2_seconds"], got["cycles"], got.get("precisions", "fp64"),
            ref["seconds"] / got["seconds"], ref_tuned["seconds"] / got["seconds"],
            abs(got["e_scf"] - ref["e_scf"]) * 1e6, abs(got["e_tot"] - ref["e_tot"]) * 1e6))
    return rows


def _whole_run_in_child(name: str, code: str, tuned: bool, device: str, conv_tol: float) -> dict:
    """One whole run in a fresh Python process; returns its JSON record."""
    path, basis = END_TO_END[name]
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    if tuned:
        env.update(THREAD_ENV)
    if code == "pyscf":   # PySCF alone: mp2trn's import would set OMP_WAIT_POLICY
        cmd = [sys.executable, str(ROOT / "scripts" / "pyscf_whole_run.py"), str(path), basis,
               "--conv-tol", repr(conv_tol), "--max-memory", repr(default_memory_mb())]
    else:
        cmd = [sys.executable, "-c", "from mp2trn.benchmark import print_whole_run; "
               f"print_whole_run({name!r}, {code!r}, {device!r}, {conv_tol!r})"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"whole run {name} {code} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_whole_run(name: str, precision: str, device: str, conv_tol: float) -> None:
    """``mp2trn.run`` with the bases, conv_tol and memory budget of PySCF's run; prints its JSON record."""
    from .jk import precision_runs
    from .pipeline import run

    path, basis = END_TO_END[name]
    t0 = time.perf_counter()
    res = run(path, basis=basis, device=device, precision=precision, conv_tol=conv_tol, max_memory=default_memory_mb())
    t = time.perf_counter() - t0
    rec = res.scf or {}
    print(json.dumps({"seconds": t, "scf_seconds": res.timings["scf"], "mp2_seconds": res.timings["mp2"],
                      "cycles": int(rec.get("cycles", 0)), "precisions": precision_runs(rec.get("precision_per_cycle", [])),
                      "e_scf": res.e_hf, "e_tot": res.e_tot}))


def whole_run_markdown(rows: list[WholeRunRow]) -> str:
    lines = ["| case | code | environment | whole run (s) | SCF (s) | MP2 (s) | SCF cycles (precision) | "
             "speed-up vs PySCF | vs PySCF, threads tuned | abs. diff E_SCF (µEh) | abs. diff E_MP2 (µEh) |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.case} | {r.code} | {r.env} | {r.seconds:.1f} | {r.scf_seconds:.1f} | {r.mp2_seconds:.1f} | "
                     f"{r.scf_cycles} ({r.scf_precisions}) | {r.speedup:.2f}× | {r.speedup_tuned:.2f}× | "
                     f"{r.delta_scf_uEh:.1e} | {r.delta_mp2_uEh:.1e} |")
    return "\n".join(lines)
