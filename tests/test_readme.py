"""The README's Python example runs as written (from the repository root)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_block(marker: str, prelude: str = "") -> dict:
    """Execute the README's first Python block containing ``marker`` (after ``prelude``); its namespace."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    block = next(b for b in blocks if marker in b)
    namespace: dict = {}
    exec(compile(prelude + block, "README.md", "exec"), namespace)  # noqa: S102 - our own documentation
    return namespace


def test_readme_python_example_runs(monkeypatch):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "the README has a Python example"
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102 - our own documentation
    assert namespace["res"].e_corr < 0 and namespace["mf"].converged
    assert namespace["mf"].with_df.jk_record()["precision_per_cycle"][-1] == "fp64"


def test_readme_qcengine_and_ase_examples_run(monkeypatch, capsys):
    import pytest

    pytest.importorskip("qcengine")
    pytest.importorskip("ase")
    monkeypatch.chdir(ROOT)
    assert (res := run_block("AtomicInput")["res"]).success and res.return_result < -75
    assert run_block("get_potential_energy")["atoms"].calc.result.e_corr < 0


def test_readme_gradient_and_optimisation_examples_run(monkeypatch, tmp_path):
    import pytest

    pytest.importorskip("geometric")
    pytest.importorskip("qcengine")
    monkeypatch.chdir(ROOT)
    namespace = run_block("nuc_grad_method", "from pyscf import gto, scf\nimport mp2trn\n"
                          "mol = gto.M(atom='O 0 0 0.117; H 0 0.757 -0.469; H 0 -0.757 -0.469', basis='cc-pvdz')\n")
    assert namespace["de"].shape == (3, 3) and namespace["res"].gradient.shape == (3, 3)
    assert 0.95 < run_block("BFGS")["atoms"].get_distance(0, 1) < 0.98
    monkeypatch.chdir(tmp_path)    # geomeTRIC's QCEngine procedure writes files where it runs
    opt = run_block("OptimizationInput")["opt"]
    assert opt.success and opt.properties.return_energy < -76.23
