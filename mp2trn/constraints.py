"""geomeTRIC constraints files, read strictly, so that an optimisation applies exactly what the file says.

The syntax is geomeTRIC's (``geometric.prepare.parse_constraints``; L.-P. Wang, C. Song, J. Chem. Phys. 144,
214108 (2016)): a section line ``$freeze``, ``$set`` or ``$scan``, then one constraint per line,
``<type> <atoms...> [numbers...]``; ``#`` starts a comment; case does not matter::

    $freeze
    xyz 1                  # atom 1 stays where it is (also: x, y, z, xy, xz, yz; an element: xyz H; a range: xyz 1-3,5)
    distance 1 2
    $set
    angle 2 1 3 95.0       # degrees; distances and Cartesian positions in Å
    $scan
    dihedral 1 2 3 4 0 180 7   # from, to, number of points

geomeTRIC itself reads leniently: a section keyword it does not know (``$set garbage``) opens a section
whose lines it skips or fails on later with an unrelated message, and an element that names no atom
selects nothing. Here every line is understood or refused with its line number; geomeTRIC is then given
the file written back from what was read (:meth:`Constraints.geometric_text`), and the optimisation
states the constraints it applies (:meth:`Constraints.describe`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

SECTIONS = ("freeze", "set", "scan")


@dataclass(frozen=True)
class ConstraintType:
    """One type of constraint: how many atom arguments it takes (each an atom, or a group of atoms when
    ``groups``), how many fixed numbers precede its values (the rotation axis), how many values a ``$set``
    gives (a ``$scan`` gives a start and an end for each, then the number of points), and their unit."""

    atom_args: int
    groups: bool
    values: int
    unit: str
    fixed: int = 0
    elements: bool = False      # an atom argument may be an element symbol (every atom of that element)


def _cartesian(axes: str) -> ConstraintType:
    """x, xy, ... (each atom of the group held) and trans-x, ... (the group's centre): one value per axis."""
    return ConstraintType(1, True, len(axes), "Å", elements=True)


#: the types geomeTRIC knows (its ``ClassDict``), by their canonical name
TYPES: dict[str, ConstraintType] = {
    "distance": ConstraintType(2, False, 1, "Å"),
    "angle": ConstraintType(3, False, 1, "°"),
    "dihedral": ConstraintType(4, False, 1, "°"),
    **{axes: _cartesian(axes) for axes in ("x", "y", "z", "xy", "xz", "yz", "xyz")},
    **{f"trans-{axes}": _cartesian(axes) for axes in ("x", "y", "z", "xy", "xz", "yz", "xyz")},
    "rotation": ConstraintType(1, True, 1, "°", fixed=3),
    "centroid_distance": ConstraintType(2, True, 1, "Å"),
}

_GROUP = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


@dataclass(frozen=True)
class Constraint:
    """One constraint line: its ``mode`` (freeze/set/scan), canonical ``kind``, ``atoms`` (1-based, one
    tuple per atom argument), ``numbers`` (the fixed numbers, then the $set values or the $scan starts and
    ends, in the file's units: Å and degrees), ``points`` of a scan, and its ``line`` in the file."""

    line: int
    mode: str
    kind: str
    atoms: tuple[tuple[int, ...], ...]
    numbers: tuple[float, ...] = ()
    points: int | None = None

    def geometric_line(self) -> str:
        """The line as geomeTRIC reads it."""
        atoms = " ".join(",".join(map(str, group)) for group in self.atoms)
        numbers = " ".join(repr(v) for v in self.numbers)
        return " ".join(part for part in (self.kind, atoms, numbers,
                                          "" if self.points is None else str(self.points)) if part)

    def describe(self, symbols: list[str]) -> str:
        """'set angle H2-O1-H3 to 95°', 'freeze xyz of H2, H3', 'scan distance O1-H2 from 0.9 to 1.2 Å (7 points)'."""
        ctype = TYPES[self.kind]
        names = [", ".join(f"{symbols[a - 1]}{a}" for a in group) for group in self.atoms]
        what = (f"{self.kind} {'-'.join(names)}" if not ctype.groups else
                f"{self.kind} of {' and '.join(names)}")
        numbers = self.numbers[ctype.fixed:]
        about = f" about axis ({', '.join(f'{v:g}' for v in self.numbers[:ctype.fixed])})" if ctype.fixed else ""

        def values(vals) -> str:
            text = ", ".join(f"{v:g}" for v in vals)
            return (text if len(vals) == 1 else f"({text})") + (ctype.unit if ctype.unit == "°" else f" {ctype.unit}")

        if self.mode == "freeze":
            return f"freeze {what}"
        if self.mode == "set":
            return f"set {what}{about} to {values(numbers)}"
        half = len(numbers) // 2
        return (f"scan {what}{about} from {values(numbers[:half])} to {values(numbers[half:])} "
                f"({self.points} point{'' if self.points == 1 else 's'})")


@dataclass(frozen=True)
class Constraints:
    """The constraints of one file, in its order."""

    items: tuple[Constraint, ...]

    def geometric_text(self) -> str:
        """The file geomeTRIC is given: a section line wherever the mode changes, then the lines."""
        lines, mode = [], None
        for item in self.items:
            if item.mode != mode:
                lines.append(f"${item.mode}")
                mode = item.mode
            lines.append(item.geometric_line())
        return "\n".join(lines) + "\n"

    def describe(self, symbols: list[str]) -> list[str]:
        return [item.describe(symbols) for item in self.items]


def read_constraints(path: str | Path, symbols: list[str]) -> Constraints:
    """The constraints file at ``path`` for the atoms ``symbols`` (the atoms geomeTRIC moves, in order)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read the constraints file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(f"the constraints file {path} is not a text file") from None
    return parse_constraints(text, symbols, str(path))


def parse_constraints(text: str, symbols: list[str], source: str = "constraints") -> Constraints:
    """Every line of ``text`` understood, or an InputError naming the line (see the module docstring)."""
    items: list[Constraint] = []
    mode: str | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip().lower()
        if not line:
            continue

        def refuse(why: str) -> InputError:
            return InputError(f"{source}, line {number} ({raw.strip()!r}): {why}")

        if line.startswith("$"):
            mode = _section(line[1:].strip(), refuse)
            continue
        if mode is None:
            raise refuse("a constraint before any section: start with $freeze, $set or $scan")
        items.append(_constraint(number, mode, line.split(), symbols, refuse))
    if not items:
        raise InputError(f"{source} names no constraint: give $freeze, $set or $scan lines, or drop --constraints")
    return Constraints(tuple(items))


def _section(name: str, refuse) -> str | None:
    """The mode a section line opens (None after ``$end``)."""
    if name in SECTIONS:
        return name
    if name == "end":
        return None
    if name == "options":
        raise refuse("a $options block is not taken: mp2trn sets geomeTRIC's options from its own flags "
                     "(--convergence, --max-steps); remove the block")
    raise refuse(f"unknown section ${name}: use $freeze, $set or $scan")


def _canonical_kind(word: str) -> str | None:
    """geomeTRIC's name of a type: Cartesian axes in any order ('yx' is 'xy', 'trans-zx' is 'trans-xz')."""
    prefix, axes = ("trans-", word[6:]) if word.startswith("trans-") else ("", word)
    if axes and set(axes) <= set("xyz") and len(set(axes)) == len(axes):
        return prefix + "".join(sorted(axes))
    return word if word in TYPES else None


def _constraint(number: int, mode: str, tokens: list[str], symbols: list[str], refuse) -> Constraint:
    kind = _canonical_kind(tokens[0])
    if kind is None:
        raise refuse(f"unknown constraint type {tokens[0]!r}: use one of {', '.join(TYPES)}")
    ctype = TYPES[kind]
    counts = {"freeze": ctype.atom_args, "set": ctype.atom_args + ctype.fixed + ctype.values,
              "scan": ctype.atom_args + ctype.fixed + 2 * ctype.values + 1}
    if len(tokens) - 1 != counts[mode]:
        raise refuse(f"${mode} {kind} takes {counts[mode]} item{'s' if counts[mode] != 1 else ''} after the type "
                     f"({_usage(mode, kind, ctype)}), not {len(tokens) - 1}")
    atoms = tuple(_atoms(tok, ctype, symbols, refuse) for tok in tokens[1:1 + ctype.atom_args])
    _check_atoms(kind, ctype, atoms, refuse)
    rest = tokens[1 + ctype.atom_args:]
    points = None
    if mode == "scan":
        points = _integer(rest.pop(), "the number of scan points", refuse)
        if points < 1:
            raise refuse(f"a scan needs at least one point, got {points}")
    numbers = tuple(_number(tok, refuse) for tok in rest)
    _check_numbers(kind, ctype, numbers, refuse)
    return Constraint(number, mode, kind, atoms, numbers, points)


def _usage(mode: str, kind: str, ctype: ConstraintType) -> str:
    atoms = " ".join("ATOMS" if ctype.groups else "ATOM" for _ in range(ctype.atom_args))
    fixed = " AXIS_X AXIS_Y AXIS_Z" if ctype.fixed else ""
    value = "ANGLE" if ctype.unit == "°" else ("VALUE" if ctype.values == 1 else " ".join(["VALUE"] * ctype.values))
    if mode == "freeze":
        return f"{kind} {atoms}"
    if mode == "set":
        return f"{kind} {atoms}{fixed} {value}"
    return f"{kind} {atoms}{fixed} {' '.join(['FROM'] * ctype.values)} {' '.join(['TO'] * ctype.values)} POINTS"


def _atoms(token: str, ctype: ConstraintType, symbols: list[str], refuse) -> tuple[int, ...]:
    """The 1-based atoms of one atom argument: a number; for a group also a range list '1-3,5'; for the
    Cartesian types also an element symbol (every atom of that element)."""
    natm = len(symbols)
    if ctype.elements and token.isalpha():
        atoms = tuple(i + 1 for i, sym in enumerate(symbols) if sym.lower() == token)
        if not atoms:
            raise refuse(f"no atom of element {token.capitalize()} in the molecule ({' '.join(symbols)})")
        return atoms
    if not ctype.groups:
        atoms = (_integer(token, "an atom number", refuse),)
    elif _GROUP.match(token):
        atoms = tuple(a for part in token.split(",") for a in _span(part, refuse))
    else:
        raise refuse(f"{token!r} is not an atom number or a range list such as 1-3,5")
    outside = [a for a in atoms if not 1 <= a <= natm]
    if outside:
        raise refuse(f"atom {outside[0]} does not exist: atoms are numbered 1 to {natm}")
    if len(set(atoms)) != len(atoms):
        raise refuse(f"{token!r} names an atom twice")
    return atoms


def _span(part: str, refuse) -> range:
    first, _, last = part.partition("-")
    lo, hi = int(first), int(last or first)
    if hi < lo:
        raise refuse(f"the range {part} runs backwards")
    return range(lo, hi + 1)


def _check_atoms(kind: str, ctype: ConstraintType, atoms: tuple[tuple[int, ...], ...], refuse) -> None:
    flat = [a for group in atoms for a in group]
    if len(set(flat)) != len(flat):
        raise refuse(f"the groups of one {kind} must not overlap" if ctype.groups else
                     f"the atoms of one {kind} must differ")
    if kind == "rotation" and len(flat) < 2:
        raise refuse("a rotation needs a group of at least two atoms")


def _check_numbers(kind: str, ctype: ConstraintType, numbers: tuple[float, ...], refuse) -> None:
    axis, values = numbers[:ctype.fixed], numbers[ctype.fixed:]
    if ctype.fixed and math.hypot(*axis) == 0.0:
        raise refuse("the rotation axis is zero")
    if kind in ("distance", "centroid_distance") and any(v <= 0 for v in values):
        raise refuse(f"the {kind} must be positive (Å)")
    if kind == "angle" and any(not 0 <= v <= 180 for v in values):
        raise refuse("an angle lies between 0 and 180 degrees")


def _number(token: str, refuse) -> float:
    try:
        value = float(token)
    except ValueError:
        raise refuse(f"{token!r} is not a number") from None
    if not math.isfinite(value):
        raise refuse(f"{token!r} is not a finite number")
    return value


def _integer(token: str, what: str, refuse) -> int:
    if not re.fullmatch(r"[+-]?\d+", token):
        raise refuse(f"{token!r} is not {what} (a whole number)")
    return int(token)


__all__ = ["Constraint", "Constraints", "TYPES", "parse_constraints", "read_constraints"]
