"""``mp2trn run``: one molecule through the compute path, printed as tables and written as JSON."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ..errors import InputError
from ..files import check_output_path
from ..result import HARTREE_TO_KCAL, MP2Result
from .common import (JsonPath, Quiet, StageProgress, app, cli_errors, console, finish, options_from_flags,
                     with_run_flags)


@app.command()
@cli_errors
@with_run_flags()
def run(
    xyz: Path = typer.Argument(..., help="Molecule in XYZ format (Angstrom unless --unit bohr)."),
    json_path: JsonPath = None,
    quiet: Quiet = False,
    gradient: bool = typer.Option(False, "--gradient", help=(
        "Also the analytic nuclear gradient (Eh/bohr), the relaxed MP2 density's dipole and natural orbitals; "
        "--json then writes a gradient-driver result.")),
    molden: Optional[Path] = typer.Option(None, "--molden", help=(
        "Write the natural orbitals of the relaxed MP2 density to this Molden file (implies --gradient).")),
    **flags,
) -> None:
    """Compute the DF-MP2 energy of a molecule (an XYZ file, any molecule file ASE reads, or a QCSchema
    AtomicInput JSON file, recognised by its content)."""
    from ..pipeline import compute, open_device, open_ranks   # the compute path, imported when a run starts
    from ..scratch import run_scratch

    check_output_path(json_path)
    check_output_path(molden)
    options = options_from_flags({**flags, "gradient": gradient or molden is not None})
    atomic_input = _atomic_input_text(xyz)
    if atomic_input:
        return run_qcschema_file(xyz, atomic_input, options, json_path, quiet)
    with open_ranks(options) as comm, run_scratch(options.scratch), open_device(options) as dev, \
            StageProgress(enabled=not quiet and sys.stderr.isatty() and comm.rank == 0) as progress:
        result, mf = compute(xyz, options, dev, progress, comm=comm)
    if comm.rank == 0:   # over several ranks, rank 0 alone prints and writes
        if molden is not None:
            from ..grad.properties import natural_orbitals, write_molden

            write_molden(molden, mf.mol, natural_orbitals(mf.mol, result.densities.dm_relaxed, mf.mo_coeff))
        finish(json_path, result.to_qcschema(), quiet, lambda: print_result(result, title=str(xyz)))
        if molden is not None and not quiet:
            console.print(f"natural orbitals of the relaxed MP2 density written to {molden}")


def _atomic_input_text(path: Path) -> str | None:
    """The file's text when it is a QCSchema AtomicInput (by content), else None (read once)."""
    try:
        with open(path, encoding="utf-8") as fh:
            if fh.read(64).lstrip()[:1] != "{":
                return None
            fh.seek(0)
            text = fh.read()
    except (OSError, UnicodeDecodeError):
        return None  # the molecule reader says what is wrong with the file
    from ..qcschema import looks_like_atomic_input   # only for files that look like JSON

    return text if looks_like_atomic_input(text) else None


def run_qcschema_file(path: Path, text: str, options, json_path: Path | None, quiet: bool) -> None:
    """A QCSchema AtomicInput file: its model and keywords say what to run; ``--json`` gets the
    AtomicResult. Settings given as flags as well are refused (one place for each setting)."""
    from dataclasses import fields

    from ..options import RunOptions
    from ..qcschema import run_atomic_input

    defaults = RunOptions(scratch=options.scratch)
    flagged = [f.name for f in fields(RunOptions) if getattr(options, f.name) != getattr(defaults, f.name)]
    if flagged:
        raise InputError(f"{path} is a QCSchema AtomicInput, which carries its own settings: put "
                         f"{', '.join(flagged)} in its model or keywords instead of the command line")
    result = run_atomic_input(text)
    document = result.model_dump(mode="json")

    def show() -> None:
        props = result.properties
        table = Table(title=f"QCSchema AtomicResult: {path}", title_justify="left")
        table.add_column("property")
        table.add_column("Eh", justify="right")
        for name in ("scf_total_energy", "mp2_same_spin_correlation_energy", "mp2_opposite_spin_correlation_energy",
                     "mp2_correlation_energy", "mp2_total_energy", "return_energy"):
            value = getattr(props, name, None)
            if value is not None:
                table.add_row(name, f"{value:.10f}")
        console.print(table)
        ran = result.extras.get("mp2trn", {})
        console.print(f"method {result.input_data.specification.model.method}, device {ran.get('device')}, "
                      f"precision {ran.get('precision', ran.get('scf', {}).get('precision_per_cycle', ['?'])[-1])}")

    finish(json_path, document, quiet, show)


def energy_table(result: MP2Result, title: str) -> Table:
    method = result.method
    table = Table(title=f"{'DF-MP2' if method.name == 'mp2' else method.name.upper()} energies: {title}",
                  title_justify="left")
    table.add_column("quantity")
    table.add_column("Eh", justify="right")
    table.add_column("kcal/mol", justify="right")
    if method.double_hybrid:
        rows = [
            ("Kohn-Sham total energy (DFT part)", result.e_hf, False),
            ("PT2 opposite-spin correlation", result.e_corr_os, True),
            ("PT2 same-spin correlation", result.e_corr_ss, True),
            (f"scaled PT2 ({method.c_os:g}·os + {method.c_ss:g}·ss)", result.e_method_corr, True),
        ]
        if method.dispersion:
            rows.append((f"dispersion ({method.dispersion[0].upper()})", result.e_disp, True))
        rows.append((f"{method.name.upper()} total energy", result.e_tot, False))
    else:
        rows = [
            ("SCF total energy", result.e_hf, False),
            *([("MP2 singles (ROHF-MBPT(2))", result.e_singles, True)] if result.reference == "ROHF" else []),
            ("MP2 opposite-spin correlation", result.e_corr_os, True),
            ("MP2 same-spin correlation", result.e_corr_ss, True),
            ("MP2 correlation energy", result.e_corr, True),
            ("MP2 total energy", result.e_mp2_tot, False),
            ("SCS-MP2 correlation energy", result.e_scs_corr, True),
            ("SCS-MP2 total energy", result.e_scs, False),
        ]
        if method.name not in ("mp2", "scs-mp2"):
            rows += [(f"{method.name.upper()} correlation energy", result.e_method_corr, True),
                     (f"{method.name.upper()} total energy", result.e_tot, False)]
    for name, value, corr in rows:
        table.add_row(name, f"{value:.10f}", f"{value * HARTREE_TO_KCAL:.4f}" if corr else "")
    return table


def ecp_summary(ecp: dict | None) -> str:
    """'I: def2-svp, 28 core electrons (×2 atoms)' or 'none'."""
    if not ecp:
        return "none (all-electron)"
    counts: dict[str, list[int]] = {}
    for atom in ecp["atoms"]:
        counts.setdefault(atom["symbol"], []).append(atom["core_electrons"])
    parts = []
    for sym, cores in counts.items():
        el = ecp["elements"][sym]
        parts.append(f"{sym}: {el['name']} ({el['source']}), {cores[0]} core electrons × {len(cores)} atom"
                     + ("s" if len(cores) > 1 else ""))
    return "; ".join(parts)


def sources_summary(bases: dict) -> str:
    """'orbital: PySCF library; RI fit: PySCF library (C, H), BSE 0.12 (I); ...' (sources per basis)."""
    parts = []
    for key, label in (("orbital", "orbital"), ("jkfit", "JK fit"), ("rifit", "RI fit")):
        entry = bases.get(key)
        if not entry:
            continue
        by_source: dict[str, list[str]] = {}
        for sym, el in entry["elements"].items():
            by_source.setdefault(el["source"], []).append(sym)
        text = ", ".join(src if len(by_source) == 1 else f"{src} ({' '.join(syms)})" for src, syms in by_source.items())
        parts.append(f"{label}: {text}")
    return "; ".join(parts)


def what_ran_table(result: MP2Result) -> Table:
    w, s = result.what_ran, result.sizes
    table = Table(title="What ran", title_justify="left", show_header=False)
    table.add_column("key")
    table.add_column("value")
    table.add_row("reference", result.reference + (f" (⟨S²⟩ = {result.spin_square:.6f})"
                                                   if result.spin_square is not None else ""))
    table.add_row("device", str(w.get("device")) + (f" ({w['backend']})" if w.get("backend") else ""))
    if w.get("device_selection"):
        table.add_row("device selection", w["device_selection"])
    for key in ("nki", "target"):
        if w.get(key):
            table.add_row(key, str(w[key]))
    table.add_row("precision", str(w.get("precision")))
    if w.get("blas"):
        table.add_row("BLAS threads", w["blas"])
    if result.method.name != "mp2":
        m = result.method
        text = f"{m.name} (c_os {m.c_os:g}, c_ss {m.c_ss:g}" + (f"; {m.xc}" if m.xc else "") + ")"
        if result.scf and result.scf.get("grid"):
            text += f", grid level {result.scf['grid']['level']} ({result.scf['grid']['points']} points)"
        table.add_row("method", text)
    table.add_row("basis / aux basis", f"{w.get('basis')} / {w.get('auxbasis')}")
    if w.get("bases"):
        table.add_row("basis sources", sources_summary(w["bases"]))
        table.add_row("functions", w["bases"].get("functions", ""))
        table.add_row("ECP", ecp_summary(w["bases"].get("ecp")))
    table.add_row("SCF", f"density-fitted ({w.get('jkbasis')})" if w.get("jkbasis") else "conventional integrals")
    if result.scf:
        table.add_row("SCF J/K", scf_summary(result.scf))
        if result.scf.get("orthogonalisation"):
            table.add_row("orthogonalisation", result.scf["orthogonalisation"])
    table.add_row("frozen orbitals", str(w.get("frozen")))
    table.add_row("nao / naux / nocc / nvir", f"{s['nao']} / {s['naux']} / {s['nocc']} / {s['nvir']}")
    mem = f"{w.get('memory_mb', 0):.0f} MB budget, B tensors {'on disk (HDF5)' if w.get('out_of_core') else 'in memory'}"
    if result.parallel:
        mem = mem.replace("budget", "budget per rank")
    table.add_row("memory", mem)
    if result.parallel:
        table.add_row("ranks", ranks_summary(result.parallel))
    if result.gradient is not None:
        strips, iterations = w.get("gradient_strips"), w.get("zvector_iterations")
        table.add_row("gradient", f"{w.get('gradient')}: pair sweep on {w.get('gradient_pairs')} "
                      f"({strips} strip{'' if strips == 1 else 's'}), Z-vector {iterations} "
                      f"iteration{'' if iterations == 1 else 's'} with "
                      f"{w.get('gradient_jk')}, preconditioned by "
                      f"{(w.get('zvector') or {}).get('preconditioner', 'orbital-energy differences')}, "
                      f"derivative integrals {w.get('derivative_integrals')}")
        if w.get("gradient_memory"):
            table.add_row("gradient memory", gradient_memory_summary(w["gradient_memory"]))
    if w.get("pair_energies"):
        table.add_row("pair energies", w["pair_energies"])
    return table


def gradient_memory_summary(memory: dict) -> str:
    """'B and Γ̄ in memory; sweep: ...; response: ...; (P|iμ) in memory; planned peak 412 MB' (what-ran's
    gradient_memory, shortened)."""
    def where(text: str) -> str:
        return "in memory" if text == "in memory" else "streamed (HDF5)"

    peak = max(memory.get("planned_peak_mb", {}).values(), default=0.0)
    return (f"B and Γ̄ {where(memory['B'])}; sweep: {memory['pair_sweep']}; response's JK-fit MO blocks "
            f"{'in memory' if memory['response_jkfit_mo_blocks'].startswith('in memory') else 'not made (J/K builds)'}; "
            f"JK-fit (P|iμ) {where(memory['jkfit_half_transformed'])}; planned peak {peak:.0f} MB")


def ranks_summary(parallel: dict) -> str:
    """'2 ranks (gloo); per rank: peak 512/498 MB, B share 0.50/0.50, sent 12.3/11.9 MB'."""
    ranks = parallel["per_rank"]
    peak = "/".join(f"{r['peak_memory_mb']:.0f}" for r in ranks)
    share = "/".join(f"{r['b_share_fraction']:.2f}" for r in ranks)
    sent = "/".join(f"{sum(r['bytes_sent'].values()) / 1e6:.1f}" for r in ranks)
    return (f"{parallel['ranks']} ranks ({parallel['backend']}); per rank: peak memory {peak} MB, "
            f"share of B {share}, sent {sent} MB")


def scf_summary(scf: dict) -> str:
    """'device cpu: fp32 ×4 → fp64 ×6, 10 cycles, 0.05 s per J/K build' (runs of equal precision)."""
    from ..jk import precision_runs

    runs = precision_runs(scf.get("precision_per_cycle", []))
    text = scf["jk"] + (": " + runs if runs else "")
    text += f", {scf['cycles']} cycles"
    if scf.get("convergence"):
        conv = scf["convergence"]
        text += f", orbital gradient {conv['orbital_gradient']:.1e} (< {conv['conv_tol_grad']:.0e})"
    if scf.get("jk_seconds_per_build"):
        text += f", {scf['jk_seconds_per_build']:.3g} s per J/K build"
    if scf.get("seconds_per_cycle"):
        text += f", {scf['seconds_per_cycle']:.3g} s per cycle"
    return text


def timing_table(result: MP2Result) -> Table:
    table = Table(title="Timings (wall, s)", title_justify="left")
    table.add_column("stage")
    table.add_column("s", justify="right")
    for key, value in result.timings.items():
        table.add_row(key, f"{value:.3f}")
    return table


def gradient_table(result: MP2Result) -> Table:
    """Per atom: symbol and dE/dx, dE/dy, dE/dz in Eh/bohr."""
    table = Table(title=f"Nuclear gradient of the {result.method.name.upper()} energy (Eh/bohr)", title_justify="left")
    for col in ("atom", "x", "y", "z"):
        table.add_column(col, justify="left" if col == "atom" else "right")
    symbols = (result.molecule or {}).get("symbols", [])
    real = (result.molecule or {}).get("real", [])
    for k, row in enumerate(result.gradient):
        label = f"{k + 1} {symbols[k] if k < len(symbols) else ''}" + (" (ghost)" if k < len(real) and not real[k] else "")
        table.add_row(label, *(f"{v:.10f}" for v in row))
    return table


def dipole_table(result: MP2Result) -> Table:
    """The SCF, unrelaxed-MP2 and relaxed-MP2 dipole moments (nuclei included) in Debye and a.u."""
    from ..grad.properties import debye

    table = Table(title="Dipole moment (about the coordinate origin)", title_justify="left")
    for col in ("density", "x (D)", "y (D)", "z (D)", "|μ| (D)", "|μ| (a.u.)"):
        table.add_column(col, justify="left" if col == "density" else "right")
    for key, label in (("scf", "SCF"), ("mp2_unrelaxed", "MP2 unrelaxed"), ("mp2_relaxed", "MP2 relaxed")):
        au = result.dipoles[key]
        d = debye(au)
        table.add_row(label, *(f"{v:.5f}" for v in d), f"{float(sum(v * v for v in d)) ** 0.5:.5f}",
                      f"{float(sum(v * v for v in au)) ** 0.5:.6f}")
    return table


#: natural orbitals printed on either side of the frontier (--json holds every occupation, --molden the orbitals)
FRONTIER_NOS = 5


def natural_occupations_table(result: MP2Result) -> Table:
    """The natural occupations (spin-summed, 0..2 electrons) of the relaxed MP2 density around the frontier:
    the FRONTIER_NOS natural orbitals up to the ⌈N/2⌉-th and as many after it (N = their sum, the electron
    count), and the sum itself as a check."""
    occupations = result.natural_occupations
    total = float(sum(occupations))
    frontier = -(-round(total) // 2)                     # ⌈N/2⌉: the last orbital occupied in the SCF
    first, last = max(0, frontier - FRONTIER_NOS), min(len(occupations), frontier + FRONTIER_NOS)
    table = Table(title="Natural occupations", title_justify="left")
    table.add_column(f"NO (of {len(occupations)})", justify="right")
    table.add_column("relaxed MP2", justify="right")
    for k in range(first, last):
        table.add_row(str(k + 1), f"{occupations[k]:.6f}")
    table.add_row("sum", f"{total:.6f}", style="dim")
    return table


def print_result(result: MP2Result, title: str) -> None:
    console.print(energy_table(result, title))
    if result.gradient is not None:
        console.print(gradient_table(result))
        console.print(dipole_table(result))
        console.print(natural_occupations_table(result))
    console.print(what_ran_table(result))
    if result.cost:
        from ..costreport import cost_table  # noqa: PLC0415

        console.print(cost_table(result.cost))
    console.print(timing_table(result))
    for note in result.notes:
        console.print(f"note: {note}")
