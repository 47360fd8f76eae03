"""``mp2trn freq``: harmonic frequencies, IR intensities and thermochemistry from the Hessian by central
differences of mp2trn's analytic gradients (the displacements shared over torchrun ranks, resumable)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..files import check_output_path
from .common import JsonPath, Quiet, app, cli_errors, console, finish, options_from_flags, with_run_flags

#: the flags of a frequency calculation, shared by ``freq`` and ``optimize --freq``
HessianStep = Annotated[float, typer.Option("--hessian-step", help=(
    "Displacement of the central differences (bohr).") )]
Temperature = Annotated[float, typer.Option("--temperature", help="Temperature of the thermochemistry (K).")]
Pressure = Annotated[float, typer.Option("--pressure", help="Pressure of the thermochemistry (Pa; 101325 = 1 atm).")]
SymmetryNumber = Annotated[Optional[int], typer.Option("--symmetry-number", help=(
    "Rotational symmetry number (default: from the point group PySCF detects, e.g. H2O 2, NH3 3, CH4 12)."))]
MoldenPath = Annotated[Optional[Path], typer.Option("--molden", help=(
    "Write the normal modes to this Molden file ([FREQ], [FR-COORD], [FR-NORM-COORD], [INT]; atomically)."))]


@app.command()
@cli_errors
@with_run_flags()
def freq(
    xyz: Path = typer.Argument(..., help="Molecule (XYZ, or any molecule file ASE reads), ideally an optimised geometry."),
    hessian_step: HessianStep = 0.005,
    temperature: Temperature = 298.15,
    pressure: Pressure = 101325.0,
    symmetry_number: SymmetryNumber = None,
    displacements: Optional[Path] = typer.Option(None, "--displacements", help=(
        "Directory where every finished displaced gradient is written (atomically) as it completes; "
        "--resume continues from it.")),
    resume: bool = typer.Option(False, "--resume", help=(
        "Continue a killed frequency run from the points in --displacements (none is recomputed).")),
    molden: MoldenPath = None,
    json_path: JsonPath = None,
    quiet: Quiet = False,
    **flags,
) -> None:
    """Harmonic frequencies (cm⁻¹), normal modes, IR intensities (km/mol) and ideal-gas thermochemistry (ZPE,
    U, H, S, G) from the Hessian by central differences of the analytic DF-MP2 gradient."""
    from ..pipeline import open_device, open_ranks
    from ..scratch import run_scratch

    for path in (json_path, molden):
        check_output_path(path)
    options = options_from_flags({**flags, "gradient": True, "hessian_step": hessian_step})
    with open_ranks(options) as comm, run_scratch(options.scratch), open_device(options) as device:
        result = frequencies_of(xyz, options, device, comm, displacements, resume, temperature, pressure,
                                symmetry_number, quiet)
    if comm.rank == 0:
        write_outputs(result, molden, json_path, quiet, str(xyz))


def frequencies_of(source, options, device, comm, displacements=None, resume=False, temperature=298.15,
                   pressure=101325.0, symmetry_number=None, quiet=False, coords_bohr=None):
    """The frequency run with a progress line per displaced gradient (rank 0, unless quiet)."""
    from ..hessian import run_frequencies

    def report(disp, point, done, total) -> None:
        if quiet or comm.rank != 0:
            return
        took = "read back" if point.seconds is None or point.scf_cycles is None else \
            f"SCF cycles {point.scf_cycles}  {point.seconds:.1f} s"
        console.print(f"displacement {done:3d}/{total} (rank 0 of {comm.size})  atom {disp.atom + 1} "
                      f"{'xyz'[disp.axis]}{'+' if disp.sign > 0 else '-'}  E {point.energy:.10f} Eh  {took}",
                      highlight=False, soft_wrap=True)

    return run_frequencies(source, options, device, comm, displacements, resume, temperature, pressure,
                           symmetry_number, report=report, coords_bohr=coords_bohr)


def write_outputs(result, molden: Path | None, json_path: Path | None, quiet: bool, title: str) -> None:
    """The Molden file and JSON (atomically), then the tables."""
    from ..hessian import write_molden

    if molden is not None:
        write_molden(molden, result.symbols, result.vibrations)
    finish(json_path, result.to_qcschema(), quiet, lambda: print_frequencies(result, title))
    if molden is not None and not quiet:
        console.print(f"normal modes written to {molden}")


def print_frequencies(result, title: str) -> None:
    """The table of modes, the thermochemistry table and the warnings."""
    from ..result import HARTREE_TO_KCAL

    vib, hess, thermo = result.vibrations, result.hessian, result.thermo
    modes = Table(title=f"Harmonic frequencies: {title} ({result.point_group}"
                  f"{', linear' if vib.linear else ''})", title_justify="left")
    for name in ("mode", "cm⁻¹", "reduced mass (amu)", "force const. (mdyn/Å)", "IR (km/mol)"):
        modes.add_column(name, justify="right")
    intensities = vib.ir_intensities if vib.ir_intensities is not None else [None] * len(vib.frequencies_cm1)
    for k, (f, mu, kf, ir) in enumerate(zip(vib.frequencies_cm1, vib.reduced_masses, vib.force_constants,
                                            intensities), start=1):
        modes.add_row(str(k), f"{abs(f):.2f}i" if f < 0 else f"{f:.2f}", f"{mu:.4f}", f"{kf:.4f}",
                      "" if ir is None else f"{ir:.3f}")
    console.print(modes)
    per = hess.seconds_per_displacement
    console.print(f"{6 * len(hess.moved)} displaced gradients (step {hess.step} bohr, central differences): "
                  f"{hess.computed} computed, {hess.reused} read back, over {hess.ranks} rank(s), "
                  f"{hess.seconds:.1f} s" + (f" ({per:.2f} s per displacement)" if per else "")
                  + f"; max |H − Hᵀ| {hess.asymmetry:.1e} Eh/bohr²", highlight=False, soft_wrap=True)
    table = Table(title=f"Thermochemistry at {thermo.temperature:g} K, {thermo.pressure:g} Pa (σ = "
                  f"{thermo.symmetry_number}, {thermo.symmetry_source})", title_justify="left")
    for name in ("quantity", "Eh", "kcal/mol (correction)"):
        table.add_column(name, justify="right" if name != "quantity" else "left")
    e0 = thermo.parts["E0"]
    rows = [("electronic energy E0", e0, None), ("zero-point energy", thermo.zpe, thermo.zpe),
            ("E0 + ZPE", e0 + thermo.zpe, thermo.zpe),
            ("internal energy U", thermo.internal_energy, thermo.internal_energy - e0),
            ("enthalpy H", thermo.enthalpy, thermo.enthalpy - e0),
            ("Gibbs energy G", thermo.gibbs, thermo.gibbs - e0)]
    for name, value, corr in rows:
        table.add_row(name, f"{value:.8f}", "" if corr is None else f"{corr * HARTREE_TO_KCAL:.4f}")
    for part in ("tot", "trans", "rot", "vib", "elec"):
        s = thermo.parts[f"S_{part}"]
        table.add_row(f"entropy S ({'total' if part == 'tot' else part}) [Eh/K | cal/(mol·K)]", f"{s:.6e}",
                      f"{s * HARTREE_TO_KCAL * 1000:.4f}")
    console.print(table)
    for warning in result.warnings:
        console.print(warning, style="yellow", highlight=False, soft_wrap=True)
