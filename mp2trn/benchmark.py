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
from .jk import precision_runs
from .memory import default_memory_mb
from .options import RunOptions
from .pipeline import open_device, scf_stage
from .scratch import run_scratch
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


@dataclass
class WholeRunRow:
    case: str
    code: str  # "pyscf" or "mp2trn <device> <precision>"
    seconds: float  # the whole run: molecule → SCF → DF-MP2
    scf_seconds: float
    mp2_seconds: float
    scf_cycles: int
    scf_precisions: str  # e.g. "fp32 ×9 → fp64 ×4"
    speedup: float  # PySCF whole-run time / this time
    delta_scf_uEh: float  # |E_SCF − PySCF| in µEh
    delta_mp2_uEh: float  # |E_MP2 total − PySCF| in µEh


def end_to_end_case(name: str, precisions: list[str], device: str = "cpu", conv_tol: float = 1e-10,
                    repeat: int = 1) -> list[WholeRunRow]:
    """PySCF (density-fitted RHF + DFMP2, the same bases) and mp2trn.run per precision, whole runs; with
    ``repeat`` > 1 the codes take turns that many times and each keeps its fastest run."""
    codes = ["pyscf", *precisions]
    best: dict[str, tuple] = {}
    for _ in range(max(1, repeat)):
        for code in codes:
            got = _pyscf_whole_run(name, conv_tol) if code == "pyscf" else _mp2trn_whole_run(name, code, device, conv_tol)
            if code not in best or got[0] < best[code][0]:
                best[code] = got
    t_ref, _, _, _, _, e_ref_scf, e_ref = best["pyscf"]
    rows = []
    for code in codes:
        t, t_scf, t_mp2, cycles, label, e_scf, e_tot = best[code]
        rows.append(WholeRunRow(name, "pyscf" if code == "pyscf" else f"mp2trn {device} {code}", t, t_scf, t_mp2,
                                cycles, label, t_ref / t, abs(e_scf - e_ref_scf) * 1e6, abs(e_tot - e_ref) * 1e6))
    return rows


def _pyscf_whole_run(name: str, conv_tol: float) -> tuple:
    """(seconds, SCF s, MP2 s, cycles, precisions, E_SCF, E_total) of PySCF's density-fitted RHF + DFMP2."""
    from pyscf import df, scf
    from pyscf.mp import dfmp2

    from .molecule import build_mole

    path, basis = END_TO_END[name]
    budget = default_memory_mb()
    t0 = time.perf_counter()
    mol = build_mole(path, basis=basis)
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.verbose, mf.max_memory = conv_tol, 0, budget
    mf.kernel()
    t_scf = time.perf_counter() - t0
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    pt.verbose, pt.max_memory = 0, budget
    pt.kernel(with_t2=False)
    t = time.perf_counter() - t0
    return t, t_scf, t - t_scf, int(mf.cycles), "fp64", float(mf.e_tot), float(mf.e_tot + pt.e_corr)


def _mp2trn_whole_run(name: str, precision: str, device: str, conv_tol: float) -> tuple:
    """The same tuple for ``mp2trn.run`` with the same bases, conv_tol and memory budget."""
    from .pipeline import run

    path, basis = END_TO_END[name]
    t0 = time.perf_counter()
    res = run(path, basis=basis, device=device, precision=precision, conv_tol=conv_tol, max_memory=default_memory_mb())
    t = time.perf_counter() - t0
    rec = res.scf or {}
    return (t, res.timings["scf"], res.timings["mp2"], int(rec.get("cycles", 0)),
            precision_runs(rec.get("precision_per_cycle", [])), res.e_hf, res.e_tot)


def whole_run_markdown(rows: list[WholeRunRow]) -> str:
    lines = ["| case | code | whole run (s) | SCF (s) | MP2 (s) | SCF cycles (precision) | speed-up vs PySCF | "
             "abs. diff E_SCF (µEh) | abs. diff E_MP2 (µEh) |", "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.case} | {r.code} | {r.seconds:.1f} | {r.scf_seconds:.1f} | {r.mp2_seconds:.1f} | "
                     f"{r.scf_cycles} ({r.scf_precisions}) | {r.speedup:.2f}× | {r.delta_scf_uEh:.1e} | "
                     f"{r.delta_mp2_uEh:.1e} |")
    return "\n".join(lines)
