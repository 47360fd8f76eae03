"""The accuracy figures in the docs are what the scripts that measure them last recorded (docs/records/*.json,
written by scripts/accuracy_records.py): nothing is re-run here, the docs are read against the records."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDS = sorted((ROOT / "docs" / "records").glob("*.json"))
#: every measurement script that docs quote accuracy figures from, and the entries it must have recorded
EXPECTED = {"validate_water_dimer_cp": {"cc-pvdz, frozen core none", "cc-pvdz, frozen core auto",
                                        "cc-pvdz, frozen core none, scf-jk pyscf"},
            "gradient_accuracy": {"fd", "pyscf", "precision cpu:fp32 sim:fp32 sim:fp32x3", "rohf"},
            "bench_rohf": {"tempo cc-pvdz cpu"}}


def _records_module():
    spec = importlib.util.spec_from_file_location("accuracy_records", ROOT / "scripts" / "accuracy_records.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def _entries():
    for path in RECORDS:
        for key, entry in json.loads(path.read_text()).items():
            yield pytest.param(path.stem, entry, id=f"{path.stem}[{key}]")


def test_every_measuring_script_has_its_records():
    recorded = {path.stem: set(json.loads(path.read_text())) for path in RECORDS}
    for script, keys in EXPECTED.items():
        assert keys <= recorded.get(script, set()), f"re-run scripts/{script}.py (see its docstring)"
        assert (ROOT / "scripts" / f"{script}.py").exists()


@pytest.mark.parametrize("script,entry", list(_entries()))
def test_the_doc_quotes_what_the_script_recorded(script, entry):
    doc = (ROOT / entry["doc"]).read_text()
    for text in entry["quoted"]:
        assert text in doc, f"{entry['doc']} does not quote this from `{entry['command']}`:\n{text}"
    assert entry["command"].startswith(f"python scripts/{script}.py")
    assert entry["machine"] and re.fullmatch(r"\d{4}-\d\d-\d\d", entry["date"])


def _accuracy_figures(script: str, figures: dict) -> list[float]:
    """The accuracy figures of a record (differences and errors, not the sizes beside them)."""
    if script == "validate_water_dimer_cp":
        return [figures["largest_difference_eh"]]
    if script == "bench_rohf":      # a benchmark: its quoted tables are its figures (checked verbatim above)
        return []
    rows = figures.values()
    return [value for row in rows for key, value in row.items() if key not in ("max_gradient", "net_force")]


@pytest.mark.parametrize("script,entry", list(_entries()))
def test_the_quoted_texts_carry_the_recorded_figures(script, entry):
    """The quoted tables and phrases are built from the figures: each accuracy figure appears in them."""
    short = _records_module().short
    quoted = "\n".join(entry["quoted"])
    for value in _accuracy_figures(script, entry["figures"]):
        assert short(value) in quoted or f"{value:.1e}" in quoted, value


def test_short_writes_figures_as_the_docs_do():
    short = _records_module().short
    assert short(1.83e-10) == "1.8e-10" and short(2.8e-14) == "2.8e-14" and short(0.0) == "0"
    assert short(1.25e-8) in ("1.2e-8", "1.3e-8")
