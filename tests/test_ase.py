"""ASE: MP2Calculator on water against mp2trn.run (eV), molecule files in formats ASE reads, and the
error naming the extra when ASE is absent."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.errors import InputError

ase = pytest.importorskip("ase")
from ase import Atoms  # noqa: E402
import ase.io  # noqa: E402
from ase.io import write  # noqa: E402
from ase.units import Hartree  # noqa: E402

from mp2trn.ase import MP2Calculator  # noqa: E402

WATER = Atoms("OH2", positions=[(0, 0, 0.1173), (0, 0.7572, -0.4692), (0, -0.7572, -0.4692)])
XYZ = "3\nwater\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n"


def test_calculator_energy_equals_mp2trn_run_in_ev():
    atoms = WATER.copy()
    atoms.calc = MP2Calculator(basis="cc-pvdz", device="cpu")
    e = atoms.get_potential_energy()
    direct = mp2trn.run(XYZ, basis="cc-pvdz")
    assert abs(e - direct.e_tot * Hartree) <= 1e-8 and abs(atoms.calc.result.e_tot - direct.e_tot) <= 1e-10
    assert atoms.calc.implemented_properties == ["energy", "forces", "dipole"]
    atoms.positions[1, 1] += 0.01  # a new geometry is a new calculation
    assert abs(atoms.get_potential_energy() - e) > 1e-6


def test_calculator_charge_multiplicity_method():
    oh = Atoms("OH", positions=[(0, 0, 0), (0, 0, 0.97)])
    oh.calc = MP2Calculator(basis="cc-pvdz", charge=-1)
    anion = mp2trn.run("2\n\nO 0 0 0\nH 0 0 0.97\n", charge=-1)
    assert abs(oh.get_potential_energy() - anion.e_tot * Hartree) <= 1e-8
    oh.calc = MP2Calculator(basis="cc-pvdz", multiplicity=2, method="scs-mp2")
    radical = mp2trn.run("2\n\nO 0 0 0\nH 0 0 0.97\n", multiplicity=2)
    assert abs(oh.get_potential_energy() - radical.e_scs * Hartree) <= 1e-8
    with pytest.raises(InputError, match="unknown parameter"):
        MP2Calculator(bassis="cc-pvdz")


@pytest.mark.parametrize("fmt,suffix", [("proteindatabank", ".pdb"), ("sdf", ".sdf"), ("mol", ".mol"), ("json", ".json"),
                                        ("cif", ".cif")])
def test_run_reads_files_ase_reads(tmp_path, fmt, suffix):
    path = tmp_path / f"water{suffix}"
    if fmt in ("sdf", "mol"):  # an MDL molfile; an SDF file is molfile records ending in $$$$
        path.write_text(_sdf() if fmt == "sdf" else _sdf().replace("$$$$\n", ""))
    elif fmt == "cif":  # a molecule in a box: its periodicity is ignored, the atoms are one molecule
        boxed = WATER.copy()
        boxed.cell, boxed.pbc = [12.0, 12.0, 12.0], True
        boxed.center()
        write(str(path), boxed, format=fmt)
    else:
        write(str(path), WATER, format=fmt)
    res = CliRunner().invoke(app, ["run", str(path), "-q", "--json", str(tmp_path / "out.json")])
    assert res.exit_code == 0, res.output
    atoms = ase.io.read(str(path))  # the geometry as the file holds it (PDB keeps three decimals)
    assert atoms.get_chemical_symbols() == ["O", "H", "H"]
    text = "3\n\n" + "\n".join(f"{s} {float(x)!r} {float(y)!r} {float(z)!r}" for s, (x, y, z) in
                                zip(atoms.get_chemical_symbols(), atoms.get_positions()))
    assert abs(mp2trn.run(path).e_tot - mp2trn.run(text).e_tot) <= 1e-10


def _sdf():
    return ("water\n  test\n\n  3  2  0  0  0  0  0  0  0  0999 V2000\n"
            "    0.0000    0.0000    0.1173 O   0  0  0  0  0  0  0  0  0  0  0  0\n"
            "    0.0000    0.7572   -0.4692 H   0  0  0  0  0  0  0  0  0  0  0  0\n"
            "    0.0000   -0.7572   -0.4692 H   0  0  0  0  0  0  0  0  0  0  0  0\n"
            "  1  2  1  0\n  1  3  1  0\nM  END\n$$$$\n")


def test_without_ase_the_error_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "water.pdb"
    write(str(path), WATER, format="proteindatabank")
    monkeypatch.setitem(sys.modules, "ase", None)
    monkeypatch.setitem(sys.modules, "ase.io", None)
    res = CliRunner().invoke(app, ["run", str(path)])
    assert res.exit_code == 2 and "pip install 'mp2trn[ase]'" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert np.isfinite(mp2trn.run(XYZ, basis="sto-3g").e_tot)  # XYZ needs no ASE


def test_unreadable_file_is_an_input_error(tmp_path):
    path = tmp_path / "junk.pdb"
    path.write_text("nothing to see\n")
    res = CliRunner().invoke(app, ["run", str(path)])
    assert res.exit_code == 2 and str(path) in res.output
