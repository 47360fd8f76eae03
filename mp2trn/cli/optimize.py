"""``mp2trn optimize``: a geometry optimisation (geomeTRIC on mp2trn's analytic gradient)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..files import check_output_path, write_text_atomic
from .common import JsonPath, Quiet, app, cli_errors, console, finish, options_from_flags, with_run_flags


@app.command()
@cli_errors
@with_run_flags()
def optimize(
    xyz: Path = typer.Argument(..., help="Starting geometry (XYZ, or any molecule file ASE reads)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the final geometry here (XYZ, energy in the comment)."),
    trajectory: Optional[Path] = typer.Option(None, "--trajectory", help=(
        "Every finished step as a multi-frame XYZ (energies and gradients in the comments), written atomically "
        "per step; --resume continues from it.")),
    convergence: str = typer.Option("gau", "--convergence", help=(
        "geomeTRIC convergence set: gau, gau_loose, gau_tight, gau_verytight, nwchem_loose, turbomole, "
        "interfrag_tight.")),
    max_steps: int = typer.Option(100, "--max-steps", help=(
        "Optimisation steps (geomeTRIC iterations, after the starting point's gradient) before giving up (exit 3).")),
    constraints: Optional[Path] = typer.Option(None, "--constraints", help=(
        "geomeTRIC constraints file ($freeze, $set distance/angle/dihedral/xyz..., $scan), read strictly: a line "
        "not understood is an error naming it; the constraints applied are printed before the first step.")),
    resume: bool = typer.Option(False, "--resume", help=(
        "Continue a killed optimisation from the last step in --trajectory (no finished step is recomputed).")),
    reuse_density: bool = typer.Option(True, "--reuse-density/--fresh-guess", help=(
        "Start each step's SCF from the previous step's density (default) or from PySCF's guess.")),
    json_path: JsonPath = None,
    quiet: Quiet = False,
    **flags,
) -> None:
    """Optimise a geometry with geomeTRIC (translation-rotation internal coordinates) on the analytic
    DF-MP2 gradient; one progress line per step."""
    from ..geomopt import optimize as run_optimize
    from ..pipeline import open_device, open_ranks
    from ..qcschema import optimization_result
    from ..scratch import run_scratch

    for path in (out, json_path):
        check_output_path(path)
    options = options_from_flags({**flags, "gradient": True})

    def report(step, previous) -> None:
        if quiet:
            return
        de = "" if previous is None else f"  ΔE {step.energy - previous.energy:+.3e}"
        size = "" if previous is None else f"  step {float(((step.coords - previous.coords) ** 2).sum() ** 0.5) * 0.529177:.4f} Å"
        console.print(f"step {step.step:3d}  E {step.energy:.10f} Eh{de}  max|g| {step.max_gradient:.2e}  "
                      f"rms|g| {step.rms_gradient:.2e}{size}  SCF cycles {step.scf_cycles}  {step.seconds:.1f} s",
                      highlight=False, soft_wrap=True)

    def announce(stated: list[str]) -> None:
        if not quiet:
            console.print(f"constraints from {constraints}: " + "; ".join(stated), highlight=False, soft_wrap=True)

    with open_ranks(options) as comm, run_scratch(options.scratch), open_device(options) as device:
        opt = run_optimize(xyz, options, device, convergence, max_steps, constraints, trajectory, resume,
                           reuse_density, report, comm, announce=announce)
    if opt is None:      # a rank other than 0: it computed its share of every gradient; rank 0 reports
        return
    if out is not None:
        write_text_atomic(out, opt.final_xyz())
    finish(json_path, optimization_result(opt, options), quiet,
           lambda: console.print(f"{opt.message}; final energy {opt.final.energy:.10f} Eh"
                                 + (f"; geometry written to {out}" if out else ""), highlight=False, soft_wrap=True))
    if not quiet and out is None:
        sys.stdout.write(opt.final_xyz())
