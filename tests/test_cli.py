"""The CLI: a clean run with JSON output, and for each bad input a one-line error, a non-zero exit code
and no output file left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mp2trn.cli import app
from mp2trn.errors import ConvergenceError, InputError, ResourceError

from .conftest import molecule_path

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_run_water_prints_energies_and_writes_qcschema_json(tmp_path):
    out = tmp_path / "water.json"
    res = invoke("run", str(molecule_path("water")), "--json", str(out))
    assert res.exit_code == 0, res.output
    assert "MP2 total energy" in res.output and "cc-pvdz-ri" in res.output and "kcal/mol" in res.output
    doc = json.loads(out.read_text())
    assert doc["schema_name"] == "qcschema_output"
    props = doc["properties"]
    # the document's energies are sums of its own parts: equal to rounding (1e-12 Eh)
    assert props["return_energy"] == props["mp2_total_energy"]
    assert props["mp2_correlation_energy"] == pytest.approx(
        props["mp2_same_spin_correlation_energy"] + props["mp2_opposite_spin_correlation_energy"], rel=0, abs=1e-12)
    extras = doc["extras"]["mp2trn"]
    assert extras["device"] == "cpu" and extras["precision"] == "fp64"
    assert extras["auxbasis"] == "cc-pvdz-ri" and extras["jkbasis"] == "cc-pvdz-jkfit"
    assert extras["scs_mp2_correlation_energy"] == pytest.approx(
        1.2 * props["mp2_opposite_spin_correlation_energy"] + props["mp2_same_spin_correlation_energy"] / 3,
        rel=0, abs=1e-12)
    assert set(extras["timings"]) >= {"scf", "ao_to_mo", "metric", "pairs", "total"}
    assert doc["molecule"]["molecular_multiplicity"] == 1


def test_quiet_prints_nothing(tmp_path):
    res = invoke("run", str(molecule_path("water")), "--quiet")
    assert res.exit_code == 0 and res.output.strip() == ""


def test_comment_line_multiplicity_and_flag_override(tmp_path):
    out = tmp_path / "oh.json"
    assert invoke("run", str(molecule_path("hydroxyl")), "--json", str(out), "-q").exit_code == 0
    doc = json.loads(out.read_text())
    assert doc["extras"]["mp2trn"]["reference"] == "UHF" and doc["molecule"]["molecular_multiplicity"] == 2
    res = invoke("run", str(molecule_path("hydroxyl")), "--multiplicity", "4", "--json", str(out), "-q")
    assert res.exit_code == 0
    assert json.loads(out.read_text())["molecule"]["molecular_multiplicity"] == 4


def test_frozen_core_and_bohr_units(tmp_path):
    out = tmp_path / "w.json"
    text = molecule_path("water").read_text().splitlines()
    bohr = [text[0], text[1]] + [
        f"{p[0]} " + " ".join(str(float(x) / 0.52917721092) for x in p[1:]) for p in (ln.split() for ln in text[2:])
    ]
    xyz = tmp_path / "water_bohr.xyz"
    xyz.write_text("\n".join(bohr) + "\n")
    assert invoke("run", str(xyz), "--unit", "bohr", "--frozen-core", "auto", "--json", str(out), "-q").exit_code == 0
    bohr_doc = json.loads(out.read_text())
    assert invoke("run", str(molecule_path("water")), "--frozen-core", "1", "--json", str(out), "-q").exit_code == 0
    ang_doc = json.loads(out.read_text())
    assert bohr_doc["extras"]["mp2trn"]["frozen"].startswith("auto (1 core")
    # the same molecule in other units: the fp64 claim (1e-8 Eh), coordinates printed to 16 digits
    assert bohr_doc["properties"]["mp2_correlation_energy"] == pytest.approx(
        ang_doc["properties"]["mp2_correlation_energy"], rel=0, abs=1e-8)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "input.xyz"
    path.write_text(text)
    return path


WATER = "3\nwater\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n"

BAD_INPUTS = [
    # (xyz text or None for the water file, extra args, expected message fragment, exit code)
    ("3\nwater\nO 0 0 0\nH 0 0.75\nH 0 -0.75 0.5\n", [], "expected 'symbol x y z'", InputError.exit_code),
    ("2\nwater\nO 0 0 0\nH 0 0.75 0.5\nH 0 -0.75 0.5\n", [], "count line says 2 atoms, found 3", InputError.exit_code),
    ("three\nwater\nO 0 0 0\n", [], "first line must be a positive atom count", InputError.exit_code),
    ("1\nx\nO 0 zero 0\n", [], "non-numeric coordinate", InputError.exit_code),
    ("2\nbad element\nQq 0 0 0\nH 0 0 1\n", [], "unknown element: 'Qq'", InputError.exit_code),
    (WATER, ["--charge", "10"], "impossible charge 10", InputError.exit_code),
    (WATER, ["--multiplicity", "2"], "cannot have multiplicity 2", InputError.exit_code),
    (WATER, ["--multiplicity", "0"], "impossible multiplicity 0", InputError.exit_code),
    (WATER, ["--basis", "no-such-basis"], "basis 'no-such-basis' is not available", InputError.exit_code),
    (WATER, ["--auxbasis", "no-such-fit"], "auxiliary basis 'no-such-fit' is not usable", InputError.exit_code),
    (WATER, ["--jkbasis", "no-such-jkfit"], "JK-fit basis 'no-such-jkfit' is not usable", InputError.exit_code),
    ("1\nghost only\nGh(O) 0 0 0\n", [], "impossible charge 0: leaves 0 electrons", InputError.exit_code),
    (WATER, ["--frozen-core", "lots"], "--frozen-core 'lots'", InputError.exit_code),
    (WATER, ["--frozen-core", "5"], "cannot freeze 5 orbitals", InputError.exit_code),
    (WATER, ["--device", "tpu"], "unknown device 'tpu'", InputError.exit_code),
    (WATER, ["--precision", "fp16"], "precision 'fp16' is not available", InputError.exit_code),
    (WATER, ["--memory", "0.05"], "too small", ResourceError.exit_code),
    (WATER, ["--memory", "-3"], "--memory must be a positive", InputError.exit_code),
    ("12\nbenzene\n" + "\n".join(molecule_path("benzene").read_text().splitlines()[2:]) + "\n",
     ["--scf-max-cycle", "2"], "SCF did not converge", ConvergenceError.exit_code),
]


@pytest.mark.parametrize("text,args,message,code", BAD_INPUTS, ids=[b[2][:30] for b in BAD_INPUTS])
def test_bad_input_one_line_error_nonzero_exit_no_file(tmp_path, text, args, message, code):
    out = tmp_path / "result.json"
    res = invoke("run", str(_write(tmp_path, text)), *args, "--json", str(out))
    assert res.exit_code == code, res.output
    assert message in res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.xyz"]  # no temp file left either


def test_too_little_memory_fails_before_the_scf(tmp_path, monkeypatch):
    import mp2trn.pipeline

    def no_scf(*args, **kwargs):  # pragma: no cover - reaching it is the failure
        raise AssertionError("SCF started despite an impossible memory budget")

    monkeypatch.setattr(mp2trn.pipeline, "run_scf", no_scf)
    res = invoke("run", str(molecule_path("benzene")), "--memory", "0.5")
    assert res.exit_code == ResourceError.exit_code and "raise --memory" in res.output


def test_missing_file_and_unwritable_output(tmp_path):
    res = invoke("run", str(tmp_path / "nope.xyz"))
    assert res.exit_code == InputError.exit_code and "no such file" in res.output
    res = invoke("run", str(molecule_path("water")), "--json", str(tmp_path / "missing_dir" / "o.json"))
    assert res.exit_code == InputError.exit_code and "does not exist" in res.output


def test_unavailable_device_names_what_to_install():
    res = invoke("run", str(molecule_path("water")), "--device", "neuron")
    assert res.exit_code != 0
    assert "neuron" in res.output and res.output.strip().startswith("error:")


def test_info_lists_devices():
    res = invoke("info")
    assert res.exit_code == 0
    for name in ("device cpu", "device cuda", "device sim", "device neuron", "NKI"):
        assert name in res.output
