"""The application layer: RunOptions validated once, one device per run, DFMP2's memory budget, the
precision registry, and the Device interface the host relies on."""

from __future__ import annotations

import numpy as np
import pytest

import mp2trn
from mp2trn import RunOptions
from mp2trn.devices import Device, get_device
from mp2trn.errors import InputError
from mp2trn.options import parse_frozen
from mp2trn.precision import PRECISIONS, get_precision, tolerance_for

from .conftest import molecule_path


@pytest.mark.parametrize("changes,message", [
    ({"max_memory": -3}, "--memory must be a positive number of MB"),
    ({"conv_tol": 0}, "--conv-tol must be positive"),
    ({"conv_tol_grad": 0.0}, "--conv-tol-grad must be positive"),
    ({"max_cycle": 0}, "--scf-max-cycle must be at least 1"),
    ({"unit": "furlong"}, "unknown unit"),
    ({"frozen": "lots"}, "--frozen-core 'lots'"),
    ({"frozen": -1}, "must not be negative"),
    ({"target": "trn2"}, "--target applies to --device sim or neuron only"),
    ({"device": "sim", "target": "trn9"}, "unknown Trainium target"),
])
def test_options_are_checked_when_built(changes, message):
    with pytest.raises(InputError, match=message):
        RunOptions(**changes)


def test_options_normalise_and_reject_unknown_names():
    assert parse_frozen("NONE") is None and parse_frozen(" auto ") == "auto" and parse_frozen("2") == 2
    assert parse_frozen(np.int64(3)) == 3 and parse_frozen([[0], [0, 1]]) == ((0,), (0, 1))
    opts = RunOptions(device="sim", target="TRN2", frozen="1")
    assert opts.target == "trn2" and opts.frozen == 1 and opts.device_kwargs() == {"target": "trn2"}
    assert opts.scf.conv_tol == 1e-10
    with pytest.raises(InputError, match="unknown option"):
        RunOptions.build(memory=100)  # one name for the budget: max_memory


def test_one_device_per_run_and_a_caller_device_stays_open(monkeypatch):
    import mp2trn.pipeline as pipeline

    built = []

    def counting(name, precision=None, **kw):
        dev = get_device(name, precision, **kw)
        built.append(dev)
        return dev

    monkeypatch.setattr(pipeline, "get_device", counting)
    ie = mp2trn.interaction_energy("2\nhelium dimer\nHe 0 0 0\n--\nHe 0 0 3.0\n", basis="cc-pvdz")
    assert len(ie.calculations) == 3 and len(built) == 1  # complex and two fragments on one device

    class Recording(type(get_device("cpu"))):
        closed = 0

        def close(self):
            Recording.closed += 1

    mine = Recording()
    mp2trn.run(molecule_path("water"), device=mine)
    assert Recording.closed == 0  # the caller's device is the caller's to close


def test_dfmp2_takes_its_budget_from_the_scf_object_unless_given(water_rhf):
    saved = water_rhf.max_memory
    try:
        water_rhf.max_memory = 1234
        assert mp2trn.DFMP2(water_rhf).run().result.what_ran["memory_mb"] == 1234
        assert mp2trn.DFMP2(water_rhf, max_memory=777).run().result.what_ran["memory_mb"] == 777
    finally:
        water_rhf.max_memory = saved


def test_precision_registry_drives_the_devices():
    assert set(PRECISIONS) >= {"fp64", "fp32", "fp32x3", "bf16"}
    assert get_device("cpu", "fp32").storage_dtype == np.float32
    assert get_device("sim", "fp32x3").storage_dtype == np.float64  # plane pairs summed in fp64
    x = np.random.default_rng(0).standard_normal((300, 7))
    hi, lo, full = get_precision("fp32x3").split_operand(x, axis=0, moving=True)
    assert np.max(np.abs(hi.astype(np.float64) + lo - x)) < 1e-9 * np.max(np.abs(x))
    assert get_precision("fp32").combine((np.ones(2, np.float32), np.ones(2, np.float32))).tolist() == [2.0, 2.0]
    assert tolerance_for("fp32x3") == 1e-7 and tolerance_for("something-x5") == 2e-6
    for device in ("cpu", "sim"):
        with pytest.raises(InputError, match="precision 'bf16' is not available"):
            get_device(device, "bf16")


def test_device_interface_has_what_the_host_asks():
    cpu, sim = get_device("cpu"), get_device("sim")
    assert cpu.occ_block_limit(100, 100) is None and sim.occ_block_limit(100, 100) == 512
    auto = get_device("auto")
    assert isinstance(auto, Device) and "auto picked" in auto.what_ran()["device_selection"]
    assert "device_selection" not in cpu.what_ran()


def test_orbital_gradient_threshold_reaches_the_scf_and_its_record():
    """--conv-tol-grad is PySCF's conv_tol_grad; the run records the converged cycle's |ΔE| and orbital
    gradient against the thresholds, and converged that tightly the MP2 energy is PySCF's tightly converged
    one (the MP2 energy follows the orbital gradient linearly, so both must stop at the same tight point)."""
    import mp2trn
    from pyscf import df, gto, scf
    from pyscf.mp import dfmp2

    path = molecule_path("water")
    res = mp2trn.run(path, conv_tol=1e-12, conv_tol_grad=1e-9)
    conv = res.scf["convergence"]
    assert conv["conv_tol"] == 1e-12 and conv["conv_tol_grad"] == 1e-9
    assert conv["orbital_gradient"] < 1e-9 and conv["energy_change"] < 1e-12
    default = mp2trn.run(path).scf["convergence"]
    assert default["conv_tol_grad"] == pytest.approx(1e-5)          # PySCF's √conv_tol
    mol = gto.M(atom=str(path), basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit")
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    assert abs(res.e_corr - pt.kernel()[0]) < 1e-10
