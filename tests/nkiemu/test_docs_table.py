"""docs/emulator.md's API coverage table is the one scripts/emulator_api_table.py writes from the code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_api_table_is_current():
    spec = importlib.util.spec_from_file_location("emulator_api_table", ROOT / "scripts" / "emulator_api_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.section() in (ROOT / "docs" / "emulator.md").read_text(), \
        "run python scripts/emulator_api_table.py"
    assert len(mod.ISA_REFERENCE) == 49
