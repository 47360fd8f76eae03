"""Fixtures for the NKI emulator tests (tests/nkiemu): conformance-kernel loader, clean target state."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import mp2trn.nkiemu as nki

HERE = Path(__file__).resolve().parent
_loaded = {}


def load_conformance(name: str):
    """Import tests/nkiemu/conformance/<name>.py with the emulator registered as ``nki``."""
    if name not in _loaded:
        with nki.as_nki():
            spec = importlib.util.spec_from_file_location(f"nkiemu_conformance_{name}",
                                                          HERE / "conformance" / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        _loaded[name] = mod
    return _loaded[name]


@pytest.fixture(autouse=True)
def _clean_target(monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    nki.set_default_target(None)
    yield
    nki.set_default_target(None)


@pytest.fixture
def on_trn2():
    """Run a test written for trn2 rules/prices (the emulator's default target is trn1, DEFAULT_TARGET)."""
    nki.set_default_target("trn2")
    yield


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


BF16 = ml_dtypes.bfloat16
