"""``mp2trn bench``: time the MP2 step of mp2trn and of PySCF's DFMP2 after the same SCF."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from ..benchmark import CASES, QUICK, BenchRow, bench_case, rows_markdown, rows_table
from ..errors import InputError
from ..files import check_output_path, write_json_atomic
from ..machine import machine_description
from .common import app, cli_errors, console


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
