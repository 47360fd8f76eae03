"""Command line: ``mp2trn run | info | bench`` (and the commands other modules register).

Every mp2trn error becomes one line on stderr and a non-zero exit code (see ``mp2trn.errors``);
output files are written atomically, or not at all.
"""

from __future__ import annotations

import functools
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape  # error text may contain [brackets], e.g. "mp2trn[neuron]"
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__
from .errors import InputError, Mp2trnError
from .result import HARTREE_TO_KCAL, MP2Result, write_json_atomic

app = typer.Typer(
    name="mp2trn",
    help="Density-fitted MP2 energies on CPU, CUDA, and AWS Trainium (NKI kernels, or their emulator).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


class Unit(str, Enum):
    angstrom = "angstrom"
    bohr = "bohr"


class Target(str, Enum):
    trn1 = "trn1"
    trn2 = "trn2"


def cli_errors(func):
    """Turn mp2trn errors into one line on stderr and the error's exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Mp2trnError as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]")
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            if os.environ.get("MP2TRN_DEBUG"):
                raise
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            err_console.print(
                f"[bold red]internal error:[/] {type(exc).__name__}: {escape(msg)} (set MP2TRN_DEBUG=1 for a traceback)",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(70) from None

    return wrapper


def check_output_path(path: Optional[Path]) -> None:
    """Fail before any work if an output file could not be written."""
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {path}: directory {parent} does not exist")
    if path.is_dir():
        raise InputError(f"cannot write {path}: it is a directory")
    if not os.access(parent, os.W_OK):
        raise InputError(f"cannot write {path}: directory {parent} is not writable")


def parse_frozen(value: str) -> str | int:
    v = value.strip().lower()
    if v in ("auto", "none"):
        return v
    try:
        n = int(v)
    except ValueError:
        raise InputError(f"--frozen-core {value!r}: use auto, none or a number of orbitals") from None
    if n < 0:
        raise InputError(f"--frozen-core {value!r}: must not be negative")
    return n


class StageProgress:
    """A rich progress display with one bar per pipeline stage (to stderr)."""

    LABELS = {"scf": "SCF", "ao_to_mo": "AO→MO transform", "metric": "metric solve", "pairs": "pair energies"}

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("{task.description:<16}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
            disable=not enabled,
        )
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(self.LABELS.get(stage, stage), total=total)
        self.progress.update(self.tasks[stage], completed=done, total=total)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)


def run_options(
    basis: str,
    auxbasis: Optional[str],
    charge: Optional[int],
    multiplicity: Optional[int],
    unit: Unit,
    frozen_core: str,
    scf_df: bool,
    jkbasis: Optional[str],
    conv_tol: float,
    device: str,
    precision: Optional[str],
    memory: Optional[float],
    target: Optional[Target],
    max_cycle: int = 100,
) -> dict[str, Any]:
    """The keyword arguments of ``mp2trn.run`` from CLI flags (shared with other commands)."""
    if memory is not None and memory <= 0:
        raise InputError(f"--memory must be a positive number of MB, got {memory}")
    if conv_tol <= 0:
        raise InputError(f"--conv-tol must be positive, got {conv_tol}")
    if max_cycle < 1:
        raise InputError(f"--scf-max-cycle must be at least 1, got {max_cycle}")
    device_options = {}
    if target is not None:
        if device.split(":")[0] not in ("sim", "neuron"):
            raise InputError("--target applies to --device sim or neuron only")
        device_options["target"] = target.value
    return dict(
        basis=basis,
        auxbasis=auxbasis,
        charge=charge,
        multiplicity=multiplicity,
        unit=unit.value,
        frozen=parse_frozen(frozen_core),
        scf_df=scf_df,
        jkbasis=jkbasis,
        conv_tol=conv_tol,
        max_cycle=max_cycle,
        device=device,
        precision=precision,
        memory=memory,
        device_options=device_options,
    )


# Flag definitions shared by `run`, `interaction` and `validate`
BasisOpt = typer.Option("cc-pvdz", "--basis", "-b", help="Orbital basis set.")
AuxOpt = typer.Option(None, "--auxbasis", help="MP2 fitting basis (default: the RI partner of --basis).")
ChargeOpt = typer.Option(None, "--charge", "-c", help="Molecular charge (default: XYZ comment, else 0).")
MultOpt = typer.Option(None, "--multiplicity", "-m", help="Spin multiplicity 2S+1 (default: XYZ comment, else lowest).")
UnitOpt = typer.Option(Unit.angstrom, "--unit", help="Unit of the XYZ coordinates.")
FrozenOpt = typer.Option("none", "--frozen-core", help="auto (noble-gas cores), none, or a number of orbitals.")
ScfDfOpt = typer.Option(True, "--scf-df/--no-scf-df", help="Density-fitted SCF (JK-fit basis) or conventional.")
JkOpt = typer.Option(None, "--jkbasis", help="JK-fit basis of the SCF (default: PySCF's for --basis).")
ConvOpt = typer.Option(1e-10, "--conv-tol", help="SCF energy convergence threshold (Eh).")
MaxCycleOpt = typer.Option(100, "--scf-max-cycle", help="SCF iterations before giving up (an error, never MP2 on top).")
DeviceOpt = typer.Option("cpu", "--device", "-d", help="cpu, cuda, sim (NKI emulator), neuron, or auto.")
PrecOpt = typer.Option(None, "--precision", "-p", help="fp64 (cpu/cuda default), fp32, or a device's compensated mode.")
MemOpt = typer.Option(None, "--memory", help="Memory budget in MB (default: PYSCF_MAX_MEMORY, else 60% of free RAM).")
TargetOpt = typer.Option(None, "--target", help="Trainium generation whose rules are enforced (sim/neuron).")
JsonOpt = typer.Option(None, "--json", help="Write a QCSchema-shaped JSON result here (atomically).")
QuietOpt = typer.Option(False, "--quiet", "-q", help="No output on success except files.")


@app.command()
@cli_errors
def run(
    xyz: Path = typer.Argument(..., help="Molecule in XYZ format (Angstrom unless --unit bohr)."),
    basis: str = BasisOpt,
    auxbasis: Optional[str] = AuxOpt,
    charge: Optional[int] = ChargeOpt,
    multiplicity: Optional[int] = MultOpt,
    unit: Unit = UnitOpt,
    frozen_core: str = FrozenOpt,
    scf_df: bool = ScfDfOpt,
    jkbasis: Optional[str] = JkOpt,
    conv_tol: float = ConvOpt,
    max_cycle: int = MaxCycleOpt,
    device: str = DeviceOpt,
    precision: Optional[str] = PrecOpt,
    memory: Optional[float] = MemOpt,
    target: Optional[Target] = TargetOpt,
    json_path: Optional[Path] = JsonOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Compute the DF-MP2 energy of a molecule."""
    from .api import run as run_mp2

    check_output_path(json_path)
    opts = run_options(basis, auxbasis, charge, multiplicity, unit, frozen_core, scf_df, jkbasis, conv_tol,
                       device, precision, memory, target, max_cycle)
    with StageProgress(enabled=not quiet and sys.stderr.isatty()) as progress:
        result = run_mp2(xyz, progress=progress, **opts)
    if json_path is not None:
        write_json_atomic(json_path, result.to_qcschema())
    if not quiet:
        print_result(result, title=str(xyz))
        if json_path is not None:
            console.print(f"JSON written to {json_path}")


def energy_table(result: MP2Result, title: str) -> Table:
    table = Table(title=f"DF-MP2 energies: {title}", title_justify="left")
    table.add_column("quantity")
    table.add_column("Eh", justify="right")
    table.add_column("kcal/mol", justify="right")
    rows = [
        ("SCF total energy", result.e_hf, False),
        ("MP2 opposite-spin correlation", result.e_corr_os, True),
        ("MP2 same-spin correlation", result.e_corr_ss, True),
        ("MP2 correlation energy", result.e_corr, True),
        ("MP2 total energy", result.e_tot, False),
        ("SCS-MP2 correlation energy", result.e_scs_corr, True),
        ("SCS-MP2 total energy", result.e_scs, False),
    ]
    for name, value, corr in rows:
        table.add_row(name, f"{value:.10f}", f"{value * HARTREE_TO_KCAL:.4f}" if corr else "")
    return table


def what_ran_table(result: MP2Result) -> Table:
    w, s = result.what_ran, result.sizes
    table = Table(title="What ran", title_justify="left", show_header=False)
    table.add_column("key")
    table.add_column("value")
    table.add_row("reference", result.reference)
    table.add_row("device", str(w.get("device")) + (f" ({w['backend']})" if w.get("backend") else ""))
    if w.get("device_selection"):
        table.add_row("device selection", w["device_selection"])
    for key in ("nki", "target"):
        if w.get(key):
            table.add_row(key, str(w[key]))
    table.add_row("precision", str(w.get("precision")))
    table.add_row("basis / aux basis", f"{w.get('basis')} / {w.get('auxbasis')}")
    table.add_row("SCF", f"density-fitted ({w.get('jkbasis')})" if w.get("jkbasis") else "conventional integrals")
    table.add_row("frozen orbitals", str(w.get("frozen")))
    table.add_row("nao / naux / nocc / nvir", f"{s['nao']} / {s['naux']} / {s['nocc']} / {s['nvir']}")
    mem = f"{w.get('memory_mb', 0):.0f} MB budget, B tensors {'on disk (HDF5)' if w.get('out_of_core') else 'in memory'}"
    table.add_row("memory", mem)
    return table


def timing_table(result: MP2Result) -> Table:
    table = Table(title="Timings (wall, s)", title_justify="left")
    table.add_column("stage")
    table.add_column("s", justify="right")
    for key, value in result.timings.items():
        table.add_row(key, f"{value:.3f}")
    return table


def print_result(result: MP2Result, title: str) -> None:
    console.print(energy_table(result, title))
    console.print(what_ran_table(result))
    if result.cost:
        from .costreport import cost_table  # noqa: PLC0415

        console.print(cost_table(result.cost))
    console.print(timing_table(result))
    for note in result.notes:
        console.print(f"note: {note}")


@app.command()
@cli_errors
def info() -> None:
    """List devices, backends and the NKI implementation present."""
    import numpy as np  # noqa: PLC0415
    import pyscf  # noqa: PLC0415

    from .devices import available_devices  # noqa: PLC0415

    table = Table(title=f"mp2trn {__version__}", title_justify="left", show_header=False)
    table.add_column("item")
    table.add_column("status")
    table.add_row("python", sys.version.split()[0])
    table.add_row("pyscf", pyscf.__version__)
    table.add_row("numpy", np.__version__)
    try:
        import torch  # noqa: PLC0415

        table.add_row("torch", f"{torch.__version__} (CUDA {'available' if torch.cuda.is_available() else 'not available'})")
    except ImportError:
        table.add_row("torch", "not installed (pip install 'mp2trn[cuda]')")
    table.add_row("NKI", _nki_status())
    for name, status in available_devices().items():
        table.add_row(f"device {name}", escape(status))
    console.print(table)


def _nki_status() -> str:
    try:
        from .kernels import _nki  # noqa: PLC0415
    except Exception as exc:  # the shim reports, never crashes `info`
        return f"unavailable ({exc})"
    return _nki.describe()


def main() -> None:  # pragma: no cover - console entry point
    app()


# Commands defined in their own modules register themselves on `app` when imported.
from . import bench as _bench_commands  # noqa: E402,F401
from . import validate as _validate_commands  # noqa: E402,F401
