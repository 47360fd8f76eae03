"""`mp2trn run --json` field by field against documents written before the application-layer redesign.

tests/data/run_*_before.json were written by the code at commit fec43e7 (before the redesign) with the
commands below. Everything must be the same except wall times (their stages and order must match); floats to 1e-10 (energies; modeled costs
are deterministic), version numbers inside backend strings are masked (they follow the installed NumPy).
Later issues may only add fields (ADDED_KEYS), never change these.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mp2trn.cli import app

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "run_water_before.json": ["molecules/water.xyz", "--memory", "2000"],
    "run_hydroxyl_sim_before.json": ["molecules/hydroxyl.xyz", "--device", "sim", "--memory", "2000",
                                     "--frozen-core", "auto", "--scf-jk", "pyscf"],  # the SCF as before
}
#: keys holding wall-clock times, which differ from run to run
TIMING_KEYS = {"timings", "emulation_wall_s"}
#: fields added since, on purpose: the SCF stage record (J/K device, precision per cycle), the
#: modeled whole-run estimate in the cost report, two QCSchema properties, and the compile counts
ADDED_KEYS = {"scf", "whole_run", "nuclear_repulsion_energy", "scf_iterations", "compiles", "compiles_by_stage"}


def _mask_versions(text: str) -> str:
    return re.sub(r"\d+(\.\d+)+", "<version>", text)


def _compare(before, after, path: str) -> list[str]:
    if isinstance(before, dict):
        problems = []
        if set(before) != set(after) - ADDED_KEYS:
            return [f"{path}: keys differ: {sorted(set(before) ^ (set(after) - ADDED_KEYS))}"]
        for key in before:
            if key not in TIMING_KEYS:
                problems += _compare(before[key], after[key], f"{path}.{key}")
            elif isinstance(before[key], dict) and list(before[key]) != list(after[key]):
                problems.append(f"{path}.{key}: stages {list(before[key])} != {list(after[key])}")
        return problems
    if isinstance(before, list):
        if not isinstance(after, list) or len(before) != len(after):
            return [f"{path}: {before!r} != {after!r}"]
        return [p for i, (b, a) in enumerate(zip(before, after)) for p in _compare(b, a, f"{path}[{i}]")]
    if isinstance(before, float) and isinstance(after, (int, float)):
        return [] if math.isclose(before, after, rel_tol=1e-10, abs_tol=1e-10) else [f"{path}: {before} != {after}"]
    if isinstance(before, str) and isinstance(after, str):
        return [] if _mask_versions(before) == _mask_versions(after) else [f"{path}: {before!r} != {after!r}"]
    return [] if before == after else [f"{path}: {before!r} != {after!r}"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_json_is_unchanged_by_the_redesign(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "after.json"
    res = CliRunner().invoke(app, ["run", *CASES[name], "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    before = json.loads((DATA / name).read_text())
    after = json.loads(out.read_text())
    assert _compare(before, after, "$") == []
