"""`mp2trn interaction`: counterpoise-corrected interaction energies against a CP calculation done
directly in PySCF (ghost atoms, same bases), fragment handling, and clear errors for bad fragments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyscf import df, gto, scf
from pyscf.mp import dfmp2
from typer.testing import CliRunner

from mp2trn.cli import app
from mp2trn.errors import InputError
from mp2trn.interaction import build_calculations, interaction_energy, parse_int_list, resolve_fragments
from mp2trn.molecule import parse_xyz, read_xyz
from mp2trn.result import HARTREE_TO_KCAL

ROOT = Path(__file__).resolve().parents[1]
WATER_DIMER = ROOT / "molecules" / "s22" / "02_water_dimer.xyz"
runner = CliRunner()

# the same explicit bases on both sides (never PySCF's implicit choices)
BASIS, JK, RI, CONV = "cc-pvdz", "cc-pvdz-jkfit", "cc-pvdz-ri", 1e-12


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _pyscf_energies(atom: str) -> dict[str, float]:
    """DF-RHF + DF-MP2 done with PySCF alone; ``atom`` may hold ghost-X labels."""
    mol = gto.M(atom=atom, basis=BASIS, unit="Angstrom", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=JK)
    mf.conv_tol = CONV
    mf.kernel()
    assert mf.converged
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=RI)
    pt.verbose = 0
    pt.run()
    return {
        "scf": mf.e_tot,
        "mp2_correlation": pt.e_corr,
        "mp2_total": mf.e_tot + pt.e_corr,
        "scs_mp2_total": mf.e_tot + 1.2 * pt.e_corr_os + pt.e_corr_ss / 3,
    }


def pyscf_interaction(counterpoise: bool) -> dict[str, float]:
    geom = read_xyz(WATER_DIMER)
    atoms = [(a.symbol, a.coords) for a in geom.atoms]
    n_a = geom.fragments[0]

    def line(sym, xyz, ghost=False):
        return f"{'ghost-' if ghost else ''}{sym} {xyz[0]} {xyz[1]} {xyz[2]}"

    dimer = "; ".join(line(s, x) for s, x in atoms)
    if counterpoise:
        mono_a = "; ".join(line(s, x, ghost=i >= n_a) for i, (s, x) in enumerate(atoms))
        mono_b = "; ".join(line(s, x, ghost=i < n_a) for i, (s, x) in enumerate(atoms))
    else:
        mono_a = "; ".join(line(s, x) for s, x in atoms[:n_a])
        mono_b = "; ".join(line(s, x) for s, x in atoms[n_a:])
    e_ab, e_a, e_b = (_pyscf_energies(a) for a in (dimer, mono_a, mono_b))
    return {k: e_ab[k] - e_a[k] - e_b[k] for k in e_ab}


def _without_separator(tmp_path: Path) -> Path:
    text = WATER_DIMER.read_text().splitlines()
    plain = tmp_path / "water_dimer_plain.xyz"
    plain.write_text("\n".join([text[0], "water dimer, no fragment separator"] + [ln for ln in text[2:] if ln.strip() != "--"]) + "\n")
    return plain


@pytest.mark.parametrize("counterpoise", [True, False], ids=["cp", "no-cp"])
def test_water_dimer_matches_a_direct_pyscf_counterpoise_calculation(tmp_path, counterpoise):
    ref = pyscf_interaction(counterpoise)
    out = tmp_path / "ie.json"
    # fragments from --split on a file without separators, to cover that path too
    res = invoke("interaction", _without_separator(tmp_path), "--split", 3, "--auxbasis", RI, "--jkbasis", JK,
                 "--conv-tol", CONV, "--cp" if counterpoise else "--no-cp", "--json", out)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    ie = doc["interaction_energy"]
    assert ie["counterpoise"] is counterpoise
    for key in ("scf", "mp2_correlation", "mp2_total", "scs_mp2_total"):
        assert abs(ie[key] - ref[key]) <= 1e-8, (key, ie[key], ref[key])
        assert doc["interaction_energy_kcal_per_mol"][key] == pytest.approx(ie[key] * HARTREE_TO_KCAL, rel=1e-12)
    # CP: every calculation in the full dimer basis (orbital and both fitting bases); no CP: own basis
    calcs = doc["calculations"]
    assert [c["sign"] for c in calcs] == [1, -1, -1]
    nao = {c["result"]["properties"]["calcinfo_nbasis"] for c in calcs}
    naux = {c["result"]["extras"]["mp2trn"]["sizes"]["naux"] for c in calcs}
    assert (len(nao), len(naux)) == ((1, 1) if counterpoise else (2, 2))
    assert [c["ghost_atoms"] for c in calcs] == ([0, 3, 3] if counterpoise else [0, 0, 0])
    ghosts = calcs[1]["result"]["molecule"]["real"]
    assert ghosts == ([True] * 3 + [False] * 3 if counterpoise else [True] * 3)
    # the human output has every quantity in both units
    assert "SCS-MP2 total" in res.output and "kcal/mol" in res.output and "counterpoise" in res.output
    # the separator file gives the same numbers
    if counterpoise:
        sep = interaction_energy(WATER_DIMER, auxbasis=RI, jkbasis=JK, conv_tol=CONV)
        for key in ie:
            if key != "counterpoise":
                assert abs(sep.delta[key] - ie[key]) <= 1e-10


def test_cp_correction_reduces_binding_and_monomers_see_the_partner_basis():
    cp = interaction_energy(WATER_DIMER, counterpoise=True, conv_tol=1e-10)
    raw = interaction_energy(WATER_DIMER, counterpoise=False, conv_tol=1e-10)
    # basis-set superposition error makes the uncorrected dimer more bound, most of all in MP2 correlation
    assert raw.delta["mp2_total"] < cp.delta["mp2_total"] < 0
    assert raw.delta["mp2_correlation"] < cp.delta["mp2_correlation"]
    # ghost functions lower each monomer's energy (variational SCF)
    for k in (1, 2):
        assert cp.calculations[k].result.e_hf < raw.calculations[k].result.e_hf
    assert cp.delta["mp2_total"] == pytest.approx(
        cp.calculations[0].result.e_tot - cp.calculations[1].result.e_tot - cp.calculations[2].result.e_tot, abs=1e-14)


def test_open_shell_fragments_and_frozen_core(tmp_path):
    """OH radical + water: UHF fragments in the complex's basis, charges/multiplicities from the comment."""
    xyz = tmp_path / "oh_water.xyz"
    xyz.write_text(
        "5\nOH radical - water, multiplicities=2,1\n"
        "O 0.000 0.000 0.000\nH 0.000 0.000 0.970\n--\n"
        "O 0.000 0.000 2.900\nH 0.760 0.000 3.480\nH -0.760 0.000 3.480\n"
    )
    ie = interaction_energy(xyz, frozen="auto", conv_tol=1e-10)
    assert [f.multiplicity for f in ie.fragments] == [2, 1]
    assert [c.multiplicity for c in ie.calculations] == [2, 2, 1]
    assert [c.result.reference for c in ie.calculations] == ["UHF", "UHF", "RHF"]
    assert len({c.result.sizes["nao"] for c in ie.calculations}) == 1
    assert len({c.result.sizes["naux"] for c in ie.calculations}) == 1
    # one O core per real oxygen is frozen; ghost oxygens have no core to freeze
    assert [c.result.what_ran["frozen_orbitals"] for c in ie.calculations] == [
        [[0, 1], [0, 1]], [[0], [0]], [0]]
    assert -0.02 < ie.delta["mp2_total"] < 0


# --- fragments, charges and multiplicities -------------------------------------------------------


def test_resolve_fragments_defaults_and_comment_lists():
    geom = read_xyz(WATER_DIMER)
    frags, q, m = resolve_fragments(geom)
    assert [f.atoms for f in frags] == [(0, 1, 2), (3, 4, 5)]
    assert [(f.charge, f.multiplicity) for f in frags] == [(0, 1), (0, 1)] and (q, m) == (0, 1)
    frags, q, m = resolve_fragments(geom, charges="1,0", multiplicities="2,1")
    assert (q, m) == (1, 2) and frags[0].formula == "H2O"
    # two doublets (two OH radicals): high spin (triplet) by default, singlet on request
    geom2 = parse_xyz("4\ntwo OH radicals, charges=0,0 multiplicities=2,2\nO 0 0 0\nH 0 0 1\n--\nO 0 0 3\nH 0 0 4\n")
    frags, q, m = resolve_fragments(geom2)
    assert [f.multiplicity for f in frags] == [2, 2] and (q, m) == (0, 3)
    assert resolve_fragments(geom2, multiplicity=1)[2] == 1
    # flags win over the comment line: OH+ and OH-, both singlets
    frags, q, m = resolve_fragments(geom2, charges=[1, -1], multiplicities=[1, 1])
    assert [(f.charge, f.multiplicity) for f in frags] == [(1, 1), (-1, 1)] and (q, m) == (0, 1)


def test_build_calculations_ghosts_partner_atoms():
    geom = read_xyz(WATER_DIMER)
    frags, q, m = resolve_fragments(geom)
    cp = build_calculations(geom, frags, q, m, counterpoise=True)
    assert [c.geometry.atom_string().count("ghost-") for c in cp] == [0, 3, 3]
    assert [a.ghost for a in cp[2].geometry.atoms] == [True] * 3 + [False] * 3
    raw = build_calculations(geom, frags, q, m, counterpoise=False)
    assert [len(c.geometry.atoms) for c in raw] == [6, 3, 3]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"split": 0}, "--split 0 is out of range"),
        ({"split": 6}, "--split 6 is out of range"),
        ({"split": -2}, "must be 1..5"),
        ({"split": 2}, "disagrees with the '--' fragment separators"),
        ({"charges": "1,0", "multiplicities": "1,1"}, "fragment 1 (H2O, atoms 1-3): impossible charge/multiplicity"),
        ({"multiplicities": "1,2"}, "fragment 2 (H2O, atoms 4-6): impossible charge/multiplicity"),
        ({"charges": "0,20"}, "fragment 2 (H2O, atoms 4-6): impossible charge 20"),
        ({"charges": "0"}, "1 charges given (0) for 2 fragments"),
        ({"charges": "0,x"}, "comma-separated list of integers"),
        ({"charge": 1}, "the complex has charge 1: say how it is shared"),
        ({"charge": 1, "charges": "0,0"}, "add up to 0, but the complex's charge is given as 1"),
        ({"multiplicity": 3}, "cannot be formed from fragments of multiplicity 1,1"),
        ({"charges": "1,1", "multiplicities": "2,2", "multiplicity": 2}, "the complex: impossible charge/multiplicity"),
    ],
)
def test_bad_fragment_specifications_are_clear_input_errors(kwargs, message):
    geom = read_xyz(WATER_DIMER)
    geom.comment = "water dimer"  # no charges=/multiplicities= lists: only the arguments count
    with pytest.raises(InputError) as err:
        resolve_fragments(geom, **kwargs)
    assert message in str(err.value)


def test_parse_int_list():
    assert parse_int_list("0, -1,+2", "--charges") == [0, -1, 2]
    assert parse_int_list(None, "x") is None
    with pytest.raises(InputError):
        parse_int_list("", "--charges")


# --- the CLI: one-line errors, exit code 2, no JSON left behind -----------------------------------


def _cli_error(tmp_path, xyz, *args):
    out = tmp_path / "ie.json"
    res = invoke("interaction", xyz, *args, "--json", out)
    assert res.exit_code == 2, res.output
    assert not out.exists()
    assert list(tmp_path.glob(".*.tmp")) == []
    return res.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--split", "0"], "--split 0 is out of range"),
        (["--split", "6"], "--split 6 is out of range"),
        (["--charges", "1,0", "--multiplicities", "1,1"], "fragment 1 (H2O, atoms 1-3): impossible"),
        (["--charges", "0,0,0"], "3 charges given"),
        (["--frozen-core", "2"], "frozen core 2 is ambiguous for an interaction energy"),
        (["--auxbasis", "no-such-basis-ri"], "auxiliary basis 'no-such-basis-ri' is not usable"),
    ],
)
def test_cli_bad_inputs(tmp_path, args, message):
    assert message in _cli_error(tmp_path, WATER_DIMER, *args)


@pytest.mark.parametrize(
    "body, message",
    [
        ("--\nO 0 0 0\nH 0 0 1\n--\nH 0 0 3\n", "empty fragment before '--'"),
        ("O 0 0 0\nH 0 0 1\n--\n--\nH 0 0 3\n", "empty fragment before '--'"),
        ("O 0 0 0\nH 0 0 1\nH 0 0 3\n--\n", "empty fragment after the last '--'"),
        ("O 0 0 0\nH 0 0 1\nH 0 0 3\n", "no fragments given: use --split N"),
        ("O 0 0 0\nH 0 0 1\n--\nGh(H) 0 0 3\n", "fragment 2 (ghosts only, atom 3) has only ghost atoms"),
    ],
)
def test_cli_empty_or_missing_fragments(tmp_path, body, message):
    xyz = tmp_path / "bad.xyz"
    xyz.write_text("3\nbad fragments\n" + body)
    assert message in _cli_error(tmp_path, xyz)


def test_cli_split_on_a_single_atom(tmp_path):
    xyz = tmp_path / "he.xyz"
    xyz.write_text("1\nhelium\nHe 0 0 0\n")
    assert "a complex needs at least 2" in _cli_error(tmp_path, xyz, "--split", "1")


def test_cli_missing_file(tmp_path):
    assert "no such file" in _cli_error(tmp_path, tmp_path / "nope.xyz", "--split", "1")
