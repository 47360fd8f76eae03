"""`mp2trn batch`: one JSON line per molecule (the record of `run --json`), failures recorded without
stopping, --resume after a kill skips what is done, list files and folders, and ranks under torchrun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import mp2trn
from mp2trn.batch import collect_sources, run_batch
from mp2trn.cli import app
from mp2trn.errors import InputError

from .conftest import ROOT, molecule_path

BAD = "2\nslip\nO 0 0 0\nO 0 0 0.01\n"


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "mols"
    d.mkdir()
    shutil.copy(molecule_path("water"), d / "a_water.xyz")
    (d / "b_bad.xyz").write_text(BAD)
    shutil.copy(molecule_path("hydroxyl"), d / "c_hydroxyl.xyz")
    (d / "notes.md").write_text("not a molecule")
    return d


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_batch_records_each_molecule_and_keeps_going(folder, tmp_path):
    out = tmp_path / "res.jsonl"
    res = CliRunner().invoke(app, ["batch", str(folder), "--out", str(out), "--basis", "sto-3g", "-q"])
    assert res.exit_code == 1                                   # one molecule failed; the batch finished
    recs = _records(out)
    assert [r["source"].split("/")[-1] for r in recs] == ["a_water.xyz", "b_bad.xyz", "c_hydroxyl.xyz"]
    assert [r["status"] for r in recs] == ["ok", "error", "ok"]
    bad = recs[1]
    assert bad["error_type"] == "InputError" and bad["exit_code"] == 2 and "0.0100 Å apart" in bad["error"]
    single = mp2trn.run(folder / "a_water.xyz", basis="sto-3g").to_qcschema()
    assert recs[0]["result"]["properties"]["mp2_total_energy"] == pytest.approx(
        single["properties"]["mp2_total_energy"], abs=1e-10)
    assert set(recs[0]["result"]) == set(single)                # what a single run --json holds
    assert all(r["peak_memory_mb"] > 10 for r in recs)


def test_resume_after_a_kill_skips_what_is_done(folder, tmp_path):
    out = tmp_path / "res.jsonl"
    run_batch([folder], out, mp2trn.RunOptions(basis="sto-3g"), resume=True)
    lines = out.read_text().splitlines()
    out.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])    # killed while writing the second
    (folder / "b_bad.xyz").write_text(molecule_path("water").read_text())  # the user fixes the bad file
    summary = run_batch([folder], out, mp2trn.RunOptions(basis="sto-3g"), resume=True)
    assert summary.skipped == 1 and summary.ok == 2 and summary.failed == 0
    recs = _records(out)                                        # the torn line is gone, every line parses
    assert [(r["source"].split("/")[-1], r["status"]) for r in recs] == [
        ("a_water.xyz", "ok"), ("b_bad.xyz", "ok"), ("c_hydroxyl.xyz", "ok")]
    with pytest.raises(InputError, match="--resume"):
        run_batch([folder], out, mp2trn.RunOptions(basis="sto-3g"))


def test_list_files_and_missing_inputs(folder, tmp_path):
    lst = folder / "todo.txt"
    lst.write_text("# two of them\nc_hydroxyl.xyz\na_water.xyz  # again below\na_water.xyz\n")
    assert [p.name for p in collect_sources([lst])] == ["c_hydroxyl.xyz", "a_water.xyz"]
    with pytest.raises(InputError, match="no such file"):
        collect_sources([tmp_path / "nope"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no molecule files"):
        collect_sources([empty])


def test_ranks_share_the_molecules_under_torchrun(folder, tmp_path):
    pytest.importorskip("torch.distributed")
    (folder / "b_bad.xyz").unlink()
    out = tmp_path / "res.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "mp2trn", "batch",
           str(folder), "--out", str(out), "--basis", "sto-3g"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = _records(out)
    assert sorted((r["source"].split("/")[-1], r["rank"]) for r in recs) == [("a_water.xyz", 0), ("c_hydroxyl.xyz", 1)]
    assert all(r["status"] == "ok" for r in recs)
    assert proc.stdout.count("2 ok, 0 failed") == 1                   # rank 0 alone prints the summary
