"""The README's Python example runs as written (from the repository root)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    monkeypatch.chdir(ROOT)
    qc = next(b for b in blocks if "qcengine.compute" in b)
    namespace: dict = {}
    exec(compile(qc, "README.md", "exec"), namespace)  # noqa: S102 - our own documentation
    assert namespace["res"].success and namespace["res"].return_result < -75
    calc = next(b for b in blocks if "MP2Calculator" in b)
    namespace = {}
    exec(compile(calc, "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["atoms"].calc.result.e_corr < 0
