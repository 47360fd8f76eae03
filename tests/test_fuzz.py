"""Fuzzing `mp2trn run` and the Python API with generated XYZ files and options: never a traceback
(exit 70, "internal error"), never exit 0 with a non-finite or non-physical result.

The bounded run is in the default suite; ``pytest -m slow tests/test_fuzz.py`` runs ten times as many."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mp2trn
from mp2trn.cli import app
from mp2trn.errors import Mp2trnError

SYMBOLS = ["H", "H", "He", "Li", "O", "N", "Gh(H)", "X-O", "1", "Qq", "h"]
NUMBERS = st.one_of(
    st.floats(-3, 3, allow_nan=False),                    # ordinary
    st.sampled_from([0.0, 1e-9, -1e-9, 0.3, 1e6, -1e6]),  # coinciding, very close, far apart
)
BAD_TOKENS = st.sampled_from(["nan", "inf", "1e400", "abc", "", "1.0.0"])


@st.composite
def plausible_xyz(draw):
    """Well-formed files of light atoms at ordinary distances: most of these should run."""
    n = draw(st.integers(1, 4))
    lines = [" ".join([draw(st.sampled_from(["H", "H", "O", "N", "Li", "Gh(H)"])),
                       *(repr(draw(st.floats(-2, 2, allow_nan=False))) for _ in range(3))]) for _ in range(n)]
    return "\n".join([str(n), "", *lines]) + "\n"


def xyz_files():
    return st.one_of(plausible_xyz(), any_xyz())


@st.composite
def any_xyz(draw):
    n = draw(st.integers(1, 4))
    lines = []
    for _ in range(n):
        coords = [repr(draw(NUMBERS)) for _ in range(3)]
        if draw(st.integers(0, 9)) == 0:
            coords[draw(st.integers(0, 2))] = draw(BAD_TOKENS)
        lines.append(" ".join([draw(st.sampled_from(SYMBOLS)), *coords]))
    if n > 1 and draw(st.booleans()):
        lines[-1] = lines[0]                               # a duplicated atom
    count = draw(st.sampled_from([str(n), str(n), str(n + 1), str(max(n - 1, 0)), "x"]))
    comment = draw(st.sampled_from(["", "charge=1", "multiplicity=3", "charge=-1 multiplicity=2", "charge=9"]))
    return "\n".join([count, comment, *lines]) + "\n"


OPTIONS = st.fixed_dictionaries({
    "--unit": st.sampled_from(["angstrom", "bohr"]),
    "--charge": st.sampled_from([None, "0", "1", "-1", "5"]),
    "--multiplicity": st.sampled_from([None, "1", "2", "3", "0"]),
    "--frozen-core": st.sampled_from(["none", "auto", "1", "7"]),
    "--basis": st.sampled_from(["sto-3g", "sto-3g", "no-such-basis"]),
})


def _check_cli(tmp_path, text, options):
    path = tmp_path / "in.xyz"
    path.write_text(text)
    out = tmp_path / "out.json"
    out.unlink(missing_ok=True)
    args = ["run", str(path), "--json", str(out), "-q", "--scf-max-cycle", "60"]
    for flag, value in options.items():
        if value is not None:
            args += [flag, value]
    res = CliRunner().invoke(app, args)
    assert res.exit_code != 70 and "internal error" not in res.output, (text, options, res.output)
    assert res.exception is None or isinstance(res.exception, SystemExit), (text, options, res.exception)
    if res.exit_code == 0:
        props = json.loads(out.read_text())["properties"]
        energies = [props[k] for k in ("scf_total_energy", "mp2_correlation_energy", "mp2_total_energy")]
        assert all(math.isfinite(e) for e in energies), (text, options, energies)
        assert props["mp2_correlation_energy"] <= 0 and props["scf_total_energy"] < 0, (text, options, props)
    else:
        assert not out.exists() and len(res.output.strip().splitlines()) == 1


def _check_api(text, options):
    kw = {"unit": options["--unit"], "basis": options["--basis"], "frozen": options["--frozen-core"],
          "charge": None if options["--charge"] is None else int(options["--charge"]),
          "multiplicity": None if options["--multiplicity"] is None else int(options["--multiplicity"])}
    try:
        res = mp2trn.run(text, max_cycle=60, **kw)
    except Mp2trnError:
        return
    assert math.isfinite(res.e_tot) and res.e_corr <= 0 and res.e_hf < 0


# The default suite draws the same examples every run (CI must not fail by chance); the slow variant
# below draws new ones each time and is where new failures are found. Each one found becomes an
# explicit example here.
FUZZ = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
FOUND = [
    # He⁻ in STO-3G: two alpha electrons, one basis function (was "internal error" from PySCF's mo_occ)
    ("1\n\nHe 0.0 0.0 0.0\n", {"--unit": "angstrom", "--charge": "-1", "--multiplicity": None,
                                 "--frozen-core": "none", "--basis": "sto-3g"}),
]


def _with_found(test):
    for text, options in FOUND:
        test = example(text=text, options=options)(test)
    return test


@FUZZ
@_with_found
@given(text=xyz_files(), options=OPTIONS)
def test_cli_never_crashes_and_never_returns_nonsense(tmp_path_factory, text, options):
    _check_cli(tmp_path_factory.mktemp("fuzz"), text, options)


@FUZZ
@_with_found
@given(text=xyz_files(), options=OPTIONS)
def test_api_raises_only_mp2trn_errors(text, options):
    _check_api(text, options)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=xyz_files(), options=OPTIONS)
def test_cli_fuzz_long(tmp_path_factory, text, options):
    _check_cli(tmp_path_factory.mktemp("fuzz"), text, options)
