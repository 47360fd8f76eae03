"""``mp2trn validate``: an accuracy table against PySCF for a molecule set.

Results go to the terminal (a table per entry, then a summary) and to ``--out``: CSV, JSON and a
Markdown table per set/device/precision, and a PNG plot of the errors (log scale) of every
device/precision run of that set found in the folder. The exit code is 0 when every entry passes, 1
when any entry exceeds its tolerance or fails to run.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InputError
from ..files import check_output_dir
from ..options import DEFAULTS, parse_frozen
from .common import (AuxBasis, ConvTol, ConvTolGrad, DeviceFlag, JkBasis, MaxCycle, Memory, PrecisionFlag,
                     Quiet, ScfDf, ScratchDir, TargetFlag,
                     app, cli_errors, console, err_console, options_from_flags)


@app.command()
@cli_errors
def validate(
    set_name: Annotated[str, typer.Option(
        "--set", "-s", help="Molecule set: a name in molecules/sets (default, s22) or a set file.")] = "default",
    device: DeviceFlag = DEFAULTS.device,
    precision: PrecisionFlag = None,
    out: Annotated[Path, typer.Option(
        "--out", "-o", help="Folder for the CSV, JSON, Markdown and PNG files (created).")] = Path("out/validate"),
    only: Annotated[Optional[str], typer.Option(
        "--only", help="Comma-separated entry names (file stems) to run, e.g. water,hydroxyl.")] = None,
    basis: Annotated[Optional[str], typer.Option(
        "--basis", "-b", help="Orbital basis for every entry (default: each entry's own).")] = None,
    auxbasis: AuxBasis = None,
    frozen_core: Annotated[Optional[str], typer.Option(
        "--frozen-core", help="auto, none or N for every entry (default: each entry's own).")] = None,
    scf_df: ScfDf = DEFAULTS.scf_df,
    jkbasis: JkBasis = None,
    conv_tol: ConvTol = DEFAULTS.conv_tol,
    conv_tol_grad: ConvTolGrad = None,
    max_cycle: MaxCycle = DEFAULTS.max_cycle,
    memory: Memory = None,
    target: TargetFlag = None,
    tol: Annotated[Optional[float], typer.Option("--tol", help=(
        "Pass/fail threshold in Eh (default: 1e-8 fp64, 1e-6 fp32, 1e-7 fp32x3, 2e-6 other compensated modes)."))] = None,
    conventional: Annotated[bool, typer.Option(
        "--conventional/--no-conventional", help="Also run conventional MP2 to show the DF error (energy sets).")] = True,
    pyscf_check: Annotated[bool, typer.Option(
        "--pyscf/--no-pyscf", help="Interaction sets: cross-check every E_corr with PySCF's DF-MP2.")] = True,
    scratch: ScratchDir = None,
    quiet: Quiet = False,
) -> None:
    """Accuracy table against PySCF for a molecule set (exit code 1 when any entry exceeds its tolerance)."""
    # every cheap check before any SCF: set, entries, options, output folder, device
    flags = dict(locals())
    from ..molecule import read_xyz   # the compute path and the reports, imported when a validation starts
    from ..pipeline import bind_device, open_device
    from ..precision import tolerance_for
    from ..validation import ValidationConfig, load_set, run_validation, select_entries
    from ..validation.report import (energy_table, interaction_table, summary_lines, validation_document,
                                     write_reports)

    flags.pop("basis")       # per entry unless given: ValidationConfig.basis
    flags.pop("frozen_core")  # likewise: ValidationConfig.frozen
    mset = load_set(set_name)
    entries = select_entries(mset, only)
    if tol is not None and not tol > 0:
        raise InputError(f"--tol must be positive, got {tol}")
    frozen = parse_frozen(frozen_core) if frozen_core is not None else None
    if mset.kind == "interaction" and isinstance(frozen, int):
        raise InputError(f"--frozen-core {frozen_core}: interaction sets take auto or none (the complex and each "
                         "fragment have different numbers of core orbitals)")
    options = options_from_flags(flags)
    check_output_dir(out)
    with open_device(options) as dev:  # DeviceUnavailableError: a clear message before any SCF
        for entry in entries:  # malformed XYZ files fail here, not half-way through the run
            read_xyz(entry.path)
        cfg = ValidationConfig(bind_device(options, dev), basis=basis, frozen=frozen_core, tolerance=tol,
                               conventional=conventional, pyscf_check=pyscf_check)
        tolerance = tol if tol is not None else tolerance_for(dev.precision)
        noun = "molecules" if mset.kind == "energy" else "complexes"
        if not quiet:
            console.print(f"validating set [bold]{mset.name}[/] ({len(entries)} {noun}) on device {dev.name}, "
                          f"precision {dev.precision}; tolerance {tolerance:g} Eh", highlight=False)

        def on_row(row):
            if not quiet and err_console.is_terminal:
                status = "ERROR" if row.get("error") else ("ok" if row["passed"] else "FAIL")
                err_console.print(f"  {row['key']}: {status}", highlight=False)

        t0 = time.perf_counter()
        rows, summary = run_validation(mset, entries, cfg, on_row)
        summary["wall_time"] = time.perf_counter() - t0
        ran = [r for r in rows if not r.get("error")]
        device_ran = ran[0]["device"] if ran else dev.name
        precision_ran = ran[0]["precision"] if ran else dev.precision
    tol_text = f"tolerance {tolerance:g} Eh for {precision_ran}"
    command = "mp2trn " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if Path(sys.argv[0]).name == "mp2trn" else \
        f"mp2trn validate --set {mset.name} --device {device}" + (f" --precision {precision}" if precision else "")
    doc = validation_document(mset, cfg, rows, summary, device_ran, precision_ran, tolerance, command)
    files = write_reports(out, mset, doc, tol_text)
    if not quiet:
        title = f"{mset.name}: mp2trn ({device_ran}, {precision_ran}) vs PySCF"
        if mset.kind == "energy":
            console.print(energy_table(rows, title + " DF-MP2 (energies Eh, |Δ| and DF error µEh, times s)"))
        else:
            console.print(interaction_table(rows, title + " (ΔE kcal/mol, counterpoise-corrected; times s)"))
        for line in summary_lines(mset.kind, summary, tol_text):
            console.print(line, highlight=False)
        console.print(f"written to {out}: {', '.join(files)}"
                      + ("" if files[-1].endswith(".png") else " (no plot: matplotlib not installed)"), highlight=False)
    failed = len(rows) - summary["passed"]
    if failed:
        err_console.print(f"[bold red]validation failed:[/] {failed} of {len(rows)} entries "
                          f"{'exceed the tolerance or did not run' if summary['errors'] else 'exceed the tolerance'} "
                          f"({', '.join(summary['failed'])})", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
