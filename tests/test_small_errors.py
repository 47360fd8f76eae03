"""Small errors said clearly: one atom has no geometry to optimise; gradients refuse a canonically
orthogonalised SCF (--lindep), before the SCF where the options say so; constraints files read strictly."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.constraints import parse_constraints
from mp2trn.errors import InputError
from mp2trn.options import RunOptions

from .conftest import molecule_path

runner = CliRunner()
WATER = str(molecule_path("water"))
#: two s functions on each H with almost the same exponent: the overlap has two near-zero eigenvalues
DEPENDENT = {"H": [[0, [1.0, 1.0]], [0, [1.00001, 1.0]], [0, [0.2, 1.0]]]}
H2 = "2\nH2\nH 0 0 0\nH 0 0 0.74\n"


def _refuse_scf(monkeypatch):
    """Any SCF started fails the test: the refusals below must come first."""
    import mp2trn.pipeline

    def no_scf(*args, **kwargs):
        raise AssertionError("an SCF started before the refusal")

    monkeypatch.setattr(mp2trn.pipeline, "run_scf", no_scf)


@pytest.mark.parametrize("command", [["run", WATER, "--gradient"], ["optimize", WATER]])
def test_lindep_gradient_is_refused_before_the_scf(monkeypatch, command):
    pytest.importorskip("geometric")
    _refuse_scf(monkeypatch)
    res = runner.invoke(app, [*command, "--basis", "sto-3g", "--lindep", "1e-7"])
    assert res.exit_code == 2
    assert "--lindep with a gradient" in res.output and "derivative of that projection" in res.output
    with pytest.raises(InputError, match="--lindep with a gradient"):
        RunOptions(gradient=True, lindep=1e-7)


def test_gradient_of_an_orthogonalised_scf_is_refused():
    """A PySCF SCF that dropped two near-dependent combinations (PySCF's own threshold, set by the user):
    its energy runs, its gradient is refused, naming the orbital count."""
    from pyscf import gto, scf

    mol = gto.M(atom="H 0 0 0; H 0 0 0.74", basis=DEPENDENT, verbose=0)
    saved = scf.hf.remove_overlap_zero_eigenvalue, scf.hf.overlap_zero_eigenvalue_threshold
    scf.hf.remove_overlap_zero_eigenvalue, scf.hf.overlap_zero_eigenvalue_threshold = True, 1e-7
    try:
        mf = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit").run()
    finally:
        scf.hf.remove_overlap_zero_eigenvalue, scf.hf.overlap_zero_eigenvalue_threshold = saved
    assert mf.converged and mf.mo_coeff.shape == (6, 4)
    pt = mp2trn.DFMP2(mf, auxbasis="cc-pvdz-ri").run()
    assert pt.e_corr < 0
    with pytest.raises(InputError, match="orbitals span 4 of the 6 basis functions: canonical orthogonalisation"):
        pt.nuc_grad_method().kernel()


def test_lindep_energy_still_runs():
    res = mp2trn.run(H2, basis=DEPENDENT, auxbasis="cc-pvdz-ri", jkbasis="cc-pvdz-jkfit", lindep=1e-7)
    assert res.e_corr < 0 and res.sizes["nmo"] == res.sizes["nao"] - 2


@pytest.mark.parametrize("text", ["1\none atom\nNe 0 0 0\n", "2\nNe and a ghost\nNe 0 0 0\nGh(He) 0 0 3\n"])
def test_one_atom_has_no_geometry_to_optimise(tmp_path, monkeypatch, text):
    pytest.importorskip("geometric")
    _refuse_scf(monkeypatch)
    xyz = tmp_path / "atom.xyz"
    xyz.write_text(text)
    res = runner.invoke(app, ["optimize", str(xyz), "--basis", "sto-3g"])
    assert res.exit_code == 2 and "has no geometry to optimise" in res.output
    assert "a and b must be different" not in res.output


# -- constraints files ----------------------------------------------------------------------------------

SYMBOLS = ["O", "H", "H", "H"]
EVERY_TYPE = """$freeze
xyz 1          # a comment
YX h           # case, axis order and an element, as geomeTRIC takes them
distance 1 2
$set
angle 2 1 3 95.0
trans-zx 1-3 0.1 0.2
rotation 1-3 0 0 1 30
$scan
dihedral 4 1 2 3 0 180 7
centroid_distance 1 2,3 1.0 1.5 3
$end
"""


def test_every_type_is_read_as_geometric_reads_it():
    """geomeTRIC parses the file mp2trn writes back into the same primitives and values as the original."""
    pytest.importorskip("geometric")
    from geometric.molecule import Molecule
    from geometric.prepare import parse_constraints as geometric_parse

    molecule = Molecule()
    molecule.elem = SYMBOLS
    molecule.xyzs = [np.array([[0, 0, 0], [0, 0.8, 0.5], [0, -0.8, 0.5], [0.3, 0.2, 1.4]])]
    read = parse_constraints(EVERY_TYPE, SYMBOLS)
    theirs, their_values = geometric_parse(molecule, EVERY_TYPE)
    ours, our_values = geometric_parse(molecule, read.geometric_text())
    assert [repr(p) for p in ours] == [repr(p) for p in theirs] and len(theirs) == 18
    assert np.allclose(np.array(our_values, dtype=float), np.array(their_values, dtype=float), equal_nan=True)
    assert read.describe(SYMBOLS)[:4] == ["freeze xyz of O1", "freeze xy of H2, H3, H4", "freeze distance O1-H2",
                                          "set angle H2-O1-H3 to 95°"]
    assert read.describe(SYMBOLS)[-2] == "scan dihedral H4-O1-H2-H3 from 0° to 180° (7 points)"


@pytest.mark.parametrize("text, line, why", [
    ("$set garbage\nangle 2 1 3 95\n", 1, "unknown section $set garbage"),
    ("$freeze\ndistance 1 2\n$sett\n", 3, "unknown section $sett"),
    ("$set\nlength 1 2 1.0\n", 2, "unknown constraint type 'length'"),
    ("distance 1 2\n", 1, "a constraint before any section"),
    ("$set\n\n# angle first\nangle 2 1 3\n", 4, "$set angle takes 4 items after the type (angle ATOM ATOM ATOM ANGLE), not 3"),
    ("$freeze\ndistance 1 2 1.0\n", 2, "$freeze distance takes 2 items"),
    ("$scan\ndistance 1 2 0.9 1.1\n", 2, "$scan distance takes 5 items"),
    ("$freeze\ndistance 1 5\n", 2, "atom 5 does not exist: atoms are numbered 1 to 4"),
    ("$freeze\ndistance 0 1\n", 2, "atom 0 does not exist"),
    ("$freeze\nangle 1 2 1\n", 2, "the atoms of one angle must differ"),
    ("$freeze\ncentroid_distance 1-2 2,3\n", 2, "the groups of one centroid_distance must not overlap"),
    ("$freeze\nxyz C\n", 2, "no atom of element C"),
    ("$freeze\nxyz 1-9\n", 2, "atom 5 does not exist"),
    ("$set\nangle 2 1 3 190\n", 2, "an angle lies between 0 and 180 degrees"),
    ("$set\ndistance 1 2 -1.0\n", 2, "the distance must be positive"),
    ("$set\ndistance 1 2 one\n", 2, "'one' is not a number"),
    ("$scan\ndistance 1 2 0.9 1.1 2.5\n", 2, "'2.5' is not the number of scan points (a whole number)"),
    ("$options\nmaxiter 3\n$end\n", 1, "a $options block is not taken"),
])
def test_a_line_not_understood_is_refused_by_number(text, line, why):
    with pytest.raises(InputError, match=rf"^c\.txt, line {line} \(.*\): {re.escape(why)}"):
        parse_constraints(text, SYMBOLS, "c.txt")


def test_a_file_without_constraints_is_refused():
    with pytest.raises(InputError, match="names no constraint"):
        parse_constraints("# nothing here\n$freeze\n", SYMBOLS, "c.txt")


def test_optimize_refuses_an_unknown_line_before_the_scf(tmp_path, monkeypatch):
    pytest.importorskip("geometric")
    _refuse_scf(monkeypatch)
    cons = tmp_path / "c.txt"
    cons.write_text("$set garbage\n")
    res = runner.invoke(app, ["optimize", WATER, "--constraints", str(cons)])
    assert res.exit_code == 2 and f"{cons}, line 1 ('$set garbage'): unknown section" in res.output


def test_optimize_states_the_constraints_it_applies(tmp_path):
    """Printed before the first step and recorded in the JSON; the constraint holds at the end."""
    pytest.importorskip("geometric")
    cons, out, js = tmp_path / "c.txt", tmp_path / "final.xyz", tmp_path / "opt.json"
    cons.write_text("$set\nangle 2 1 3 100.0  # degrees\n")
    res = runner.invoke(app, ["optimize", WATER, "--basis", "sto-3g", "--constraints", str(cons), "--out", str(out),
                              "--json", str(js)])
    assert res.exit_code == 0, res.output
    first = res.output.splitlines()[0]
    assert first == f"constraints from {cons}: set angle H2-O1-H3 to 100°"
    doc = json.loads(js.read_text())
    assert doc["extras"]["mp2trn"]["constraints"] == [
        {"line": 2, "applied": "set angle H2-O1-H3 to 100°", "geometric": "angle 2 1 3 100.0"}]
    rows = [line.split() for line in out.read_text().splitlines()[2:5]]
    o, h1, h2 = (np.array([float(v) for v in row[1:4]]) for row in rows)
    u, v = h1 - o, h2 - o
    assert abs(np.degrees(np.arccos(u @ v / np.linalg.norm(u) / np.linalg.norm(v))) - 100.0) < 0.01
