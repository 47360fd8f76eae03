"""The Python API: inputs (XYZ path/text, PySCF atom string, Mole), ghost atoms, device selection."""

from __future__ import annotations

import pytest
from pyscf import gto

import mp2trn
from mp2trn.errors import DeviceUnavailableError, InputError
from mp2trn.molecule import build_mole, parse_xyz

from .conftest import molecule_path

WATER_ATOMS = "O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692"


@pytest.fixture(scope="module")
def water_result():
    return mp2trn.run(molecule_path("water"))


def test_atom_string_mole_and_xyz_text_give_the_same_energy(water_result):
    by_string = mp2trn.run(WATER_ATOMS)
    mol = gto.M(atom=WATER_ATOMS, basis="cc-pvdz", verbose=0)
    by_mole = mp2trn.run(mol)
    by_text = mp2trn.run(molecule_path("water").read_text())
    for res in (by_string, by_mole, by_text):
        assert abs(res.e_tot - water_result.e_tot) < 1e-9


@pytest.mark.parametrize("label", ["Gh(O)", "X-O", "ghost-O", "gh(o)"])
def test_ghost_atom_notations(label):
    geom = parse_xyz(f"3\nghost\n{label} 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n")
    assert geom.atoms[0].ghost and geom.atoms[0].symbol == "O"
    mol = build_mole(geom, basis="cc-pvdz", charge=0, multiplicity=1)
    assert mol.nelectron == 2  # the ghost brings basis functions, no nucleus, no electrons
    assert mol.nao_nr() == 24  # but all 24 cc-pVDZ functions of water


def test_ghost_atoms_run_and_are_marked_in_json():
    res = mp2trn.run(f"3\nghost O\nGh(O) 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n")
    doc = res.to_qcschema()
    assert doc["molecule"]["real"] == [False, True, True]
    assert doc["molecule"]["symbols"] == ["O", "H", "H"]
    assert res.e_corr < 0


def test_auto_device_says_what_it_picked(water_result):
    res = mp2trn.run(molecule_path("water"), device="auto")
    assert "auto picked" in res.what_ran["device_selection"]
    assert res.what_ran["blas"]   # which BLAS pool ran, and which were held back (mp2trn.threads)
    tol = 1e-8 if res.what_ran["precision"] == "fp64" else 1e-6
    assert abs(res.e_corr - water_result.e_corr) < tol


def test_conventional_scf_and_explicit_jkbasis(water_result):
    conv = mp2trn.run(molecule_path("water"), scf_df=False)
    assert conv.what_ran["jkbasis"] is None
    assert abs(conv.e_hf - water_result.e_hf) < 1e-4  # DF-SCF error is small but real
    jk = mp2trn.run(molecule_path("water"), jkbasis="def2-universal-jkfit")
    assert jk.what_ran["jkbasis"] == "def2-universal-jkfit"


def test_result_properties_are_consistent(water_result):
    # sums of the result's own parts: equal to rounding (1e-12 Eh), far inside any accuracy claim
    r = water_result
    assert r.e_corr == pytest.approx(r.e_corr_os + r.e_corr_ss, rel=0, abs=1e-12)
    assert r.e_tot == pytest.approx(r.e_hf + r.e_corr, rel=0, abs=1e-12)
    assert r.e_scs_corr == pytest.approx(1.2 * r.e_corr_os + r.e_corr_ss / 3, rel=0, abs=1e-12)
    assert r.sizes["nocc"] == 5 and r.sizes["naux"] == 84


def test_dfmp2_requires_converged_scf_and_takes_rohf():
    from pyscf import scf

    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol)
    mf.max_cycle = 1
    mf.kernel()
    with pytest.raises(mp2trn.ConvergenceError):
        mp2trn.DFMP2(mf).run()
    rohf = scf.ROHF(mol).run()
    pt = mp2trn.DFMP2(rohf).run()   # ROHF-MBPT(2) (tests/test_rohf.py, gradients in test_rohf_gradient.py)
    assert pt.result.reference == "ROHF" and pt.e_singles < 0
    with pytest.raises(InputError, match="density-fitted SCF"):   # this ROHF has exact integrals
        pt.nuc_grad_method().kernel()


def test_unknown_and_missing_devices(water_rhf):
    with pytest.raises(InputError, match="unknown device"):
        mp2trn.DFMP2(water_rhf, device="quantum").run()
    with pytest.raises(DeviceUnavailableError):
        mp2trn.DFMP2(water_rhf, device="neuron").run()


def test_pair_energies_sum_to_the_correlation_energy(water_rhf):
    pt = mp2trn.DFMP2(water_rhf, keep_pair_energies=True).run()
    (pairs,) = pt.result.pair_energies
    assert pairs.shape == (5, 5)
    assert abs(pairs.sum() - pt.e_corr) < 1e-12
    assert (pairs[pairs != 0] < 0).all()


def test_progress_reports_every_stage_in_order():
    events = []
    mp2trn.run(molecule_path("water"), progress=lambda stage, done, total: events.append((stage, done, total)))
    stages = [e[0] for e in events]
    scf = [e for e in events if e[0] == "scf"]
    assert scf[0][1] == 0 and scf[-1][1] == scf[-1][2] > 1  # a line per SCF cycle, then complete
    assert [e[1] for e in scf[1:-1]] == list(range(1, len(scf) - 1))
    order = [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s]
    assert order == ["scf", "ao_to_mo", "metric", "pairs"]
    assert all(0 <= done <= total for _, done, total in events)
