"""``mp2trn clean``: remove run directories that killed runs left behind (never a live run's)."""

from __future__ import annotations

from .common import ScratchDir, app, cli_errors, console


@app.command()
@cli_errors
def clean(scratch: ScratchDir = None) -> None:
    """Remove stale mp2trn scratch directories (their process is gone) under --scratch or $TMPDIR."""
    from ..scratch import clean_stale

    removed = clean_stale(scratch)
    for d in removed:
        console.print(f"removed {d}", highlight=False)
    console.print(f"{len(removed)} stale scratch director{'y' if len(removed) == 1 else 'ies'} removed")
