"""Fitting bases named as Psi4 and ORCA name them (issue 38): each name resolves, element by element, to
the functions of the set it means — checked against that set fetched from the Basis Set Exchange by the
name written out here — runs end to end with the typed name and the set that ran recorded, and a name
that maps nowhere is an error listing the known names spelt like it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from pyscf import gto
from typer.testing import CliRunner

import mp2trn
from mp2trn import basis as B
from mp2trn.cli import app
from mp2trn.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
CH2I2 = ROOT / "molecules/heavy/diiodomethane.xyz"
WATER = ROOT / "molecules/water.xyz"
HEAVY = ["C", "H", "I"]
LIGHT = ["O", "H"]
runner = CliRunner()

# (typed name, role, elements, the BSE's name of the set it means — written out, not computed)
PSI4 = [
    ("def2-svp-ri", "rifit", HEAVY, "def2-SVP-RIFIT"),
    ("def2-tzvpp-ri", "rifit", HEAVY, "def2-TZVPP-RIFIT"),
    ("def2-sv_p_-ri", "rifit", HEAVY, "def2-SV(P)-RIFIT"),
    ("def2-universal-jkfit", "jkfit", HEAVY, "def2-universal-JKFIT"),
    ("def2-qzvpp-jkfit", "jkfit", HEAVY, "def2-universal-JKFIT"),
    ("cc-pvtz-ri", "rifit", LIGHT, "cc-pVTZ-RIFIT"),
    ("aug-cc-pvtz-ri", "rifit", LIGHT, "aug-cc-pVTZ-RIFIT"),
    ("cc-pvtz-jkfit", "jkfit", LIGHT, "cc-pVTZ-JKFIT"),
]
ORCA = [
    ("def2/J", "jkfit", HEAVY, "def2-universal-JFIT"),
    ("def2/JK", "jkfit", HEAVY, "def2-universal-JKFIT"),
    ("def2-SVP/C", "rifit", HEAVY, "def2-SVP-RIFIT"),
    ("def2-TZVPP/C", "rifit", HEAVY, "def2-TZVPP-RIFIT"),
    ("def2-SV(P)/C", "rifit", HEAVY, "def2-SV(P)-RIFIT"),
    ("cc-pVTZ/C", "rifit", LIGHT, "cc-pVTZ-RIFIT"),
    ("aug-cc-pVTZ/C", "rifit", LIGHT, "aug-cc-pVTZ-RIFIT"),
    ("cc-pVTZ/JK", "jkfit", LIGHT, "cc-pVTZ-JKFIT"),
]


def _overlap(symbol: str, basis) -> np.ndarray:
    """One atom's overlap matrix in ``basis`` (a name PySCF loads, or shells): equal matrices, equal sets."""
    z = gto.charge(symbol)
    mol = gto.M(atom=f"{symbol} 0 0 0", basis={symbol: basis}, spin=z % 2, verbose=0)
    return mol.intor("int1e_ovlp")


def _bse_shells(bse_name: str, symbol: str):
    import basis_set_exchange as bse

    text = bse.get_basis(bse_name, elements=[gto.charge(symbol)], fmt="nwchem", header=False)
    return gto.basis.parse(text, symbol)


@pytest.mark.parametrize("typed, role, symbols, bse_name", PSI4 + ORCA, ids=[c[0] for c in PSI4 + ORCA])
def test_other_program_name_resolves_to_the_set_it_means(typed, role, symbols, bse_name):
    chosen = B.fitting_basis(role, B.BasisSet("orbital", {}), symbols, typed)
    assert chosen.given == typed and set(chosen.per_element) == set(symbols)
    for sym in symbols:
        ours, theirs = _overlap(sym, chosen.pyscf_basis()[sym]), _overlap(sym, _bse_shells(bse_name, sym))
        assert ours.shape == theirs.shape and np.allclose(ours, theirs, atol=1e-10), (typed, sym)
    record = chosen.record()
    assert record["given"] == typed
    program = "ORCA" if "/" in typed else "Psi4"
    for sym, element in record["elements"].items():   # an element found under the typed name needs no note
        assert element["rule"] == "given"
        assert "read_as" not in element or element["read_as"].startswith(f"{program}'s {typed} = ")


def test_a_name_found_as_typed_is_not_read_as_another_program_s():
    """Names PySCF's library already knows (Psi4 and PySCF share them) resolve there, as before."""
    chosen = B.fitting_basis("rifit", B.BasisSet("orbital", {}), LIGHT, "cc-pvtz-ri")
    assert chosen.name == "cc-pvtz-ri" and not chosen.read_as
    assert {eb.source for eb in chosen.per_element.values()} == {B.PYSCF_LIBRARY}


@pytest.fixture(scope="module")
def pyscf_ch2i2():
    """PySCF's own DF-SCF and DF-MP2 of CH2I2/def2-SVP with the sets named in full: Weigend's universal JK
    fit, def2-SVP-RI from PySCF's library for C and H and def2-SVP-RIFIT for iodine (which PySCF's library
    lacks: PySCF fetches it from the BSE itself). Returns (E_SCF, E_corr) in Eh."""
    from pyscf import df, scf
    from pyscf.mp import dfmp2

    atoms = "\n".join(CH2I2.read_text().splitlines()[2:])
    mol = gto.M(atom=atoms, basis="def2-svp", ecp={"I": "def2-svp"}, verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis="def2-universal-jkfit")
    mf.conv_tol = 1e-10
    mf.kernel()
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis={"C": "def2-svp-ri", "H": "def2-svp-ri", "I": "def2-svp-rifit"})
    pt.kernel(with_t2=False)
    return mf.e_tot, pt.e_corr


def test_psi4_names_through_qcengine_on_diiodomethane_match_pyscf(pyscf_ch2i2):
    """The issue's case: QCEngine keywords df_basis_mp2 "def2-svp-ri" on CH2I2 (PySCF's def2-svp-ri has no
    iodine) and df_basis_scf "def2-universal-jkfit", against PySCF's own route with the sets named in full."""
    pytest.importorskip("qcelemental")
    from mp2trn.qcschema import run_atomic_input

    lines = CH2I2.read_text().splitlines()[2:]
    symbols = [ln.split()[0] for ln in lines]
    geometry = [float(x) / 0.52917721092 for ln in lines for x in ln.split()[1:4]]
    inp = {"molecule": {"symbols": symbols, "geometry": geometry},
           "specification": {"driver": "energy", "model": {"method": "mp2", "basis": "def2-svp"},
                             "keywords": {"df_basis_mp2": "def2-svp-ri", "df_basis_scf": "def2-universal-jkfit"}}}
    result = run_atomic_input(inp)
    bases = result.extras["mp2trn"]["bases"]
    assert bases["rifit"]["given"] == "def2-svp-ri" and bases["jkfit"]["given"] == "def2-universal-jkfit"
    assert bases["rifit"]["elements"]["I"]["name"] == "def2-svp-rifit"
    assert bases["rifit"]["elements"]["I"]["read_as"] == "Psi4's def2-svp-ri = def2-svp-rifit"
    e_scf, e_corr = pyscf_ch2i2
    assert abs(result.properties.scf_total_energy - e_scf) < 1e-8
    assert abs(result.properties.mp2_correlation_energy - e_corr) < 1e-8


def test_orca_names_on_the_cli_record_the_name_typed_and_the_set_that_ran(tmp_path, pyscf_ch2i2):
    """ORCA's spellings on iodine: def2-SVP/C (the BSE's def2-SVP-RIFIT for every element) and def2/JK are
    the sets of PySCF's route above, so its energies."""
    out = tmp_path / "orca.json"
    res = runner.invoke(app, ["run", str(CH2I2), "--basis", "def2-svp", "--auxbasis", "def2-SVP/C",
                              "--jkbasis", "def2/JK", "--json", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    bases = doc["extras"]["mp2trn"]["bases"]
    assert bases["rifit"]["given"] == "def2-SVP/C" and bases["rifit"]["name"] == "def2-svp-rifit"
    assert bases["jkfit"]["given"] == "def2/JK" and bases["jkfit"]["name"] == "def2-universal-jkfit"
    assert bases["rifit"]["elements"]["I"]["read_as"] == "ORCA's def2-SVP/C = def2-svp-rifit"
    e_scf, e_corr = pyscf_ch2i2
    props = doc["properties"]
    assert abs(props["scf_total_energy"] - e_scf) < 1e-8
    assert abs(props["mp2_correlation_energy"] - e_corr) < 1e-8


def test_orca_and_psi4_names_on_water_give_the_same_energy():
    """A light molecule: ORCA's cc-pVDZ/C (the BSE's cc-pVDZ-RIFIT) and Psi4's cc-pvdz-ri (PySCF's library)
    are one set, so one energy; the record says which name each run read."""
    orca = mp2trn.run(WATER, basis="cc-pvdz", auxbasis="cc-pVDZ/C", jkbasis="cc-pVDZ/JK")
    psi4 = mp2trn.run(WATER, basis="cc-pvdz", auxbasis="cc-pvdz-ri", jkbasis="cc-pvdz-jkfit")
    assert orca.what_ran["bases"]["rifit"]["elements"]["O"]["source"] == B.bse_source()
    assert psi4.what_ran["bases"]["rifit"]["elements"]["O"]["source"] == B.PYSCF_LIBRARY
    assert orca.what_ran["bases"]["rifit"]["given"] == "cc-pVDZ/C"
    assert abs(orca.e_tot - psi4.e_tot) < 1e-10


def test_pyscf_style_api_takes_other_programs_names():
    """mp2trn.DFMP2(mf, auxbasis=...) resolves through the same rules: ORCA's def2-SVP/C is Psi4's def2-svp-ri."""
    from pyscf import scf

    mol = gto.M(atom=WATER.read_text().split("\n", 2)[2], basis="def2-svp", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis="def2-universal-jkfit").run()
    orca = mp2trn.DFMP2(mf, auxbasis="def2-SVP/C").run()
    psi4 = mp2trn.DFMP2(mf, auxbasis="def2-svp-ri").run()
    assert abs(orca.e_corr - psi4.e_corr) < 1e-12


# -- names that map nowhere ------------------------------------------------------------------------------
def test_a_misspelt_name_lists_near_matches():
    with pytest.raises(InputError, match=r"near matches: .*def2-svp-ri"):
        B.fitting_basis("rifit", B.BasisSet("orbital", {}), HEAVY, "def2-svp-rj")


def test_an_unknown_name_on_the_cli_is_one_line_with_near_matches():
    res = runner.invoke(app, ["run", str(WATER), "--auxbasis", "cc-pvdz-rfit"])
    assert res.exit_code == InputError.exit_code
    assert "auxiliary basis 'cc-pvdz-rfit' is not usable" in res.output and "near matches:" in res.output


def test_a_set_without_the_element_names_it_and_what_the_name_was_read_as():
    """cc-pVTZ-RIFIT has no iodine (cc-pVTZ has none): the error says so, not 'unknown name'."""
    with pytest.raises(InputError, match=r"no functions for I .*ORCA's cc-pVTZ/C = cc-pvtz-rifit"):
        B.fitting_basis("rifit", B.BasisSet("orbital", {}), HEAVY, "cc-pVTZ/C")


def test_orca_autoaux_is_explained():
    with pytest.raises(InputError, match="AutoAux generates a fitting set"):
        B.fitting_basis("rifit", B.BasisSet("orbital", {}), LIGHT, "AutoAux")


def test_a_fitting_name_as_the_orbital_basis_says_where_it_belongs():
    with pytest.raises(InputError, match=r"ORCA's def2-SVP/C = def2-svp-rifit, a fitting basis: give it as --auxbasis"):
        B.resolve_orbital("def2-SVP/C", LIGHT)


# -- the table in docs/bases.md is the code's ----------------------------------------------------------------
def test_docs_table_of_other_programs_names_matches_the_code():
    text = (ROOT / "docs/bases.md").read_text()
    section = text.split("## Names from Psi4 and ORCA", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (Psi4|ORCA) \| `([^`]+)` \| `([^`]+)` \|", section, re.MULTILINE)
    assert len(rows) >= 8
    for program, typed, meaning in rows:
        foreign = B.other_program_name(typed)
        assert foreign is not None and (foreign.program, foreign.meaning) == (program, meaning), typed


def test_a_coulomb_only_jk_basis_is_warned_about():
    """def2/J fits Coulomb only; used for exchange too, the run's notes say so (def2/JK does not warn)."""
    from mp2trn.options import RunOptions
    from mp2trn.pipeline import build_molecule

    water = "O 0 0 0.117; H 0 0.757 -0.469; H 0 -0.757 -0.469"
    notes = build_molecule(water, RunOptions(basis="def2-svp", jkbasis="def2/J")).basis_notes()
    assert any("Coulomb only" in n and "H, O" in n for n in notes), notes
    assert not build_molecule(water, RunOptions(basis="def2-svp", jkbasis="def2/JK")).basis_notes()
