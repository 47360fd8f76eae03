"""Analytic DF-MP2 gradients and relaxed densities against finite differences of mp2trn's own energies,
invariances, PySCF's conventional MP2, and the interfaces (API, CLI, QCSchema).

Finite differences are central 3-point with h = 1e-3 bohr (truncation error ~1e-7 Eh/bohr on these
molecules, below the 1e-6 tolerance); SCF converged to 1e-12 Eh so that the MP2 energy's orbital
dependence does not show as noise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pyscf import gto, scf
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.errors import InputError

from .conftest import df_scf_in_field

TIGHT = {"conv_tol": 1e-12}
WATER = "O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45"      # distorted: every component non-zero
HYDROXYL = "O 0 0 0; H 0.1 0 1.05"


def mole(atom: str, spin: int = 0, basis: str = "cc-pvdz", **kw) -> gto.Mole:
    return gto.M(atom=atom, basis=basis, spin=spin, verbose=0, **kw)


def analytic(mol: gto.Mole, **options) -> mp2trn.MP2Result:
    return mp2trn.run(mol, basis=mol.basis, multiplicity=mol.spin + 1, gradient=True, **TIGHT, **options)


def energy(mol: gto.Mole, **options) -> float:
    return mp2trn.run(mol, basis=mol.basis, multiplicity=mol.spin + 1, **TIGHT, **options).e_tot


def finite_difference(mol: gto.Mole, h: float = 1e-3, atoms=None, **options) -> np.ndarray:
    coords = mol.atom_coords()
    out = np.full_like(coords, np.nan)
    for a in (range(mol.natm) if atoms is None else atoms):
        for x in range(3):
            e = []
            for step in (-h, h):
                c = coords.copy()
                c[a, x] += step
                e.append(energy(mol.set_geom_(c, unit="Bohr", inplace=False), **options))
            out[a, x] = (e[1] - e[0]) / (2 * h)
    return out


@pytest.mark.parametrize("atom, spin, options", [
    (WATER, 0, {"frozen": "auto"}),
    (HYDROXYL, 1, {"frozen": "auto"}),
    (WATER, 0, {"method": "scs-mp2"}),
    # SOS on UHF (19 s, -m slow): UHF is checked by hydroxyl-uhf-fc, a scaled method by water-scs, and the
    # unrestricted gradient without same-spin pairs by tests/test_rohf_gradient.py's hydroxyl-sos-fc
    pytest.param(HYDROXYL, 1, {"method": "sos-mp2"}, marks=pytest.mark.slow),
], ids=["water-rhf-fc", "hydroxyl-uhf-fc", "water-scs", "hydroxyl-uhf-sos"])
def test_gradient_matches_finite_differences(atom, spin, options):
    mol = mole(atom, spin)
    result = analytic(mol, **options)
    assert result.gradient.shape == (mol.natm, 3)
    fd = finite_difference(mol, **options)
    assert np.max(np.abs(result.gradient - fd)) < 1e-6
    assert np.max(np.abs(result.gradient.sum(axis=0))) < 1e-8      # translational invariance


def test_ghost_atoms_carry_only_their_basis_functions():
    """A ghost atom's gradient is the pull on its basis functions (as PySCF's), and matches finite differences."""
    mol = mole("O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45; ghost-He 0 0 2.6")
    result = analytic(mol, frozen="auto")
    fd = finite_difference(mol, frozen="auto")
    assert np.max(np.abs(result.gradient - fd)) < 1e-6
    assert 0 < np.max(np.abs(result.gradient[3])) < 1e-2


def test_ecp_molecule_matches_finite_differences():
    """HI with def2-SVP: iodine's 28-electron ECP (PySCF's ECP derivative integrals)."""
    mol = mole("I 0 0 0; H 0 0.1 1.65", basis="def2-svp", ecp="def2-svp")
    result = analytic(mol, frozen="auto")
    assert mol.has_ecp() and result.sizes["nalpha"] == 13           # 53 − 28 + 1 electrons
    fd = finite_difference(mol, frozen="auto")
    assert np.max(np.abs(result.gradient - fd)) < 1e-6


def test_gradient_rotates_with_the_molecule():
    mol = mole(WATER)
    g = analytic(mol).gradient
    rot = np.linalg.qr(np.random.default_rng(7).normal(size=(3, 3)))[0]
    moved = mol.set_geom_(mol.atom_coords() @ rot.T + np.array([0.3, -0.2, 0.5]), unit="Bohr", inplace=False)
    g2 = analytic(moved).gradient
    assert np.max(np.abs(g2 - g @ rot.T)) < 1e-7
    centre = mol.atom_coords().mean(axis=0)
    torque = np.cross(mol.atom_coords() - centre, g).sum(axis=0)
    assert np.max(np.abs(torque)) < 1e-7


def _df_rhf(mol: gto.Mole, field=None) -> scf.hf.RHF:
    return df_scf_in_field(scf.RHF, mol, "cc-pvdz-jkfit", field)


def test_relaxed_dipole_is_the_field_derivative_of_the_energy():
    """μ_el = −dE/dF with h + F·r (5-point, F = 1e-3 au): the relaxed density's electronic dipole."""
    mol = mole(WATER)
    pt = mp2trn.DFMP2(_df_rhf(mol), auxbasis="cc-pvdz-ri").run()
    dm = pt.make_rdm1(relaxed=True)
    mu_el = -np.einsum("xij,ij->x", mol.intor("int1e_r"), dm)
    f = 1e-3
    fd = np.zeros(3)
    for x in range(3):
        e = {}
        for k in (-2, -1, 1, 2):
            field = np.zeros(3)
            field[x] = k * f
            e[k] = mp2trn.DFMP2(_df_rhf(mol, field), auxbasis="cc-pvdz-ri").run().e_tot
        fd[x] = -(e[-2] - 8 * e[-1] + 8 * e[1] - e[2]) / (12 * f)
    assert np.max(np.abs(mu_el - fd)) < 1e-5
    unrelaxed = -np.einsum("xij,ij->x", mol.intor("int1e_r"), pt.make_rdm1(relaxed=False))
    assert np.max(np.abs(unrelaxed - fd)) > 1e-3      # the orbital response matters


@pytest.mark.parametrize("atom, spin", [(WATER, 0), (HYDROXYL, 1)], ids=["water", "hydroxyl"])
def test_against_pyscf_conventional_mp2_gradient(atom, spin):
    """PySCF's conventional (non-DF) MP2 gradient differs only by the density-fitting error (measured
    here: ≤ 3e-5 Eh/bohr with cc-pVDZ and its JK-fit/RI partners)."""
    from pyscf import mp

    mol = mole(atom, spin)
    mf = (scf.RHF(mol) if spin == 0 else scf.UHF(mol))
    mf.conv_tol = 1e-12
    mf.run()
    conventional = mp.MP2(mf).run().nuc_grad_method().kernel()
    ours = analytic(mol).gradient
    assert np.max(np.abs(ours - conventional)) < 1e-4


def test_relaxed_dipole_against_pyscf_conventional_finite_field():
    """The relaxed MP2 dipole against −dE/dF of PySCF's conventional RHF + MP2 (3-point, F = 1e-3 au)."""
    from pyscf import mp

    mol = mole(WATER)
    ours = np.asarray(analytic(mol).dipoles["mp2_relaxed"])
    h0 = scf.RHF(mol).get_hcore()
    r = mol.intor("int1e_r")
    nuclear = np.einsum("a,ax->x", mol.atom_charges(), mol.atom_coords())
    fd = np.zeros(3)
    for x in range(3):
        e = []
        for sign in (-1, 1):
            mf = scf.RHF(mol)
            h = h0 + sign * 1e-3 * r[x]
            mf.get_hcore = lambda *args, h=h: h
            mf.conv_tol = 1e-12
            e.append(mp.MP2(mf.run()).run().e_tot)
        fd[x] = -(e[1] - e[0]) / 2e-3
    assert np.max(np.abs(ours - (fd + nuclear))) < 1e-4      # measured 1.0e-5 (scripts/gradient_accuracy.py)


def test_dfmp2_object_gradient_matches_run():
    """The PySCF-style object on PySCF's own DF-SCF and mp2trn.run (its own SCF) give the same gradient."""
    mol = mole(WATER)
    mf = _df_rhf(mol)
    pt = mp2trn.DFMP2(mf, auxbasis="cc-pvdz-ri", frozen="auto", method="scs-mp2").run()
    grad = pt.nuc_grad_method()
    de = grad.kernel()
    assert de.shape == (3, 3) and grad.de is de
    assert np.allclose(pt.Gradients().kernel(), de, atol=1e-10)
    ran = analytic(mol, auxbasis="cc-pvdz-ri", jkbasis="cc-pvdz-jkfit", frozen="auto", method="scs-mp2")
    assert abs(ran.e_tot - pt.e_tot) < 1e-9
    assert np.max(np.abs(np.asarray(ran.gradient) - de)) < 1e-7
    assert pt.make_rdm1(relaxed=True).shape == (mol.nao_nr(), mol.nao_nr())
    uhf = scf.UHF(mole(HYDROXYL, 1)).density_fit(auxbasis="cc-pvdz-jkfit").run()
    assert mp2trn.DFMP2(uhf).run().make_rdm1(relaxed=False).shape == (2, 19, 19)


def test_unsupported_references_are_clear_errors():
    mol = mole(WATER)
    conventional = scf.RHF(mol).run()
    with pytest.raises(InputError, match="density-fitted"):
        mp2trn.DFMP2(conventional).run().nuc_grad_method().kernel()
    with pytest.raises(InputError, match="double hybrid"):
        mp2trn.RunOptions(method="b2plyp", gradient=True)
    with pytest.raises(InputError, match="scf-df"):
        mp2trn.RunOptions(scf_df=False, gradient=True)


def test_cli_gradient_json_and_molden(tmp_path):
    out, molden = tmp_path / "g.json", tmp_path / "nos.molden"
    res = CliRunner().invoke(app, ["run", "molecules/water.xyz", "--gradient", "--molden", str(molden),
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "Nuclear gradient" in res.output and "MP2 relaxed" in res.output
    doc = json.loads(out.read_text())
    assert doc["driver"] == "gradient" and len(doc["return_result"]) == 9
    assert doc["properties"]["return_gradient"] == doc["return_result"]
    assert len(doc["properties"]["mp2_dipole_moment"]) == 3
    occ = doc["extras"]["mp2trn"]["natural_occupations"]
    assert abs(sum(occ) - 10) < 1e-8 and max(occ) <= 2.0 + 1e-4
    text = molden.read_text()
    assert "[MO]" in text and "Occup=" in text


@pytest.mark.parametrize("atom, spin", [(WATER, 0), (HYDROXYL, 1)], ids=["rhf", "uhf"])
def test_scf_terms_reproduce_pyscf_df_scf_gradient(atom, spin):
    """With no MP2 correction the gradient's SCF terms (one-electron, JK-fit two-electron with the fitting
    basis' response, nuclear) are PySCF's own DF-SCF gradient."""
    from mp2trn.grad.dfmp2 import scf_gradient

    mol = mole(atom, spin)
    mf = (scf.RHF(mol) if spin == 0 else scf.UHF(mol)).density_fit(auxbasis="cc-pvdz-jkfit").run(conv_tol=1e-12)
    assert np.max(np.abs(scf_gradient(mf, 2000) - mf.nuc_grad_method().kernel())) < 1e-10


@pytest.mark.parametrize("atom, spin", [(WATER, 0), (HYDROXYL, 1)], ids=["rhf", "uhf"])
def test_out_of_core_gradient_equals_in_memory(atom, spin, monkeypatch):
    """Every array the plan can stream streamed, in the smallest blocks (B and Γ̄ in HDF5 files, B read in
    pairs of one-orbital blocks, one-orbital strips, (P|iμ) of the JK-fit pass in a file solved one orbital
    at a time, generic J/K builds for the response, one shell per integral block): the in-memory gradient
    and relaxed density to 1e-10."""
    from dataclasses import replace

    import mp2trn.grad.dfmp2 as grad_dfmp2

    mol = mole(atom, spin)
    in_memory = analytic(mol, frozen="auto")
    assert not in_memory.what_ran["gradient_out_of_core"]
    plan = grad_dfmp2.plan_gradient
    monkeypatch.setattr(grad_dfmp2, "plan_gradient", lambda *a, **k: replace(
        plan(*a, **k), stores_incore=False, strip_block=1, pair_block=1, metric_cols=7, ri_aux_block=1,
        response_factors=False, jk_half_incore=False, jk_columns=1, jk_aux_block=1))
    result = analytic(mol, frozen="auto")
    memory = result.what_ran["gradient_memory"]
    assert result.what_ran["gradient_out_of_core"] and "pairs of 1-orbital" in memory["pair_sweep"]
    assert "HDF5" in memory["jkfit_half_transformed"] and "J/K builds" in result.what_ran["gradient_jk"]
    assert np.max(np.abs(result.gradient - in_memory.gradient)) < 1e-10
    # the relaxed density carries the Z-vector, solved to the solver's residual by J/K builds here and by
    # the MO blocks in memory: the two solutions agree to the solve's tolerance, not to rounding
    assert np.max(np.abs(result.densities.dm_relaxed - in_memory.densities.dm_relaxed)) < 1e-9


@pytest.mark.parametrize("atom, spin", [(WATER, 0), (HYDROXYL, 1)], ids=["rhf", "uhf"])
def test_occupied_factor_products_equal_generic_jk_builds(atom, spin, monkeypatch):
    """The response's products through occupied factors of the JK-fit tensor equal the SCF's own J/K builds,
    product by product and in the final gradient."""
    from mp2trn.grad import cpks, dfmp2
    from mp2trn.grad.orbitals import channels
    from mp2trn.grad.response import Products
    from mp2trn.orbitals import select_frozen

    mol = mole(atom, spin)
    mf = (scf.RHF(mol) if spin == 0 else scf.UHF(mol)).density_fit(auxbasis="cc-pvdz-jkfit").run(conv_tol=1e-11)
    chans = channels(mf, select_frozen(mf, "auto"))
    fast, generic = cpks.ResponseJK.build(mf, chans, 2000), Products(mf, chans)
    rng = np.random.default_rng(3)
    mats = [(lambda m: m + m.T)(rng.normal(size=(c.nmo, c.nmo))) for c in chans]
    zs = [rng.normal(size=(c.nvir, len(c.occ))) for c in chans]
    for a, b in zip(fast.occupied_columns(mats), generic.occupied_columns(mats)):
        assert np.max(np.abs(a - b)) < 1e-11
    for a, b in zip(fast.zvector(zs), generic.zvector(zs)):
        assert np.max(np.abs(a - b)) < 1e-11
    # the z part's occupied block (W's), and the same block of G[X] for X = Z + Zᵀ through occupied_columns
    z_mats = []
    for c, z in zip(chans, zs):
        full = np.zeros((c.nmo, c.nmo))
        full[np.ix_(c.vir, c.occ)] = z
        z_mats.append(full + full.T)
    for c, a, b, whole in zip(chans, fast.zvector_occupied(zs), generic.zvector_occupied(zs),
                              fast.occupied_columns(z_mats)):
        assert np.max(np.abs(a - b)) < 1e-11 and np.max(np.abs(a - whole[c.occ])) < 1e-11
    with_fast = mp2trn.DFMP2(mf, auxbasis="cc-pvdz-ri", frozen="auto").run().nuc_grad_method().kernel()
    monkeypatch.setattr(dfmp2.ResponseJK, "build", classmethod(lambda cls, *a: None))
    monkeypatch.setattr(dfmp2, "scf_tensor", lambda mf: None)     # nor made from the SCF's own tensor
    pt = mp2trn.DFMP2(mf, auxbasis="cc-pvdz-ri", frozen="auto").run()
    grad = pt.nuc_grad_method()
    with_generic = grad.kernel()
    assert "J/K builds" in grad.result.what_ran["gradient_jk"]
    assert np.max(np.abs(with_fast - with_generic)) < 1e-9


def test_frozen_core_splitting_a_degenerate_set_is_an_error():
    """Methane's three degenerate 2p-like orbitals: freezing one of them leaves no defined gradient."""
    mol = mole("C 0 0 0; H .629 .629 .629; H -.629 -.629 .629; H -.629 .629 -.629; H .629 -.629 -.629")
    with pytest.raises(InputError, match="degenerate"):
        analytic(mol, frozen=3)
    assert np.max(np.abs(analytic(mol, frozen=2).gradient)) < 1e-2


def test_sim_device_compensated_gradient_matches_finite_differences():
    """The NKI kernels in the emulator at fp32x3 (the fp64-class mode; the gradient's pair step in fp32):
    analytic gradient against central differences of the fp64 energies."""
    mol = mole(WATER)
    result = analytic(mol, device="sim", precision="fp32x3", frozen="auto")
    assert result.what_ran["gradient_pairs"] == "sim (fp32)"
    fd = finite_difference(mol, frozen="auto")
    assert np.max(np.abs(result.gradient - fd)) < 1e-6


@pytest.mark.parametrize("n", [1, 3, 8, 37])
def test_symmetric_product_from_its_lower_blocks_equals_the_full_gemm(n):
    """The JK-fit pass's d (1 ⊗ Z) dᵀ from its lower block triangle: the full product to rounding, exactly
    symmetric, added to what the output held (sizes with empty, single-row and uneven blocks)."""
    from mp2trn.grad.jk_terms import _add_symmetric_product

    rng = np.random.default_rng(n)
    nao, nocc = 5, 3
    d = rng.normal(size=(n, nocc * nao))
    z = rng.normal(size=(nao, nao))
    c = (d.reshape(-1, nao) @ (z + z.T)).reshape(n, -1)
    held = rng.normal(size=(n, n))
    held = held + held.T
    out = held.copy()
    _add_symmetric_product(out, d, c)
    assert np.max(np.abs(out - (held + d @ c.T))) < 1e-12 * max(1.0, np.max(np.abs(d @ c.T)))
    assert np.array_equal(out, out.T)


def test_symmetric_product_holds_no_square_temporary():
    """Its peak beside the output is a row block and the diagonal block's pieces, well under the n × n result
    the full GEMM made (the JK-fit stage's memory plan counts five naux² arrays)."""
    import tracemalloc

    from mp2trn.grad.jk_terms import _add_symmetric_product

    n, m = 400, 60
    rng = np.random.default_rng(0)
    a = rng.normal(size=(n, m))
    out = np.zeros((n, n))
    tracemalloc.start()
    try:
        _add_symmetric_product(out, a, a)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.6 * n * n * 8


def test_block_buffers_give_the_same_blocks_as_new_arrays():
    """The derivative passes' buffers (reused from block to block): packed rows unpacked into a buffer, the
    derivative integrals contracted from one, and the device's product written into one equal what new
    arrays give — in a buffer larger than the block, as the passes' buffers are for all but the largest."""
    from pyscf import df, lib

    from mp2trn.devices import get_device
    from mp2trn.df import tensor_rows_unpacked
    from mp2trn.grad.ri import contract_3c_derivatives

    rng = np.random.default_rng(3)
    mol = gto.M(atom="O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45", basis="cc-pvdz", verbose=0)
    nao = mol.nao_nr()
    packed = rng.normal(size=(5, nao * (nao + 1) // 2))
    buf = np.full(7 * nao * nao, np.nan)
    assert np.array_equal(tensor_rows_unpacked(packed, out=buf), lib.unpack_tril(packed))

    aux = df.addons.make_auxmol(mol, "cc-pvdz-jkfit")
    pmol, nbas = mol + aux, mol.nbas
    shls = (0, nbas, 0, nbas, nbas + 2, nbas + 6)
    p = int(aux.ao_loc_nr()[6] - aux.ao_loc_nr()[2])
    g = rng.normal(size=(p, nao, nao))
    sym = g + g.transpose(0, 2, 1)
    sums = []
    for out in (None, np.full(3 * (p + 4) * nao * nao, np.nan)):
        per_ao, per_aux = np.zeros((nao, 3)), np.zeros((p, 3))
        contract_3c_derivatives(pmol, shls, sym, per_ao, per_aux, out=out)
        sums.append((per_ao, per_aux))
    assert np.array_equal(sums[0][0], sums[1][0]) and np.array_equal(sums[0][1], sums[1][1])

    a_t, b = rng.normal(size=(9, 40)), rng.normal(size=(9, 30))
    for device in (get_device("cpu"), get_device("cpu").reduced_response(), get_device("sim", "fp32")):
        kept = device.response_operand(a_t)
        out = np.full((40, 30), np.nan)
        got = device.response_gemm(kept, b, "zvector", out=out)
        assert got is out and np.array_equal(out, device.response_gemm(kept, b, "zvector"))
