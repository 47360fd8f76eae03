"""Analytic ROHF-MBPT(2) gradients (issue 37): against central differences of mp2trn's own ROHF-MBPT(2)
energies (a doublet, a triplet, frozen core, SOS-MP2, an ECP radical), the closed-shell limit against the RHF
gradient, the relaxed density against the energy's field derivative, the ROHF orbital Hessian against
differences of PySCF's ROHF orbital gradient, and every route that runs a gradient (API, CLI, QCSchema).

Finite differences: central, h = 1e-3 bohr (truncation ~2e-7 Eh/bohr here, 4.6e-8 at h = 5e-4: it scales
as h²), SCF converged to 1e-12 Eh; a few components per molecule, the rest held by translational invariance.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.linalg
from pyscf import gto, scf
from pyscf.lib.parameters import BOHR
from pyscf.soscf.newton_ah import gen_g_hop_rohf
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.grad import rohf
from mp2trn.grad.orbitals import channels
from mp2trn.grad.response import Products
from mp2trn.orbitals import select_frozen, semicanonical

from .conftest import df_scf_in_field, molecule_path

TIGHT = {"conv_tol": 1e-12, "reference": "rohf"}
HYDROXYL = "O 0 0 0; H 0.1 0 1.05"
METHYLENE_TRIPLET = "C 0 0 0.1004; H 0 0.9911 -0.3115; H 0 -0.9811 -0.3315"     # distorted: no symmetry
WATER = "O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45"
IODINE_MONOXIDE = "I 0 0 0; O 0 0.1 1.87"


def _mol(atom: str, spin: int, basis: str) -> gto.Mole:
    return gto.M(atom=atom, basis=basis, spin=spin, verbose=0)


def _run(mol: gto.Mole, **options) -> mp2trn.MP2Result:
    return mp2trn.run(mol, basis=mol.basis, multiplicity=mol.spin + 1, **TIGHT, **options)


def _central_differences(mol: gto.Mole, components, h: float = 1e-3, **options) -> np.ndarray:
    coords = mol.atom_coords()
    out = []
    for atom, x in components:
        e = []
        for step in (-h, h):
            c = coords.copy()
            c[atom, x] += step
            e.append(_run(mol.set_geom_(c, unit="Bohr", inplace=False), **options).e_tot)
        out.append((e[1] - e[0]) / (2 * h))
    return np.array(out)


@pytest.mark.parametrize("atom, spin, basis, options, components", [
    (HYDROXYL, 1, "cc-pvdz", {}, [(0, 0), (0, 2)]),
    (METHYLENE_TRIPLET, 2, "6-31g", {"frozen": "auto"}, [(0, 1), (0, 2), (1, 1), (2, 2)]),
    (HYDROXYL, 1, "6-31g", {"frozen": "auto", "method": "sos-mp2"}, [(0, 2)]),
], ids=["hydroxyl-doublet", "methylene-triplet-fc", "hydroxyl-sos-fc"])
def test_gradient_matches_finite_differences(atom, spin, basis, options, components):
    mol = _mol(atom, spin, basis)
    result = _run(mol, gradient=True, **options)
    assert result.reference == "ROHF" and abs(result.e_singles) > 1e-5     # the singles are in the energy
    analytic = np.array([result.gradient[a, x] for a, x in components])
    assert np.max(np.abs(analytic - _central_differences(mol, components, **options))) < 1e-6
    assert np.max(np.abs(result.gradient.sum(axis=0))) < 1e-8              # translational invariance


@pytest.mark.slow
def test_ecp_radical_matches_finite_differences():
    """IO (doublet) in def2-SVP: iodine's 28-electron ECP, frozen core."""
    result = mp2trn.run(IODINE_MONOXIDE, basis="def2-svp", multiplicity=2, frozen="auto", gradient=True, **TIGHT)
    assert result.what_ran["ecp"]["core_electrons"] == 28
    mol = gto.M(atom=IODINE_MONOXIDE, basis="def2-svp", ecp="def2-svp", spin=1, verbose=0)
    fd = _central_differences(mol, [(1, 2)], frozen="auto")
    assert abs(result.gradient[1, 2] - fd[0]) < 1e-6
    assert np.max(np.abs(result.gradient.sum(axis=0))) < 1e-8


def test_closed_shell_rohf_gradient_is_the_rhf_gradient():
    """ROHF on a closed shell is RHF: on the RHF's own orbitals the ROHF-MBPT(2) gradient and relaxed density
    are the RHF ones to rounding (frozen core included); from its own SCF, to that SCF's convergence."""
    mol = _mol(WATER, 0, "6-31g")
    rhf = _df_rhf(mol)
    rohf_mf = scf.ROHF(mol).density_fit(auxbasis="def2-universal-jkfit")
    rohf_mf.mo_coeff, rohf_mf.mo_occ, rohf_mf.mo_energy = rhf.mo_coeff, rhf.mo_occ, rhf.mo_energy
    rohf_mf.e_tot, rohf_mf.converged = rhf.e_tot, True
    objects = [mp2trn.DFMP2(mf, auxbasis="def2-svp-ri", frozen="auto") for mf in (rhf, rohf_mf)]
    grads = [pt.nuc_grad_method().kernel() for pt in objects]
    # the two Z-vector solvers (RHF: PCG from zero with the Hessian's diagonal; ROHF: SciPy's CG) stop at the
    # same relative residual along different paths: measured 1.8e-11 apart
    assert np.max(np.abs(grads[0] - grads[1])) < 1e-10
    dms = [pt.make_rdm1() for pt in objects]
    assert np.max(np.abs(dms[0] - dms[1][0] - dms[1][1])) < 1e-10
    ro = _run(mol, gradient=True, frozen="auto")
    by_run = mp2trn.run(mol, basis="6-31g", gradient=True, frozen="auto", conv_tol=1e-12)
    assert ro.reference == "ROHF" and by_run.reference == "RHF"
    assert np.max(np.abs(ro.gradient - by_run.gradient)) < 1e-8          # measured 2.1e-9


def _df_rhf(mol: gto.Mole) -> scf.hf.RHF:
    return df_scf_in_field(scf.RHF, mol, "def2-universal-jkfit", conv_tol_grad=1e-10)


def _df_rohf(mol: gto.Mole, field=None) -> scf.rohf.ROHF:
    return df_scf_in_field(scf.ROHF, mol, "def2-universal-jkfit", field)


def test_relaxed_dipole_is_the_field_derivative_of_the_energy():
    """μ_el = −dE/dF with h + F·r (central, F = 1e-3 au) for the ROHF-MBPT(2) relaxed density (a PySCF ROHF
    object through mp2trn.DFMP2): the singles, the semicanonical response and the ROHF Z-vector all in it."""
    mol = _mol(HYDROXYL, 1, "6-31g")
    pt = mp2trn.DFMP2(_df_rohf(mol), auxbasis="def2-svp-ri").run()
    dm = pt.make_rdm1(relaxed=True)
    assert dm.shape == (2, mol.nao, mol.nao)
    r = mol.intor("int1e_r")
    mu_el = -np.einsum("xij,ij->x", r, dm[0] + dm[1])
    fd = np.zeros(3)
    for x in (2,):              # along the bond (x: tested for RHF/UHF in test_gradient)
        e = {}
        for k in (-1, 1):
            field = np.zeros(3)
            field[x] = k * 1e-3
            e[k] = mp2trn.DFMP2(_df_rohf(mol, field), auxbasis="def2-svp-ri").run().e_tot
        fd[x] = -(e[1] - e[-1]) / 2e-3
    assert abs(mu_el[2] - fd[2]) < 1e-5
    unrelaxed = pt.make_rdm1(relaxed=False)
    assert abs(-np.einsum("xij,ij->x", r, unrelaxed[0] + unrelaxed[1])[2] - fd[2]) > 1e-3


def test_rohf_hessian_product_is_the_derivative_of_the_rohf_orbital_gradient():
    """H z against central differences of PySCF's ROHF orbital gradient along the rotation z (PySCF's own
    Hessian product of gen_g_hop_rohf leaves out the spin Fock matrices' occupied–virtual terms: 1e-3 off)."""
    mf = _df_rohf(_mol(METHYLENE_TRIPLET, 2, "6-31g"))
    orbs = semicanonical(mf)
    chans = channels(orbs, select_frozen(orbs, None))
    space = rohf.RohfSpace.build(orbs, chans)
    z = np.random.default_rng(7).standard_normal(int(space.rotations.sum()))
    ours = rohf.hessian_product(Products(mf, chans), chans, space, z)
    rotation = np.zeros(space.rotations.shape)
    rotation[space.rotations] = z
    rotation -= rotation.T
    h = 1e-4
    g = [gen_g_hop_rohf(mf, mf.mo_coeff @ scipy.linalg.expm(s * rotation), mf.mo_occ)[0] for s in (-h, h)]
    fd = (g[1] - g[0]) / (2 * h)            # PySCF's g is half of ∂E/∂κ
    assert np.max(np.abs(ours - 2 * fd)) < 1e-6 * np.max(np.abs(ours))


def test_dfmp2_object_gradient_equals_run():
    """DFMP2(mf).nuc_grad_method() on PySCF's own DF-ROHF equals run(gradient=True) (mp2trn's SCF) with the
    same fitting bases."""
    mol = _mol(HYDROXYL, 1, "6-31g")
    ran = _run(mol, gradient=True, auxbasis="def2-svp-ri", jkbasis="def2-universal-jkfit")
    pt = mp2trn.DFMP2(_df_rohf(mol), auxbasis="def2-svp-ri").run()
    grad = pt.nuc_grad_method()
    de = grad.kernel()
    assert de.shape == (2, 3) and grad.de is de
    assert abs(ran.e_tot - pt.e_tot) < 1e-9
    assert np.max(np.abs(de - ran.gradient)) < 1e-7


def test_cli_and_qcschema_gradient_with_rohf(tmp_path):
    out = tmp_path / "g.json"
    res = CliRunner().invoke(app, ["run", str(molecule_path("hydroxyl")), "--reference", "rohf", "--gradient",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["driver"] == "gradient"
    direct = mp2trn.run(molecule_path("hydroxyl"), reference="rohf", gradient=True)
    assert np.max(np.abs(np.asarray(doc["return_result"]) - direct.gradient.ravel())) < 1e-10
    assert "natural" in res.output.lower()
    pytest.importorskip("qcelemental")
    from mp2trn.qcschema import run_atomic_input

    inp = {"molecule": {"symbols": ["O", "H"], "geometry": [0.0, 0.0, 0.0, 0.0, 0.0, 1.83], "molecular_multiplicity": 2},
           "specification": {"driver": "gradient", "model": {"method": "mp2", "basis": "cc-pvdz"},
                             "keywords": {"reference": "rohf"}}}
    result = run_atomic_input(inp)
    assert result.extras["mp2trn"]["reference"] == "ROHF"
    qc = np.asarray(result.return_result).reshape(2, 3)
    assert abs(qc[1, 2] + qc[0, 2]) < 1e-8 and abs(qc[1, 2]) > 1e-3


def test_gradient_over_two_ranks_equals_one_rank(tmp_path):
    """Two ranks (torchrun, gloo): each runs its share of the pair strips and derivative blocks, the ROHF
    response is solved on both alike; the gradient is the one-rank gradient."""
    from .test_parallel import _launch

    out = tmp_path / "hydroxyl.json"
    proc = _launch(["-m", "mp2trn", "run", str(molecule_path("hydroxyl")), "--reference", "rohf", "--gradient",
                    "--frozen-core", "auto", "--json", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert "2 ranks" in doc["extras"]["mp2trn"]["gradient"] and doc["extras"]["mp2trn"]["reference"] == "ROHF"
    one = mp2trn.run(molecule_path("hydroxyl"), reference="rohf", gradient=True, frozen="auto")
    assert np.max(np.abs(np.asarray(doc["return_result"]) - one.gradient.ravel())) <= 1e-9


@pytest.mark.slow
def test_frequencies_of_a_radical_with_rohf(tmp_path):
    """mp2trn.run(hessian=True) with reference rohf on NH2 (doublet, no degenerate state): the Hessian of
    the ROHF-MBPT(2) gradients is symmetric and its N z diagonal element is the energies' second difference."""
    xyz = tmp_path / "nh2.xyz"
    xyz.write_text("3\nNH2 radical multiplicity=2\nN 0.0 0.0 0.15\nH 0.0 0.80 -0.40\nH 0.0 -0.80 -0.40\n")
    result = mp2trn.run(xyz, basis="6-31g", reference="rohf", hessian=True)
    hess = result.frequencies.hessian
    assert result.reference == "ROHF" and len(result.frequencies.vibrations.frequencies_cm1) == 3
    assert hess.asymmetry < 1e-4                                     # measured 2.5e-5 (UHF: 7.5e-5)
    h, coords = hess.step, hess.coords
    energies = []
    for sign in (1, -1):
        moved = coords.copy()
        moved[0, 2] += sign * h
        lines = [f"{s} {x:.12f} {y:.12f} {z:.12f}" for s, (x, y, z) in zip("NHH", moved * BOHR)]
        energies.append(mp2trn.run("\n".join(["3", "multiplicity=2", *lines]), basis="6-31g", reference="rohf").e_tot)
    second = (energies[0] - 2 * hess.reference.energy + energies[1]) / h ** 2
    assert abs(second - hess.hessian[2, 2]) < 2e-4


def test_out_of_core_and_generic_jk_gradient_equals_in_memory(monkeypatch):
    """Every array the gradient's plan can stream streamed in the smallest blocks, and the response's products
    as the SCF's generic J/K builds instead of the occupied-factor products: the ROHF gradient and relaxed
    density of the in-memory run to 1e-10."""
    from dataclasses import replace

    import mp2trn.grad.dfmp2 as grad_dfmp2

    mol = _mol(METHYLENE_TRIPLET, 2, "6-31g")
    in_memory = _run(mol, gradient=True, frozen="auto")
    assert "occupied-factor" in in_memory.what_ran["gradient_jk"]
    assert in_memory.what_ran["zvector"]["preconditioner"] == rohf.PRECONDITIONER    # its own, not ResponseJK's
    plan = grad_dfmp2.plan_gradient
    monkeypatch.setattr(grad_dfmp2, "plan_gradient", lambda *a, **k: replace(
        plan(*a, **k), stores_incore=False, strip_block=1, pair_block=1, metric_cols=7, ri_aux_block=1,
        response_factors=False, jk_half_incore=False, jk_columns=1, jk_aux_block=1))
    streamed = _run(mol, gradient=True, frozen="auto")
    assert streamed.what_ran["gradient_out_of_core"] and "J/K builds" in streamed.what_ran["gradient_jk"]
    assert np.max(np.abs(streamed.gradient - in_memory.gradient)) < 1e-10
    assert np.max(np.abs(streamed.densities.dm_relaxed - in_memory.densities.dm_relaxed)) < 1e-10


def test_cli_optimize_then_freq_with_rohf_say_which_reference_ran(tmp_path):
    """`mp2trn optimize --reference rohf` then `mp2trn freq --reference rohf` on its geometry (hydroxyl,
    6-31G): both JSON documents name ROHF, the optimisation's last energy is the ROHF-MBPT(2) energy at its
    final geometry (not UMP2's there), and the frequency run finds that geometry stationary."""
    final, opt_json, freq_json = tmp_path / "final.xyz", tmp_path / "opt.json", tmp_path / "freq.json"
    common = ["--reference", "rohf", "--basis", "6-31g"]
    res = CliRunner().invoke(app, ["optimize", str(molecule_path("hydroxyl")), *common, "--out", str(final),
                                   "--json", str(opt_json)])
    assert res.exit_code == 0, res.output
    opt = json.loads(opt_json.read_text())
    assert opt["success"] and opt["input_specification"]["keywords"]["reference"] == "rohf"
    assert opt["extras"]["mp2trn"]["reference"] == "ROHF"
    assert {step["extras"]["mp2trn"]["reference"] for step in opt["trajectory"]} == {"ROHF"}
    rohf_at_final = mp2trn.run(final, basis="6-31g", reference="rohf").e_tot
    uhf_at_final = mp2trn.run(final, basis="6-31g", reference="uhf").e_tot
    assert abs(opt["energies"][-1] - rohf_at_final) < 1e-7 < abs(opt["energies"][-1] - uhf_at_final)
    res = CliRunner().invoke(app, ["freq", str(final), *common, "--json", str(freq_json)])
    assert res.exit_code == 0, res.output
    assert "not a stationary point" not in res.output
    freq = json.loads(freq_json.read_text())
    assert freq["driver"] == "hessian" and freq["extras"]["mp2trn"]["reference"] == "ROHF"
    assert abs(freq["properties"]["return_energy"] - rohf_at_final) < 1e-7
