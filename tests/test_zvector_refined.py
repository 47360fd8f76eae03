"""The Z-vector's inner solves in reduced precision refined by fp64 products (mp2trn.grad.response.solve_zvector's
``exact``; on the cpu, ResponseJK.reduced: an fp32 copy of the MO blocks beside the fp64 ones, counted by the
gradient's memory plan): the solution against the fp64 solve's, the gradient against the fp64-only one, the
plan's room for the copy, and the cpu device's fp32 products against its fp64 ones."""

from __future__ import annotations

import numpy as np
import pytest
from pyscf import gto, scf

import mp2trn
from mp2trn.devices.cpu import CpuDevice
from mp2trn.errors import ConvergenceError
from mp2trn.grad import cpks, response
from mp2trn.grad.orbitals import channels
from mp2trn.memory import ChannelShape, GradientSizes, plan_gradient
from mp2trn.orbitals import select_frozen

WATER = "O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45"
# a bent radical: linear OH's UHF Hessian has a zero mode (the singly occupied π turned into its partner), on
# which a random right-hand side has no solution at all
AMINO = "N 0 0 0; H 0 0.8 0.62; H 0 -0.8 0.62"


@pytest.fixture(scope="module", params=[(WATER, 0), (AMINO, 1)], ids=["rhf", "uhf"])
def system(request):
    atom, spin = request.param
    mol = gto.M(atom=atom, basis="cc-pvdz", spin=spin, verbose=0)
    mf = (scf.RHF(mol) if spin == 0 else scf.UHF(mol)).density_fit(auxbasis="cc-pvdz-jkfit").run(conv_tol=1e-11)
    chans = channels(mf, select_frozen(mf, "auto"))
    return mf, chans, cpks.ResponseJK.build(mf, chans, 2000)


def _lagrangian(chans, seed=7):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(c.nvir, len(c.occ))) for c in chans]


def test_cpu_reduced_products_are_fp32_of_the_same_blocks(system):
    """The cpu's reduced copy runs each product in fp32 (within fp32 rounding of the fp64 product), says so,
    shares the fp64 blocks and counts its own products; a copy of a copy is not offered."""
    _, chans, fp64 = system
    fp32 = fp64.reduced()
    assert fp32.precision == "fp32" and fp64.precision == "fp64" and fp32.b_vv[0] is fp64.b_vv[0]
    assert fp32.device.reduced_response() is None and fp32.on_host() is not None
    zs = _lagrangian(chans)
    for a, b in zip(fp32.zvector(zs), fp64.zvector(zs)):
        assert a.dtype == np.float64
        assert 1e-9 < np.max(np.abs(a - b)) < 1e-5 * np.max(np.abs(b))    # fp32, not fp64 in disguise
    assert fp32.describe()["products"] == 1 and fp32.describe()["precision"] == "fp32"


def test_reduced_copy_shares_one_fp32_copy_between_layouts_of_one_block(system):
    """B_ov kept as ((Q, i), a) rows, as (Q, (i, a)) and transposed as (a, (Q, i)) is one block: the reduced
    copy converts it once and views it in every layout (B_oo likewise); what it keeps is the bytes the memory
    plan counts."""
    _, chans, fp64 = system
    kept = fp64.reduced()._kept
    for k in kept:
        assert np.shares_memory(k["ov_rows"], k["ov_by_aux"]) and np.shares_memory(k["oo_rows"], k["oo_by_aux"])
        assert np.shares_memory(k["ov_rows"], k["vo_by_vir"]) and k["vo_by_vir"].T.flags.c_contiguous
        assert np.shares_memory(k["oo_rows"], k["oo_by_occ"])
    unique = {id(np.asarray(a).base if np.asarray(a).base is not None else a): np.asarray(a).nbytes
              for k in kept for a in k.values()}
    want = sum(fp64.naux * (c.nvir ** 2 + c.nvir * len(c.occ) + len(c.occ) ** 2) * 4 for c in chans)
    assert sum(unique.values()) == want


def test_grouped_results_go_where_the_caller_asks():
    """Both cpu precisions write a grouped product into the caller's buffer when handed one (the response's
    scratch, no fresh pages per product), and into a new array otherwise; both equal the reference."""
    rng = np.random.default_rng(2)
    b = rng.normal(size=(6, 5 * 4))
    for dev, dtype in ((CpuDevice().reduced_response(), np.float32), (CpuDevice(), np.float64)):
        assert dev.response_grouped_on_host
        kept = dev.response_operand(b, moving=True)
        for a_t in (rng.normal(size=(6, 3)), rng.normal(size=(6, 9))):     # both of its forms (k > m, k ≤ m)
            ref = np.einsum("km,kgw->gmw", a_t, b.reshape(6, 5, 4)).reshape(-1, 4)
            buf = np.full(5 * a_t.shape[1] * 4, np.nan, dtype=dtype)
            into = dev.response_grouped(a_t, kept, 4, out=buf)
            fresh = dev.response_grouped(a_t, kept, 4)
            assert np.shares_memory(into, buf) and not np.shares_memory(fresh, buf) and into.dtype == dtype
            for got in (into, fresh):
                assert np.allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_scratch_is_shared_and_reused(system):
    """The products' scratch: one buffer for the response and the copies sharing its blocks, the same memory
    for every product, fp32 or fp64, and for the G[X] columns."""
    _, chans, fp64 = system
    fp32 = fp64.reduced()
    assert fp32._scratch is fp64._scratch
    where = fp64._scratch._buffer.__array_interface__["data"][0]
    z = [np.ones((c.nvir, len(c.occ))) for c in chans]
    fp32.zvector(z)
    fp64.zvector(z)
    fp64.occupied_columns([np.eye(c.nmo) for c in chans])
    assert fp64._scratch._buffer.__array_interface__["data"][0] == where
    with pytest.raises(ValueError):
        fp64._scratch.view((fp64._scratch.size + 1,))


def test_refined_solve_reaches_the_fp64_solution(system):
    """fp32 inner solves refined by fp64 products: the true fp64 residual below the tolerance, z within 1e-8
    (relative) of the fp64 PCG's, and the count every product of either kind."""
    _, chans, fp64 = system
    lag = _lagrangian(chans)
    want, n64, _ = response.solve_zvector(fp64, chans, lag)
    fp32 = fp64.reduced()
    before = fp64.products
    got, n, residual = response.solve_zvector(fp32, chans, lag, exact=fp64)
    exact_products = fp64.products - before
    assert 1 <= exact_products <= response.REFINE_CYCLES and n == fp32.products + exact_products
    assert residual < response.ZVECTOR_TOL
    for a, b in zip(got, want):
        assert np.max(np.abs(a - b)) < 1e-8 * np.max(np.abs(b))
    # the residual it reports is the fp64 one
    zs = got
    shapes = np.concatenate([(c.e[c.vir][:, None] - c.e[c.occ][None, :]).ravel() for c in chans])
    az = shapes * np.concatenate([z.ravel() for z in zs]) + np.concatenate([g.ravel() for g in fp64.zvector(zs)])
    rhs = -np.concatenate([x.ravel() for x in lag])
    assert abs(np.linalg.norm(rhs - az) / np.linalg.norm(rhs) - residual) < 1e-3 * residual + 1e-14


def test_refinement_that_cannot_converge_raises(system):
    """Inner products of another operator than the fp64 ones (four times the Hessian: each cycle then takes
    the residual down by only 3/4): the refinement stops after REFINE_CYCLES cycles with a ConvergenceError
    (relax then solves with the fp64 products alone)."""
    _, chans, fp64 = system

    class Wrong:
        def __init__(self, right):
            self.right = right

        def zvector(self, zs):
            return [4.0 * g + 3.0 * (c.e[c.vir][:, None] - c.e[c.occ][None, :]) * z
                    for c, g, z in zip(chans, self.right.zvector(zs), zs)]

        def preconditioner(self):
            return self.right.preconditioner()

    with pytest.raises(ConvergenceError, match="refinement did not converge"):
        response.solve_zvector(Wrong(fp64.reduced()), chans, _lagrangian(chans), exact=fp64)


@pytest.mark.parametrize("molecule", ["water", "hydroxyl"])
def test_cpu_gradient_with_refined_zvector_equals_the_fp64_one(molecule, monkeypatch):
    """The cpu gradient whose Z-vector ran fp32 inner solves refined in fp64 equals the fp64-only one to
    1e-9 Eh/bohr; what-ran says which products ran, how many, and the plan's copy."""
    path = f"molecules/{molecule}.xyz"
    refined = mp2trn.run(path, basis="cc-pvdz", gradient=True)
    ran = refined.what_ran["zvector"]
    assert (ran["device"], ran["precision"]) == ("cpu", "fp32")
    assert (ran["refined_by"]["device"], ran["refined_by"]["precision"]) == ("cpu", "fp64")
    assert ran["products"] + ran["refined_by"]["products"] == ran["iterations"]
    assert ran["residual"] < response.ZVECTOR_TOL
    assert "fp32 copy" in refined.what_ran["gradient_memory"]["response_jkfit_mo_blocks"]
    assert f"cpu, fp32, refined by {ran['refined_by']['products']} cpu fp64 products" in refined.what_ran["gradient_jk"]
    monkeypatch.setattr(CpuDevice, "reduced_response_itemsize", 0)     # no room planned: fp64 alone
    alone = mp2trn.run(path, basis="cc-pvdz", gradient=True)
    assert alone.what_ran["zvector"]["precision"] == "fp64" and "refined_by" not in alone.what_ran["zvector"]
    assert "refined" not in alone.what_ran["gradient_jk"]
    assert "fp32 copy" not in alone.what_ran["gradient_memory"]["response_jkfit_mo_blocks"]
    assert np.max(np.abs(refined.gradient - alone.gradient)) < 1e-9


def test_plan_holds_the_reduced_copy_only_where_it_fits():
    """Inosine/cc-pVDZ's shapes: with room the response's stage counts the fp32 copy (B_vv, B_ov and B_oo
    once each, 4 bytes per element; its M and Y are in the products' scratch) beside the blocks; at a budget
    where the blocks fit but not the copy the plan keeps the blocks and declines the copy; a device without
    one plans none."""
    kw = dict(nao=326, naux=1232, max_aux_shell=7, naux_jk=1606, max_jk_shell=9,
              channels=(ChannelShape(70, 70, 256),), itemsize=8)
    with_copy, without = GradientSizes(**kw, reduced_response_itemsize=4), GradientSizes(**kw)
    copy_mb = 1606 * (256 ** 2 + 256 * 70 + 70 ** 2) * 4 / 1e6
    roomy = plan_gradient(with_copy, 8000)
    assert roomy.response_reduced and not plan_gradient(without, 8000).response_reduced
    assert roomy.stage_mb["response"] - plan_gradient(without, 8000).stage_mb["response"] == pytest.approx(copy_mb)
    # the smallest budget whose blocks fit: the copy does not, the blocks stay
    budgets = [b for b in range(1500, 6000, 50) if plan_gradient(with_copy, b).response_factors]
    tight = plan_gradient(with_copy, budgets[0])
    assert tight.response_factors and not tight.response_reduced
    for plan in (roomy, tight):
        assert max(plan.stage_mb.values()) <= plan.budget_mb


def test_occupied_columns_of_some_rows_equal_those_of_all(system):
    """G[X]'s occupied columns asked for the virtual or the occupied rows only equal those rows of the whole
    columns (fp64, to rounding); the rows not asked for are NaN, so that no caller reads them unawares."""
    _, chans, fp64 = system
    rng = np.random.default_rng(9)
    mats = [(lambda m: m + m.T)(rng.normal(size=(c.nmo, c.nmo))) for c in chans]
    whole = fp64.occupied_columns(mats)
    for rows, pick in (("vir", lambda c: c.vir), ("occ", lambda c: c.occ)):
        for c, part, full in zip(chans, fp64.occupied_columns(mats, rows=rows), whole):
            other = np.setdiff1d(np.arange(c.nmo), pick(c))
            np.testing.assert_allclose(part[pick(c)], full[pick(c)], rtol=1e-12, atol=1e-12 * np.abs(full).max())
            assert np.all(np.isnan(part[other]))


def test_reduced_products_where_nvir_equals_nocc():
    """H4 in STO-3G (two occupied, two virtual orbitals): M^Q and Y^Q have one shape, and the reduced copy
    keeps a buffer for each (one shared buffer let Y overwrite M before it was read)."""
    mol = gto.M(atom="H 0 0 0; H 0 0 0.74; H 0 2.5 0; H 0 2.5 0.74", basis="sto-3g", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit").run(conv_tol=1e-11)
    chans = channels(mf, select_frozen(mf, None))
    assert all(c.nvir == len(c.occ) for c in chans)
    fp64 = cpks.ResponseJK.build(mf, chans, 2000)
    fp32 = fp64.reduced()
    for seed in (1, 2):                                  # the second product reuses the buffers
        zs = _lagrangian(chans, seed)
        for a, b in zip(fp32.zvector(zs), fp64.zvector(zs)):
            assert np.max(np.abs(a - b)) < 1e-5 * np.max(np.abs(b))
    got, _, residual = response.solve_zvector(fp32, chans, _lagrangian(chans), exact=fp64)
    assert residual < response.ZVECTOR_TOL


def test_only_fp32_products_are_refined(system):
    """Products in fp32 (here the cpu's reduced copy standing for a device's) are refined by the host's fp64
    products; fp64 products (cuda's default) and compensated ones solve alone, the host's only their fallback."""
    mf, chans, fp64 = system
    rng = np.random.default_rng(3)
    sym = lambda n: (lambda m: (m + m.T) / 10)(rng.normal(size=(n, n)))   # noqa: E731
    dens = ([sym(c.nact) for c in chans], [sym(c.nvir) for c in chans], [sym(c.nmo) for c in chans])

    class OnDevice(cpks.ResponseJK):
        """The blocks' products as a device in ``precision`` would run them (the host's GEMMs, so that the
        solves compare); on_host gives the fp64 host products as for any device but the cpu."""

        def __init__(self, right, precision):
            self.__dict__.update(right.__dict__)
            self._precision = precision

        @property
        def precision(self):
            return self._precision

        def describe(self):
            return {**super().describe(), "device": "gpu", "precision": self._precision}

        def on_host(self):
            plain = cpks.ResponseJK.__new__(cpks.ResponseJK)
            plain.__dict__.update(self.__dict__)
            return plain._sharing(CpuDevice())

    as_fp32 = OnDevice(fp64.reduced(), "fp32")
    refined = response.relax(as_fp32, chans, *dens)
    assert refined.zvector["precision"] == "fp32" and refined.zvector["refined_by"]["precision"] == "fp64"
    for precision in ("fp64", "fp32x3"):
        alone = response.relax(OnDevice(fp64, precision), chans, *dens)
        assert alone.zvector is None and alone.fallback is None
        for a, b in zip(alone.p_relaxed, refined.p_relaxed):
            assert np.max(np.abs(a - b)) < 1e-6 * np.max(np.abs(b))     # both to the 1e-8 residual
