"""Output that survives a log file: with stdout redirected (a batch job, a pipe) every number is printed
in full, whatever COLUMNS the job inherited; counts read as English; `--gradient` prints the natural
occupations it promises."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

from rich.console import Console

from mp2trn.costreport import summary_rows
from mp2trn.result import MP2Result

from .conftest import molecule_path


def _run_piped(args: list[str]) -> str:
    """stdout of ``python -m mp2trn ARGS`` written to a pipe, as a scheduler's log file would get it, with
    an 80-column COLUMNS inherited from the shell that submitted it."""
    env = {**os.environ, "COLUMNS": "80", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "mp2trn", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _table_rows(text: str, title: str) -> list[list[str]]:
    """The body rows (cells stripped) of the table printed under ``title``."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            rows.append([cell.strip() for cell in line.strip("│").split("│")])
    return rows


def test_redirected_output_prints_every_number_in_full(tmp_path):
    """The sim device's cost table is the widest mp2trn prints (at 80 columns rich cut its cells to
    "measure…"); piped, each of its numbers, the energies, the gradient and the natural occupations are
    the JSON's values in full."""
    json_path = tmp_path / "water.json"
    out = _run_piped(["run", str(molecule_path("water")), "--basis", "sto-3g", "--device", "sim",
                      "--gradient", "--json", str(json_path)])
    doc = json.loads(json_path.read_text())
    extras = doc["extras"]["mp2trn"]

    assert "…" not in out
    assert f"{doc['properties']['return_energy']:.10f}" in out
    for value in doc["return_result"]:
        assert f"{value:.10f}" in out
    cost_rows = _table_rows(out, "MODELED Trainium time")
    for label, trn1, trn2 in summary_rows(extras["cost"]):
        assert [label, "", "", trn1, trn2, "", "", ""] in cost_rows

    occupations = extras["natural_occupations"]
    rows = _table_rows(out, "Natural occupations")
    assert rows[:-1] == [[str(k + 1), f"{occ:.6f}"] for k, occ in enumerate(occupations)]   # 7 NOs: all shown
    assert rows[-1] == ["sum", "10.000000"]

    blas = next(line for line in out.splitlines() if "BLAS threads" in line)
    assert re.search(r"\b1 thread\b", blas) and "1 threads" not in out


def _render(table) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=200).print(table)
    return buffer.getvalue()


def test_natural_occupations_are_shown_around_the_frontier():
    """Ten electrons in 24 natural orbitals: NOs 1-10 are printed (5 on either side of the 5th), the sum is
    the electron count."""
    from mp2trn.cli.run import natural_occupations_table

    occupations = [1.99, 1.98, 1.97, 1.96, 1.95, 0.05, 0.04, 0.03, 0.02, 0.01] + [0.0] * 14
    result = MP2Result(e_hf=0.0, e_corr_os=0.0, e_corr_ss=0.0, reference="RHF", what_ran={}, sizes={},
                       natural_occupations=occupations)
    text = _render(natural_occupations_table(result))
    rows = _table_rows(text, "Natural occupations")
    assert [r[0] for r in rows] == [str(k) for k in range(1, 11)] + ["sum"]
    assert rows[5] == ["6", "0.050000"] and rows[-1] == ["sum", "10.000000"]
    assert "NO (of 24)" in text
