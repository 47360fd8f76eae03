"""kernels/_nki.py: real NKI when it has jit+simulate, else the emulator; MP2TRN_NKI overrides."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PROBE = ("from mp2trn.kernels._nki import nki, nl, nisa, NKI_IMPL, describe; "
         "print(NKI_IMPL, nki.__name__, nl.__name__, nisa.__name__); print(describe())")


def _run(tmp_path, files=None, env=None):
    for rel, text in (files or {}).items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    e = dict(os.environ)
    e.pop("MP2TRN_NKI", None)
    e["PYTHONPATH"] = str(tmp_path) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=e, timeout=120)


FAKE_REAL = {
    "nki/__init__.py": "__version__ = '0.3.0'\ndef jit(f=None, **k): return f\ndef simulate(k): return k\n",
    "nki/language.py": "",
    "nki/isa.py": "",
    "nki/collectives.py": "",   # NKI 0.3.0 has nki.collectives (nki/api/nki.collectives.rst)
}


def test_emulator_when_no_nki(tmp_path):
    r = _run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["emulator", "mp2trn.nkiemu"]
    assert "emulator" in r.stdout.splitlines()[1]


def test_placeholder_that_raises_on_import(tmp_path):
    r = _run(tmp_path, {"nki/__init__.py": "raise ImportError('placeholder package, install from AWS')\n"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("emulator")
    assert "placeholder" in r.stdout


def test_nki_without_simulate_is_not_real(tmp_path):
    r = _run(tmp_path, {"nki/__init__.py": "def jit(f=None, **k): return f\n"})
    assert r.stdout.startswith("emulator"), r.stdout + r.stderr


def test_real_nki_is_preferred(tmp_path):
    r = _run(tmp_path, FAKE_REAL)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:4] == ["real", "nki", "nki.language", "nki.isa"]
    assert "real" in r.stdout.splitlines()[1]


def test_force_emulator(tmp_path):
    r = _run(tmp_path, FAKE_REAL, {"MP2TRN_NKI": "emulator"})
    assert r.stdout.startswith("emulator"), r.stdout + r.stderr


def test_force_real_without_nki_fails_clearly(tmp_path):
    r = _run(tmp_path, env={"MP2TRN_NKI": "real"})
    assert r.returncode != 0
    assert "RealNkiUnavailableError" in r.stderr and "MP2TRN_NKI=real" in r.stderr


def test_in_process_binding():
    from mp2trn.kernels import _nki
    if os.environ.get("MP2TRN_NKI", "") == "real":  # pragma: no cover
        pytest.skip("real NKI forced")
    assert _nki.NKI_IMPL in ("real", "emulator")
    assert isinstance(_nki.describe(), str) and "NKI" in _nki.describe()
    assert issubclass(_nki.RealNkiUnavailableError, ImportError)
