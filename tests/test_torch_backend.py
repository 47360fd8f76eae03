"""The PyTorch backend (device 'cuda') runs the same code on CPU torch in CI and agrees in fp64."""

from __future__ import annotations

import pytest

import mp2trn
from mp2trn.errors import DeviceUnavailableError

from .conftest import pyscf_dfmp2, scf_for

torch = pytest.importorskip("torch", reason="PyTorch not installed (pip install 'mp2trn[cuda]')")
from mp2trn.devices.torch_backend import TorchDevice  # noqa: E402

TORCH_DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("torch_device", TORCH_DEVICES)
@pytest.mark.parametrize("name,basis,frozen", [("water", "cc-pvdz", None), ("ethylene", "def2-svp", "auto"),
                                               ("hydroxyl", "cc-pvdz", None), ("oxygen_triplet", "cc-pvdz", "auto")])
def test_torch_fp64_matches_pyscf(torch_device, name, basis, frozen):
    mf = scf_for(name, basis)
    ncore = 1 if frozen == "auto" else None
    if name == "ethylene" and frozen == "auto":
        ncore = 2
    if name == "oxygen_triplet" and frozen == "auto":
        ncore = 2
    ref = pyscf_dfmp2(mf, frozen=ncore)
    dev = TorchDevice(precision="fp64", torch_device=torch_device)
    pt = mp2trn.DFMP2(mf, frozen=frozen, device=dev).run()
    assert abs(pt.e_corr - ref.e_corr) <= 1e-8
    assert abs(pt.e_corr_os - ref.e_corr_os) <= 1e-8
    assert abs(pt.e_corr_ss - ref.e_corr_ss) <= 1e-8
    assert pt.result.what_ran["backend"].startswith("torch")


def test_torch_fp32_close():
    """fp32 metric solve and pair GEMMs, the transform and the pair sums in fp64: formaldehyde/cc-pVTZ within
    0.05 µEh of fp64 (0.0016 µEh; 0.17 µEh with the transform and the sums in fp32, as before)."""
    mf = scf_for("formaldehyde", "cc-pvtz")
    e64 = mp2trn.DFMP2(mf).run().e_corr
    pt = mp2trn.DFMP2(mf, device=TorchDevice(precision="fp32", torch_device="cpu")).run()
    assert abs(pt.e_corr - e64) < 5e-8
    assert pt.result.what_ran["precision_detail"].startswith("AO->MO transform in fp64")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_gpu_is_a_clear_error(water_rhf):
    with pytest.raises(DeviceUnavailableError, match="no CUDA GPU"):
        mp2trn.DFMP2(water_rhf, device="cuda").run()


@pytest.mark.parametrize("torch_device", TORCH_DEVICES)
@pytest.mark.parametrize("name", ["water", "hydroxyl"])
def test_torch_gradient_matches_cpu(torch_device, name):
    """The gradient's pair step on torch (device 'cuda'; CPU torch in CI): the cpu device's gradient."""
    import numpy as np

    from .conftest import molecule_path

    dev = TorchDevice(precision="fp64", torch_device=torch_device)
    cpu = mp2trn.run(molecule_path(name), gradient=True, frozen="auto")
    ours = mp2trn.run(molecule_path(name), gradient=True, frozen="auto", device=dev)
    assert np.max(np.abs(ours.gradient - cpu.gradient)) < 1e-9
    assert ours.what_ran["gradient_pairs"].endswith("(fp64)")


def test_held_b_is_read_in_place_and_dropped_with_its_array(monkeypatch):
    """A held array's views are strided views of the one copy on the device (no transfer per launch); an
    array that is not held, or a copy of a held one, is sent; the entry goes when the host array does."""
    import gc

    import numpy as np

    monkeypatch.delenv("MP2TRN_HOLD_B", raising=False)
    dev = TorchDevice(precision="fp64", torch_device="cpu")
    b = np.random.default_rng(3).standard_normal((7, 5 * 4))
    assert dev.hold([b]).startswith("resident in torch cpu memory")
    copy = dev._held[id(b)][1]
    view = b[:, 8:16].reshape(7, 2, 4)                     # occupied orbitals 2:4 of nvir 4, as BStore gives
    got = dev._t(view)
    assert got.untyped_storage().data_ptr() == copy.untyped_storage().data_ptr()
    assert np.array_equal(got.numpy(), view)
    assert dev._t(view.copy()).untyped_storage().data_ptr() != copy.untyped_storage().data_ptr()
    assert "held since the energy" in dev.hold([b])       # a second offer sends nothing
    del view, b
    gc.collect()
    assert not dev._held


def test_hold_counts_only_what_is_new_and_adds_nothing_when_told(monkeypatch):
    """An array held already is not counted against the free memory again (the GPU's free memory has
    shrunk by its copy); a later stage that may not add (its plan did not count B) holds nothing new; a
    new array beyond half the free memory is sent with each launch."""
    import numpy as np

    monkeypatch.delenv("MP2TRN_HOLD_B", raising=False)
    dev = TorchDevice(precision="fp64", torch_device="cpu")
    b, other = np.ones((100, 1000)), np.ones((100, 1000))       # 0.8 MB each
    monkeypatch.setattr(dev, "memory_mb", lambda: 2.0)
    assert dev.hold([b]).endswith("sent once)") and dev.held_mb() == 0.8
    monkeypatch.setattr(dev, "memory_mb", lambda: 1.2)              # less free now: b's copy takes some
    assert dev.hold([b], add=False).endswith("held since the energy)")
    assert dev.hold([other], add=False).startswith("sent with each launch") and len(dev._held) == 1
    assert dev.hold([b, other]).startswith("sent with each launch: holding B would take 1 MB")
    dev.close()
    assert not dev._held and dev.held_mb() == 0.0


@pytest.mark.parametrize("name", ["water", "hydroxyl"])
def test_energy_and_gradient_with_b_held_equal_those_without(name, monkeypatch):
    """B held on the torch device from the energy through the gradient's sweep gives the energies and
    gradients of the path that sends every block (1e-12 Eh, 1e-10 Eh/bohr), and what-ran says where B was."""
    import numpy as np

    from .conftest import molecule_path

    def run():
        return mp2trn.run(molecule_path(name), gradient=True, device=TorchDevice(precision="fp64", torch_device="cpu"))

    monkeypatch.delenv("MP2TRN_HOLD_B", raising=False)

    held = run()
    assert held.what_ran["b_on_device"].startswith("resident in torch cpu memory")
    assert held.what_ran["gradient_reused"]["B_on_device"].endswith("held since the energy)")
    monkeypatch.setattr(TorchDevice, "hold", lambda self, arrays, add=True: "sent with each launch (test)")
    sent = run()
    assert sent.what_ran["b_on_device"] == "sent with each launch (test)"
    assert abs(held.e_tot - sent.e_tot) < 1e-12
    assert np.max(np.abs(held.gradient - sent.gradient)) < 1e-10
