"""What every command shares: the typer app, the consoles, the error wrapper, the progress display and
the flag definitions (typer ``Annotated`` types, written once; defaults come from
:data:`mp2trn.options.DEFAULTS`).

Every mp2trn error becomes one line on stderr and a non-zero exit code (see ``mp2trn.errors``);
output files are written atomically, or not at all.
"""

from __future__ import annotations

import functools
import inspect
import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape  # error text may contain [brackets], e.g. "mp2trn[neuron]"
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import Mp2trnError, Terminated
from ..files import write_json_atomic
from ..options import DEFAULTS, RunOptions

app = typer.Typer(
    name="mp2trn",
    help="Density-fitted MP2 energies on CPU, CUDA, and AWS Trainium (NKI kernels, or their emulator).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


#: Columns of a console whose output is no terminal (a log file, a pipe, a batch job): wider than any table
#: mp2trn prints, so that every cell is printed in full (rich's own choice there is 80 columns, which cuts
#: numbers to "3417.4…"). Tables stay as narrow as their contents; only text longer than this wraps.
LOG_WIDTH = 1000


class LogSafeConsole(Console):
    """rich's console, laid out :data:`LOG_WIDTH` columns wide whenever its output is not a terminal.

    Decided at each print, from where the output goes then (the file or pipe of a redirected run, or the
    stream a test captures), not once at import."""

    @property
    def size(self) -> ConsoleDimensions:
        dims = Console.size.fget(self)
        return dims if self.is_terminal else ConsoleDimensions(LOG_WIDTH, dims.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


console = LogSafeConsole()
err_console = LogSafeConsole(stderr=True)


class Unit(str, Enum):
    angstrom = "angstrom"
    bohr = "bohr"


class Target(str, Enum):
    trn1 = "trn1"
    trn2 = "trn2"


# -- flags shared by `run`, `interaction`, `validate` and `bench` ---------------------------------------
Basis = Annotated[str, typer.Option("--basis", "-b", help=(
    "Orbital basis: a name (PySCF library, else the Basis Set Exchange), a file (NWChem/Gaussian94), "
    "or per element 'I:def2-svp,H:cc-pvdz'."))]
AuxBasis = Annotated[Optional[str], typer.Option("--auxbasis", help=(
    "MP2 fitting basis (default: the RI partner of --basis, else def2 RIFIT; Psi4's and ORCA's names too, "
    "e.g. def2-svp-ri, def2-SVP/C; see docs/bases.md)."))]
MethodFlag = Annotated[str, typer.Option("--method", help=(
    "mp2, scs-mp2, sos-mp2, or a double hybrid: b2plyp, b2gp-plyp, dsd-pbep86, revdsd-pbep86."))]
EcpFlag = Annotated[Optional[str], typer.Option("--ecp", help=(
    "Effective core potentials: auto (the basis's own, default), none, or an ECP/basis name or file."))]
CartesianFlag = Annotated[Optional[bool], typer.Option("--cartesian/--spherical", help=(
    "Cartesian or spherical functions (default: the basis's own convention)."), show_default=False)]
GridFlag = Annotated[Optional[int], typer.Option("--grid", help="DFT grid level 0-9 of a double hybrid (default: PySCF's 3).")]
Charge = Annotated[Optional[int], typer.Option("--charge", "-c", help="Molecular charge (default: XYZ comment, else 0).")]
Multiplicity = Annotated[Optional[int], typer.Option(
    "--multiplicity", "-m", help="Spin multiplicity 2S+1 (default: XYZ comment, else lowest).")]
UnitFlag = Annotated[Unit, typer.Option("--unit", help="Unit of the XYZ coordinates.")]


class Reference(str, Enum):
    rhf = "rhf"
    uhf = "uhf"
    rohf = "rohf"


ReferenceFlag = Annotated[Optional[Reference], typer.Option("--reference", help=(
    "SCF reference: rhf, uhf, or rohf (ROHF-MBPT(2): semicanonical orbitals + singles, no spin contamination). "
    "Default: rhf for closed shells, uhf for open shells."))]
FrozenCore = Annotated[str, typer.Option("--frozen-core", help="auto (noble-gas cores), none, or a number of orbitals.")]
ScfDf = Annotated[bool, typer.Option("--scf-df/--no-scf-df", help="Density-fitted SCF (JK-fit basis) or conventional.")]
JkBasis = Annotated[Optional[str], typer.Option("--jkbasis", help=(
    "JK-fit basis of the SCF (default: the JK partner of --basis, else def2-universal-jkfit; ORCA's def2/JK "
    "and Psi4's names too)."))]
ConvTol = Annotated[float, typer.Option("--conv-tol", help="SCF energy convergence threshold (Eh).")]
ConvTolGrad = Annotated[Optional[float], typer.Option("--conv-tol-grad", help=(
    "SCF orbital-gradient convergence threshold (default: √conv-tol, PySCF's). The MP2 energy is not stationary "
    "in the orbitals: tighten it (e.g. 1e-8) for energies compared below 1 µEh."))]
MaxCycle = Annotated[int, typer.Option(
    "--scf-max-cycle", help="SCF iterations before giving up (an error, never MP2 on top).")]
Lindep = Annotated[Optional[float], typer.Option(
    "--lindep", help="Canonical orthogonalisation threshold for a linearly dependent basis (default: refuse one).")]
ScratchDir = Annotated[Optional[str], typer.Option(
    "--scratch", help="Directory for the run's temporary files (default: $TMPDIR); removed on every exit.")]
ScfJk = Annotated[str, typer.Option(
    "--scf-jk", help="Where the SCF's J/K builds run: auto (the device when it has them), device, or pyscf.")]
DeviceFlag = Annotated[str, typer.Option("--device", "-d", help="cpu, cuda, sim (NKI emulator), neuron, or auto.")]
PrecisionFlag = Annotated[Optional[str], typer.Option(
    "--precision", "-p", help="fp64 (cpu/cuda default), fp32, or a device's compensated mode.")]
Memory = Annotated[Optional[float], typer.Option(
    "--memory", help="Memory budget in MB (default: PYSCF_MAX_MEMORY, else 60% of free RAM).")]
TargetFlag = Annotated[Optional[Target], typer.Option(
    "--target", help="Trainium generation whose rules are enforced (sim/neuron).")]
JsonPath = Annotated[Optional[Path], typer.Option("--json", help="Write a QCSchema-shaped JSON result here (atomically).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No output on success except files.")]

def _run_flags(
    basis: Basis = DEFAULTS.basis,
    auxbasis: AuxBasis = None,
    method: MethodFlag = DEFAULTS.method,
    ecp: EcpFlag = None,
    cartesian: CartesianFlag = None,
    grid: GridFlag = None,
    charge: Charge = None,
    multiplicity: Multiplicity = None,
    reference: ReferenceFlag = None,
    unit: UnitFlag = Unit.angstrom,
    frozen_core: FrozenCore = "none",
    scf_df: ScfDf = DEFAULTS.scf_df,
    jkbasis: JkBasis = None,
    conv_tol: ConvTol = DEFAULTS.conv_tol,
    conv_tol_grad: ConvTolGrad = None,
    max_cycle: MaxCycle = DEFAULTS.max_cycle,
    scf_jk: ScfJk = DEFAULTS.scf_jk,
    lindep: Lindep = None,
    scratch: ScratchDir = None,
    device: DeviceFlag = DEFAULTS.device,
    precision: PrecisionFlag = None,
    memory: Memory = None,
    target: TargetFlag = None,
) -> None:
    """The flags of one run (the fields of RunOptions), written once for every command that runs."""


def with_run_flags(*, exclude: tuple[str, ...] = ()):
    """Give a command the run flags of :func:`_run_flags` after its own parameters (one of its own with
    the same name wins; ``exclude`` drops some). The command takes them as ``**flags``; typer reads the
    combined signature."""
    def add(command):
        sig = inspect.signature(command, eval_str=True)   # typer reads the annotations as given here
        own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        names = {p.name for p in own}
        shared = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                  for p in inspect.signature(_run_flags, eval_str=True).parameters.values()
                  if p.name not in names and p.name not in exclude]
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
               and p.default is not inspect.Parameter.empty else p for p in own]
        command.__signature__ = sig.replace(parameters=[*own, *shared])
        return command
    return add


#: CLI flag (parameter name) -> RunOptions field, where they differ
_FIELD_OF_FLAG = {"frozen_core": "frozen", "memory": "max_memory"}
_RUN_FIELDS = set(RunOptions.__dataclass_fields__)


def options_from_flags(flags: dict[str, Any]) -> RunOptions:
    """RunOptions from a command's flag values (its ``locals()``); flags that are no option are ignored,
    enums become their values, and None leaves a field at its default."""
    fields = {}
    for name, value in flags.items():
        field = _FIELD_OF_FLAG.get(name, name)
        if field in _RUN_FIELDS and value is not None:
            fields[field] = value.value if isinstance(value, Enum) else value
    return RunOptions(**fields)


def finish(json_path: Path | None, document: dict[str, Any], quiet: bool, show) -> None:
    """Write the JSON document (atomically) when asked, then ``show()`` the tables unless quiet."""
    from ..scratch import check_stopped

    check_stopped()  # never write the output of a run that was told to stop
    if json_path is not None:
        write_json_atomic(json_path, document)
    if not quiet:
        show()
        if json_path is not None:
            console.print(f"JSON written to {json_path}")


def cli_errors(func):
    """Turn mp2trn errors into one line on stderr and the error's exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from ..scratch import handle_signals

        try:
            with handle_signals():  # SIGTERM/SIGHUP end the run like SIGINT: scratch removed, nothing written
                return func(*args, **kwargs)
        except (Mp2trnError, Terminated) as exc:
            if getattr(exc, "silent", False):   # a run over ranks: rank 0 prints the one line
                raise typer.Exit(exc.exit_code) from None
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
            if getattr(exc, "silent", False):
                raise typer.Exit(70) from None
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            err_console.print(
                f"[bold red]internal error:[/] {type(exc).__name__}: {escape(msg)} (set MP2TRN_DEBUG=1 for a traceback)",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(70) from None

    return wrapper


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
