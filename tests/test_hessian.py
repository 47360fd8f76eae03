"""Frequencies: the finite-difference Hessian against PySCF's analytic SCF Hessian (same machinery on the SCF
gradient) and against second differences of mp2trn's energies; IR intensities against finite differences
of the relaxed dipole along a mode; thermochemistry against ASE's and the NIST-JANAF entropy of water;
linear molecules; symmetry numbers; resume after a kill; two ranks; the CLI, QCEngine and ASE routes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from pyscf import gto, scf
from pyscf.hessian import thermo as pyscf_thermo
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.hessian import Point, analyse, finite_difference_hessian, run_frequencies, thermochemistry
from mp2trn.hessian.thermo import bare_molecule, symmetry_number
from mp2trn.hessian.vibrations import IR_KM_MOL
from mp2trn.options import RunOptions
from mp2trn.pipeline import open_device

from .conftest import ROOT, molecule_path

WATER = "O 0 0 0.117; H 0 0.757 -0.469; H 0 -0.757 -0.469"


def scf_evaluator(mol0: gto.Mole):
    """PySCF's conventional RHF/UHF energy, analytic gradient and dipole at a geometry (tightly converged)."""

    def evaluate(coords, dm0):
        mol = mol0.set_geom_(coords, unit="Bohr", inplace=False)
        mf = (scf.RHF if mol.spin == 0 else scf.UHF)(mol)
        mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
        mf.kernel(dm0=dm0)
        return Point(mf.e_tot, mf.nuc_grad_method().kernel(), mf.dip_moment(unit="AU", verbose=0)), mf.make_rdm1()

    return evaluate


@pytest.mark.parametrize("atom,spin", [pytest.param(WATER, 0, marks=pytest.mark.slow), ("O 0 0 0; H 0 0 0.97", 1)],
                         ids=["water-rhf", "hydroxyl-uhf"])   # RHF (18 s, -m slow): the other default tests are RHF
def test_fd_machinery_reproduces_pyscf_analytic_scf_hessian(atom, spin):
    """The driver on PySCF's SCF gradient equals PySCF's analytic Hessian (≤ 1e-5 Eh/bohr²), and the harmonic
    analysis of it equals PySCF's (projection, units, masses: frequencies, reduced masses, force constants)."""
    mol = gto.M(atom=atom, basis="sto-3g", spin=spin, verbose=0)
    fd = finite_difference_hessian(scf_evaluator(mol), mol.atom_coords(), range(mol.natm), step=0.002)
    mf = (scf.RHF if spin == 0 else scf.UHF)(mol).run(conv_tol=1e-12)
    analytic = mf.Hessian().kernel()
    n = 3 * mol.natm
    assert np.max(np.abs(fd.hessian - analytic.transpose(0, 2, 1, 3).reshape(n, n))) <= 1e-5
    assert fd.computed == 6 * mol.natm and fd.reused == 0
    ours = analyse(fd.hessian, mol.atom_mass_list(isotope_avg=True), mol.atom_coords())
    ref = pyscf_thermo.harmonic_analysis(mol, analytic, imaginary_freq=False)
    assert len(ours.frequencies_cm1) == len(ref["freq_wavenumber"]) == (1 if mol.natm == 2 else 3)
    assert np.max(np.abs(ours.frequencies_cm1 - ref["freq_wavenumber"])) < 0.5          # cm⁻¹
    assert np.max(np.abs(ours.reduced_masses - ref["reduced_mass"])) < 1e-3             # amu
    assert np.max(np.abs(ours.force_constants - ref["force_const_dyne"])) < 1e-3        # mdyn/Å


@pytest.fixture(scope="module")
def water_freq():
    """Water MP2/cc-pVDZ frequencies at the experimental geometry (one rank, no store)."""
    options = RunOptions(basis="cc-pvdz")
    with open_device(options) as device:
        return run_frequencies(molecule_path("water"), options, device)


def _water_at(coords) -> str:
    """Water at ``coords`` (bohr) as an atom string for mp2trn.run(..., unit="bohr") (the bases by mp2trn's rules)."""
    return "; ".join(f"{s} {float(x)!r} {float(y)!r} {float(z)!r}" for s, (x, y, z) in zip("OHH", coords))


def _energy(coords) -> float:
    return mp2trn.run(_water_at(coords), basis="cc-pvdz", unit="bohr").e_tot


def test_mp2_hessian_matches_second_differences_of_energies(water_freq):
    """Diagonal elements as second differences of energies, (E₊ − 2E₀ + E₋)/h², and one off-diagonal element
    from four corner energies, against the Hessian of the gradients."""
    hess = water_freq.hessian
    h, e0 = hess.step, hess.reference.energy
    from mp2trn.hessian.driver import Displacement

    store = {}
    options = RunOptions(basis="cc-pvdz", gradient=True)
    with open_device(options) as device:
        from mp2trn.geomopt import PointCalculator
        from mp2trn.hessian.driver import mp2_evaluator

        evaluate = mp2_evaluator(PointCalculator(molecule_path("water"), options, device, reuse_density=False))
        for atom, axis in ((0, 2), (1, 1), (2, 2)):
            for sign in (1, -1):
                d = Displacement(atom, axis, sign)
                store[d.name] = evaluate(d.coords(hess.coords, h), None)[0].energy
    for atom, axis in ((0, 2), (1, 1), (2, 2)):
        i = 3 * atom + axis
        second = (store[Displacement(atom, axis, 1).name] - 2 * e0 + store[Displacement(atom, axis, -1).name]) / h ** 2
        assert abs(second - hess.hessian[i, i]) < 2e-4, (i, second, hess.hessian[i, i])
    i, j = 2, 4            # O z with H1 y
    corners = []
    for si, sj in ((1, 1), (1, -1), (-1, 1), (-1, -1)):
        x = hess.coords.copy()
        x[0, 2] += si * h
        x[1, 1] += sj * h
        corners.append(_energy(x))
    mixed = (corners[0] - corners[1] - corners[2] + corners[3]) / (4 * h * h)
    assert abs(mixed - hess.hessian[i, j]) < 2e-4
    assert hess.asymmetry < 1e-4


@pytest.mark.slow   # ~15 s: 12 displaced gradients and 6 energies
def test_uhf_mp2_hessian_of_hydroxyl_matches_second_differences_of_energies():
    """An open shell (UHF-MP2, hydroxyl/6-31G): the stretch element H[zO, zO] and the coupling H[zO, zH] of
    the Hessian of gradients against second differences of mp2trn's UHF-MP2 energies; the transverse elements
    against the bond's turn, (dE/dR)/R."""
    options = RunOptions(basis="6-31g")
    with open_device(options) as device:
        hess = run_frequencies(molecule_path("hydroxyl"), options, device).hessian
    h, e0, x0 = hess.step, hess.reference.energy, hess.coords

    def energy(moves) -> float:
        x = x0.copy()
        for (atom, axis), step in moves.items():
            x[atom, axis] += step
        atoms = "; ".join(f"{s} {float(a)!r} {float(b)!r} {float(c)!r}" for s, (a, b, c) in zip("OH", x))
        return mp2trn.run(atoms, basis="6-31g", unit="bohr", multiplicity=2).e_tot

    second = (energy({(0, 2): h}) - 2 * e0 + energy({(0, 2): -h})) / h ** 2
    assert abs(second - hess.hessian[2, 2]) < 2e-4, (second, hess.hessian[2, 2])
    corners = [energy({(0, 2): si * h, (1, 2): sj * h}) for si, sj in ((1, 1), (1, -1), (-1, 1), (-1, -1))]
    mixed = (corners[0] - corners[1] - corners[2] + corners[3]) / (4 * h * h)
    assert abs(mixed - hess.hessian[2, 5]) < 2e-4, (mixed, hess.hessian[2, 5])
    assert hess.hessian[2, 2] > 0.3 and abs(hess.hessian[2, 2] + hess.hessian[2, 5]) < 1e-3   # translation-free
    # off the minimum a transverse move turns the bond: ∂²E/∂x_O² = (dE/dR)/R, R the bond length
    bond = float(x0[1, 2] - x0[0, 2])
    turn = float(np.asarray(hess.reference.gradient)[1, 2]) / bond
    for x in (0, 1):
        assert abs(hess.hessian[x, x] - turn) < 1e-4 and abs(hess.hessian[x, 3 + x] + turn) < 1e-4
    # the stretch block is symmetric; the transverse one only to ~1e-4: the ²Π radical's singly occupied π
    # orbital has a degenerate partner, and a transverse move can turn which one the displaced UHF occupies
    assert abs(hess.hessian[2, 5] - hess.hessian[5, 2]) < 1e-5


def test_ir_intensity_matches_finite_differences_of_the_dipole_along_the_mode(water_freq):
    """I = 974.9 km/mol · |∂μ/∂Q|² with ∂μ/∂Q from two relaxed-dipole runs at Q = ±δ along the normal mode."""
    vib = water_freq.vibrations
    k = int(np.argmax(vib.ir_intensities))
    cartesian = vib.modes[k] / np.sqrt(vib.reduced_masses[k])      # bohr per (bohr·√amu) of Q
    delta = 0.01
    dipoles = []
    for sign in (1, -1):
        x = water_freq.hessian.coords + sign * delta * cartesian
        result = mp2trn.run(_water_at(x), basis="cc-pvdz", unit="bohr", gradient=True)
        dipoles.append(np.asarray(result.dipoles["mp2_relaxed"]))
    fd = IR_KM_MOL * np.sum(((dipoles[0] - dipoles[1]) / (2 * delta)) ** 2)
    assert abs(fd - vib.ir_intensities[k]) < 1e-2 * vib.ir_intensities[k]
    assert abs(IR_KM_MOL - 974.88) < 0.05       # the usual conversion, from PySCF's constants


def test_water_frequencies_warnings_and_document(water_freq):
    vib = water_freq.vibrations
    assert len(vib.frequencies_cm1) == 3 and vib.imaginary == 0 and not vib.linear
    assert 1550 < vib.frequencies_cm1[0] < 1750 and 3800 < vib.frequencies_cm1[1] < vib.frequencies_cm1[2] < 4200
    assert any("not a stationary point" in w for w in water_freq.warnings)   # experimental geometry, not MP2's
    doc = water_freq.to_qcschema()
    assert doc["driver"] == "hessian" and len(doc["return_result"]) == 81
    thermo = doc["extras"]["mp2trn"]["thermochemistry"]
    for key in ("temperature", "pressure", "zpe", "enthalpy", "entropy", "gibbs", "frequencies_cm1"):
        assert key in thermo
    assert thermo["temperature"] == 298.15 and thermo["pressure"] == 101325.0
    assert thermo["gibbs"] < thermo["enthalpy"] and thermo["enthalpy"] > doc["properties"]["return_energy"]


def test_thermochemistry_matches_ase_and_the_janaf_entropy_of_water():
    """Water at its experimental geometry with the experimental fundamentals (1594.7, 3657.1, 3755.9 cm⁻¹):
    S°(298.15 K, 1 bar) within 0.3 J/(mol K) of NIST-JANAF's 188.834, and H, S, G as ASE's IdealGasThermo."""
    from ase import Atoms
    from ase.thermochemistry import IdealGasThermo
    from ase.units import Hartree, invcm

    mol = gto.M(atom=WATER.replace("0.757", "0.7572").replace("0.469", "0.4692").replace("0.117", "0.1173"), verbose=0)
    bare = bare_molecule(["O", "H", "H"], mol.atom_coords())
    freqs = [1594.7, 3657.1, 3755.9]
    t = thermochemistry(bare, -76.0, freqs, 298.15, 1e5)
    joule_per_mol_k = t.entropy * 4.3597447222071e-18 * 6.02214076e23
    assert abs(joule_per_mol_k - 188.834) < 0.3
    atoms = Atoms("OH2", positions=mol.atom_coords(unit="Angstrom"))
    ase = IdealGasThermo([f * invcm for f in freqs], "nonlinear", atoms=atoms, symmetrynumber=2, spin=0,
                         potentialenergy=-76.0 * Hartree)
    assert abs(ase.get_entropy(298.15, 1e5, verbose=False) / Hartree - t.entropy) < 2e-9
    assert abs(ase.get_enthalpy(298.15, verbose=False) / Hartree - t.enthalpy) < 2e-6
    assert abs(ase.get_gibbs_energy(298.15, 1e5, verbose=False) / Hartree - t.gibbs) < 2e-6
    assert abs(ase.get_ZPE_correction() / Hartree - t.zpe) < 1e-7
    sigma1 = thermochemistry(bare, -76.0, freqs, 298.15, 1e5, sigma=1)     # --symmetry-number
    assert sigma1.symmetry_source == "--symmetry-number"
    r = 8.314462618 / (4.3597447222071e-18 * 6.02214076e23)
    assert abs(sigma1.entropy - t.entropy - r * np.log(2)) < 1e-10


@pytest.mark.parametrize("name,sigma", [("water", 2), ("ammonia", 3), ("methane", 12), ("benzene", 12)])
def test_symmetry_numbers(name, sigma):
    mol = gto.M(atom=str(molecule_path(name)), verbose=0)
    bare = bare_molecule([mol.atom_symbol(i) for i in range(mol.natm)], mol.atom_coords())
    assert symmetry_number(bare) == sigma


def test_linear_molecule_has_3n_minus_5_modes():
    """CO₂: four modes, the bend twice at one frequency, PySCF's analysis of the same Hessian agreeing."""
    options = RunOptions(basis="sto-3g")
    with open_device(options) as device:
        freq = run_frequencies("C 0 0 0; O 0 0 1.18; O 0 0 -1.18", options, device)
    vib = freq.vibrations
    assert vib.linear and len(vib.frequencies_cm1) == 4 and vib.imaginary == 0
    assert abs(vib.frequencies_cm1[0] - vib.frequencies_cm1[1]) < 1.0
    assert vib.ir_intensities[2] < 1e-3 < vib.ir_intensities[3]          # symmetric stretch IR-inactive
    mol = gto.M(atom="C 0 0 0; O 0 0 1.18; O 0 0 -1.18", verbose=0)
    ref = pyscf_thermo.harmonic_analysis(mol, freq.hessian.hessian.reshape(3, 3, 3, 3).transpose(0, 2, 1, 3),
                                         imaginary_freq=False)
    assert np.max(np.abs(np.sort(ref["freq_wavenumber"]) - vib.frequencies_cm1)) < 0.5
    assert freq.thermo.symmetry_number == 2 and freq.point_group == "Dooh"


def _freq_cli(tmp_path, *args, env_extra=None):
    return [sys.executable, "-m", "mp2trn", "freq", str(molecule_path("water")), "--basis", "sto-3g", *args]


@pytest.fixture(scope="module")
def water_sto3g():
    options = RunOptions(basis="sto-3g")
    with open_device(options) as device:
        return run_frequencies(molecule_path("water"), options, device)


def test_resume_after_a_kill_recomputes_nothing(tmp_path, water_sto3g):
    store, js = tmp_path / "disp", tmp_path / "freq.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.Popen(_freq_cli(tmp_path, "--displacements", str(store), "-q"), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(store.glob("d*.json"))) < 4 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    done = {p.name: p.stat().st_mtime_ns for p in store.glob("d*.json")}
    assert 4 <= len(done) < 18 and not js.exists()
    res = CliRunner().invoke(app, ["freq", str(molecule_path("water")), "--basis", "sto-3g", "--displacements",
                                   str(store), "--resume", "--json", str(js)])
    assert res.exit_code == 0, res.output
    hess = json.loads(js.read_text())["extras"]["mp2trn"]["hessian"]
    assert hess["reused"] == len(done) and hess["computed"] == 18 - len(done)
    assert {p.name: p.stat().st_mtime_ns for p in store.glob("d*.json") if p.name in done} == done
    got = np.array(json.loads(js.read_text())["return_result"]).reshape(9, 9)
    assert np.max(np.abs(got - water_sto3g.hessian.hessian)) < 1e-7
    res = CliRunner().invoke(app, ["freq", str(molecule_path("water")), "--basis", "sto-3g", "--displacements",
                                   str(store)])
    assert res.exit_code == 2 and "--resume" in res.output             # a fresh run refuses a used store
    res = CliRunner().invoke(app, ["freq", str(molecule_path("water")), "--basis", "6-31g", "--displacements",
                                   str(store), "--resume"])
    assert res.exit_code == 2 and "another frequency run" in res.output


def test_two_ranks_give_the_one_rank_hessian(tmp_path, water_sto3g):
    pytest.importorskip("torch.distributed")
    js = tmp_path / "freq.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "mp2trn", "freq", str(molecule_path("water")), "--basis", "sto-3g", "--json", str(js)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("Harmonic frequencies") == 1            # rank 0 alone prints
    doc = json.loads(js.read_text())
    assert doc["extras"]["mp2trn"]["hessian"]["ranks"] == 2 and doc["extras"]["mp2trn"]["hessian"]["computed"] == 18
    got = np.array(doc["return_result"]).reshape(9, 9)
    assert np.max(np.abs(got - water_sto3g.hessian.hessian)) < 1e-9


def test_cli_writes_json_and_molden(tmp_path, water_sto3g):
    js, molden = tmp_path / "f.json", tmp_path / "modes.molden"
    res = CliRunner().invoke(app, ["freq", str(molecule_path("water")), "--basis", "sto-3g", "--json", str(js),
                                   "--molden", str(molden), "--temperature", "350", "--pressure", "100000",
                                   "--symmetry-number", "1"])
    assert res.exit_code == 0, res.output
    assert "Harmonic frequencies" in res.output and "Gibbs energy G" in res.output and "not a stationary" in res.output
    thermo = json.loads(js.read_text())["extras"]["mp2trn"]["thermochemistry"]
    assert thermo["temperature"] == 350 and thermo["pressure"] == 100000 and thermo["symmetry_number"] == 1
    text = molden.read_text()
    for section in ("[FREQ]", "[FR-COORD]", "[FR-NORM-COORD]", "[INT]"):
        assert section in text
    freqs = [float(x) for x in text.split("[FREQ]")[1].split("[FR-COORD]")[0].split()]
    assert np.allclose(freqs, water_sto3g.vibrations.frequencies_cm1, atol=1e-3)
    assert text.count("vibration") == 3
    res = CliRunner().invoke(app, ["freq", str(molecule_path("water")), "--hessian-step", "0", "-q"])
    assert res.exit_code == 2 and "--hessian-step" in res.output


def test_run_hessian_qcengine_and_ase_vibrations_agree(water_sto3g, tmp_path, monkeypatch):
    """mp2trn.run(hessian=True), QCEngine's driver="hessian" and ASE's Vibrations/Infrared through
    MP2Calculator give the same frequencies (ASE: its own displacements of 0.01 Å, no projection)."""
    res = mp2trn.run(molecule_path("water"), basis="sto-3g", hessian=True)
    assert np.max(np.abs(res.hessian - water_sto3g.hessian.hessian)) < 1e-9
    assert res.to_qcschema()["driver"] == "hessian"
    qcengine = pytest.importorskip("qcengine")
    from qcelemental.models import v2

    mol = v2.Molecule(symbols=["O", "H", "H"], geometry=water_sto3g.hessian.coords.ravel())
    out = qcengine.compute(v2.AtomicInput(molecule=mol, specification={"driver": "hessian", "model": {
        "method": "mp2", "basis": "sto-3g"}}), "mp2trn")
    assert out.success, getattr(out, "error", None)
    assert np.max(np.abs(np.asarray(out.return_result) - water_sto3g.hessian.hessian)) < 1e-7
    pytest.importorskip("ase")
    from ase import Atoms
    from ase.vibrations import Infrared

    from mp2trn.ase import MP2Calculator

    monkeypatch.chdir(tmp_path)       # ASE keeps its displacements in a cache folder where it runs
    atoms = Atoms("OH2", positions=water_sto3g.hessian.coords * 0.52917721092)
    atoms.calc = MP2Calculator(basis="sto-3g")
    ir = Infrared(atoms, delta=0.005)
    ir.run()
    from ase.units import Bohr, Hartree

    ir.read()
    assert np.max(np.abs(ir.H / (Hartree / Bohr ** 2) - water_sto3g.hessian.hessian)) < 1e-3   # Eh/bohr²
    ase_freq = np.real(ir.get_frequencies())[-3:]
    assert np.max(np.abs(ase_freq - water_sto3g.vibrations.frequencies_cm1)) < 2.0    # cm⁻¹; ASE projects nothing
    km_per_mol = 42.255 * ir.intensities[-3:]        # ASE's (D/Å)²/amu → km/mol (its own factor)
    assert np.allclose(km_per_mol, water_sto3g.vibrations.ir_intensities, rtol=0.05)


@pytest.mark.slow
def test_nh3_inversion_transition_state(tmp_path):
    """From a slightly pyramidal start, geomeTRIC's TS search on mp2trn's Hessian ends planar with exactly
    one imaginary mode (the umbrella)."""
    pytest.importorskip("geometric")
    start = tmp_path / "nh3.xyz"
    start.write_text("4\nammonia, N 0.1 A out of the H3 plane\nN 0 0 0.1\nH 1.01 0 0\nH -0.505 0.874686 0\n"
                     "H -0.505 -0.874686 0\n")
    out, js = tmp_path / "ts.xyz", tmp_path / "ts.json"
    res = CliRunner().invoke(app, ["optimize", str(start), "--transition-state", "--basis", "sto-3g", "--out", str(out),
                                   "--json", str(js)])
    assert res.exit_code == 0, res.output
    assert "transition state confirmed: exactly one imaginary mode" in res.output
    xyz = np.array([[float(v) for v in line.split()[1:4]] for line in out.read_text().splitlines()[2:6]])
    normal = np.cross(xyz[2] - xyz[1], xyz[3] - xyz[1])
    assert abs(normal @ (xyz[0] - xyz[1])) / np.linalg.norm(normal) < 1e-3        # N in the H3 plane (Å)
    freq = json.loads(js.read_text())["extras"]["mp2trn"]["frequencies"]["extras"]["mp2trn"]
    assert freq["vibrations"]["imaginary_modes"] == 1 and freq["vibrations"]["point_group"] == "D3h"


def test_readme_frequency_example_runs(monkeypatch):
    """The README's frequency example (mp2trn.run(hessian=True), ASE's Infrared on MP2Calculator) as written."""
    pytest.importorskip("ase")
    from .test_readme import run_block

    monkeypatch.chdir(ROOT)
    namespace = run_block("hessian=True")
    assert namespace["res"].hessian.shape == (9, 9) and len(namespace["res"].frequencies.vibrations.frequencies_cm1) == 3
    ase_freq = np.real(namespace["ir"].get_frequencies()[-3:])
    assert np.max(np.abs(ase_freq - namespace["res"].frequencies.vibrations.frequencies_cm1)) < 2.0


def test_batch_freq_records_hessian_documents(tmp_path):
    out = tmp_path / "freq.jsonl"
    res = CliRunner().invoke(app, ["batch", str(molecule_path("water")), str(molecule_path("hydrogen_fluoride")),
                                   "--freq", "--basis", "sto-3g", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all(r["result"]["driver"] == "hessian" for r in records)
    hf = records[1]["result"]["extras"]["mp2trn"]
    assert len(hf["thermochemistry"]["frequencies_cm1"]) == 1 and hf["vibrations"]["linear"]


@pytest.mark.slow
def test_nh3_irc_from_the_planar_transition_state_reaches_the_pyramid(tmp_path):
    """geomeTRIC's IRC on mp2trn's gradients from the MP2/STO-3G planar NH₃ (the TS test's result): the path
    goes down to a pyramidal minimum, every point in the trajectory."""
    pytest.importorskip("geometric")
    ts = tmp_path / "ts.xyz"
    ts.write_text("4\nplanar ammonia (MP2/STO-3G transition state)\nN 0.0048500964 0.0085109652 0.1847736936\n"
                  "H 1.0228595304 0.0018310476 0.1883006382\nH -0.4983989468 0.8934449538 0.1904758790\n"
                  "H -0.5099036136 -0.8697328051 0.1760060542\n")
    out, traj = tmp_path / "end.xyz", tmp_path / "irc.xyz"
    res = CliRunner().invoke(app, ["optimize", str(ts), "--irc", "--basis", "sto-3g", "--out", str(out),
                                   "--trajectory", str(traj), "--max-steps", "60"])
    assert res.exit_code == 0, res.output
    energies = [float(p.split("=")[1]) for p in traj.read_text().split() if p.startswith("energy=")]
    assert energies[0] > -55.482 and min(energies) < energies[0] - 0.02          # down from the barrier
    xyz = np.array([[float(v) for v in line.split()[1:4]] for line in out.read_text().splitlines()[2:6]])
    normal = np.cross(xyz[2] - xyz[1], xyz[3] - xyz[1])
    assert abs(normal @ (xyz[0] - xyz[1])) / np.linalg.norm(normal) > 0.2          # N out of the H₃ plane (Å)


def test_store_header_missing_setting_reads_as_unset(tmp_path):
    """A store written before a setting existed (no key) resumes a run that leaves it unset, refuses one that
    sets it, and a changed setting is named."""
    from mp2trn.errors import InputError
    from mp2trn.hessian.driver import DisplacementStore, header_differences, store_header

    coords = np.zeros((1, 3))
    old = store_header(["He"], coords, 0.005, {"basis": "sto-3g"})
    unset = store_header(["He"], coords, 0.005, {"basis": "sto-3g", "conv_tol_grad": "None"})
    tight = store_header(["He"], coords, 0.005, {"basis": "sto-3g", "conv_tol_grad": "1e-08"})
    assert header_differences(old, unset) == []
    assert header_differences(old, tight) == ["settings.conv_tol_grad"]
    assert header_differences(unset, store_header(["He"], coords, 0.01, {"basis": "6-31g"})) == \
        ["step_bohr", "settings.basis"]
    DisplacementStore(tmp_path / "s", old, resume=False)
    DisplacementStore(tmp_path / "s", unset, resume=True)
    with pytest.raises(InputError, match="differs in settings.conv_tol_grad"):
        DisplacementStore(tmp_path / "s", tight, resume=True)
