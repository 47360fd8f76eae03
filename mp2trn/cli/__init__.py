"""Command line: ``mp2trn run | freq | optimize | interaction | validate | bench | info | clean``, one module per command.

Flags shared by several commands are defined once in :mod:`mp2trn.cli.common`; every command builds a
:class:`~mp2trn.options.RunOptions` from them and goes through :mod:`mp2trn.pipeline`.
"""

from . import batch, bench, clean, freq, info, interaction, optimize, run, selftest, validate  # noqa: F401  (each registers its command on `app`)
from .common import app


def main() -> None:  # pragma: no cover - console entry point
    app()


__all__ = ["app", "main"]
