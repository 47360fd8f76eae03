"""``mp2trn interaction``: the counterpoise-corrected interaction energy of a complex."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..files import check_output_path
from ..result import HARTREE_TO_KCAL
from .common import (Quiet, app, cli_errors, console, err_console, finish, options_from_flags,
                     with_run_flags)


@app.command()
@cli_errors
@with_run_flags(exclude=("lindep", "scf_jk"))
def interaction(
    xyz: Path = typer.Argument(..., help="The complex in XYZ format; fragments by --split or '--' lines."),
    split: Annotated[Optional[int], typer.Option("--split", help="Atoms 1..N form fragment 1, the rest fragment 2.")] = None,
    charges: Annotated[Optional[str], typer.Option(
        "--charges", help="Charge per fragment, e.g. 0,-1 (default: comment line, else 0).")] = None,
    multiplicities: Annotated[Optional[str], typer.Option(
        "--multiplicities", help="Multiplicity per fragment, e.g. 1,2 (default: comment line, else lowest).")] = None,
    counterpoise: Annotated[bool, typer.Option(
        "--cp/--no-cp", help="Counterpoise correction (fragments in the complex's basis, ghost atoms).")] = True,
    charge: Annotated[Optional[int], typer.Option(
        "--charge", "-c", help="Charge of the complex (default: the sum of the fragment charges).")] = None,
    multiplicity: Annotated[Optional[int], typer.Option(
        "--multiplicity", "-m", help="Multiplicity of the complex (default: high spin, 1 + Σ(m_k − 1)).")] = None,
    frozen_core: Annotated[str, typer.Option(
        "--frozen-core", help="auto (noble-gas cores of each calculation's real atoms) or none.")] = "none",
    json_path: Annotated[Optional[Path], typer.Option(
        "--json", help="Write ΔE (under interaction_energy, Eh) and every calculation's result here (atomically).")] = None,
    quiet: Quiet = False,
    **flags,
) -> None:
    """Counterpoise-corrected interaction energy (SCF, MP2 and SCS-MP2) of a complex."""
    from ..interaction import interaction_energy
    from ..parallel import rank_and_size

    check_output_path(json_path)
    options = options_from_flags({**flags, "charge": charge, "multiplicity": multiplicity, "frozen_core": frozen_core})

    first = rank_and_size()[0] == 0   # under torchrun the calculations are spread over the ranks; rank 0 reports

    def progress(label: str, k: int, n: int) -> None:
        if not quiet and first and err_console.is_terminal:
            err_console.print(f"  [{k + 1}/{n}] {label}", highlight=False)

    ie = interaction_energy(xyz, split=split, charges=charges, multiplicities=multiplicities,
                            counterpoise=counterpoise, options=options, progress=progress)
    if first:
        finish(json_path, ie.to_json(), quiet, lambda: print_interaction(ie, title=str(xyz)))


def print_interaction(ie, title: str) -> None:
    from ..interaction import DELTA_KEYS, DELTA_LABELS

    cp = "counterpoise-corrected" if ie.counterpoise else "no counterpoise correction"
    t = Table(title=f"Interaction energy ({cp}): {title}", title_justify="left")
    t.add_column("ΔE")
    t.add_column("Eh", justify="right")
    t.add_column("kcal/mol", justify="right")
    for key in DELTA_KEYS:
        t.add_row(DELTA_LABELS[key], f"{ie.delta[key]:.10f}", f"{ie.delta[key] * HARTREE_TO_KCAL:.4f}")
    console.print(t)
    c = Table(title="Calculations (ΔE = complex − Σ fragments)", title_justify="left")
    for col in ("calculation", "atoms", "ghosts", "charge", "mult", "ref", "nao", "naux", "E_SCF (Eh)",
                "E_corr MP2 (Eh)", "t SCF (s)", "t MP2 (s)"):
        c.add_column(col, justify="left" if col in ("calculation", "ref") else "right")
    for calc in ie.calculations:
        r = calc.result
        c.add_row(calc.label, str(calc.n_real), str(calc.n_ghost), str(calc.charge), str(calc.multiplicity),
                  r.reference, str(r.sizes["nao"]), str(r.sizes["naux"]), f"{r.e_hf:.10f}", f"{r.e_corr:.10f}",
                  f"{calc.t_scf:.2f}", f"{calc.t_mp2:.2f}")
    console.print(c)
    w = ie.what_ran
    info = Table(title="What ran", title_justify="left", show_header=False)
    info.add_column("key")
    info.add_column("value")
    info.add_row("device", str(w.get("device")) + (f" ({w['backend']})" if w.get("backend") else ""))
    info.add_row("precision", str(w.get("precision")))
    info.add_row("basis / aux basis", f"{w.get('basis')} / {w.get('auxbasis')}")
    info.add_row("SCF", f"density-fitted ({w.get('jkbasis')})" if w.get("jkbasis") else "conventional integrals")
    frozen = sorted(set(map(str, w.get("frozen", {}).values())))
    info.add_row("frozen orbitals", "; ".join(frozen))
    info.add_row("fragments", "; ".join(f"{f.describe()}: charge {f.charge}, multiplicity {f.multiplicity}"
                                        for f in ie.fragments))
    info.add_row("time", f"{ie.timings['total']:.2f} s (SCF {ie.timings['scf']:.2f} s, MP2 {ie.timings['mp2']:.2f} s)")
    console.print(info)
