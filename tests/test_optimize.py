"""Geometry optimisation: `mp2trn optimize` (geomeTRIC), ASE forces and BFGS, QCEngine's gradient driver
and geomeTRIC procedure — the same minimum everywhere, constraints, resume, step limit."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app

pytest.importorskip("geometric")
BOHR = 0.52917721092


def read_xyz(path):
    lines = path.read_text().splitlines()
    n = int(lines[0])
    return np.array([[float(v) for v in row.split()[1:4]] for row in lines[2 : 2 + n]])


def internal(coords, a=0, b=1, c=2):
    """Bond lengths a–b, a–c (Å) and the angle b–a–c (degrees)."""
    u, v = coords[b] - coords[a], coords[c] - coords[a]
    return np.linalg.norm(u), np.linalg.norm(v), np.degrees(np.arccos(u @ v / np.linalg.norm(u) / np.linalg.norm(v)))


def optimize_cli(tmp_path, xyz, *flags):
    out, traj, js = tmp_path / "final.xyz", tmp_path / "traj.xyz", tmp_path / "opt.json"
    res = CliRunner().invoke(app, ["optimize", xyz, "--out", str(out), "--trajectory", str(traj), "--json", str(js),
                                   *flags])
    return res, out, traj, js


@pytest.fixture(scope="module")
def water_minimum(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("water")
    res, out, traj, js = optimize_cli(tmp, "molecules/water.xyz")
    assert res.exit_code == 0, res.output
    return read_xyz(out), json.loads(js.read_text()), res.output


def test_water_optimisation_converges(water_minimum):
    coords, doc, output = water_minimum
    assert doc["success"] and doc["schema_name"] == "qcschema_optimization_output"
    assert max(abs(g) for g in doc["trajectory"][-1]["return_result"]) < 4.5e-4      # GAU max gradient
    assert doc["energies"] == sorted(doc["energies"], reverse=True)
    assert "step   0" in output and "SCF cycles" in output
    r1, r2, angle = internal(coords)
    assert abs(r1 - r2) < 1e-4 and 0.960 < r1 < 0.968 and 101.0 < angle < 103.0


def test_ase_bfgs_and_qcengine_procedure_find_the_same_minimum(water_minimum, tmp_path, monkeypatch):
    from ase import Atoms
    from ase.optimize import BFGS

    from mp2trn.ase import MP2Calculator

    coords, _, _ = water_minimum
    ours = internal(coords)
    atoms = Atoms("OH2", positions=[[0, 0, 0.117], [0, 0.757, -0.469], [0, -0.757, -0.469]])
    atoms.calc = MP2Calculator(basis="cc-pvdz")
    BFGS(atoms, logfile=None).run(fmax=2e-3)
    ase_geom = internal(atoms.get_positions())
    qcengine = pytest.importorskip("qcengine")
    from qcelemental.models import v2

    monkeypatch.chdir(tmp_path)     # geomeTRIC's QCEngine procedure writes qce_optim.xyz in the working directory
    mol = v2.Molecule(symbols=["O", "H", "H"], geometry=[0, 0, 0.22, 0, 1.43, -0.89, 0, -1.43, -0.89])
    spec = v2.OptimizationSpecification(program="geometric", keywords={"program": "mp2trn", "convergence_set": "GAU"},
                                        specification=v2.AtomicSpecification(driver="gradient", program="mp2trn",
                                                                             model={"method": "mp2", "basis": "cc-pvdz"}))
    result = qcengine.compute(v2.OptimizationInput(initial_molecule=mol, specification=spec), "geometric")
    assert result.success
    qce_geom = internal(np.asarray(result.final_molecule.geometry) * BOHR)
    for other in (ase_geom, qce_geom):
        assert abs(other[0] - ours[0]) < 1e-3 and abs(other[1] - ours[1]) < 1e-3 and abs(other[2] - ours[2]) < 0.1


def test_hydroxyl_uhf_frozen_core_same_minimum_everywhere(tmp_path, monkeypatch):
    from ase import Atoms
    from ase.optimize import BFGS

    from mp2trn.ase import MP2Calculator

    res, out, _, js = optimize_cli(tmp_path, "molecules/hydroxyl.xyz", "--frozen-core", "auto")
    assert res.exit_code == 0, res.output
    r = np.linalg.norm(np.diff(read_xyz(out), axis=0))
    assert 0.96 < r < 0.98
    doc = json.loads(js.read_text())
    assert doc["trajectory"][-1]["extras"]["mp2trn"]["reference"] == "UHF"
    assert max(abs(g) for g in doc["trajectory"][-1]["return_result"]) < 4.5e-4
    atoms = Atoms("OH", positions=[[0, 0, 0], [0, 0, 1.0]])
    atoms.calc = MP2Calculator(basis="cc-pvdz", multiplicity=2, frozen="auto")
    BFGS(atoms, logfile=None).run(fmax=2e-3)
    assert abs(atoms.get_distance(0, 1) - r) < 1e-3
    qcengine = pytest.importorskip("qcengine")
    from qcelemental.models import v2

    monkeypatch.chdir(tmp_path)
    mol = v2.Molecule(symbols=["O", "H"], geometry=[0, 0, 0, 0, 0, 1.9], molecular_multiplicity=2)
    spec = v2.OptimizationSpecification(program="geometric", keywords={"program": "mp2trn", "convergence_set": "GAU"},
                                        specification=v2.AtomicSpecification(
                                            driver="gradient", program="mp2trn", keywords={"frozen_core": "auto"},
                                            model={"method": "mp2", "basis": "cc-pvdz"}))
    result = qcengine.compute(v2.OptimizationInput(initial_molecule=mol, specification=spec), "geometric")
    assert result.success
    g = np.asarray(result.final_molecule.geometry)
    assert abs(np.linalg.norm(g[1] - g[0]) * BOHR - r) < 1e-3


def test_constraintis_kept(tmp_path):
    cons = tmp_path / "cons.txt"
    cons.write_text("$set\nangle 2 1 3 95.0\n")
    res, out, _, _ = optimize_cli(tmp_path, "molecules/water.xyz", "--constraints", str(cons))
    assert res.exit_code == 0, res.output
    assert abs(internal(read_xyz(out))[2] - 95.0) < 0.01


def test_step_limit_then_resume_ends_at_the_same_minimum(tmp_path, water_minimum):
    res, out, traj, _ = optimize_cli(tmp_path, "molecules/water.xyz", "--max-steps", "2")
    assert res.exit_code == 3 and "did not converge in 2 steps" in res.output and not out.exists()
    frames = traj.read_text()
    assert frames.count("step=") == 3                              # the start and two steps
    res, out, traj, js = optimize_cli(tmp_path, "molecules/water.xyz", "--resume")
    assert res.exit_code == 0, res.output
    assert traj.read_text().startswith(frames)                     # finished steps kept as they were
    doc = json.loads(js.read_text())
    assert doc["extras"]["mp2trn"]["scf_cycles"][:3] == [None] * 3     # read back, not recomputed
    assert None not in doc["extras"]["mp2trn"]["scf_cycles"][3:]
    steps = [int(part.split("=")[1]) for part in traj.read_text().split() if part.startswith("step=")]
    assert steps == list(range(len(steps)))
    energies = doc["energies"]
    assert len(set(energies)) == len(energies)      # the last finished step is not computed again
    other = tmp_path / "hf.xyz"
    other.write_text("3\nnot water\nF 0 0 0\nH 0 0 0.92\nH 0 0 5\n")
    res = CliRunner().invoke(app, ["optimize", str(other), "--trajectory", str(traj), "--resume"])
    assert res.exit_code == 2 and "resume needs that run's trajectory" in res.output
    assert np.max(np.abs(read_xyz(out) - water_minimum[0])) < 1e-3


def test_density_reuse_cuts_scf_cycles(tmp_path, water_minimum):
    res, _, _, js = optimize_cli(tmp_path, "molecules/water.xyz", "--fresh-guess")
    assert res.exit_code == 0
    fresh = json.loads(js.read_text())["extras"]["mp2trn"]["scf_cycles"]
    reused = water_minimum[1]["extras"]["mp2trn"]["scf_cycles"]
    assert sum(reused[1:]) < sum(fresh[1:])


def test_qcengine_gradient_and_ase_forces_match_the_dfmp2_gradient():
    from ase import Atoms
    from ase.units import Bohr, Hartree
    from pyscf import gto, scf

    from mp2trn.ase import MP2Calculator

    qcengine = pytest.importorskip("qcengine")
    from qcelemental.models import v2

    geom = np.array([[0, 0, 0.2], [0, 1.5, -0.9], [0, -1.4, -0.85]])     # bohr
    mol = gto.M(atom=[("O", geom[0]), ("H", geom[1]), ("H", geom[2])], unit="Bohr", basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit").run(conv_tol=1e-11)
    reference = mp2trn.DFMP2(mf, auxbasis="cc-pvdz-ri").run().nuc_grad_method().kernel()
    inp = v2.AtomicInput(molecule=v2.Molecule(symbols=["O", "H", "H"], geometry=geom.ravel()),
                         specification={"driver": "gradient", "model": {"method": "mp2", "basis": "cc-pvdz"},
                                        "keywords": {"conv_tol": 1e-11}})
    result = qcengine.compute(inp, "mp2trn")
    assert result.success, getattr(result, "error", None)
    assert np.max(np.abs(np.asarray(result.return_result) - reference)) < 1e-8
    assert len(result.properties.mp2_dipole_moment) == 3
    atoms = Atoms("OH2", positions=geom * Bohr)
    atoms.calc = MP2Calculator(basis="cc-pvdz", conv_tol=1e-11)
    forces = atoms.get_forces()
    assert np.max(np.abs(-forces / (Hartree / Bohr) - reference)) < 1e-8


def test_batch_optimize_records_final_geometries_and_resumes(tmp_path):
    out = tmp_path / "opt.jsonl"
    args = ["batch", "molecules/water.xyz", "molecules/hydrogen_fluoride.xyz", "--out", str(out), "--optimize", "-q"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok", "ok"]
    water = records[0]["result"]
    assert water["converged"] and water["max_gradient"] < 4.5e-4 and water["final_xyz"].startswith("3\n")
    assert abs(water["energy"] - (-76.2309385)) < 1e-6            # the minimum the other routes find
    res = CliRunner().invoke(app, args + ["--resume"])
    assert res.exit_code == 0 and len(out.read_text().splitlines()) == 2    # nothing run again


def test_optimize_over_two_ranks_reaches_the_one_rank_minimum(tmp_path, water_minimum):
    """torchrun: rank 0 drives geomeTRIC and writes; both ranks compute their share of every gradient."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out, js = tmp_path / "final.xyz", tmp_path / "opt.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "mp2trn", "optimize", "molecules/water.xyz", "--out", str(out), "--json", str(js)],
                          capture_output=True, text=True, env=env, cwd=root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("step   0") == 1                      # rank 0 alone reports
    doc = json.loads(js.read_text())
    assert "2 ranks" in doc["trajectory"][-1]["extras"]["mp2trn"]["gradient"]
    assert np.max(np.abs(read_xyz(out) - water_minimum[0])) < 1e-4



def test_ghost_atoms_stay_in_place(tmp_path):
    xyz = tmp_path / "water_ghost.xyz"
    xyz.write_text("4\nwater and a ghost helium\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n"
                   "Gh(He) 0 0 2.5\n")
    res, out, _, _ = optimize_cli(tmp_path, str(xyz), "--frozen-core", "auto")
    assert res.exit_code == 0, res.output
    final = out.read_text().splitlines()
    assert final[-1].split()[0] == "Gh(He)"
    assert np.allclose(read_xyz(out)[3], [0, 0, 2.5], atol=1e-6)
