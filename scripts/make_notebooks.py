"""Write the research notebooks (outputs stripped) from their cell sources in notebooks/src/*.cells.

    python scripts/make_notebooks.py            # rewrites notebooks/*.ipynb
    python scripts/make_notebooks.py 02 03      # only those

A ``.cells`` file is the notebook as plain text: each cell starts with a line ``# %%`` (code) or
``# %% [markdown]``. Keeping the source there makes diffs readable; the test suite executes the .ipynb
files themselves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SOURCES = NOTEBOOKS / "src"


def read_cells(path: Path) -> list[tuple[str, str]]:
    """[(kind, source)] with kind "md" or "code", from a ``.cells`` file."""
    cells: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("# %%"):
            cells.append(("md" if "[markdown]" in line else "code", []))
        elif cells:
            cells[-1][1].append(line)
        elif line.strip():
            raise SystemExit(f"{path}: text before the first '# %%' cell marker")
    return [(kind, "\n".join(lines).strip("\n")) for kind, lines in cells]


def write(name: str, cells: list[tuple[str, str]]) -> None:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
    for k, cell in enumerate(nb.cells):          # stable cell ids: regenerating gives a clean diff
        cell.id = f"{name[:2]}-{k:02d}"
    nbformat.write(nb, NOTEBOOKS / name)


if __name__ == "__main__":
    notebooks = {p.stem[:2]: p for p in sorted(SOURCES.glob("*.cells"))}
    targets = sys.argv[1:] or list(notebooks)
    unknown = [t for t in targets if t not in notebooks]
    if unknown:
        sys.exit(f"unknown notebook(s) {', '.join(unknown)}: choose from {', '.join(notebooks)}")
    for t in targets:
        write(notebooks[t].stem + ".ipynb", read_cells(notebooks[t]))
    print("wrote", ", ".join(notebooks[t].stem + ".ipynb" for t in targets))
