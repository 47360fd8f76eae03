"""Start-up and structure: what `import mp2trn`, `mp2trn --help` and `mp2trn run` import (counted, never
timed), QCEngine registration without importing QCEngine, devices asked through their interface (never
probed with getattr), and the run flags written once for every command."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: modules a start-up must not pay for: the compute stack, and the extras only some commands use
HEAVY = ("pyscf", "scipy", "h5py", "qcengine", "qcelemental", "basis_set_exchange", "torch", "matplotlib", "ase")


def _modules_after(code: str) -> dict:
    """sys.modules after running ``code`` in a fresh interpreter: {"count": n, "names": [...]}."""
    probe = code + "\nimport json, sys\nprint(json.dumps({'count': len(sys.modules), 'names': sorted(sys.modules)}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loaded(mods: dict, name: str) -> bool:
    return name in mods["names"]


def test_import_mp2trn_loads_no_compute_stack():
    mods = _modules_after("import mp2trn")
    assert not [m for m in HEAVY if _loaded(mods, m)]
    assert mods["count"] < 200      # measured 99 (Python 3.11)


def test_help_imports_no_compute_stack():
    mods = _modules_after(
        "import contextlib, io, sys\nsys.argv = ['mp2trn', '--help']\nfrom mp2trn.cli import app\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    try:\n        app()\n    except SystemExit:\n        pass")
    assert not [m for m in HEAVY if _loaded(mods, m)]
    assert mods["count"] < 700      # measured 461: typer, rich and NumPy


def test_run_imports_only_what_the_run_needs():
    mods = _modules_after(
        "import contextlib, io, sys\nsys.argv = ['mp2trn', 'run', 'molecules/water.xyz', '-q']\n"
        "from mp2trn.cli import app\ntry:\n    app()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code")
    assert _loaded(mods, "pyscf")
    assert not [m for m in ("qcengine", "qcelemental", "basis_set_exchange", "torch", "matplotlib", "ase")
                if _loaded(mods, m)]


@pytest.mark.parametrize("order", ["mp2trn first", "qcengine first"])
def test_qcengine_finds_mp2trn_in_either_import_order(order):
    pytest.importorskip("qcengine")
    first, second = ("mp2trn", "qcengine") if order == "mp2trn first" else ("qcengine", "mp2trn")
    done = subprocess.run([sys.executable, "-c", f"import {first}, {second}\n"
                           "print('mp2trn' in qcengine.list_all_programs())"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.stdout.strip().splitlines()[-1] == "True", done.stderr[-2000:]


def _device_probes(path: Path) -> list[str]:
    """getattr/hasattr calls on a device, its launcher or the options' device, in one source file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            target = ast.unparse(node.args[0]) if node.args else ""
            if target.split(".")[-1] in ("device", "dev", "launcher") or target.endswith("options.device"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_devices_are_asked_never_probed():
    probes = [p for f in sorted((ROOT / "mp2trn").rglob("*.py")) for p in _device_probes(f)]
    assert probes == []


def test_collective_launcher_is_part_of_the_device_interface():
    from mp2trn.devices import get_device

    cpu, sim = get_device("cpu"), get_device("sim")
    try:
        assert cpu.collective_launcher() is None
        assert sim.collective_launcher() is sim.launcher
    finally:
        cpu.close()
        sim.close()


def test_run_flags_are_written_once():
    """run, batch and interaction take the run flags from cli.common, none declares them again."""
    from typer.testing import CliRunner

    from mp2trn.cli import app

    for command in ("run", "batch", "interaction"):
        text = CliRunner().invoke(app, [command, "--help"], terminal_width=200).output
        for flag in ("--basis", "--method", "--ecp", "--device", "--precision", "--memory", "--jkbasis"):
            assert flag in text, (command, flag)
        source = (ROOT / "mp2trn" / "cli" / f"{command}.py").read_text()
        assert "basis: Basis" not in source and "device: DeviceFlag" not in source
