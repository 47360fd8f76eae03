"""Distinct kernel signatures per run (a NEFF compile each on Trainium): counted per stage, shown with the
launches, and held within SIGNATURE_BOUND across molecules of several sizes by the host's padding."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.devices.nki_device import SIGNATURE_BOUND
from mp2trn.devices.nki_launch import compile_signature

from .conftest import molecule_path


@pytest.mark.parametrize("name,basis,memory", [
    ("water", "cc-pvdz", None), ("hydroxyl", "cc-pvdz", None),
    pytest.param("benzene", "cc-pvdz", None, marks=pytest.mark.slow),   # 20 s; water and hydroxyl stay in the default run
    # several aux and occupied blocks: padded to one size each (slow: its SCF's J/K builds are emulated too)
    pytest.param("benzene", "cc-pvtz", 300, marks=pytest.mark.slow),
])
def test_signatures_stay_within_the_bound(name, basis, memory):
    res = mp2trn.run(molecule_path(name), basis=basis, device="sim", max_memory=memory)
    cost = res.cost
    for stage, n in cost["compiles_by_stage"].items():
        assert 1 <= n <= SIGNATURE_BOUND[stage], (stage, n)
        assert n <= cost["launches_by_stage"][stage]
    assert cost["compiles"] <= sum(SIGNATURE_BOUND.values())
    if name == "benzene" and basis == "cc-pvtz":   # many launches, few compiles
        assert cost["launches"] >= 10 * cost["compiles"]


def test_padding_keeps_energies(monkeypatch):
    """The padded launches give the energies of unpadded ones (zero rows and columns add nothing)."""
    import mp2trn.devices.nki_device as nd

    padded = mp2trn.run(molecule_path("hydroxyl"), device="sim", scf_jk="pyscf")
    monkeypatch.setattr(nd.NkiDevice, "_bucket", lambda self, key, n: n)
    plain = mp2trn.run(molecule_path("hydroxyl"), device="sim", scf_jk="pyscf")
    assert abs(padded.e_corr - plain.e_corr) < 1e-8
    assert padded.cost["compiles"] < plain.cost["compiles"]


def test_signature_is_shapes_dtypes_and_constants():
    import numpy as np

    a = np.zeros((4, 3), np.float32)
    assert compile_signature("k", (a,), {"g": 1}) == compile_signature("k", (np.ones((4, 3), np.float32),), {"g": 1})
    assert compile_signature("k", (a,), {"g": 1}) != compile_signature("k", (a,), {"g": 2})
    assert compile_signature("k", (a,), {}) != compile_signature("k", (a.astype(np.float64),), {})


def test_compiles_are_shown_with_launches():
    res = CliRunner().invoke(app, ["run", str(molecule_path("water")), "--device", "sim"])
    assert res.exit_code == 0 and "compiles" in res.output
