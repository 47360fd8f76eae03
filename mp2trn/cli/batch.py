"""``mp2trn batch``: many molecules, one JSON line each, failures recorded, resumable; under torchrun
each rank takes its share of the molecules (gloo process group for the start check and the summary)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import DeviceUnavailableError, InputError
from .common import (Quiet, app, cli_errors, console, err_console, options_from_flags, with_run_flags)


@app.command()
@cli_errors
@with_run_flags(exclude=("charge", "multiplicity", "lindep"))
def batch(
    inputs: Annotated[list[Path], typer.Argument(help="Molecule files, folders of them, or list files (.txt/.list).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON-lines file, one record per molecule.")],
    resume: Annotated[bool, typer.Option("--resume", help="Continue a batch: skip molecules with an ok record.")] = False,
    optimize: Annotated[bool, typer.Option("--optimize", help=(
        "Optimise each geometry (geomeTRIC on the analytic gradient); records hold the final geometry and energy."))] = False,
    convergence: Annotated[str, typer.Option("--convergence", help="geomeTRIC convergence set (with --optimize).")] = "gau",
    max_steps: Annotated[int, typer.Option("--max-steps", help="Optimisation steps per molecule (with --optimize).")] = 100,
    freq: Annotated[bool, typer.Option("--freq", help=(
        "Frequencies and thermochemistry of each molecule (at its final geometry with --optimize); records hold "
        "the hessian document (as mp2trn freq --json writes)."))] = False,
    quiet: Quiet = False,
    **flags,
) -> None:
    """Run DF-MP2 on many molecules (or optimise each, --optimize); each finished molecule appends one record
    to --out."""
    from ..batch import run_batch
    from ..parallel import rank_and_size

    options = options_from_flags(flags)
    rank, world = rank_and_size()
    group = _process_group(world)
    try:
        if rank == 0 and out.exists() and not resume:
            raise InputError(f"{out} exists: use --resume to continue that batch, or another --out")
        _barrier(group)
        show = not quiet and rank == 0

        with _BatchProgress(show) as progress:
            summary = run_batch(inputs, out, options, resume=True, progress=progress, optimize=optimize,
                                convergence=convergence, max_steps=max_steps, freq=freq)
        summaries = _gather(group, summary)
    finally:
        if group is not None:
            import torch.distributed as dist

            dist.destroy_process_group()
    failed = sum(s.failed for s in summaries)
    if rank == 0 and not quiet:
        ok = sum(s.ok for s in summaries)
        skipped = sum(s.skipped for s in summaries)
        console.print(f"{ok} ok, {failed} failed, {skipped} skipped (already done) over {world} rank(s); "
                      f"records in {out}", highlight=False, markup=False, soft_wrap=True)
        for source, message in [f for s in summaries for f in s.failures][:10]:
            console.print(f"  failed: {source}: {message}", highlight=False, markup=False, soft_wrap=True)
    if failed and rank == 0:
        raise typer.Exit(1)   # the batch ran to the end; its failures are in the records (rank 0 says so)


class _BatchProgress:
    """A bar with the molecule count and the time remaining on a terminal; one line per molecule when
    piped (logs); nothing when quiet."""

    def __init__(self, enabled: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.enabled = enabled
        self.bar = enabled and err_console.is_terminal
        self.progress = Progress(TextColumn("batch"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                 TextColumn("{task.description}"), console=err_console, disable=not self.bar)
        self.task = None

    def __call__(self, done: int, total: int, source: str, eta: float) -> None:
        if self.bar:
            if self.task is None:
                self.task = self.progress.add_task("", total=total)
            self.progress.update(self.task, completed=done, description=Path(source).name)
        elif self.enabled:
            err_console.print(f"[{done}/{total}] {source} (ETA {eta:.0f} s)", highlight=False, markup=False)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)


def _process_group(world: int):
    if world == 1:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        raise DeviceUnavailableError("a batch under torchrun needs PyTorch: pip install 'mp2trn[cuda]' "
                                     "(or a CPU build of torch)") from None
    dist.init_process_group("gloo")
    return dist.group.WORLD


def _barrier(group) -> None:
    if group is not None:
        import torch.distributed as dist

        dist.barrier()


def _gather(group, summary):
    if group is None:
        return [summary]
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, summary)
    return out
