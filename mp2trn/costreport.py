"""Rendering of a modeled accelerator cost report (a JSON-able dict) as rich tables."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def cost_table(cost: dict[str, Any]) -> Table:
    """A table of the top-level scalar entries of a cost report, labelled as a model."""
    table = Table(title="Modeled accelerator cost (a model, not a measurement)", title_justify="left", show_header=False)
    table.add_column("item")
    table.add_column("value")
    for key, value in cost.items():
        if isinstance(value, (dict, list)):
            continue
        table.add_row(str(key), f"{value:.4g}" if isinstance(value, float) else str(value))
    return table
