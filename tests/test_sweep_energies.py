"""Nothing formed twice: a gradient run's MP2 energy summed by the gradient's pair sweep from the amplitudes
it forms anyway, instead of a pair step of the energy's own — the same energies as the energy run's pair
step, and the pair step kept wherever the sweep cannot give every reported sum."""

from __future__ import annotations

import numpy as np
import pytest

from mp2trn.devices import get_device
from mp2trn.energy import pair_energies
from mp2trn.grad import densities
from mp2trn.options import RunOptions
from mp2trn.orbitals import SpinOrbitals
from mp2trn.pipeline import compute, open_device
from mp2trn.transform import BStore

WATER = "O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45"
HYDROXYL = "O 0 0 0; H 0.1 0 1.05"
DEFERRED = "summed by the gradient's pair sweep"


def _run(atom: str, multiplicity: int, gradient: bool, keep: bool = False, **kw):
    options = RunOptions.build(None, basis="cc-pvdz", multiplicity=multiplicity, gradient=gradient, conv_tol=1e-10,
                               **kw)
    with open_device(options) as device:
        result, _ = compute(atom, options, device, keep_pair_energies=keep)
    return result


@pytest.mark.parametrize("atom, multiplicity, method, frozen", [
    (WATER, 1, "mp2", "none"), (WATER, 1, "scs-mp2", "auto"), (HYDROXYL, 2, "mp2", "auto"),
    (HYDROXYL, 2, "scs-mp2", "none"), (HYDROXYL, 2, "mp2", "rohf")],
    ids=["rhf", "rhf-scs-frozen", "uhf-frozen", "uhf-scs", "rohf"])
def test_gradient_run_energies_from_the_sweep_equal_the_pair_step(atom, multiplicity, method, frozen):
    """cpu fp64: the gradient run's energies (no pair step; summed by the sweep) equal the energy run's to
    1e-12 Eh, the per-pair matrices too, and what-ran says where they came from (ROHF: its semicanonical
    channels, the singles energy the energy's own)."""
    kw = {"reference": "rohf", "frozen": "auto"} if frozen == "rohf" else {"frozen": frozen}
    energy = _run(atom, multiplicity, False, keep=True, method=method, **kw)
    grad = _run(atom, multiplicity, True, keep=True, method=method, **kw)
    if frozen == "rohf":
        assert abs(energy.e_singles) > 1e-6
    assert grad.what_ran["pair_energies"].startswith(DEFERRED) and "pair_energies" not in energy.what_ran
    assert grad.what_ran["pair_blocks"] == 0 and energy.what_ran["pair_blocks"] > 0
    for key, value in energy.energies().items():
        assert abs(grad.energies()[key] - value) < 1e-12, key
    assert abs(grad.e_corr_ss) > 1e-3 and abs(grad.e_corr_os) > 1e-3
    assert len(grad.pair_energies) == len(energy.pair_energies)
    for got, expected in zip(grad.pair_energies, energy.pair_energies):
        assert np.max(np.abs(got - expected)) < 1e-13


@pytest.mark.parametrize("method, multiplicity", [("sos-mp2", 1), ("sos-mp2", 2)], ids=["rhf-sos", "uhf-sos"])
def test_pair_step_kept_where_the_sweep_cannot_sum_every_energy(method, multiplicity):
    """SOS-MP2 (no same-spin strips, or t̃ without τᵀ: no exchange sums) keeps the energy's pair step, and
    reports what it gives."""
    atom = WATER if multiplicity == 1 else HYDROXYL
    grad = _run(atom, multiplicity, True, method=method)
    energy = _run(atom, multiplicity, False, method=method)
    assert "pair_energies" not in grad.what_ran and grad.what_ran["pair_blocks"] > 0
    assert abs(grad.e_corr - energy.e_corr) < 1e-10


@pytest.mark.parametrize("multiplicity", [1, 2], ids=["rhf", "uhf"])
def test_fp32_gradient_run_energies_from_the_sweep(multiplicity):
    """cpu fp32: the sweep's fp32 tiles summed in fp64, as the pair step sums its own: the gradient run's
    energies within fp32 rounding of the fp32 energy run's (1e-8 Eh; the fp32 mode's bound against fp64 is
    1 µEh), and of the fp64 run's within that bound."""
    atom = WATER if multiplicity == 1 else HYDROXYL
    grad = _run(atom, multiplicity, True, precision="fp32")
    energy = _run(atom, multiplicity, False, precision="fp32")
    exact = _run(atom, multiplicity, False)
    assert grad.what_ran["pair_energies"].startswith(DEFERRED)
    for part in ("e_corr_os", "e_corr_ss"):
        assert abs(getattr(grad, part) - getattr(energy, part)) < 1e-8, part
        assert abs(getattr(grad, part) - getattr(exact, part)) < 1e-6, part


def _spins(rng, nspins: int, nocc=(5, 4), nvir=(7, 8)) -> list[SpinOrbitals]:
    out = []
    for s in range(nspins):
        e_occ = np.sort(rng.uniform(-2.0, -0.4, nocc[s]))
        e_vir = np.sort(rng.uniform(0.2, 3.0, nvir[s]))
        out.append(SpinOrbitals.from_active("" if nspins == 1 else ("alpha", "beta")[s], rng.normal(size=(12, nocc[s])), rng.normal(size=(12, nvir[s])),
                                            e_occ, e_vir))
    return out


@pytest.mark.parametrize("nspins, c_os, c_ss", [(1, 1.0, 1.0), (1, 1.2, 1 / 3), (1, 1.0, 0.01), (2, 1.0, 1.0),
                                                (2, 1.2, 1 / 3)],
                         ids=["rhf", "rhf-scs", "rhf-small-ss", "uhf", "uhf-scs"])
@pytest.mark.parametrize("strip, pair_block", [(0, 0), (2, 0), (2, 2)], ids=["whole", "strips", "pair-blocks"])
def test_sweep_energies_equal_pair_energies(nspins, c_os, c_ss, strip, pair_block):
    """The sweep's sums — whole strips, strips of two k, and B read as pairs of two-orbital blocks (each i
    block met n − 1 times) — against the energy's pair step on the same B, to 1e-13 relative."""
    _compare_sums(nspins, c_os, c_ss, strip, pair_block, "fp64", 1e-13)


@pytest.mark.parametrize("nspins, c_os, c_ss", [(1, 1.0, 1.0), (1, 1.2, 1 / 3), (1, 1.0, 0.01), (2, 1.2, 1 / 3)],
                         ids=["rhf", "rhf-scs", "rhf-small-ss", "uhf-scs"])
def test_fp32_sweep_energies_equal_pair_energies(nspins, c_os, c_ss):
    """fp32 tiles: the sweep's fp64 sums of T·τ and T·τᵀ within fp32 rounding (3e-7 relative) of the fp32
    pair step's, whatever the SCS coefficients (x is summed itself, not recovered from a difference that
    magnifies the rounding by c_direct/c_exch)."""
    _compare_sums(nspins, c_os, c_ss, 0, 0, "fp32", 3e-7)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("c_direct, c_exch", [(2.0, 1.0), (1.2 + 1 / 3, 1 / 3), (1.01, 0.01), (1.0, 0.0)],
                         ids=["rhf", "scs", "small-ss", "no-exchange"])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_pair_sums_of_one_tile(dtype, c_direct, c_exch, layout):
    """One pair's os = Σ T·τ and x = Σ T·τᵀ as the cpu sweep sums them — fp64 contiguous tiles through two dot
    products and x recovered from Σ T·t̃, fp32 or strided tiles each sum by itself in fp64 — against the
    definitions in fp64: 1e-12 relative (fp64, the recovered x included, c_exch down to 0.01), 3e-7 (fp32)."""
    from mp2trn.devices.cpu import _exchanged, _pair_sums

    rng = np.random.default_rng(3)
    nv = 9
    wide = rng.normal(size=(nv, 3 * nv)).astype(dtype)
    tau = np.ascontiguousarray(wide[:, :nv]) if layout == "contiguous" else wide[:, nv : 2 * nv]
    big_t = (rng.normal(size=(nv, nv)) * tau).astype(dtype)
    tilde = np.empty_like(tau) if layout == "contiguous" else np.empty_like(wide)[:, :nv]
    _exchanged(tau, c_direct, c_exch, np.empty((nv, nv), dtype=dtype), tilde)
    os_, x = _pair_sums(big_t, tau, tilde, c_direct, c_exch, bool(c_exch))
    t64, tau64 = big_t.astype(np.float64), tau.astype(np.float64)
    want_os, want_x = np.sum(t64 * tau64), np.sum(t64 * tau64.T)
    tol = 1e-12 if dtype == np.float64 else 3e-7
    scale = np.sum(np.abs(t64 * tau64))
    assert abs(os_ - want_os) < tol * scale
    assert (x is None) == (not c_exch) and (x is None or abs(x - want_x) < tol * scale)


def _compare_sums(nspins, c_os, c_ss, strip, pair_block, precision, tol):
    rng = np.random.default_rng(11 + nspins)
    spins = _spins(rng, nspins)
    naux = 20
    device = get_device("cpu", precision=precision)
    dtype = np.float64 if precision == "fp64" else np.float32
    with BStore(naux, spins, dtype, True) as store, BStore(naux, spins, np.float64, True) as gamma:
        for arr in store.arrays:
            arr[...] = rng.normal(scale=0.3, size=arr.shape)
        expected = pair_energies(store, spins, device, 3)
        got = densities.sweep(store, spins, device, strip or max(s.nocc for s in spins), c_os, c_ss, gamma,
                              pair_block=pair_block, energies=True).energies
    scale = abs(expected.e_os) + abs(expected.e_ss)
    assert abs(got.e_os - expected.e_os) < tol * abs(expected.e_os)
    assert abs(got.e_ss - expected.e_ss) < tol * abs(expected.e_ss)
    for a, b in zip(got.pair_os + got.pair_ss, expected.pair_os + expected.pair_ss):
        assert np.max(np.abs(a - b)) < tol * scale


def test_sweep_refuses_energies_it_cannot_sum():
    """Asked for energies the strips cannot give (SOS: no same-spin exchange sums) or on a device whose sweep
    does not sum them (sim: the mp2_density kernel returns no pair sums), the sweep says so instead of
    returning partial sums."""
    rng = np.random.default_rng(5)
    spins = _spins(rng, 1)
    with BStore(10, spins, np.float64, True) as store, BStore(10, spins, np.float64, True) as gamma:
        store.arrays[0][...] = rng.normal(size=store.arrays[0].shape)
        with pytest.raises(ValueError, match="pair energies"):
            densities.sweep(store, spins, get_device("cpu"), 5, 1.3, 0.0, gamma, energies=True)
        sim = get_device("sim", precision="fp32")
        assert not sim.sweep_energies and get_device("cpu", precision="fp32").sweep_energies
        with pytest.raises(ValueError, match="pair energies"):
            densities.sweep(store, spins, sim, 5, 1.0, 1.0, gamma, energies=True)


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_torch_sweep_energies_equal_its_pair_step(precision):
    """The cuda device's sweep (torch; here on the CPU) sums its pair energies as its pair step does
    (products in the compute dtype, sums in fp64): the same E_os and E_ss to 1e-12 (fp64) or fp32 rounding."""
    pytest.importorskip("torch")
    from mp2trn.devices.torch_backend import TorchDevice

    rng = np.random.default_rng(23)
    spins = _spins(rng, 2)
    device = TorchDevice(precision=precision, torch_device="cpu")
    assert device.sweep_energies
    dtype = np.float64 if precision == "fp64" else np.float32
    with BStore(16, spins, dtype, True) as store, BStore(16, spins, np.float64, True) as gamma:
        for arr in store.arrays:
            arr[...] = rng.normal(scale=0.3, size=arr.shape)
        expected = pair_energies(store, spins, device, 3)
        got = densities.sweep(store, spins, device, 2, 1.2, 1 / 3, gamma, energies=True).energies
    tol = 1e-12 if precision == "fp64" else 1e-6
    scale = abs(expected.e_os) + abs(expected.e_ss)
    assert abs(got.e_os - expected.e_os) < tol * scale and abs(got.e_ss - expected.e_ss) < tol * scale


@pytest.mark.parametrize("atom, multiplicity", [(WATER, 1), (HYDROXYL, 2)], ids=["rhf", "uhf"])
def test_gradient_run_energies_equal_pyscf_dfmp2(atom, multiplicity):
    """Independent of mp2trn's pair step: the gradient run's sweep-summed correlation energy equals PySCF's
    DF-MP2 on PySCF's own DF-SCF with the same orbital, JK-fit and RI bases (1e-8 Eh: the two SCFs converge
    separately)."""
    from pyscf import df, gto
    from pyscf.mp import dfmp2, dfump2

    from mp2trn.validation.pyscf_reference import pyscf_scf_energy

    grad = _run(atom, multiplicity, True)
    assert grad.what_ran["pair_energies"].startswith(DEFERRED)
    mol = gto.M(atom=atom, basis="cc-pvdz", spin=multiplicity - 1, verbose=0)
    mf = pyscf_scf_energy(mol, grad.what_ran["bases"]["jkfit"]["name"])
    pt = (dfump2.DFUMP2 if mol.spin else dfmp2.DFMP2)(mf)
    pt.with_df = df.DF(mol, auxbasis=grad.what_ran["bases"]["rifit"]["name"])
    pt.verbose = 0
    pt.kernel(with_t2=False)
    assert abs(grad.e_hf - mf.e_tot) < 1e-8
    assert abs(grad.e_corr - pt.e_corr) < 1e-8
