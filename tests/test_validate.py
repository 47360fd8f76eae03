"""`mp2trn validate`: the molecule sets, the accuracy table against PySCF (a fast subset here, the whole
sets behind the `slow` mark), the output files, the exit codes and the errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mp2trn import validation as v
from mp2trn.cli import app
from mp2trn.errors import DeviceUnavailableError, InputError
from mp2trn.molecule import read_xyz

runner = CliRunner()

# closed and open shell, anion, cation, a third-row atom with frozen core, a def2 basis: about 3 s
FAST = "water/cc-pvdz,hydroxyl,hydroxide,hydronium,hydrogen_chloride,methyl/def2-svp"


def invoke(*args):
    return runner.invoke(app, ["validate", *map(str, args)], catch_exceptions=False)


def _doc(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.json").read_text())


def _no_temp_files(folder: Path) -> bool:
    return not list(folder.glob(".*.tmp"))


# --- the sets -------------------------------------------------------------------------------------


def test_default_set_covers_what_the_suite_promises():
    mset = v.load_set("default")
    assert mset.kind == "energy" and len(mset.entries) >= 15
    names = {e.name for e in mset.entries}
    assert {"water", "benzene", "hydroxyl", "oxygen_triplet", "methylene_triplet", "hydroxide", "hydronium",
            "water_cation", "hydrogen_sulfide", "hydrogen_chloride", "phosphine", "hydrosulfide"} <= names
    assert {e.basis for e in mset.entries} == {"cc-pvdz", "cc-pvtz", "def2-svp"}
    assert any(e.options.get("frozen") == "auto" for e in mset.entries)
    charges = {read_xyz(e.path).charge for e in mset.entries}
    mults = {read_xyz(e.path).multiplicity for e in mset.entries}
    assert {-1, 1} <= charges and {2, 3} <= mults


def test_s22_set_has_22_complexes_with_two_fragments_and_references():
    mset = v.load_set("s22")
    assert mset.kind == "interaction" and len(mset.entries) == 22
    refs = [float(e.options["ref"]) for e in mset.entries]
    assert refs[1] == -4.989 and min(refs) == -20.641 and max(refs) == -0.527  # S22B values
    natoms = []
    for e in mset.entries:
        geom = read_xyz(e.path)
        assert len(geom.fragments) == 2 and sum(geom.fragments) == len(geom.atoms)
        natoms.append(len(geom.atoms))
    assert sum(natoms) == 414 and max(natoms) == 30


def test_set_names_paths_and_selection(tmp_path):
    assert {"default", "s22"} <= set(v.available_sets())
    with pytest.raises(InputError, match="unknown molecule set 'nope'.*available: .*default"):
        v.load_set("nope")
    mset = v.load_set(str(v.resolve_set("default")))  # a path works as well as a name
    chosen = v.select_entries(mset, "water,hydroxyl/cc-pvdz")
    assert [e.key for e in chosen] == ["water/cc-pvdz", "water/cc-pvtz", "hydroxyl/cc-pvdz"]
    assert [e.name for e in v.select_entries(v.load_set("s22"), "water_dimer")] == ["02_water_dimer"]
    with pytest.raises(InputError, match="--only: no entry xenon"):
        v.select_entries(mset, "water,xenon")


@pytest.mark.parametrize(
    "body, message",
    [
        ("../nothere.xyz cc-pvdz\n", "no such molecule file"),
        ("water.xyz\n", "expected 'XYZ BASIS"),
        ("water.xyz cc-pvdz frozen\n", "option 'frozen' is not key=value"),
        ("water.xyz cc-pvdz colour=blue\n", "unknown option 'colour'"),
        ("kind: spectra\nwater.xyz cc-pvdz\n", "expected 'kind: energy' or 'kind: interaction'"),
        ("water.xyz cc-pvdz\nwater.xyz cc-pvdz\n", "duplicate entries water/cc-pvdz"),
        ("# only a comment\n", "the set has no entries"),
    ],
)
def test_malformed_set_files_name_file_and_line(tmp_path, body, message):
    (tmp_path / "water.xyz").write_text("3\nwater\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n")
    (tmp_path / "my.txt").write_text(body)
    with pytest.raises(InputError, match=message):
        v.load_set(str(tmp_path / "my.txt"))


def test_tolerances():
    assert v.tolerance_for("fp64") == 1e-8
    assert v.tolerance_for("fp32") == 1e-6
    assert v.tolerance_for("fp32x3") == 1e-7  # the sim device's compensated mode, measured
    assert v.tolerance_for("bf16x3") == v.COMPENSATED_TOLERANCE == 2e-6  # any other compensated mode


# --- runs -----------------------------------------------------------------------------------------


def test_fast_subset_fp64_and_fp32_pass_and_write_csv_json_markdown_png(tmp_path):
    out = tmp_path / "val"
    res = invoke("--only", FAST, "--out", out)
    assert res.exit_code == 0, res.output
    assert "6 of 6 entries pass (tolerance 1e-08 Eh for fp64)" in res.output
    doc = _doc(out, "validate_default_cpu_fp64")
    assert doc["schema_name"] == "mp2trn_validation" and doc["device"] == "cpu" and doc["precision"] == "fp64"
    rows = doc["rows"]
    assert [r["key"] for r in rows] == ["water/cc-pvdz", "hydroxyl/cc-pvdz", "methyl/def2-svp", "hydroxide/cc-pvdz",
                                        "hydronium/cc-pvdz", "hydrogen_chloride/cc-pvdz/fc-auto"]  # set order
    for r in rows:
        assert r["passed"] and r["error"] is None and r["abs_diff"] <= 1e-8
        assert (r["device"], r["precision"], r["tolerance"]) == ("cpu", "fp64", 1e-8)
        # the DF error is real (µEh) and far larger than the mp2trn-PySCF difference
        assert 1e-7 < abs(r["df_error"]) < 1e-3
        assert r["auxbasis"].endswith("-ri") and r["jkbasis"].endswith("-jkfit")
        assert min(r["t_scf"], r["t_mp2trn"], r["t_pyscf"], r["t_conventional"]) >= 0
    by = {r["key"]: r for r in rows}
    assert by["hydroxyl/cc-pvdz"]["reference"] == "UHF" and by["hydroxyl/cc-pvdz"]["nocc"] == "5/4"
    assert by["hydroxide/cc-pvdz"]["charge"] == -1 and by["hydronium/cc-pvdz"]["charge"] == 1
    assert by["hydrogen_chloride/cc-pvdz/fc-auto"]["frozen"] == 5
    assert by["methyl/def2-svp"]["auxbasis"] == "def2-svp-ri"
    with open(out / "validate_default_cpu_fp64.csv") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 6 and float(table[0]["e_corr_pyscf"]) == rows[0]["e_corr_pyscf"]
    assert "| water | RHF | 3 | cc-pvdz |" in (out / "validate_default_cpu_fp64.md").read_text()
    png = out / "validate_default.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # fp32 into the same folder: its own files, and the plot now shows both runs
    res = invoke("--only", "water/cc-pvdz,hydroxyl", "--precision", "fp32", "--out", out, "--no-conventional",
                 "--conv-tol-grad", "1e-7")
    assert res.exit_code == 0, res.output
    doc32 = _doc(out, "validate_default_cpu_fp32")
    assert doc32["tolerance"] == 1e-6
    assert doc32["options"]["conv_tol_grad"] == 1e-7 and doc["options"]["conv_tol_grad"] is None
    for r in doc32["rows"]:
        assert r["precision"] == "fp32" and r["passed"] and 0 < r["abs_diff"] <= 1e-6
        assert r["df_error"] is None and r["t_conventional"] is None
    assert _doc(out, "validate_default_cpu_fp64")["rows"] == rows  # untouched
    assert _no_temp_files(out)


def test_tolerance_exceeded_exits_1_after_writing_the_report(tmp_path):
    out = tmp_path / "val"
    res = invoke("--only", "water/cc-pvdz", "--precision", "fp32", "--tol", "1e-14", "--no-conventional", "--out", out)
    assert res.exit_code == 1
    assert "validation failed" in res.output and "water/cc-pvdz" in res.output
    doc = _doc(out, "validate_default_cpu_fp32")
    assert doc["rows"][0]["passed"] is False and doc["summary"]["failed"] == ["water/cc-pvdz"]


def test_a_molecule_that_fails_to_run_is_reported_and_fails_the_suite(tmp_path):
    out = tmp_path / "val"
    res = invoke("--only", "water/cc-pvdz", "--scf-max-cycle", "1", "--no-conventional", "--out", out)
    assert res.exit_code == 1
    assert "ERROR" in res.output and "ConvergenceError" in res.output
    row = _doc(out, "validate_default_cpu_fp64")["rows"][0]
    assert row["passed"] is False and row["error"].startswith("ConvergenceError")


def test_interaction_set_subset(tmp_path):
    out = tmp_path / "val"
    res = invoke("--set", "s22", "--only", "water_dimer", "--out", out)
    assert res.exit_code == 0, res.output
    assert "MP2 vs reference: MAE" in res.output and "02_water_dimer" in res.output
    doc = _doc(out, "validate_s22_cpu_fp64")
    r = doc["rows"][0]
    assert r["passed"] and r["max_abs_diff_corr"] <= 1e-8 and r["abs_diff_ie"] <= 1e-8
    assert r["ref_kcal"] == -4.989 and r["error_mp2_kcal"] == pytest.approx(r["ie_mp2_kcal"] + 4.989)
    # MP2/cc-pVDZ with CP and frozen core underbinds the water dimer by about 1 kcal/mol
    assert -4.2 < r["ie_mp2_kcal"] < -3.6
    assert doc["summary"]["mp2_vs_reference_kcal"]["n"] == 1
    assert (out / "validate_s22.png").is_file()
    # without the PySCF cross-check: the reference comparison only, nothing to fail on
    res = invoke("--set", "s22", "--only", "water_dimer", "--no-pyscf", "--out", tmp_path / "nopyscf")
    assert res.exit_code == 0, res.output
    r2 = _doc(tmp_path / "nopyscf", "validate_s22_cpu_fp64")["rows"][0]
    assert r2["passed"] and r2["abs_diff"] is None and r2["t_pyscf"] is None
    assert r2["ie_mp2_kcal"] == pytest.approx(r["ie_mp2_kcal"], abs=1e-6)


# --- bad inputs: one line, exit code, nothing written ---------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "nope"], "unknown molecule set 'nope'"),
        (["--only", "xenon"], "--only: no entry xenon"),
        (["--tol", "-1"], "--tol must be positive"),
        (["--precision", "fp16"], "precision 'fp16' is not available on device 'cpu'"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--frozen-core", "lots"], "--frozen-core 'lots'"),
        (["--set", "s22", "--frozen-core", "2"], "interaction sets take auto or none"),
    ],
)
def test_bad_options_are_one_line_errors(tmp_path, args, message):
    out = tmp_path / "val"
    res = invoke(*args, "--out", out)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert not out.exists()


def test_out_must_be_a_folder(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    res = invoke("--only", "water/cc-pvdz", "--out", f)
    assert res.exit_code == 2 and "exists and is not a directory" in res.output


def test_unavailable_device_is_reported_not_crashed(tmp_path, monkeypatch):
    import mp2trn.pipeline

    def unavailable(name, precision=None, **options):
        raise DeviceUnavailableError(f"device {name!r} is not part of this mp2trn build")

    monkeypatch.setattr(mp2trn.pipeline, "get_device", unavailable)  # where every run opens its device
    out = tmp_path / "val"
    res = invoke("--device", "sim", "--out", out)
    assert res.exit_code == 5
    assert "device 'sim' is not part of this mp2trn build" in res.output
    assert not out.exists()


# --- the whole sets (minutes): pytest -m slow ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_whole_default_set(tmp_path, precision):
    res = invoke("--precision", precision, "--out", tmp_path)
    assert res.exit_code == 0, res.output
    doc = _doc(tmp_path, f"validate_default_cpu_{precision}")
    assert len(doc["rows"]) == len(v.load_set("default").entries)
    assert all(r["passed"] for r in doc["rows"])


@pytest.mark.slow
def test_whole_s22_set(tmp_path):
    res = invoke("--set", "s22", "--out", tmp_path)
    assert res.exit_code == 0, res.output
    doc = _doc(tmp_path, "validate_s22_cpu_fp64")
    assert len(doc["rows"]) == 22 and all(r["passed"] for r in doc["rows"])
    # MP2/cc-pVDZ (CP, frozen core) against CCSD(T)/CBS: about a kcal/mol on average
    stats = doc["summary"]["mp2_vs_reference_kcal"]
    assert stats["n"] == 22 and stats["mae"] < 3.0
