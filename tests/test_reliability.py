"""Reliability: impossible geometries refused before any integral, numerical failures as domain errors,
signals and scratch (nothing left behind), a full scratch disk."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import h5py
import pytest
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.errors import InputError, NumericalError, ResourceError
from mp2trn.scratch import clean_stale, run_scratch

from .conftest import ROOT, molecule_path

#: two nearly identical s exponents on H: a linearly dependent basis at any geometry
DEPENDENT = {"H": [[0, [1.0, 1.0]], [0, [1.00001, 1.0]], [0, [0.2, 1.0]]]}
H2 = "2\nH2\nH 0 0 0\nH 0 0 0.74\n"


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("xyz,message", [
    ("2\nO2 slip\nO 0 0 0\nO 0 0 0.01\n", "atoms 1 (O) and 2 (O) are 0.0100 Å apart"),
    ("3\nduplicate H\nO 0 0 0\nH 0 0.76 0.59\nH 0 0.76 0.59\n", "atoms 2 (H) and 3 (H) coincide"),
    ("2\nghost on top\nO 0 0 0\nGh(O) 0 0 0.2\n", "atoms 1 (O) and 2 (ghost O) are 0.2000 Å apart"),
])
def test_impossible_geometries_are_refused_before_any_integral(tmp_path, monkeypatch, xyz, message):
    import mp2trn.pipeline

    monkeypatch.setattr(mp2trn.pipeline, "run_scf", lambda *a, **k: pytest.fail("the SCF started"))
    path = tmp_path / "in.xyz"
    path.write_text(xyz)
    out = tmp_path / "out.json"
    res = invoke("run", path, "--json", out)
    assert res.exit_code == InputError.exit_code and message in res.output
    assert "coordinates read in angstrom" in res.output and len(res.output.strip().splitlines()) == 1
    assert not out.exists()


def test_angstrom_file_read_as_bohr_gets_a_hint(tmp_path):
    path = tmp_path / "water.xyz"
    path.write_text(molecule_path("water").read_text())
    res = mp2trn.run(path, unit="bohr")   # O–H 0.96 "bohr" = 0.51 Å: allowed, but noted with the --unit hint
    assert any("use --unit angstrom" in n for n in res.notes)
    ho = "2\nHO\nO 0 0 0\nH 0 0 0.8\n"
    with pytest.raises(InputError, match="try --unit angstrom"):
        mp2trn.run(ho, unit="bohr", multiplicity=2)   # 0.8 bohr = 0.42 Å: refused, with the hint


def test_more_electrons_than_orbitals_is_an_input_error():
    with pytest.raises(InputError, match="1 function.*2 alpha and 1 beta electrons.*charge -1"):
        mp2trn.run("He 0 0 0", basis="sto-3g", charge=-1)


def test_linearly_dependent_basis_is_a_numerical_error_or_orthogonalised():
    kw = dict(basis=DEPENDENT, auxbasis="cc-pvdz-ri", jkbasis="cc-pvdz-jkfit")
    with pytest.raises(NumericalError, match=r"overlap matrix .* nearly singular .* --lindep"):
        mp2trn.run(H2, **kw)
    res = mp2trn.run(H2, lindep=1e-7, **kw)
    assert "--lindep 1e-07): 2 basis combinations dropped" in res.scf["orthogonalisation"]  # one pair per H
    assert res.e_corr < 0 and res.sizes["nmo"] == res.sizes["nao"] - 2


def test_singular_aux_metric_is_a_numerical_error(water_rhf):
    twice = {"O": [[0, [2.0, 1.0]], [0, [2.0, 1.0]]], "H": [[0, [1.0, 1.0]]]}
    with pytest.raises(NumericalError, match="Coulomb metric .* not positive definite"):
        mp2trn.DFMP2(water_rhf, auxbasis=twice).run()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_scratch_is_removed_and_a_live_runs_is_not(tmp_path):
    stale = tmp_path / f"mp2trn-{_dead_pid()}-abc"
    stale.mkdir()
    (stale / "owner").write_text(f"{_dead_pid()}\n")
    (stale / "B.h5").write_bytes(b"x" * 1000)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        live = tmp_path / f"mp2trn-{sleeper.pid}-def"
        live.mkdir()
        (live / "owner").write_text(f"{sleeper.pid}\n")
        with run_scratch(tmp_path) as mine:
            assert mine.is_dir() and not stale.exists() and live.is_dir()
        assert not mine.exists()
        assert clean_stale(tmp_path) == [] and live.is_dir()
        res = invoke("clean", "--scratch", tmp_path)
        assert res.exit_code == 0 and live.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert clean_stale(tmp_path) == [live]


def test_full_scratch_disk_is_a_resource_error_and_scratch_is_removed(tmp_path, monkeypatch):
    def no_space(self, key, value):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(h5py.Dataset, "__setitem__", no_space)
    with pytest.raises(ResourceError, match="scratch disk .* is full .* --scratch"):
        mp2trn.run(molecule_path("benzene"), max_memory=10, scratch=str(tmp_path))  # B out of core
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_mid_run_exits_cleanly_and_leaves_no_scratch(tmp_path, sig):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed package, as a user runs it
    cmd = [sys.executable, "-c", "from mp2trn.cli import app; app()", "run", str(molecule_path("benzene")),
           "--basis", "cc-pvtz", "--memory", "300", "--scratch", str(scratch), "--json", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    deadline = time.time() + 60
    while time.time() < deadline and not any(p.name.startswith("mp2trn-") for p in scratch.iterdir()):
        time.sleep(0.05)
    time.sleep(0.5)  # inside the run: the scratch directory exists
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err and len(err.strip().splitlines()) == 1
    assert list(scratch.iterdir()) == [] and not out.exists()
