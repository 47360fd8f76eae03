"""The ``neuron`` device: a clear error naming what to install when torch-neuronx / a real NKI are absent,
and its launch path (tensors to the XLA device once per launch, one kernel call per block, results back
once) exercised with a stand-in XLA device that runs the kernels in the emulator."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.devices import get_device
from mp2trn.devices import nki_launch
from mp2trn.errors import DeviceUnavailableError

from .conftest import molecule_path, scf_for


def test_neuron_unavailable_names_what_to_install():
    with pytest.raises(DeviceUnavailableError) as exc:
        get_device("neuron")
    msg = str(exc.value)
    assert "mp2trn[neuron]" in msg and "pip.repos.neuron.amazonaws.com" in msg
    assert "trn1" in msg and "--device sim" in msg and "emulator" in msg


def test_neuron_unavailable_on_the_cli_is_one_line():
    res = CliRunner().invoke(app, ["run", str(molecule_path("water")), "--device", "neuron"])
    assert res.exit_code == DeviceUnavailableError.exit_code
    assert len(res.output.strip().splitlines()) == 1 and "mp2trn[neuron]" in res.output


@pytest.fixture
def fake_xla(monkeypatch, tmp_path):
    """Pretend torch-neuronx is there: an 'XLA device' that is the CPU; kernels run in the emulator.
    The persistent compile cache lives in a temporary directory."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("MP2TRN_COMPILE_CACHE", str(tmp_path / "compile-cache"))
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", str(tmp_path / "compile-cache"))
    xm = types.ModuleType("torch_xla.core.xla_model")
    xm.xla_device = lambda: torch.device("cpu")
    xm.mark_step = lambda: None
    pkg = types.ModuleType("torch_xla")
    core = types.ModuleType("torch_xla.core")
    pkg.core, core.xla_model = core, xm
    monkeypatch.setitem(sys.modules, "torch_xla", pkg)
    monkeypatch.setitem(sys.modules, "torch_xla.core", core)
    monkeypatch.setitem(sys.modules, "torch_xla.core.xla_model", xm)
    monkeypatch.setattr(nki_launch, "neuron_missing", lambda: None)
    calls = []

    def call(kernel, args, kwargs):
        import mp2trn.nkiemu as emu

        assert all(not isinstance(a, np.ndarray) for a in args)           # inputs are device tensors
        host = [a.view(torch.int16).numpy().view(np.dtype("bfloat16")) if getattr(a, "dtype", None) == torch.bfloat16
                else (a.numpy() if isinstance(a, torch.Tensor) else a) for a in args]
        out = emu.simulate(kernel, target="trn1")(*host, **kwargs)
        calls.append(kernel.__name__)
        def conv(o):   # a bf16 output (resplit_x3's hi plane) travels as its int16 bits, as the inputs do
            o = np.ascontiguousarray(o)
            if o.dtype == np.dtype("bfloat16"):
                return torch.from_numpy(o.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(o)
        return tuple(conv(o) for o in out) if isinstance(out, tuple) else conv(out)

    return call, calls


@pytest.mark.parametrize("precision", ["fp32", "fp32x3"])
def test_neuron_path_runs_the_same_kernels_and_plan_as_sim(fake_xla, precision, monkeypatch):
    call, calls = fake_xla
    # a NeuronCore computes off the host's cores, so the integrals are made a block ahead in half-size blocks
    # (mp2trn.overlap); the sim device, on the host's cores, does not overlap: both overlap here for one plan
    import mp2trn.transform

    monkeypatch.setattr(mp2trn.transform, "overlaps", lambda device: True)
    mf = scf_for("water", "cc-pvdz")
    dev = get_device("neuron", precision)
    assert isinstance(dev.launcher, nki_launch.NeuronLauncher)
    dev.launcher.call = call
    pt = mp2trn.DFMP2(mf, device=dev).run()
    sim = mp2trn.DFMP2(mf, device="sim", precision=precision).run()
    assert pt.e_corr == pytest.approx(sim.e_corr, abs=1e-12)
    assert pt.cost["kind"] == "measured" and pt.cost["launches_by_stage"] == sim.cost["launches_by_stage"]
    assert sorted(set(calls)) == sorted({"batched_gemm", "trsm", "mp2_energy"} if precision == "fp32"
                                        else {"batched_gemm_x3", "trsm_x3", "mp2_energy_x3"})
    assert pt.result.what_ran["device"] == "neuron"


def test_neuron_compile_cache_counts_misses_then_hits(fake_xla):
    """The first run compiles every signature (misses); the same molecule again finds them all (hits)."""
    call, _ = fake_xla
    mf = scf_for("water", "cc-pvdz")
    reports = []
    for _ in range(2):
        dev = get_device("neuron", "fp32")
        dev.launcher.call = call
        reports.append(mp2trn.DFMP2(mf, device=dev).run().cost)
    first, second = (r["compile_cache"] for r in reports)
    assert first["misses"] == reports[0]["compiles"] > 0 and first["hits"] == 0
    assert second["hits"] == reports[1]["compiles"] and second["misses"] == 0
    assert reports[0]["compiles_by_stage"] == {"ao_to_mo": 1, "metric": 1, "pairs": 1}


def test_neuron_holds_b_and_slices_its_blocks_in_hbm(fake_xla, monkeypatch):
    """With B held, the neuron launcher copies it to the XLA device once and hands the pair kernel slices of
    that tensor (zero-padded as the host would pad them): the energy equals the sim device's with the same
    blocks, to fp32 rounding."""
    call, _ = fake_xla
    monkeypatch.delenv("MP2TRN_HOLD_B", raising=False)
    mf = scf_for("water", "cc-pvdz")
    dev = get_device("neuron", "fp32")
    dev.launcher.call = call
    stage, copies = [None], []
    real_launch, real_copy = dev.launcher.launch, dev.launcher._copy_to_device
    monkeypatch.setattr(dev.launcher, "launch", lambda st, *a, **k: stage.__setitem__(0, st) or real_launch(st, *a, **k))
    monkeypatch.setattr(dev.launcher, "_copy_to_device", lambda a: copies.append((stage[0], a.shape)) or real_copy(a))
    monkeypatch.setattr(dev, "occ_block_limit", lambda *a, **k: 3)   # several blocks: slices, one padded
    pt = mp2trn.DFMP2(mf, device=dev).run()
    sim_dev = get_device("sim", "fp32")
    monkeypatch.setattr(sim_dev, "occ_block_limit", lambda *a, **k: 3)   # the same blocks: the same fp32 sums
    sim = mp2trn.DFMP2(mf, device=sim_dev).run()
    assert pt.result.what_ran["b_on_device"].startswith("resident in device memory")
    assert pt.result.what_ran["pair_blocks"] > 1
    # fp32 sums of differently laid-out operands: bitwise equal with the Intel VM's OpenBLAS, 6e-9 apart
    # on an AMD EPYC's; a wrong slice or padding would be off by far more
    assert pt.e_corr == pytest.approx(sim.e_corr, abs=1e-7)
    naux, nocc, nvir = (pt.result.sizes[k] for k in ("naux", "nocc", "nvir"))
    sent = [shape for st, shape in copies if st == "pairs"]
    assert sent.count((naux, nocc * nvir)) == 1                     # B itself, once
    assert all(shape[0] != naux for shape in sent if shape != (naux, nocc * nvir))   # no block of it


def test_neuron_launcher_frees_a_dropped_array_and_never_reuses_a_stale_copy(fake_xla):
    """drop() frees the device tensor of a kept array; keep() of an array (say, a new one that got a freed
    array's id) copies it afresh at its next launch instead of handing out the old device tensor."""
    launcher = get_device("neuron", "fp32").launcher
    a = np.arange(6, dtype=np.float32).reshape(2, 3).copy()   # its own root (the device keys on it)
    launcher.keep(a)
    launcher._to_device(a)
    assert id(a) in launcher._resident
    launcher.drop(a)
    assert id(a) not in launcher._resident
    launcher.keep(a)
    assert launcher._to_device(a).numpy()[0, 0] == 0
    a[:] = 7
    launcher.keep(a)
    assert launcher._to_device(a).numpy()[0, 0] == 7


def test_neuron_launcher_frees_the_device_tensor_of_a_kept_array_the_host_frees(fake_xla):
    """A kept array freed on the host (an fp32 SCF block the precision switch does not reuse) takes its
    device tensor with it, before drop_kept."""
    import gc

    launcher = get_device("neuron", "fp32").launcher
    # a copy, as an XLA device's is (the CPU stand-in's from_numpy would share the host array's memory)
    launcher._copy_to_device = lambda host: launcher._torch.tensor(np.array(host))
    a = np.arange(6, dtype=np.float32).reshape(2, 3).copy()
    launcher.keep(a)
    launcher._to_device(a)
    key = id(a)
    assert key in launcher._resident
    del a
    gc.collect()
    assert key not in launcher._resident
