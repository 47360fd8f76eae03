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


def test_torch_fp32_close(water_rhf):
    e64 = mp2trn.DFMP2(water_rhf).run().e_corr
    pt = mp2trn.DFMP2(water_rhf, device=TorchDevice(precision="fp32", torch_device="cpu")).run()
    assert abs(pt.e_corr - e64) < 1e-6


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
