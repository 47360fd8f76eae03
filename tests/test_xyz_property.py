"""Property tests over generated XYZ text: valid files parse to the right atoms and coordinates;
invalid ones raise InputError and nothing else. The same examples every run (derandomize, no deadline): CI must
not fail by chance; tests/test_fuzz.py's slow variant is where new examples are drawn."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mp2trn.errors import InputError
from mp2trn.molecule import parse_xyz

SYMBOLS = ["H", "He", "Li", "C", "N", "O", "F", "Ne", "Na", "Mg", "Si", "P", "S", "Cl", "Ar", "Fe", "Br"]
coord = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
atom = st.tuples(st.sampled_from(SYMBOLS), st.booleans(), st.sampled_from(["lower", "upper", "as-is"]), coord, coord, coord)


def render_symbol(sym: str, ghost: bool, case: str) -> str:
    s = {"lower": sym.lower(), "upper": sym.upper(), "as-is": sym}[case]
    return f"Gh({s})" if ghost else s


@given(st.lists(atom, min_size=1, max_size=12), st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=40),
       st.sampled_from([" ", "\t", "   "]))
@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
def test_valid_xyz_parses_to_the_right_atoms(atoms, comment, sep):
    lines = [str(len(atoms)), comment]
    for sym, ghost, case, x, y, z in atoms:
        lines.append(sep.join([render_symbol(sym, ghost, case), repr(x), repr(y), repr(z)]))
    geom = parse_xyz("\n".join(lines) + "\n")
    assert len(geom.atoms) == len(atoms)
    for parsed, (sym, ghost, _case, x, y, z) in zip(geom.atoms, atoms):
        assert parsed.symbol == sym and parsed.ghost == ghost
        assert parsed.coords == (x, y, z)


def _mutations():
    """Ways to break a valid XYZ text."""
    return st.sampled_from(["count", "drop_atom", "extra_field", "bad_number", "bad_symbol", "blank_inside", "nan", "header_only"])


@given(st.lists(atom, min_size=2, max_size=8), _mutations(), st.text(alphabet="xyzQ#$%", min_size=1, max_size=5))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_invalid_xyz_raises_input_error_only(atoms, mutation, junk):
    body = [" ".join([render_symbol(s, g, c), repr(x), repr(y), repr(z)]) for s, g, c, x, y, z in atoms]
    count = str(len(atoms))
    if mutation == "count":
        count = str(len(atoms) + 1)
    elif mutation == "drop_atom":
        body = body[:-1]
    elif mutation == "extra_field":
        body[0] += " 1.0"
    elif mutation == "bad_number":
        parts = body[0].split()
        parts[2] = junk
        body[0] = " ".join(parts)
    elif mutation == "bad_symbol":
        parts = body[0].split()
        parts[0] = "Qx" + junk
        body[0] = " ".join(parts)
    elif mutation == "blank_inside":
        body.insert(1, "")
    elif mutation == "nan":
        parts = body[0].split()
        parts[1] = "nan"
        body[0] = " ".join(parts)
    elif mutation == "header_only":
        body = []
    text = "\n".join([count, "comment"] + body) + "\n"
    try:
        parse_xyz(text)
    except InputError:
        return
    raise AssertionError(f"invalid XYZ ({mutation}) was accepted:\n{text}")


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_arbitrary_text_never_raises_anything_but_input_error(text):
    try:
        geom = parse_xyz(text)
    except InputError:
        return
    assert all(math.isfinite(c) for a in geom.atoms for c in a.coords)
