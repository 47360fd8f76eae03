"""QCEngine/QCSchema: ``qcengine.compute(atomic_input, "mp2trn")`` against mp2trn.run and PySCF, failures
as FailedOperation with the CLI's message and the right error type, AtomicInput files on the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pyscf import scf
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.molecule import build_mole
from mp2trn.validation.pyscf_reference import pyscf_reference

from .conftest import molecule_path

qcengine = pytest.importorskip("qcengine")
v2 = pytest.importorskip("qcelemental.models.v2")

BOHR = 0.52917721092
WATER = [("O", 0.0, 0.0, 0.1173), ("H", 0.0, 0.7572, -0.4692), ("H", 0.0, -0.7572, -0.4692)]
HYDROXYL = [("O", 0.0, 0.0, 0.0), ("H", 0.0, 0.0, 0.97)]


def _molecule(atoms, unit="angstrom", ghosts=(), **kw):
    """A QCSchema molecule made the way users make them: from text in either unit, ghosts as ``@X``."""
    scale = 1.0 if unit == "angstrom" else 1.0 / BOHR
    lines = [f"{'@' if i in ghosts else ''}{s} {x * scale!r} {y * scale!r} {z * scale!r}"
             for i, (s, x, y, z) in enumerate(atoms)]
    return v2.Molecule.from_data("\n".join(lines) + ("\nunits bohr" if unit == "bohr" else ""), **kw)


def _input(molecule, method="mp2", basis="cc-pvdz", **keywords):
    return v2.AtomicInput(molecule=molecule, specification={
        "driver": "energy", "model": {"method": method, "basis": basis}, "keywords": keywords})


def _xyz(atoms, ghosts=(), comment=""):
    lines = [f"{f'Gh({s})' if i in ghosts else s} {x!r} {y!r} {z!r}" for i, (s, x, y, z) in enumerate(atoms)]
    return "\n".join([str(len(atoms)), comment, *lines]) + "\n"


def _bohr_xyz(molecule):
    """The QCSchema molecule as XYZ text in bohr (ghosts from ``real``), for mp2trn.run(..., unit="bohr")."""
    geom = np.asarray(molecule.geometry).reshape(-1, 3)
    atoms = [(s, *map(float, xyz)) for s, xyz in zip(molecule.symbols, geom)]
    ghosts = [i for i, r in enumerate(molecule.real) if not r]
    return _xyz(atoms, ghosts)


def test_mp2trn_is_a_registered_qcengine_program():
    assert "mp2trn" in qcengine.list_all_programs()
    assert qcengine.get_program("mp2trn").get_version() == mp2trn.__version__


@pytest.mark.parametrize("unit", ["angstrom", "bohr"])
@pytest.mark.parametrize("case", ["water-rhf", "hydroxyl-uhf", "water-with-ghost"])
def test_energies_equal_mp2trn_run_and_pyscf(case, unit):
    atoms = HYDROXYL if case == "hydroxyl-uhf" else WATER
    ghosts = (2,) if case == "water-with-ghost" else ()
    mol = _molecule(atoms, unit, ghosts)
    res = qcengine.compute(_input(mol), "mp2trn")
    assert isinstance(res, v2.AtomicResult) and res.success, getattr(res, "error", None)
    mult = 2 if case != "water-rhf" else 1
    assert res.molecule.molecular_multiplicity == mult
    direct = mp2trn.run(_bohr_xyz(res.molecule), multiplicity=mult, unit="bohr")
    props = res.properties
    assert abs(res.return_result - direct.e_tot) <= 1e-10
    assert abs(props.mp2_correlation_energy - direct.e_corr) <= 1e-10
    assert abs(props.mp2_same_spin_correlation_energy - direct.e_corr_ss) <= 1e-10
    assert abs(props.mp2_opposite_spin_correlation_energy - direct.e_corr_os) <= 1e-10
    assert abs(props.scf_total_energy - direct.e_hf) <= 1e-10
    mol = build_mole(_bohr_xyz(res.molecule), basis="cc-pvdz", multiplicity=mult, unit="bohr")
    mf = (scf.RHF(mol) if mol.spin == 0 else scf.UHF(mol)).density_fit()
    mf.conv_tol, mf.verbose = 1e-10, 0
    mf.kernel()
    ref = pyscf_reference(mf)
    assert abs(props.mp2_total_energy - (ref.e_hf + ref.e_corr)) <= 1e-8
    assert abs(props.nuclear_repulsion_energy - mol.energy_nuc()) <= 1e-10
    assert props.calcinfo_nbasis == mol.nao_nr() and props.calcinfo_natom == len(atoms)
    assert props.calcinfo_nalpha == mol.nelec[0] and props.calcinfo_nbeta == mol.nelec[1]
    assert res.provenance.creator == "mp2trn"
    assert res.extras["mp2trn"]["device"] == "cpu" and res.extras["mp2trn"]["scf"]["cycles"] == props.scf_iterations


def test_scs_mp2_hf_and_keywords():
    mol = _molecule(WATER)
    direct = mp2trn.run(_bohr_xyz(mol), frozen="auto", device="sim", unit="bohr")
    scs = qcengine.compute(_input(mol, "scs-mp2", frozen_core="auto", device="sim"), "mp2trn")
    assert abs(scs.return_result - direct.e_scs) <= 1e-9
    assert abs(scs.extras["qcvars"]["SCS-MP2 TOTAL ENERGY"] - direct.e_scs) <= 1e-9
    assert scs.extras["mp2trn"]["precision"] == "fp32" and scs.extras["mp2trn"]["cost"]["launches"] > 0
    hf = qcengine.compute(_input(mol, "hf"), "mp2trn")
    assert abs(hf.return_result - direct.e_hf) <= 1e-7 and hf.properties.mp2_total_energy is None


@pytest.mark.parametrize("spec,error_type,message", [
    ({"method": "ccsd"}, "input_error", "method 'ccsd' is not available in mp2trn"),
    ({"basis": "no-such-basis"}, "input_error", "basis 'no-such-basis' is not available"),
    ({"keywords": {"frozen_core": "auto", "colour": "blue"}}, "input_error", "unknown keyword(s) colour"),
    ({"keywords": {"max_cycle": 2}}, "convergence_error", "SCF did not converge in 2 cycles"),
    ({"driver": "hessian", "method": "hf"}, "input_error", "driver 'hessian' needs the analytic MP2 gradient"),
    ({"driver": "gradient", "method": "hf"}, "input_error", "driver 'gradient' needs the analytic MP2 gradient"),
])
def test_failures_are_failed_operations_with_the_cli_message(spec, error_type, message):
    inp = _input(_molecule(WATER), spec.get("method", "mp2"), spec.get("basis", "cc-pvdz"), **spec.get("keywords", {}))
    if "driver" in spec:
        inp = v2.AtomicInput(**{**inp.model_dump(), "specification": {**inp.specification.model_dump(),
                                                                       "driver": spec["driver"]}})
    res = qcengine.compute(inp, "mp2trn")
    assert isinstance(res, v2.FailedOperation) and not res.success
    assert res.error.error_type == error_type and message in res.error.error_message
    assert "\n" not in res.error.error_message


def test_impossible_multiplicity_is_an_input_error(tmp_path):
    """qcelemental refuses H2 as a quintet when it validates; unvalidated molecules reach mp2trn, which
    refuses them itself (through QCEngine, and as a file on the CLI)."""
    mol = v2.Molecule(symbols=["H", "H"], geometry=[0, 0, 0, 0, 0, 1.4], molecular_multiplicity=5, validate=False)
    res = qcengine.compute(_input(mol), "mp2trn")
    assert res.error.error_type == "input_error"
    assert res.error.error_message == "impossible multiplicity 5 for 2 electrons"
    path = tmp_path / "h2.json"
    path.write_text(json.dumps({"schema_version": 2, "molecule": {"symbols": ["H", "H"], "geometry": [0, 0, 0, 0, 0, 1.4],
                                "molecular_multiplicity": 5},
                                "specification": {"driver": "energy", "model": {"method": "mp2", "basis": "cc-pvdz"}}}))
    cli = CliRunner().invoke(app, ["run", str(path)])
    assert cli.exit_code == 2 and "invalid QCSchema AtomicInput" in cli.output and "mult" in cli.output


def test_cli_round_trip_atomic_input_file(tmp_path):
    path = tmp_path / "water.input"  # detected by content, not by extension
    path.write_text(_input(_molecule(WATER, ghosts=(2,))).model_dump_json())
    out = tmp_path / "result.json"
    res = CliRunner().invoke(app, ["run", str(path), "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    result = v2.AtomicResult(**doc)  # validates with qcelemental
    direct = mp2trn.run(_bohr_xyz(result.molecule), multiplicity=2, unit="bohr")
    assert abs(result.return_result - direct.e_tot) <= 1e-10 and result.molecule.real.tolist() == [True, True, False]


@pytest.mark.parametrize("content,message", [
    ('{"molecule": {"symbols": ["He"]}, "specification": {}}', "invalid QCSchema AtomicInput"),
    ("SCHEMA", None),
])
def test_cli_malformed_inputs_get_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    res = CliRunner().invoke(app, ["run", str(path)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    if message:
        assert message in res.output


def test_cli_settings_belong_in_the_file(tmp_path):
    path = tmp_path / "in.json"
    path.write_text(_input(_molecule(WATER)).model_dump_json())
    res = CliRunner().invoke(app, ["run", str(path), "--basis", "sto-3g"])
    assert res.exit_code == 2 and "carries its own settings" in res.output


def test_importing_mp2trn_without_qcengine(monkeypatch):
    """The harness is optional: with QCEngine absent, registering is a no-op and mp2trn works."""
    import sys

    from mp2trn import qcschema

    monkeypatch.setitem(sys.modules, "qcengine", None)
    assert qcschema.register() is False
    assert np.isfinite(mp2trn.run(molecule_path("water"), basis="sto-3g").e_tot)
