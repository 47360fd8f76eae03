"""``mp2trn info``: the devices, backends and NKI implementation present."""

from __future__ import annotations

import sys

from rich.markup import escape
from rich.table import Table

from ..version import __version__
from .common import app, cli_errors, console


@app.command()
@cli_errors
def info() -> None:
    """List devices, backends and the NKI implementation present."""
    import numpy as np  # noqa: PLC0415
    import pyscf  # noqa: PLC0415

    from ..devices import available_devices  # noqa: PLC0415

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
        from ..kernels import _nki  # noqa: PLC0415
    except Exception as exc:  # the shim reports, never crashes `info`
        return f"unavailable ({exc})"
    return _nki.describe()
