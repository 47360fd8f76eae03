"""`mp2trn bench`: time the MP2 step of mp2trn against PySCF's DFMP2 after the same SCF.

Same process, same converged SCF object, same explicitly set MP2 aux basis on both sides. Reports wall
time, GFLOP/s (counted flops of the transforms, the metric solve and the pair GEMMs), the speed ratio
and the energy difference. A benchmark, not a test: it prints ratios and asserts nothing about speed.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .cli import app, check_output_path, cli_errors, console
from .errors import InputError
from .result import write_json_atomic

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
    """Run one case: SCF once, then PySCF's DFMP2 and mp2trn (each precision), best of ``repeat``."""
    from pyscf import df
    from pyscf.mp import dfmp2

    from .api import DFMP2
    from .molecule import build_mole
    from .scf import ScfOptions, run_scf

    from .memory import default_memory_mb

    path, basis = CASES[name]
    memory_mb = default_memory_mb()
    mol = build_mole(path, basis=basis)
    mf = run_scf(mol, ScfOptions())
    aux = df.make_auxbasis(mol, mp2fit=True)

    def run_pyscf():
        ref = dfmp2.DFMP2(mf)
        ref.with_df = df.DF(mol, auxbasis=aux)
        ref.verbose = 0
        ref.max_memory = memory_mb
        ref.kernel(with_t2=False)  # energy only, as mp2trn (PySCF otherwise stores nocc²nvir² amplitudes)
        return ref.e_corr

    e_ref, t_ref = _best(run_pyscf, repeat)
    rows = []
    results = []
    for precision in precisions:
        e, t = _best(lambda p=precision: DFMP2(mf, auxbasis=aux, device=device, precision=p, max_memory=memory_mb).run(), repeat)
        results.append((precision, e, t))
    sizes = results[0][1].result.sizes
    flops = mp2_flops(sizes["nao"], sizes["naux"], sizes["nocc"], sizes["nvir"])
    common = dict(case=name, basis=basis, natm=sizes["natm"], nao=sizes["nao"], naux=sizes["naux"],
                  nocc=sizes["nocc"], nvir=sizes["nvir"])
    rows.append(BenchRow(**common, code="pyscf DFMP2", seconds=t_ref, gflops=flops / t_ref / 1e9, speedup=1.0, delta_uEh=0.0))
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


def machine_description() -> str:
    import os

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", load average {:.1f}".format(os.getloadavg()[0]) if hasattr(os, "getloadavg") else ""
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}{load}"


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


@app.command()
@cli_errors
def bench(
    case: Optional[list[str]] = typer.Option(None, "--case", help=f"Case(s) to run: {', '.join(CASES)} (default: all)."),
    quick: bool = typer.Option(False, "--quick", help=f"Only the fast cases ({', '.join(QUICK)})."),
    precision: Optional[list[str]] = typer.Option(None, "--precision", "-p", help="mp2trn precision(s) (default fp64 and fp32)."),
    device: str = typer.Option("cpu", "--device", "-d", help="mp2trn device to time."),
    repeat: int = typer.Option(1, "--repeat", help="Best of N runs per code."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the rows as JSON (atomically)."),
    markdown: bool = typer.Option(False, "--markdown", help="Also print the table as Markdown (for docs/benchmarks.md)."),
) -> None:
    """Time the MP2 step of mp2trn and of PySCF's DFMP2 after the same SCF (prints ratios)."""
    names = list(case) if case else (QUICK if quick else list(CASES))
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise InputError(f"unknown bench case(s) {', '.join(unknown)}: choose from {', '.join(CASES)}")
    check_output_path(json_path)
    precisions = list(precision) if precision else ["fp64", "fp32"]
    rows: list[BenchRow] = []
    for name in names:
        console.print(f"running {name} ...", style="dim")
        rows.extend(bench_case(name, precisions, device=device, repeat=repeat))
    console.print(rows_table(rows))
    console.print(f"machine: {machine_description()}")
    if markdown:
        console.print(rows_markdown(rows), highlight=False, soft_wrap=True)
    if json_path is not None:
        write_json_atomic(json_path, {"machine": machine_description(), "rows": [asdict(r) for r in rows]})
