"""``mp2trn optimize``: a geometry optimisation (geomeTRIC on mp2trn's analytic gradient)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from ..errors import ConvergenceError, InputError
from ..files import check_output_path, write_text_atomic
from .common import JsonPath, Quiet, app, cli_errors, console, finish, options_from_flags, with_run_flags
from .freq import (HessianStep, MoldenPath, Pressure, SymmetryNumber, Temperature, frequencies_of,
                   print_frequencies)


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
    freq: bool = typer.Option(False, "--freq", help=(
        "Then the harmonic frequencies, IR intensities and thermochemistry at the final geometry (as mp2trn freq).")),
    transition_state: bool = typer.Option(False, "--transition-state", help=(
        "Search a transition state (geomeTRIC's TS optimiser from mp2trn's Hessian at the start); the run ends by "
        "checking that the final Hessian has exactly one imaginary mode (exit 3 otherwise).")),
    irc: bool = typer.Option(False, "--irc", help=(
        "Follow the intrinsic reaction coordinate from a transition state (geomeTRIC's IRC, both directions, "
        "from mp2trn's Hessian at the start); --trajectory gets every point of the path.")),
    hessian_step: HessianStep = 0.005,
    temperature: Temperature = 298.15,
    pressure: Pressure = 101325.0,
    symmetry_number: SymmetryNumber = None,
    molden: MoldenPath = None,
    json_path: JsonPath = None,
    quiet: Quiet = False,
    **flags,
) -> None:
    """Optimise a geometry with geomeTRIC (translation-rotation internal coordinates) on the analytic
    DF-MP2 gradient; one progress line per step. --freq adds the frequencies at the end,
    --transition-state searches a saddle point, --irc follows the reaction path from one."""
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

    if transition_state and irc:
        raise InputError("--transition-state and --irc: find the transition state first, then run --irc from it")
    check_output_path(molden)
    options = replace(options, hessian_step=hessian_step)
    final_freq = None
    with open_ranks(options) as comm, run_scratch(options.scratch), open_device(options) as device:
        start_hessian = None
        if transition_state or irc:   # geomeTRIC starts from mp2trn's Hessian (all ranks share its points)
            start = frequencies_of(xyz, options, device, comm, quiet=quiet)
            start_hessian = start.hessian.hessian
            if comm.rank == 0 and not quiet:
                console.print(f"starting Hessian: {start.imaginary} imaginary mode(s) "
                              f"({', '.join(f'{f:.1f}' for f in start.vibrations.frequencies_cm1[:3])} ... cm⁻¹)",
                              highlight=False, soft_wrap=True)
        opt = run_optimize(xyz, options, device, convergence, max_steps, constraints, trajectory, resume,
                           reuse_density, report, comm, announce=announce, transition_state=transition_state,
                           irc=irc, initial_hessian=start_hessian)
        if freq or transition_state:   # the final geometry from rank 0, then every rank takes its share
            final = comm.gather(opt.final.coords if comm.rank == 0 else None)[0]
            final_freq = frequencies_of(xyz, options, device, comm, None, False, temperature, pressure,
                                        symmetry_number, quiet, coords_bohr=final)
    if opt is None:      # a rank other than 0: it computed its share of every gradient; rank 0 reports
        return
    if out is not None:
        write_text_atomic(out, opt.final_xyz())
    document = optimization_result(opt, options)
    if final_freq is not None:
        document["extras"]["mp2trn"]["frequencies"] = final_freq.to_qcschema()
        if molden is not None:
            from ..hessian import write_molden

            write_molden(molden, final_freq.symbols, final_freq.vibrations)

    def show() -> None:
        console.print(f"{opt.message}; final energy {opt.final.energy:.10f} Eh"
                      + (f"; geometry written to {out}" if out else ""), highlight=False, soft_wrap=True)
        if final_freq is not None:
            print_frequencies(final_freq, f"{xyz} (final geometry)")

    finish(json_path, document, quiet, show)
    if not quiet and out is None:
        sys.stdout.write(opt.final_xyz())
    if transition_state:
        check_transition_state(final_freq, quiet)


def check_transition_state(result, quiet: bool) -> None:
    """The end of a transition-state search: exactly one imaginary mode, said either way (exit 3 if not)."""
    imaginary = result.vibrations.frequencies_cm1[result.vibrations.frequencies_cm1 < 0]
    if result.imaginary == 1:
        if not quiet:
            console.print(f"transition state confirmed: exactly one imaginary mode ({abs(imaginary[0]):.1f}i cm⁻¹)",
                          highlight=False, soft_wrap=True)
        return
    raise ConvergenceError(f"not a transition state: the final Hessian has {result.imaginary} imaginary modes "
                           "(a transition state has exactly one); the geometry and frequencies are written")
