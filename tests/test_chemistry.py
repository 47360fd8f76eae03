"""Chemistry coverage: ECPs, basis sets from the Basis Set Exchange and from files, the fitting-basis
rules, spherical/Cartesian functions, spin-scaled MP2 and double hybrids — each against PySCF."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import mp2trn
from mp2trn import basis as B
from mp2trn.cli import app
from mp2trn.errors import InputError
from mp2trn.methods import METHODS, get_method
from mp2trn.molecule import build_mole_with_bases
from mp2trn.validation.pyscf_reference import pyscf_double_hybrid, pyscf_scf_energy

HI = "2\nhydrogen iodide, r = 1.609 A\nH 0 0 0\nI 0 0 1.609\n"
WATER = "molecules/water.xyz"
runner = CliRunner()


def _pyscf_dfmp2(mf, rifit):
    from pyscf import df
    from pyscf.mp import dfmp2, dfump2

    pt = (dfump2.DFUMP2 if mf.mol.spin else dfmp2.DFMP2)(mf)
    pt.with_df = df.DF(mf.mol, auxbasis=rifit)
    pt.verbose = 0
    pt.kernel(with_t2=False)
    return pt


# -- ECPs ----------------------------------------------------------------------------------------------
def test_ecp_applied_by_default_recorded_and_equal_to_pyscf():
    res = mp2trn.run(HI, basis="def2-svp")
    ecp = res.what_ran["bases"]["ecp"]
    assert ecp["atoms"] == [{"atom": 1, "symbol": "I", "core_electrons": 28}]
    assert ecp["elements"]["I"]["name"] == "def2-svp"
    assert res.sizes["nalpha"] + res.sizes["nbeta"] == 1 + 53 - 28
    assert res.to_qcschema()["extras"]["mp2trn"]["bases"]["ecp"]["core_electrons"] == 28
    # PySCF alone, with the same basis, ECP, JK-fit and RI-fit bases
    from pyscf import gto

    mol = gto.M(atom="H 0 0 0; I 0 0 1.609", basis="def2-svp", ecp="def2-svp", verbose=0)
    mf = pyscf_scf_energy(mol, res.what_ran["bases"]["jkfit"]["name"])
    pt = _pyscf_dfmp2(mf, {"H": "def2-svp-ri", "I": "def2-svp-rifit"})
    assert abs(res.e_hf - mf.e_tot) < 1e-9
    assert abs(res.e_corr - pt.e_corr) < 1e-9
    assert res.e_hf > -300   # all-electron iodine would be about -7000 Eh


def test_ecp_none_on_a_basis_made_for_one_is_refused(tmp_path):
    xyz = tmp_path / "hi.xyz"
    xyz.write_text(HI)
    res = runner.invoke(app, ["run", str(xyz), "--basis", "def2-svp", "--ecp", "none"])
    assert res.exit_code == 2
    assert "made for an effective core potential on I" in res.output
    with pytest.raises(InputError, match="effective core potential"):
        mp2trn.run(HI, basis="def2-svp", ecp="none")


def test_ecp_none_on_an_all_electron_basis_is_accepted():
    mol, bases = build_mole_with_bases(WATER, basis="cc-pvdz", ecp="none")
    assert bases.ecp.record() is None and not mol.has_ecp()


def test_ecp_by_name_and_a_name_without_one():
    mol, bases = build_mole_with_bases(HI, basis="def2-svp", ecp="def2-tzvp")
    assert bases.ecp.per_element["I"].name == "def2-tzvp" and mol.atom_nelec_core(1) == 28
    with pytest.raises(InputError, match="defines no ECP"):
        build_mole_with_bases(HI, basis="def2-svp", ecp="cc-pvdz")


def test_ghost_atoms_carry_functions_but_no_ecp():
    mol, bases = build_mole_with_bases("2\n\nH 0 0 0\nGh(I) 0 0 1.609\n", basis="def2-svp", multiplicity=2)
    assert bases.ecp.record() is None
    assert mol.atom_nelec_core(1) == 0 and mol.nelectron == 1
    assert {mol.bas_atom(i) for i in range(mol.nbas)} == {0, 1}


def test_frozen_core_counts_only_the_explicit_core():
    res = mp2trn.run(HI, basis="def2-svp", frozen="auto")
    # the noble-gas core [Kr] (36 electrons) less the 28 the ECP removes ([Ar]3d10): 4s4p, 4 orbitals;
    # all-electron iodine would freeze 18
    assert res.what_ran["frozen_orbitals"] == list(range(4))


# -- basis sources ------------------------------------------------------------------------------------
def test_bse_only_orbital_and_fitting_bases_resolve_and_match_pyscf():
    res = mp2trn.run(WATER, basis="sapporo-dzp-2012", auxbasis="cc-pvdz-rifit")
    bases = res.what_ran["bases"]
    bse = B.bse_source()
    assert {el["source"] for el in bases["orbital"]["elements"].values()} == {bse}
    assert {el["source"] for el in bases["rifit"]["elements"].values()} == {bse}
    import basis_set_exchange as bse_pkg
    from pyscf import gto

    text = bse_pkg.get_basis("sapporo-dzp-2012", elements=[1, 8], fmt="nwchem", header=False)
    mol = gto.M(atom=open(WATER).read().split("\n", 2)[2], basis={"O": gto.basis.parse(text, "O"),
                                                                "H": gto.basis.parse(text, "H")}, verbose=0)
    assert mol.nao == res.sizes["nao"]
    jk = {s: el["name"] for s, el in bases["jkfit"]["elements"].items()}
    mf = pyscf_scf_energy(mol, jk)
    pt = _pyscf_dfmp2(mf, "cc-pvdz-rifit")
    assert abs(res.e_hf - mf.e_tot) < 1e-9 and abs(res.e_corr - pt.e_corr) < 1e-9


def test_unknown_basis_name_is_an_input_error():
    with pytest.raises(InputError, match="is not available"):
        build_mole_with_bases(WATER, basis="no-such-basis")


@pytest.mark.parametrize("fmt", ["nwchem", "gaussian94"])
def test_basis_file_by_path(tmp_path, fmt):
    import basis_set_exchange as bse_pkg

    path = tmp_path / f"ccpvdz.{'nw' if fmt == 'nwchem' else 'gbs'}"
    path.write_text(bse_pkg.get_basis("cc-pvdz", elements=[1, 8], fmt=fmt, header=False))
    by_file = mp2trn.run(WATER, basis=str(path), auxbasis="cc-pvdz-ri", jkbasis="cc-pvdz-jkfit")
    by_name = mp2trn.run(WATER, basis="cc-pvdz")
    assert by_file.what_ran["bases"]["orbital"]["elements"]["O"]["source"] == f"file {path.resolve()}"
    assert abs(by_file.e_tot - by_name.e_tot) < 1e-9


def test_per_element_basis_string():
    mol, bases = build_mole_with_bases(HI, basis="I:def2-svp, H:cc-pvdz")
    assert bases.orbital.per_element["H"].name == "cc-pvdz" and bases.orbital.per_element["I"].name == "def2-svp"
    assert mol.atom_nelec_core(1) == 28


# -- fitting-basis rules (one test each) -----------------------------------------------------------
def _rules(basis, xyz, role):
    mol, bases = build_mole_with_bases(xyz, basis=basis)
    symbols, _ = B.atom_symbols(mol)
    return B.fitting_basis(role, bases.orbital, symbols, None, mol)


def test_fitting_rule_1_pyscf_partner():
    jk, ri = _rules("cc-pvdz", WATER, "jkfit"), _rules("cc-pvdz", WATER, "rifit")
    assert jk.name == "cc-pvdz-jkfit" and ri.name == "cc-pvdz-ri"
    assert set(jk.rules.values()) == set(ri.rules.values()) == {"1: PySCF partner"}


def test_fitting_rule_2_bse_partner():
    ri = _rules("def2-svp", HI, "rifit")
    assert ri.rules["I"] == "2: BSE partner" and ri.per_element["I"].name == "def2-svp-rifit"
    assert ri.per_element["I"].source == B.bse_source()


def test_fitting_rule_3_def2_sets_for_a_family_without_partners():
    xyz = "2\n\nH 0 0 0\nCl 0 0 1.27\n"
    jk, ri = _rules("lanl2dz", xyz, "jkfit"), _rules("lanl2dz", xyz, "rifit")
    assert jk.name == "def2-universal-jkfit" and ri.name == "def2-svp-rifit"
    assert set(jk.rules.values()) == {"3: def2 fitting set"}
    assert B.zeta_level("cc-pvtz-pp") == 3 and B.zeta_level("ano-rcc-vqzp") == 4 and B.zeta_level("lanl2dz") == 2


def test_fitting_rule_4_generated_with_a_warning():
    ri = _rules("ano-rcc-vdz", "2\n\nFr 0 0 0\nH 0 0 2.4\n", "rifit")   # no def2 RI set has francium
    assert ri.rules["Fr"] == "4: generated" and ri.generated == ["Fr"]
    assert ri.per_element["Fr"].source == B.GENERATED


def test_generated_fitting_basis_is_a_warning_in_the_output():
    from mp2trn.pipeline import build_molecule
    from mp2trn.options import RunOptions

    built = build_molecule("2\n\nFr 0 0 0\nH 0 0 2.4\n", RunOptions(basis="ano-rcc-vdz"))
    assert any(n.startswith("WARNING") and "Fr" in n for n in built.basis_notes())


# -- spherical vs Cartesian ----------------------------------------------------------------------------
def test_pople_basis_is_cartesian_by_convention_and_overridable():
    from pyscf import gto

    cart = mp2trn.run(WATER, basis="6-31g*")
    sph = mp2trn.run(WATER, basis="6-31g*", cartesian=False)
    assert cart.what_ran["bases"]["functions"].startswith("cartesian")
    assert sph.what_ran["bases"]["functions"] == "spherical (--spherical)"
    assert cart.sizes["nao"] == sph.sizes["nao"] + 1   # 6d vs 5d on oxygen
    mol = gto.M(atom=open(WATER).read().split("\n", 2)[2], basis="6-31g*", cart=True, verbose=0)
    mf = pyscf_scf_energy(mol, "cc-pvdz-jkfit")
    assert abs(cart.e_hf - mf.e_tot) < 1e-9
    assert not B.cartesian_convention("cc-pvdz") and not B.cartesian_convention("6-311g*")


# -- methods ------------------------------------------------------------------------------------------
def test_spin_scaled_methods_scale_the_same_pair_energies():
    mp2 = mp2trn.run(WATER)
    scs = mp2trn.run(WATER, method="scs-mp2")
    sos = mp2trn.run(WATER, method="SOS-MP2")
    assert abs(scs.e_tot - (mp2.e_hf + 1.2 * mp2.e_corr_os + mp2.e_corr_ss / 3)) < 1e-10
    assert abs(sos.e_tot - (mp2.e_hf + 1.3 * mp2.e_corr_os)) < 1e-10
    assert sos.to_qcschema()["return_result"] == sos.e_tot
    assert sos.to_qcschema()["properties"]["mp2_total_energy"] == pytest.approx(mp2.e_tot, abs=1e-10)


def test_unknown_method_is_an_input_error():
    with pytest.raises(InputError, match="unknown method"):
        mp2trn.RunOptions(method="ccsd")
    assert get_method("DSD-PBEP86-D3BJ").name == "dsd-pbep86"


@pytest.mark.parametrize("name", ["b2plyp", "b2gp-plyp", "dsd-pbep86", "revdsd-pbep86"])
def test_double_hybrid_equals_pyscf_route(name):
    method = METHODS[name]
    res = mp2trn.run(WATER, method=name, grid=1)
    assert res.reference == "RKS" and res.what_ran["method"]["xc"] == method.xc
    mol = mp2trn.molecule.build_mole(WATER)
    bases = res.what_ran["bases"]
    ref = pyscf_double_hybrid(mol, method, bases["jkfit"]["name"], bases["rifit"]["name"], grid=1)
    assert abs(res.e_hf - ref["e_ks"]) < 1e-8
    assert abs(res.e_tot - ref["e_tot"]) < 1e-8
    assert (res.e_disp != 0.0) == (method.dispersion is not None)
    doc = res.to_qcschema()
    assert doc["model"]["method"] == name and doc["return_result"] == res.e_tot
    assert "mp2_total_energy" not in doc["properties"]   # PT2 on KS orbitals is not MP2


def test_double_hybrid_uks_equals_pyscf_route():
    # the methyl radical: a non-degenerate open shell (on a coarse grid, OH's two π components differ by
    # ~1e-7 Eh, and two SCFs may settle in either)
    method = METHODS["b2plyp"]
    res = mp2trn.run("molecules/methyl.xyz", method="b2plyp", grid=1)
    assert res.reference == "UKS"
    mol = mp2trn.molecule.build_mole("molecules/methyl.xyz")
    bases = res.what_ran["bases"]
    ref = pyscf_double_hybrid(mol, method, bases["jkfit"]["name"], bases["rifit"]["name"], grid=1)
    assert abs(res.e_tot - ref["e_tot"]) < 1e-8


def test_double_hybrid_cli_json_records_functional_grid_scalings_dispersion(tmp_path):
    out = tmp_path / "dh.json"
    res = runner.invoke(app, ["run", WATER, "--method", "dsd-pbep86", "--grid", "1", "--json", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    ran = doc["extras"]["mp2trn"]
    assert ran["method"]["c_os"] == 0.52 and ran["method"]["c_ss"] == 0.22
    assert "d3bj" in ran["method"]["dispersion"]
    assert ran["scf"]["grid"]["level"] == 1 and ran["scf"]["grid"]["points"] > 0
    assert ran["dispersion_correction_energy"] < 0


def test_grid_without_double_hybrid_is_refused():
    with pytest.raises(InputError, match="--grid"):
        mp2trn.RunOptions(grid=2)


def test_qcengine_keywords_ecp_and_method():
    pytest.importorskip("qcelemental")
    from mp2trn.qcschema import run_atomic_input

    inp = {"molecule": {"symbols": ["H", "I"], "geometry": [0, 0, 0, 0, 0, 3.04]},
           "specification": {"driver": "energy", "model": {"method": "scs-mp2", "basis": "def2-svp"},
                             "keywords": {"ecp": "def2-svp"}}}
    result = run_atomic_input(inp)
    ran = result.extras["mp2trn"]
    assert ran["bases"]["ecp"]["core_electrons"] == 28
    assert result.return_result == pytest.approx(result.extras["qcvars"]["SCS-MP2 TOTAL ENERGY"], abs=1e-12)


# -- the heavy-element validation set -------------------------------------------------------------------
@pytest.mark.slow   # ~2 min on 2 cores; the fitting/frozen-core choices on these molecules: tests/test_oracle.py
def test_heavy_set_end_to_end_against_pyscf(tmp_path):
    """Every entry of `mp2trn validate --set heavy` (ECP molecules, a UHF radical, ghost iodine) agrees with
    PySCF's own DF-SCF and DF-MP2 on the same bases and ECPs to 1e-9 Eh, and the command writes its table."""
    res = runner.invoke(app, ["validate", "--set", "heavy", "--no-conventional", "--out", str(tmp_path)],
                        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "validate_heavy_cpu_fp64.json").read_text())
    rows = doc["rows"]
    assert len(rows) == 10
    for row in rows:
        assert row["error"] is None and row["passed"], row
        assert row["abs_diff"] <= 1e-9 and row["scf_abs_diff"] <= 1e-9, row["key"]
    by_name = {r["key"]: r for r in rows}
    assert by_name["cisplatin/def2-svp/fc-auto"]["ecp_core_electrons"] == 60
    assert by_name["iodomethyl/def2-svp"]["reference"] == "UHF"
    assert by_name["ammonia_in_complex_basis/def2-svp"]["ecp_core_electrons"] == 0   # ghost iodine: no ECP
    assert (tmp_path / "validate_heavy_cpu_fp64.md").is_file()


# -- everything downstream with ECP molecules ---------------------------------------------------------
def test_counterpoise_with_ghost_heavy_atoms():
    ie = mp2trn.interaction_energy("molecules/heavy/ammonia_iodine.xyz", split=4, basis="def2-svp")
    cores = [sum(a["core_electrons"] for a in (c.result.what_ran["bases"]["ecp"] or {"atoms": []})["atoms"])
             for c in ie.calculations]
    # the complex and I2 in the complex's basis carry two iodine ECPs; NH3 with ghost iodine none
    assert sorted(cores) == [0, 56, 56]
    assert len({c.result.sizes["nao"] for c in ie.calculations}) == 1
    assert -10 < ie.delta["mp2_total"] * 627.5 < 0


def test_sim_device_and_ecp():
    cpu = mp2trn.run(HI, basis="def2-svp")
    sim = mp2trn.run(HI, basis="def2-svp", device="sim")
    assert sim.what_ran["bases"]["ecp"]["core_electrons"] == 28
    assert abs(sim.e_hf - cpu.e_hf) < 1e-7 and abs(sim.e_corr - cpu.e_corr) < 1e-6


def test_batch_with_ecp_molecules(tmp_path):
    (tmp_path / "hi.xyz").write_text(HI)
    out = tmp_path / "res.jsonl"
    res = runner.invoke(app, ["batch", str(tmp_path / "hi.xyz"), "molecules/heavy/stannane.xyz", "--out", str(out),
                              "--basis", "def2-svp", "--method", "scs-mp2", "-q"])
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["result"]["extras"]["mp2trn"]["bases"]["ecp"]["core_electrons"] for r in recs] == [28, 28]
    assert all(r["result"]["model"]["method"] == "scs-mp2" for r in recs)
