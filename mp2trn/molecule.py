"""Molecule input: XYZ text/files and PySCF atom strings → a built ``pyscf.gto.Mole``.

Every problem with the input (malformed XYZ, unknown element, impossible charge/multiplicity, unknown
basis) is raised as :class:`~mp2trn.errors.InputError` here, before any heavy work.

Coordinates are Angstrom unless ``unit="bohr"``. Ghost atoms (basis functions without nucleus or
electrons) may be written ``Gh(O)``, ``X-O`` or ``ghost-O``; they are passed to PySCF as ``ghost-O``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pyscf import gto
from pyscf.data import elements

from .basis import MoleculeBases, resolve_bases
from .df import quiet_pyscf
from .errors import InputError

_GHOST_PATTERNS = (
    re.compile(r"^gh\((?P<el>[A-Za-z]{1,3})\)$", re.IGNORECASE),
    re.compile(r"^x-(?P<el>[A-Za-z]{1,3})$", re.IGNORECASE),
    re.compile(r"^ghost-(?P<el>[A-Za-z]{1,3})$", re.IGNORECASE),
)
_COMMENT_KEY = re.compile(r"\b(charge|multiplicity|mult)\s*=\s*([+-]?\d+)", re.IGNORECASE)
_UNITS = {"angstrom": "Angstrom", "ang": "Angstrom", "a": "Angstrom", "bohr": "Bohr", "au": "Bohr"}


@dataclass(frozen=True)
class Atom:
    """One atom: element symbol (capitalised), whether it is a ghost, coordinates in the file's unit."""

    symbol: str
    coords: tuple[float, float, float]
    ghost: bool = False

    @property
    def pyscf_label(self) -> str:
        return f"ghost-{self.symbol}" if self.ghost else self.symbol


@dataclass
class Geometry:
    """A parsed XYZ file: atoms, the comment line and any charge/multiplicity it declared."""

    atoms: list[Atom]
    comment: str = ""
    charge: int | None = None
    multiplicity: int | None = None
    fragments: list[int] = field(default_factory=list)  # atom counts per fragment ("--" separators)

    def atom_string(self) -> str:
        return "; ".join(f"{a.pyscf_label} {a.coords[0]!r} {a.coords[1]!r} {a.coords[2]!r}" for a in self.atoms)


def canonical_symbol(token: str) -> tuple[str, bool]:
    """Return ``(symbol, is_ghost)`` for an atom label such as ``o``, ``Gh(O)``, ``X-O``, ``8``.

    Raises InputError for unknown elements.
    """
    ghost = False
    label = token.strip()
    for pattern in _GHOST_PATTERNS:
        m = pattern.match(label)
        if m:
            ghost, label = True, m.group("el")
            break
    if label.isdigit():
        z = int(label)
        if not 1 <= z <= 118:
            raise InputError(f"unknown element: atomic number {z}")
        return elements.ELEMENTS[z], ghost
    # strip a trailing numeric tag (e.g. "C1", "H12") as many XYZ writers add
    m = re.fullmatch(r"([A-Za-z]{1,3})(\d*)", label)
    if not m:
        raise InputError(f"unknown element: {token!r}")
    sym = m.group(1).capitalize()
    if sym not in elements.ELEMENTS_PROTON or sym == "X" or elements.ELEMENTS_PROTON[sym] == 0:
        raise InputError(f"unknown element: {token!r}")
    return sym, ghost


def parse_xyz(text: str, source: str = "<xyz>") -> Geometry:
    """Parse standard XYZ text (count line, comment line, ``symbol x y z`` lines).

    A line ``--`` between atom lines separates fragments (used by ``mp2trn interaction``); the count
    line counts atoms only. ``charge=`` and ``multiplicity=`` in the comment line are read.
    """
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) < 2:
        raise InputError(f"{source}: malformed XYZ: expected an atom-count line and a comment line")
    try:
        natm = int(lines[0].split()[0]) if lines[0].split() else None
    except ValueError:
        natm = None
    if natm is None or natm < 1 or len(lines[0].split()) != 1:
        raise InputError(f"{source}: malformed XYZ: first line must be a positive atom count, got {lines[0]!r}")
    comment = lines[1]
    atoms: list[Atom] = []
    fragments: list[int] = []
    current = 0
    for lineno, line in enumerate(lines[2:], start=3):
        stripped = line.strip()
        if stripped == "--":
            if current == 0:
                raise InputError(f"{source}:{lineno}: empty fragment before '--'")
            fragments.append(current)
            current = 0
            continue
        if not stripped:
            raise InputError(f"{source}:{lineno}: malformed XYZ: blank line inside the atom block")
        parts = stripped.split()
        if len(parts) != 4:
            raise InputError(f"{source}:{lineno}: malformed XYZ: expected 'symbol x y z', got {line!r}")
        symbol, ghost = canonical_symbol(parts[0])
        try:
            xyz = tuple(float(p) for p in parts[1:])
        except ValueError:
            raise InputError(f"{source}:{lineno}: malformed XYZ: non-numeric coordinate in {line!r}") from None
        if not all(map(_finite, xyz)):
            raise InputError(f"{source}:{lineno}: malformed XYZ: non-finite coordinate in {line!r}")
        atoms.append(Atom(symbol, xyz, ghost))  # type: ignore[arg-type]
        current += 1
    if fragments:
        if current == 0:
            raise InputError(f"{source}: empty fragment after the last '--'")
        fragments.append(current)
    if len(atoms) != natm:
        raise InputError(f"{source}: malformed XYZ: count line says {natm} atoms, found {len(atoms)}")
    charge = multiplicity = None
    for key, value in _COMMENT_KEY.findall(comment):
        if key.lower() == "charge":
            charge = int(value)
        else:
            multiplicity = int(value)
    return Geometry(atoms, comment, charge, multiplicity, fragments)


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def read_xyz(path: str | os.PathLike) -> Geometry:
    """Read an XYZ file; a missing or unreadable file is an InputError."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise InputError(f"no such file: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {p}: {exc}") from None
    return parse_xyz(text, source=str(p))


ASE_HINT = "pip install 'mp2trn[ase]'"


def require_ase():
    """The ``ase`` package (with ``ase.io``), or an InputError naming the extra."""
    try:
        import ase
        import ase.io
    except ImportError:
        raise InputError(f"this needs ASE: {ASE_HINT}") from None
    return ase


def geometry_of_atoms(atoms, charge: int | None = None, multiplicity: int | None = None) -> Geometry:
    """mp2trn's Geometry (Å) for an ASE ``Atoms``; periodic cells are ignored (the atoms are one molecule)."""
    symbols = atoms.get_chemical_symbols()
    if not symbols:
        raise InputError("the structure has no atoms")
    pos = atoms.get_positions()
    return Geometry([Atom(s, (float(x), float(y), float(z))) for s, (x, y, z) in zip(symbols, pos)],
                    comment=str(atoms.info.get("name", "")), charge=charge, multiplicity=multiplicity)


def read_molecule_file(path: str | os.PathLike) -> Geometry:
    """A molecule from any file ASE can read (``.pdb``, ``.sdf``, ``.mol``, ``.cif``, ...): the first
    structure in the file, its atoms in Å. An unreadable file or format is an InputError."""
    ase = require_ase()
    p = Path(path)
    try:
        atoms = ase.io.read(str(p), index=0)
    except FileNotFoundError:
        raise InputError(f"no such file: {p}") from None
    except Exception as exc:  # ASE raises many types for unknown or malformed formats
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot read {p} as a molecule (via ASE): {text}") from None
    if len(atoms) == 0:
        raise InputError(f"{p}: no atoms found (read by ASE)")
    return geometry_of_atoms(atoms)


def read_geometry(path: str | os.PathLike) -> Geometry:
    """Read a molecule file: XYZ (by extension or by content: an atom-count first line), else any format
    ASE reads (``.pdb``, ``.sdf``, ``.mol``, ``.cif``, ... — the extra ``mp2trn[ase]``)."""
    p = Path(path)
    if p.suffix.lower() == ".xyz":
        return read_xyz(p)
    try:
        with open(p, encoding="utf-8", errors="replace") as fh:
            first = fh.readline().split()
    except FileNotFoundError:
        raise InputError(f"no such file: {p}") from None
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc}") from None
    if len(first) == 1 and first[0].isdigit():
        return read_xyz(p)
    try:
        return read_molecule_file(p)
    except InputError as exc:
        if "needs ASE" in str(exc):
            raise InputError(f"{p}: not an XYZ file; reading {p.suffix or 'this'} files needs ASE: "
                             "pip install 'mp2trn[ase]' (or convert the file to XYZ)") from None
        raise


def nuclear_charge(symbols_and_ghosts: list[tuple[str, bool]]) -> int:
    return sum(0 if ghost else elements.charge(sym) for sym, ghost in symbols_and_ghosts)


def check_charge_multiplicity(n_protons: int, charge: int, multiplicity: int) -> int:
    """Validate charge/multiplicity for a system with ``n_protons``; return PySCF's ``spin`` (2S)."""
    if multiplicity < 1:
        raise InputError(f"impossible multiplicity {multiplicity}: must be >= 1")
    nelec = n_protons - charge
    if nelec < 1:
        raise InputError(f"impossible charge {charge}: leaves {nelec} electrons")
    spin = multiplicity - 1
    if spin > nelec:
        raise InputError(f"impossible multiplicity {multiplicity} for {nelec} electrons")
    if (nelec - spin) % 2:
        raise InputError(
            f"impossible charge/multiplicity: {nelec} electrons cannot have multiplicity {multiplicity}"
            f" (electron count and multiplicity must differ in parity)"
        )
    return spin


def default_multiplicity(n_protons: int, charge: int) -> int:
    """Lowest multiplicity: 1 for an even electron count, 2 for odd."""
    return 1 if (n_protons - charge) % 2 == 0 else 2


def build_mole(source: str | os.PathLike | Geometry | gto.Mole, *args, **kwargs) -> gto.Mole:
    """Build a PySCF Mole from an XYZ path, XYZ text, a PySCF atom string, a Geometry or a Mole: the Mole
    of :func:`build_mole_with_bases`, which takes the same arguments."""
    return build_mole_with_bases(source, *args, **kwargs)[0]


def build_mole_with_bases(
    source: str | os.PathLike | Geometry | gto.Mole,
    basis: str | dict = "cc-pvdz",
    charge: int | None = None,
    multiplicity: int | None = None,
    unit: str = "angstrom",
    verbose: int = 0,
    ecp: str | None = None,
    cartesian: bool | None = None,
) -> tuple[gto.Mole, MoleculeBases | None]:
    """A PySCF Mole from an XYZ path, XYZ text, a PySCF atom string, a Geometry or a Mole, and what
    :mod:`mp2trn.basis` resolved for it: the orbital basis per element with its source, the ECPs (the
    basis's own by default, ``ecp="none"``/a name to choose) and whether the functions are Cartesian
    (``cartesian=None``: the basis's own convention); None for a Mole given as is (returned as is, built if
    needed).

    Explicit ``charge``/``multiplicity`` win over values in the XYZ comment line. Units: Angstrom
    (default) or Bohr."""
    if isinstance(source, gto.Mole):
        if not source._built:
            _safe_build(source)
        return source, None
    unit_key = str(unit).lower()
    if unit_key not in _UNITS:
        raise InputError(f"unknown unit {unit!r}: use angstrom or bohr")
    geom = _as_geometry(source)
    if geom is not None:
        atom = geom.atom_string()
        labels = [(a.symbol, a.ghost) for a in geom.atoms]
        charge = geom.charge if charge is None else charge
        multiplicity = geom.multiplicity if multiplicity is None else multiplicity
    else:
        atom = str(source)
        labels = _labels_from_atom_string(atom)
    charge = 0 if charge is None else int(charge)
    n_protons = nuclear_charge(labels)
    if multiplicity is None:
        multiplicity = default_multiplicity(n_protons, charge)
    spin = check_charge_multiplicity(n_protons, charge, int(multiplicity))
    symbols, ghosts = [s for s, _ in labels], [g for _, g in labels]
    bases = resolve_bases(basis, symbols, ghosts, ecp, cartesian)
    n_core = sum(bases.ecp.core_electrons.values())
    if n_core:   # ECP cores hold an even number of electrons: the rules apply to the valence ones
        spin = check_charge_multiplicity(n_protons - n_core, charge, int(multiplicity))
    mol = gto.Mole()
    mol.atom = atom
    mol.unit = _UNITS[unit_key]
    mol.basis = bases.orbital.pyscf_basis()
    mol.ecp = bases.ecp.pyscf_ecp()
    mol.cart = bases.cartesian
    mol.charge = charge
    mol.spin = spin
    mol.verbose = verbose
    _safe_build(mol, bases.orbital.name)
    return mol, bases


def _as_geometry(source: str | os.PathLike | Geometry) -> Geometry | None:
    if isinstance(source, Geometry):
        return source
    if isinstance(source, os.PathLike):
        return read_geometry(source)
    text = str(source)
    if "\n" not in text and (text.lower().endswith(".xyz") or os.path.isfile(text)):
        return read_geometry(text)
    first = text.strip().splitlines()[0].split() if text.strip() else []
    if len(first) == 1 and first[0].isdigit():
        return parse_xyz(text)
    return None  # a PySCF atom string


def _labels_from_atom_string(atom: str) -> list[tuple[str, bool]]:
    entries = [e for e in re.split(r"[;\n]", atom) if e.strip()]
    if not entries:
        raise InputError("empty molecule: no atoms given")
    out = []
    for entry in entries:
        parts = entry.replace(",", " ").split()
        if len(parts) != 4:
            raise InputError(f"malformed atom entry {entry.strip()!r}: expected 'symbol x y z'")
        try:
            [float(p) for p in parts[1:]]
        except ValueError:
            raise InputError(f"malformed atom entry {entry.strip()!r}: non-numeric coordinate") from None
        out.append(canonical_symbol(parts[0]))
    return out


def _safe_build(mol: gto.Mole, basis_name: str | None = None) -> None:
    """``mol.build()`` with PySCF's basis/element failures turned into InputError."""
    try:
        with quiet_pyscf():
            mol.build(parse_arg=False, dump_input=False)
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        basis = basis_name or (mol.basis if isinstance(mol.basis, str) else "given basis")
        if "basis" in msg.lower() or "basis" in type(exc).__name__.lower():
            raise InputError(f"basis {basis!r} is not available for this molecule ({msg})") from None
        raise InputError(f"cannot build molecule: {msg}") from None
    if mol.nao_nr() == 0:
        raise InputError("molecule has no basis functions")
    _check_basis_covers_atoms(mol, basis_name)
    _check_electrons_fit_basis(mol, basis_name)


def _check_electrons_fit_basis(mol: gto.Mole, basis_name: str | None = None) -> None:
    """Each spin channel needs at least as many spatial orbitals as it has electrons."""
    nalpha, nbeta = mol.nelec
    nao = mol.nao_nr()
    if max(nalpha, nbeta) > nao:
        basis = basis_name or (mol.basis if isinstance(mol.basis, str) else "given basis")
        raise InputError(
            f"basis {basis!r} has {nao} function(s) but the molecule has {nalpha} alpha and {nbeta} beta electrons "
            f"(charge {mol.charge}, multiplicity {mol.spin + 1}): check --charge/--multiplicity or use a larger basis")


def _check_basis_covers_atoms(mol: gto.Mole, basis_name: str | None = None) -> None:
    have = {mol.bas_atom(i) for i in range(mol.nbas)}
    missing = [mol.atom_symbol(i) for i in range(mol.natm) if i not in have]
    if missing:
        basis = basis_name or (mol.basis if isinstance(mol.basis, str) else "given basis")
        raise InputError(f"basis {basis!r} has no functions for {', '.join(sorted(set(missing)))}")
