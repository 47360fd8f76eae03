"""Speed of the MP2 step: mp2trn against PySCF's DFMP2 after the same SCF (``mp2trn bench``).

Same process, same converged SCF object, same explicitly set MP2 aux basis on both sides. Reports wall
time, GFLOP/s (counted flops of the transforms, the metric solve and the pair GEMMs), the speed ratio
and the energy difference. A benchmark, not a test: it prints ratios and asserts nothing about speed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from rich.table import Table

from .dfmp2 import DFMP2
from .memory import default_memory_mb
from .options import RunOptions
from .pipeline import open_device, scf_stage
from .validation.pyscf_reference import pyscf_reference

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
    path, basis = CASES[name]
    options = RunOptions(basis=basis, device=device, max_memory=default_memory_mb())
    with open_device(replace(options, precision=precisions[0])) as dev:
        mf, _ = scf_stage(path, options, dev)
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
