"""kernels/mp2_density.py (the gradient's pair step: amplitudes on chip, Γ̄ rows and the density sums out)
against its NumPy reference, the reference against the contract written out with whole 4-index tensors, the
``sim`` device against ``cpu``, and a water gradient on ``sim`` against ``cpu``."""

from __future__ import annotations

import numpy as np
import pytest

import mp2trn
from mp2trn.devices import get_device
from mp2trn.kernels.mp2_density import density_plan, mp2_density, mp2_density_reference, u_coefficients

from .conftest import molecule_path
from .kernel_helpers import run

#: (c_direct, c_exch) of the strips' spin cases: RHF MP2, same-spin (SCS c_ss), opposite-spin (SOS c_os)
RHF, SAME, OPPOSITE = (2.0, 1.0), (1 / 3, 1 / 3), (1.3, 0.0)


def _strip(rng: np.random.Generator, naux: int, ni: int, nk: int, nva: int, nvb: int):
    """Random B of every i (naux, ni, nva) and of a k block (naux, nk, nvb) and orbital energies."""
    b_all = rng.standard_normal((naux, ni, nva)) * 0.1
    b_k = rng.standard_normal((naux, nk, nvb)) * 0.1
    e_all = -np.sort(rng.uniform(0.3, 2.0, ni))
    e_k = -np.sort(rng.uniform(0.3, 2.0, nk))
    ev_all = np.sort(rng.uniform(0.1, 5.0, nva))
    ev_k = ev_all if nva == nvb else np.sort(rng.uniform(0.1, 5.0, nvb))
    return b_all, b_k, e_all, e_k, ev_all, ev_k


def _contract(b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch):
    """The contract of Device.pair_densities with the whole τ_ik^ab tensor (small sizes only)."""
    d = (e_all[:, None, None, None] + e_k[None, :, None, None] - ev_all[None, None, :, None]
         - ev_k[None, None, None, :])
    tau = np.einsum("qia,qkb->ikab", b_all, b_k) / d
    tt = c_direct * tau - c_exch * tau.transpose(0, 1, 3, 2) if c_exch else c_direct * tau
    return (np.einsum("ikab,qia->qkb", tt, b_all), np.einsum("ikab,jkab->ij", tau, tt),
            np.einsum("ikab,ikcb->ac", tau, tt), np.einsum("ikab,ikac->bc", tau, tt))


def _kernel_args(b_all, b_k, e_all, e_k, ev_all, ev_k):
    """The kernel's inputs as the NKI device prepares them (fp32, aux-major)."""
    naux = b_all.shape[0]
    return (b_all.reshape(naux, -1).astype(np.float32), b_k.reshape(naux, -1).astype(np.float32),
            ev_all.reshape(-1, 1).astype(np.float32), (-e_all).reshape(1, -1).astype(np.float32),
            (ev_k[None, :] - e_k[:, None]).astype(np.float32))


def _rel(got, ref) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("coeffs,nva,nvb,vir_k", [(RHF, 9, 9, False), (SAME, 8, 8, False), (OPPOSITE, 7, 11, True),
                                                  (RHF, 6, 6, True)])
def test_reference_is_the_contract(coeffs, nva, nvb, vir_k):
    rng = np.random.default_rng(nva * nvb)
    strip = _strip(rng, 23, 5, 3, nva, nvb)
    gamma, p_occ, p_vir_all, p_vir_k = mp2_density_reference(*strip, *coeffs, vir_k)
    want = _contract(*strip, *coeffs)
    for got, ref in zip((gamma, p_occ, p_vir_all), want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14 * np.max(np.abs(ref)))
    if vir_k:
        np.testing.assert_allclose(p_vir_k, want[3], rtol=1e-12, atol=1e-14 * np.max(np.abs(want[3])))
    else:
        assert p_vir_k is None


def test_u_vectors_give_p_occ():
    """⟨α σ_i + β σ_iᵀ, α σ_i' + β σ_i'ᵀ⟩ = ⟨σ_i, c_d σ_i' − c_x σ_i'ᵀ⟩: the identity the kernel's p_occ uses."""
    rng = np.random.default_rng(3)
    sig = rng.standard_normal((4, 6, 6))
    for c_d, c_x in (RHF, SAME, OPPOSITE, (1.2 + 1 / 3, 1 / 3)):
        a, b = u_coefficients(c_d, c_x)
        u = a * sig + b * sig.transpose(0, 2, 1)
        want = np.einsum("iab,jab->ij", sig, c_d * sig - c_x * sig.transpose(0, 2, 1))
        np.testing.assert_allclose(np.einsum("iab,jab->ij", u, u), want, rtol=1e-12, atol=1e-12)


# (naux, ni, nk, nva, nvb, coefficients, vir_k, plan): plan None = the kernel's own, else
# (resident, i_block, i_group, b_buffers)
CASES = [
    (84, 5, 3, 19, 19, RHF, False, None),                   # water-like strip: resident u store
    (84, 5, 3, 19, 19, RHF, False, (False, 2, 3, 1)),          # the stream pass: three i blocks, grouped B loads
    (200, 7, 1, 150, 150, SAME, False, None),               # nk = 1, ni odd, nva > 128, naux not a multiple of 128
    (200, 7, 1, 150, 150, SAME, False, (False, 7, 2, 2)),      # the same through the stream pass (tile pairs)
    (130, 3, 2, 140, 70, OPPOSITE, True, None),             # UHF αβ: nva ≠ nvb, no exchange, p_vir_k
    (130, 3, 2, 140, 70, OPPOSITE, True, (False, 2, 1, 1)),    # … stream pass: every [a, b] block on its own
    (256, 2, 2, 128, 128, RHF, True, None),                 # exact tiles
    (100, 2, 1, 512, 512, RHF, True, (False, 2, 1, 2)),        # nvb = 512: one PSUM bank of columns
    (70, 1, 2, 520, 520, SAME, False, None),                # nv > 512: columns in two PSUM banks, ni = 1
]


@pytest.mark.parametrize("naux,ni,nk,nva,nvb,coeffs,vir_k,plan", CASES)
def test_kernel_matches_reference(naux, ni, nk, nva, nvb, coeffs, vir_k, plan):
    rng = np.random.default_rng(naux + ni * nva + nk)
    strip = _strip(rng, naux, ni, nk, nva, nvb)
    kw = dict(c_direct=coeffs[0], c_exch=coeffs[1], vir_k=vir_k)
    if plan is not None:
        kw.update(resident=plan[0], i_block=plan[1], i_group=plan[2], b_buffers=plan[3])
    out, rep = run(mp2_density, *_kernel_args(*strip), **kw)
    ref = mp2_density_reference(*strip, *coeffs, vir_k)
    assert len(out) == (4 if vir_k else 3)
    assert out[0].shape == (naux, nk * nvb) and out[1].shape == (ni, ni) and out[2].shape == (nva, nva)
    assert _rel(out[0].reshape(naux, nk, nvb), ref[0]) < 1e-5
    for got, want in zip(out[1:], ref[1:]):
        assert _rel(got, want) < 1e-5
    # only Γ̄ rows and the density sums leave the chip; the amplitudes never do
    n_out = naux * nk * nvb + ni * ni + nva * nva + (nvb * nvb if vir_k else 0)
    assert rep.bytes_sbuf_to_hbm == 4 * n_out
    assert rep.spill_save_bytes == 0


def test_stream_pass_equals_resident_store():
    """Both p_occ plans give the same densities (to fp32 rounding); the stream pass forms T once more."""
    rng = np.random.default_rng(11)
    strip = _strip(rng, 150, 6, 2, 40, 40)
    args = _kernel_args(*strip)
    res, rep_r = run(mp2_density, *args, c_direct=2.0, c_exch=1.0, resident=True, i_block=6)
    stream, rep_s = run(mp2_density, *args, c_direct=2.0, c_exch=1.0, resident=False, i_block=6, i_group=3)
    np.testing.assert_array_equal(res[0], stream[0])       # gamma and p_vir: the same main pass
    np.testing.assert_array_equal(res[2], stream[2])
    np.testing.assert_allclose(res[1], stream[1], rtol=1e-5, atol=1e-6 * np.max(np.abs(res[1])))
    assert rep_s.flops > rep_r.flops


def test_plan_fits_each_generation():
    for sbuf in (180224, 212984):
        budget = int(0.85 * sbuf)
        assert density_plan(84, 5, 3, 19, 19, True, False, budget) == (True, 5, 1, 2)   # small: resident
        resident, i_block, i_group, b_buffers = density_plan(1500, 40, 8, 300, 300, True, False, budget)
        assert not resident and i_block == 40 and i_group >= 2 and b_buffers == 2      # one i block, stream pass
        resident, i_block, _, _ = density_plan(1500, 300, 8, 300, 300, True, False, budget)
        assert not resident and 1 <= i_block <= 128
        assert density_plan(1500, 40, 8, 600, 600, True, False, budget)[3] == 1         # one B_i buffer


def test_representative_launch_stays_in_sbuf():
    """A launch of the planned size runs in strict mode (no spills): SBUF and PSUM within each target."""
    rng = np.random.default_rng(2)
    strip = _strip(rng, 300, 12, 2, 300, 300)
    for target, sbuf in (("trn1", 180224), ("trn2", 212984)):
        resident, i_block, i_group, b_buffers = density_plan(300, 12, 2, 300, 300, True, True, int(0.85 * sbuf))
        out, rep = run(mp2_density, *_kernel_args(*strip), c_direct=2.0, c_exch=1.0, vir_k=True, resident=resident,
                       i_block=i_block, i_group=i_group, b_buffers=b_buffers, target=target)
        assert rep.peak_sbuf_bytes <= 0.85 * sbuf
        assert rep.bottleneck == "tensor"
    ref = mp2_density_reference(*strip, 2.0, 1.0, True)
    for got, want in zip(out[1:], ref[1:]):
        assert _rel(got, want) < 1e-5


@pytest.mark.parametrize("coeffs,nv_k,vir_k", [(RHF, 30, False), (SAME, 30, False), (OPPOSITE, 25, True)])
def test_sim_device_matches_cpu(coeffs, nv_k, vir_k):
    """``sim``'s pair_densities (one launch, k block padded) against the cpu reference device."""
    rng = np.random.default_rng(nv_k)
    b_all, b_k, e_all, e_k, ev_all, ev_k = _strip(rng, 150, 6, 3, 30, nv_k)
    cpu = get_device("cpu").pair_densities(b_all, b_k, e_all, e_k, ev_all, ev_k, *coeffs, vir_k)
    sim = get_device("sim")
    sim._bucket(("grad_pairs_k", 150, 6, 30, nv_k, coeffs[1] != 0.0), 5)     # an earlier, longer strip
    got = sim.pair_densities(b_all.astype(np.float32), b_k.astype(np.float32), e_all, e_k, ev_all, ev_k, *coeffs,
                             vir_k)
    assert got.gamma_k.shape == (150, 3, nv_k) and got.gamma_k.dtype == np.float64
    for name in ("gamma_k", "p_occ", "p_vir_all") + (("p_vir_k",) if vir_k else ()):
        assert _rel(getattr(got, name), getattr(cpu, name)) < 1e-5, name
    assert got.p_vir_k is None if not vir_k else got.p_vir_k.shape == (nv_k, nv_k)
    assert sim.cost_report()["launches_by_stage"] == {"grad_pairs": 1}


def test_compensated_mode_runs_the_fp32_kernel_and_says_so():
    """fp32x3 has no compensated mp2_density: the gradient's pair step runs the fp32 kernel, the device says
    so, and the gradient stays within the fp32x3 target (1e-5 Eh/bohr) of the cpu's."""
    sim = get_device("sim", precision="fp32x3")
    assert sim.pair_densities_precision == "fp32" and get_device("cpu").pair_densities_precision == "fp64"
    cpu = mp2trn.run(molecule_path("water"), device="cpu", gradient=True)
    x3 = mp2trn.run(molecule_path("water"), device="sim", precision="fp32x3", gradient=True)
    assert x3.what_ran["gradient_pairs"] == "sim (fp32)" and x3.what_ran["precision"] == "fp32x3"
    assert np.max(np.abs(np.asarray(x3.gradient) - np.asarray(cpu.gradient))) < 1e-5


@pytest.mark.parametrize("name", ["water", "hydroxyl"])     # RHF; UHF (same- and opposite-spin strips)
def test_gradient_on_sim_matches_cpu(name):
    cpu = mp2trn.run(molecule_path(name), device="cpu", gradient=True)
    sim = mp2trn.run(molecule_path(name), device="sim", gradient=True)
    assert np.max(np.abs(np.asarray(sim.gradient) - np.asarray(cpu.gradient))) < 1e-5
    assert sim.cost["launches_by_stage"]["grad_pairs"] >= 1
    assert "grad_pairs" in sim.cost["stages"]
