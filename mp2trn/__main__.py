"""``python -m mp2trn ...`` (e.g. under ``torchrun -m mp2trn batch ...``): the ``mp2trn`` command."""

from .cli import app

app()
