"""The kernel files read in one sitting: each kernel (``@nki.jit``) opens with the Dimensions / Args / Returns /
Pseudocode docstring, each file of one kernel's sub-kernels (``kernels/<kernel>_<part>.py``) with Dimensions /
Helpers / Pseudocode, and no file grows past MAX_LINES."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
#: the longest kernel file a reader takes in at once (mp2_energy.py, the longest today, has 368 lines)
MAX_LINES = 400
KERNEL_SECTIONS = ("Dimensions", "Args", "Returns", "Pseudocode")
SUB_KERNEL_SECTIONS = ("Dimensions", "Helpers", "Pseudocode")

FILES = sorted(p for p in KERNELS.glob("*.py") if not p.name.startswith("_"))


def _is_sub_kernel_file(path: Path) -> bool:
    """``kernels/mp2_density_pair.py`` belongs to ``kernels/mp2_density.py``."""
    stem = path.stem
    return any((KERNELS / f"{stem[:cut]}.py").exists() for cut in range(1, len(stem)) if stem[cut] == "_")


def _sections(path: Path) -> tuple[str, ...]:
    if re.search(r"^@nki\.jit", path.read_text(), re.MULTILINE):
        return KERNEL_SECTIONS
    if _is_sub_kernel_file(path):
        return SUB_KERNEL_SECTIONS
    return ()


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_kernel_file_opens_with_its_sections_and_stays_short(path: Path):
    text = path.read_text()
    doc = ast.get_docstring(ast.parse(text)) or ""
    missing = [s for s in _sections(path) if f"\n{s}" not in f"\n{doc}"]
    assert not missing, f"{path.name}: docstring lacks {missing}"
    assert len(text.splitlines()) <= MAX_LINES, f"{path.name}: {len(text.splitlines())} lines (split it)"


def test_the_density_kernel_is_split_into_its_parts():
    """kernels/mp2_density.py keeps the plan, the loop and the reference; its pair pass and p_occ live apart."""
    assert {p.name for p in FILES if _is_sub_kernel_file(p)} >= {"mp2_density_pair.py", "mp2_density_pocc.py",
                                                                  "mp2_energy_tail.py", "mp2_energy_reduce.py"}
