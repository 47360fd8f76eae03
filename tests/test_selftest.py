"""`mp2trn selftest`: passes on cpu and sim, fails (exit 1) when a kernel is broken, and says what to
install for a device that is not there."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from mp2trn.cli import app
from mp2trn.devices.nki_device import NkiDevice
from mp2trn.selftest import selftest


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_selftest_passes(device):
    res = CliRunner().invoke(app, ["selftest", "--device", device])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[-1].startswith("PASS:") and sum(line.startswith("PASS ") for line in lines) >= 12
    assert "water/cc-pVDZ DF-MP2 vs PySCF" in res.output
    if device == "sim":
        assert "kernel launches" in res.output and "distinct compiles" in res.output


def test_a_broken_kernel_fails_the_selftest(monkeypatch):
    """A test double for mp2_energy that drops the exchange term: the pair-energy checks must fail."""
    original = NkiDevice.pair_energies

    def broken(self, *args, **kwargs):
        os_, xx = original(self, *args, **kwargs)
        return os_ * 1.001, None if xx is None else np.zeros_like(xx)

    monkeypatch.setattr(NkiDevice, "pair_energies", broken)
    passed, checks, _ = selftest("sim", report=None)
    failed = [c.name for c in checks if not c.passed]
    assert not passed and any(name.startswith("pair_energies") for name in failed)
    res = CliRunner().invoke(app, ["selftest", "--device", "sim"])
    assert res.exit_code == 1 and res.output.strip().splitlines()[-1].startswith("FAIL:")


def test_a_broken_density_kernel_fails_the_selftest(monkeypatch):
    """A test double for mp2_density that drops the occupied density: the pair_densities checks must fail."""
    original = NkiDevice.pair_densities

    def broken(self, *args, **kwargs):
        return original(self, *args, **kwargs)._replace(p_occ=np.zeros((args[0].shape[1],) * 2))

    monkeypatch.setattr(NkiDevice, "pair_densities", broken)
    passed, checks, _ = selftest("sim", report=None)
    assert not passed and [c.name for c in checks if not c.passed][0].startswith("pair_densities")


def test_a_kernel_that_raises_is_a_failed_line_not_a_traceback(monkeypatch):
    def raises(self, *args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(NkiDevice, "metric_solve", raises)
    passed, checks, _ = selftest("sim", report=None)
    assert not passed and any("kernel exploded" in c.detail for c in checks)


def test_neuron_without_the_sdk_says_what_to_install():
    res = CliRunner().invoke(app, ["selftest", "--device", "neuron"])
    assert res.exit_code == 1 and "pip install 'mp2trn[neuron]'" in res.output
    assert res.output.strip().splitlines()[-1].startswith("FAIL:")
