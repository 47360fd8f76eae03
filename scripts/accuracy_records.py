"""The accuracy figures the docs quote, recorded by the scripts that measure them.

A measurement script (scripts/validate_water_dimer_cp.py, scripts/gradient_accuracy.py) stores what it
measured in docs/records/<script>.json, one entry per run configuration: the command, the machine, the date,
the figures, the document that quotes them and the exact text it must quote (tables and phrases built from
the figures). tests/test_accuracy_records.py checks every document against its records without re-running
anything, so a figure that drifts from its script's last run, or a doc edited by hand, fails the suite.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

from mp2trn.files import write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "records"


def short(value: float) -> str:
    """A figure as the docs write it in prose: one decimal, no padded exponent (1.8e-10; exactly 0 as 0)."""
    if value == 0:
        return "0"
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{value:.1e}").replace("e+", "e")


def machine() -> str:
    """'2-core Intel(R) Xeon(R) Processor': the cores this process may use and the CPU model."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.MULTILINE)
        model = found.group(1).strip() if found else model
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores}-core {model}"


def record(script: str, key: str, doc: str, figures: dict[str, Any], quoted: list[str]) -> Path:
    """Store one run's ``figures`` and the ``quoted`` texts ``doc`` (a path under the repo) must contain,
    under ``key`` in docs/records/<script>.json (other keys kept; the file written atomically)."""
    path = RECORDS / f"{script}.json"
    RECORDS.mkdir(exist_ok=True)
    entries = load(script)
    entries[key] = {"command": "python " + " ".join([f"scripts/{script}.py", *sys.argv[1:]]), "machine": machine(),
                    "date": datetime.date.today().isoformat(), "doc": doc, "figures": figures, "quoted": quoted}
    write_json_atomic(path, dict(sorted(entries.items())))
    return path


def load(script: str) -> dict[str, Any]:
    """The entries recorded by ``script`` ({} when it has recorded none)."""
    path = RECORDS / f"{script}.json"
    return json.loads(path.read_text()) if path.exists() else {}
