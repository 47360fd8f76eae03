"""The orbital response's Z-vector on the gradient's device (mp2trn.grad.cpks.ResponseJK through
Device.response_gemm): the products against the host's fp64 ones, the preconditioner's diagonal against the
Hessian's, and the sim gradient with the device Z-vector against the same gradient with the host's."""

from __future__ import annotations

import numpy as np
import pytest
from pyscf import gto, scf

import mp2trn
from mp2trn.devices import get_device
from mp2trn.devices.nki_device import SIGNATURE_BOUND, _response_kernel
from mp2trn.grad import cpks, dfmp2, response
from mp2trn.grad.orbitals import channels
from mp2trn.orbitals import select_frozen

WATER = "O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45"
HYDROXYL = "O 0 0 0; H 0.1 0 1.05"


def _mean_field(atom: str, spin: int):
    mol = gto.M(atom=atom, basis="cc-pvdz", spin=spin, verbose=0)
    return (scf.RHF(mol) if spin == 0 else scf.UHF(mol)).density_fit(auxbasis="cc-pvdz-jkfit").run(conv_tol=1e-11)


@pytest.fixture(scope="module", params=[(WATER, 0), (HYDROXYL, 1)], ids=["rhf", "uhf"])
def system(request):
    mf = _mean_field(*request.param)
    chans = channels(mf, select_frozen(mf, "auto"))
    return mf, chans, cpks.ResponseJK.build(mf, chans, 2000)


def _random_z(chans, seed=5):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(c.nvir, len(c.occ))) for c in chans]


@pytest.mark.parametrize("device, precision, tol", [("sim", "fp32", 3e-5), ("sim", "fp32x3", 1e-7)])
def test_device_products_equal_host_fp64_ones(system, device, precision, tol):
    """Each Z-vector product through the device's GEMMs (five per channel) equals the host fp64 product to the
    precision's accuracy, relative to the product's largest element; the blocks travel to the device once;
    the G[X] columns likewise."""
    mf, chans, host = system
    dev = get_device(device, precision)
    on_device = cpks.ResponseJK.build(mf, chans, 2000, dev)
    # the MO blocks were made on the device from the tensor's rows, sent as an fp32 pair (8 bytes per
    # element; the orbitals' planes besides)
    made = dev.transfer_record()["zvector"]["to_device"]
    # moving planes of C_occ against [C_occ C_vir] (oo, ov), then of C_vir against C_vir (vv)
    orbitals = sum(10 * host.nao * (2 * len(c.occ) + 3 * c.nvir) for c in chans)
    assert made == 8 * host.naux * host.nao ** 2 + orbitals      # once for both spins
    for a, b in zip(on_device.b_vv + on_device.b_ov + on_device.b_oo, host.b_vv + host.b_ov + host.b_oo):
        assert np.max(np.abs(a - b)) < 1e-8 * np.max(np.abs(b))     # compensated in every precision
    zs = _random_z(chans)
    moved = []
    for _ in range(2):
        for a, b in zip(on_device.zvector(zs), host.zvector(zs)):
            assert np.max(np.abs(a - b)) < tol * np.max(np.abs(b))
        moved.append(dev.transfer_record()["zvector"]["to_device"] - made)
    assert on_device.describe() == {"device": device, "precision": precision, "products": 2,
                                    "gemm_launches": 2 * 5 * len(chans), "preconditioner": cpks.NOT_USED}
    # the first product sent the five kept layouts it reads and its host operands, the second only the latter
    # (fp32x3: hi and lo of each layout, and the full plane of the two that are also moving operands)
    blocks = sum(3 * ov.size + oo.size + vv.size for oo, ov, vv in
                 zip(host.b_oo, host.b_ov, host.b_vv)) * (4 if precision == "fp32" else 6)
    if precision == "fp32x3":
        blocks += sum(ov.size + oo.size for oo, ov in zip(host.b_oo, host.b_ov)) * 4
    assert moved[0] - (moved[1] - moved[0]) == blocks
    # a product sends z and zᵀ (stationary: fp32x3 hi + lo) and ρ (moving: hi, lo, x); M and Y
    # (naux·nocc·(nocc + nvir)) stay in device memory
    per_product = sum(2 * z.size * (4 if precision == "fp32" else 6) + host.naux * (4 if precision == "fp32" else 10)
                      for z in zs)
    assert moved[1] - moved[0] == per_product
    rng = np.random.default_rng(2)
    mats = [(lambda m: m + m.T)(rng.normal(size=(c.nmo, c.nmo))) for c in chans]
    for a, b in zip(on_device.occupied_columns(mats), host.occupied_columns(mats)):
        assert np.max(np.abs(a - b)) < tol * np.max(np.abs(b))
    # every kernel shape the response uses (products, G[X] columns, blocks) within the compile bound
    assert len(dev.launcher.signatures["zvector"]) <= SIGNATURE_BOUND["zvector"]


def test_torch_device_products_equal_host_ones(system):
    """The cuda device's code path (torch, here its CPU build) in fp64."""
    pytest.importorskip("torch")
    from mp2trn.devices.torch_backend import TorchDevice

    mf, chans, host = system
    on_device = cpks.ResponseJK.build(mf, chans, 2000, TorchDevice("fp64", "cpu"))
    zs = _random_z(chans)
    for a, b in zip(on_device.zvector(zs), host.zvector(zs)):
        assert np.max(np.abs(a - b)) < 1e-12


def test_preconditioner_is_the_orbital_hessians_diagonal(system):
    """ResponseJK.diagonal equals the diagonal of (ε_a − ε_k) + G[Z + Zᵀ] applied to unit vectors."""
    mf, chans, host = system
    diag = host.diagonal()
    sizes = [c.nvir * len(c.occ) for c in chans]
    picks = np.random.default_rng(0).choice(sum(sizes), 12, replace=False)
    for k in picks:
        unit = np.zeros(sum(sizes))
        unit[k] = 1.0
        zs, start = [], 0
        for c, n in zip(chans, sizes):
            zs.append(unit[start:start + n].reshape(c.nvir, len(c.occ)))
            start += n
        column = np.concatenate([g.ravel() for g in host.zvector(zs)])
        energies = np.concatenate([(c.e[c.vir][:, None] - c.e[c.occ][None, :]).ravel() for c in chans])
        assert abs(energies[k] + column[k] - diag[k]) < 1e-12


def test_woodbury_preconditioner_is_coulomb_plus_diagonal(system):
    """ResponseJK.preconditioner() inverts M = the Hessian's Coulomb part off the diagonal and the Hessian's
    diagonal on it: M built column by column from M⁻¹ against the Coulomb part from PySCF's own DF tensor
    (2w Σ_Q (Q|ak)(Q|bj), over both spins for UHF), and M⁻¹ symmetric positive definite."""
    from pyscf import lib

    mf, chans, host = system
    apply = host.preconditioner()
    assert host.describe()["preconditioner"] == cpks.PRECONDITIONER
    n = sum(c.nvir * len(c.occ) for c in chans)
    m_inv = np.column_stack([apply(np.eye(n)[:, k]) for k in range(n)])
    np.testing.assert_allclose(m_inv, m_inv.T, atol=1e-12 * np.abs(m_inv).max())
    assert np.linalg.eigvalsh(m_inv).min() > 0
    cderi = lib.unpack_tril(np.asarray(mf.with_df._cderi))             # (Q, μ, ν), any factor of the metric
    u = np.concatenate([np.sqrt(2.0 * c.weight) * np.einsum("qmn,ma,nk->akq", cderi, c.c[:, c.vir], c.c[:, c.occ])
                        .reshape(-1, len(cderi)) for c in chans])
    coulomb = u @ u.T
    m = np.linalg.inv(m_inv)
    off = ~np.eye(n, dtype=bool)
    # to fp32 rounding: S's syrk runs in fp32 (a preconditioner only steers the fp64 solve)
    assert np.abs(m - coulomb)[off].max() < 1e-6 * np.abs(coulomb).max()
    # on the diagonal: the Hessian's, where the rest of it (D_x, without the Coulomb part) stays above its
    # floor of a tenth of ε_a − ε_k (hydroxyl: a few elements below it)
    gaps = np.concatenate([(c.e[c.vir][:, None] - c.e[c.occ][None, :]).ravel() for c in chans])
    want = np.maximum(host.diagonal() - np.diag(coulomb), 0.1 * gaps) + np.diag(coulomb)
    np.testing.assert_allclose(np.diag(m), want, rtol=1e-6)


def test_preconditioner_with_a_channel_without_occupied_orbitals():
    """Triplet H₂ (UHF): the β channel has no occupied orbitals and no unknowns; M⁻¹ is still applied over
    the α ones, finite and symmetric."""
    mol = gto.M(atom="H 0 0 0; H 0 0 0.74", basis="cc-pvdz", spin=2, verbose=0)
    mf = scf.UHF(mol).density_fit(auxbasis="cc-pvdz-jkfit").run(conv_tol=1e-11)
    chans = channels(mf, select_frozen(mf, "auto"))
    assert [len(c.occ) for c in chans] == [2, 0]
    apply = cpks.ResponseJK.build(mf, chans, 2000).preconditioner()
    x, y = np.random.default_rng(0).standard_normal((2, chans[0].nvir * 2))
    assert np.all(np.isfinite(apply(x)))
    assert abs(x @ apply(y) - y @ apply(x)) < 1e-12 * np.linalg.norm(x) * np.linalg.norm(y)


def test_preconditioner_declined_is_recorded_as_the_diagonal(system):
    """Where some ε_a − ε_k is not positive (a non-aufbau SCF) the Woodbury factor is declined, the solver
    divides by the diagonal, and what-ran says so instead of naming the Woodbury preconditioner."""
    import copy

    _, chans, host = system
    shifted = copy.copy(host)
    shifted.chans = [copy.copy(c) for c in chans]
    c = shifted.chans[0]
    c.e = c.e.copy()
    c.e[c.vir[0]] = c.e[c.occ[-1]] - 0.01            # the lowest virtual below the highest occupied
    assert shifted.preconditioner() is None
    assert shifted.describe()["preconditioner"] == cpks.DIAGONAL


def test_sim_gradient_with_device_zvector_equals_host_zvector(monkeypatch):
    """Water on sim (fp32): the gradient whose Z-vector ran on the device is within 1e-6 Eh/bohr of the same
    run's gradient with the Z-vector's products on the host in fp64, and of the cpu fp64 gradient (Γ's AO
    back-transformation on the device too); what-ran and the cost report say where they ran."""
    kw = dict(basis="cc-pvdz", gradient=True, conv_tol=1e-12, device="sim", precision="fp32", frozen="auto")
    device_run = mp2trn.run(gto.M(atom=WATER, basis="cc-pvdz", verbose=0), **kw)
    ran = device_run.what_ran["zvector"]
    assert (ran["device"], ran["precision"]) == ("sim", "fp32")
    # refined by the host's fp64 products of the same blocks (one per cycle) to the fp64 solve's residual
    refined = ran["refined_by"]
    assert (refined["device"], refined["precision"]) == ("cpu", "fp64") and refined["products"] >= 1
    assert ran["products"] + refined["products"] == ran["iterations"] and ran["residual"] < response.ZVECTOR_TOL
    # five GEMMs per product, eight for G[P]'s columns (the Lagrangian's virtual rows and W's occupied ones),
    # three for the z part's occupied block
    assert ran["gemm_launches"] == 5 * ran["products"] + 8 + 3
    # and the MO blocks' launches (per row chunk of the tensor — water has one —, resplit_x3 making the
    # rows' planes on the chip, then the compensated AO→MO kernel twice: oo and ov, then vv)
    assert device_run.cost["launches_by_stage"]["zvector"] == ran["gemm_launches"] + 3
    assert device_run.cost["host_device_bytes"]["zvector"]["to_device"] > 0
    for stage in ("zvector", "grad_gamma"):     # few NEFF compiles on Trainium
        assert device_run.cost["compiles_by_stage"][stage] <= SIGNATURE_BOUND[stage]
    assert device_run.what_ran["gradient_gamma_ao"] == "sim (fp32)" and device_run.cost["launches_by_stage"]["grad_gamma"]
    cpu_run = mp2trn.run(gto.M(atom=WATER, basis="cc-pvdz", verbose=0), **{**kw, "device": "cpu", "precision": "fp64"})
    assert cpu_run.what_ran["gradient_gamma_ao"] == "cpu (fp64)"
    assert np.max(np.abs(device_run.gradient - cpu_run.gradient)) < 1e-6

    class HostResponse(cpks.ResponseJK):
        def __init__(self, mf, chans, tensor, device=None):
            super().__init__(mf, chans, tensor, None)

    monkeypatch.setattr(dfmp2, "ResponseJK", HostResponse)
    host_run = mp2trn.run(gto.M(atom=WATER, basis="cc-pvdz", verbose=0), **kw)
    assert host_run.what_ran["zvector"]["device"] == "cpu"
    assert host_run.what_ran["zvector"]["preconditioner"] == cpks.PRECONDITIONER
    assert np.max(np.abs(device_run.gradient - host_run.gradient)) < 1e-6


def test_device_zvector_that_stalls_is_solved_again_on_the_host_and_recorded(system, monkeypatch):
    """When the device's products do not converge (a near-singular Hessian: sim fp32x3 hydroxyl at --conv-tol
    1e-10), relax solves again with the host's fp64 GEMMs of the same blocks, warns, and records why."""
    from mp2trn.errors import ConvergenceError
    from mp2trn.grad import response

    mf, chans, host = system
    on_device = cpks.ResponseJK.build(mf, chans, 2000, get_device("sim", "fp32"))
    solve = response.solve_zvector

    def stalls_on_sim(products, *args, **kwargs):
        if products.describe()["device"] == "sim":
            raise ConvergenceError("stalled")
        return solve(products, *args, **kwargs)

    monkeypatch.setattr(response, "solve_zvector", stalls_on_sim)
    rng = np.random.default_rng(4)
    sym = lambda n: (lambda m: (m + m.T) / 10)(rng.normal(size=(n, n)))   # noqa: E731
    p_occ, p_vir, x = [sym(c.nact) for c in chans], [sym(c.nvir) for c in chans], [sym(c.nmo) for c in chans]
    with pytest.warns(UserWarning, match="solved again with host fp64 products"):
        got = response.relax(on_device, chans, p_occ, p_vir, x)
    # the same blocks (made on the device, compensated: within ~1e-9 of the host's, which this random,
    # near-singular system — a solution 1e5 times its right-hand side — would amplify) through host GEMMs
    same_blocks = on_device.on_host()
    assert same_blocks.describe()["device"] == "cpu" and same_blocks.precision == "fp64"
    want = response.relax(same_blocks, chans, p_occ, p_vir, x)
    assert "fp32 products on sim did not converge" in got.fallback and want.fallback is None
    # what-ran names the products that made z, their own count, and the failed ones beside them
    assert (got.zvector["device"], got.zvector["precision"]) == ("cpu", "fp64")
    assert got.zvector["products"] == got.iterations and got.zvector["failed"]["device"] == "sim"
    for a, b in zip(got.p_relaxed, want.p_relaxed):
        assert np.max(np.abs(a - b)) < 1e-5 * np.max(np.abs(b))


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-6), ("fp32x3", 1e-8)])
def test_a_contraction_longer_than_sbuf_holds_is_split_over_launches(precision, tol):
    """The response's products contract over naux·nvir rows: past what one M tile's panel holds in SBUF
    (Vitamin C/cc-pVDZ's 165 888 rows stopped the whole-run benchmark), the device splits K over launches
    and adds them in fp64; one launch of the whole K breaks the capacity rule."""
    from mp2trn.errors import KernelConstraintError

    dev = get_device("sim", precision)
    m, n = 130, 8
    rows = dev.plan.gemm_k_rows(m, n)
    rng = np.random.default_rng(3)
    a_t, b = rng.normal(size=(rows + 300, m)), rng.normal(size=(rows + 300, n))
    ref = a_t.T @ b
    out = dev.response_gemm(dev.response_operand(a_t), b)
    assert dev.launcher.launches["zvector"] == 2
    # relative to Σ_k |a_k||b_k| (random signs cancel): fp32 rounding, and 2^-β of it compensated
    assert np.max(np.abs(out - ref) / (np.abs(a_t).T @ np.abs(b))) < tol
    big = get_device("sim", precision)
    too_long = np.concatenate([a_t] * 3)
    with pytest.raises(KernelConstraintError, match="capacity"):
        big.launcher.launch("zvector", _response_kernel(big.mode.compensated),
                            (*big.mode.split_operand(too_long, axis=0, moving=False),
                             *big.mode.split_operand(np.concatenate([b] * 3), axis=0, moving=True)), {})


@pytest.mark.slow
def test_near_singular_device_zvector_gradient_stays_accurate():
    """Hydroxyl on sim fp32x3 at conv_tol 1e-10 (linear OH: a near-singular orbital Hessian). Whether the
    device's products converge or stall — a stall stops the solve (ZVECTOR_STALL), the host's fp64 products
    of the device-made blocks take over, a warning and what-ran say so; which one happens has moved with the
    preconditioner's rounding (tests/test_zvector_device.py's fast stall test forces the fallback) — the
    gradient is within 1e-6 Eh/bohr of cpu fp64."""
    import warnings

    kw = dict(basis="cc-pvdz", gradient=True, conv_tol=1e-10, frozen="auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = mp2trn.run(gto.M(atom=HYDROXYL, basis="cc-pvdz", spin=1, verbose=0), device="sim", precision="fp32x3", **kw)
    fell_back = [w for w in caught if "solved again with host fp64 products" in str(w.message)]
    if fell_back:
        assert "stalled" in sim.what_ran["zvector"]["fallback"] and sim.what_ran["zvector"]["device"] == "cpu"
    else:
        assert "fallback" not in sim.what_ran["zvector"] and sim.what_ran["zvector"]["device"] == "sim"
    assert sim.what_ran["zvector_residual"] < response.ZVECTOR_TOL
    cpu = mp2trn.run(gto.M(atom=HYDROXYL, basis="cc-pvdz", spin=1, verbose=0), device="cpu", precision="fp64", **kw)
    assert np.max(np.abs(sim.gradient - cpu.gradient)) < 1e-6


@pytest.mark.parametrize("k,m,n", [(640, 8, 3), (40, 8, 3), (640, 3, 8)])
def test_cpu_response_gemm_forms_agree(k, m, n):
    """The cpu device's product (as (bᵀ a_t)ᵀ when the inner dimension is long and b narrow) equals a_tᵀ b."""
    from mp2trn.devices.base import Device
    from mp2trn.devices.cpu import CpuDevice

    rng = np.random.default_rng(k + m + n)
    a_t, b = rng.standard_normal((k, m)), rng.standard_normal((k, n))
    got = CpuDevice().response_gemm(a_t, b)
    assert got.flags.c_contiguous
    np.testing.assert_allclose(got, Device.response_gemm(CpuDevice(), a_t, b), rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("k,m", [(9, 4), (4, 9)])
def test_cpu_grouped_forms_agree(k, m, monkeypatch):
    """The cpu device's grouped product (k > m: GEMMs over chunks of groups, here 2 groups a chunk, the last
    alone; else batched) equals the base class's batched one."""
    import mp2trn.devices.cpu as cpu
    from mp2trn.devices.base import Device

    width, groups = 3, 5
    monkeypatch.setattr(cpu, "_GROUPED_CHUNK_BYTES", 2 * 8 * m * width)
    rng = np.random.default_rng(k)
    a_t = rng.standard_normal((k, m))
    # b contiguous, and as the response keeps it: a transposed view of ((Q, j), k) rows
    for b in (rng.standard_normal((k, groups * width)), rng.standard_normal((groups * width, k)).T):
        got = cpu.CpuDevice().response_grouped(a_t, b, width)
        np.testing.assert_allclose(got, Device.response_grouped(cpu.CpuDevice(), a_t, b, width), rtol=1e-13,
                                   atol=1e-13)
