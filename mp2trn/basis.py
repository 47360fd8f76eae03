"""Basis sets and effective core potentials: where each element's functions come from, and the rules
that choose the fitting bases.

Every basis name is resolved element by element, in this order:

1. a **file** — a path to a basis in NWChem or Gaussian94 format (read through the Basis Set Exchange's
   readers when it is Gaussian94);
2. **PySCF's library** (its bundled ``.dat`` files, read as PySCF's loader reads them but without its own
   fallback to the BSE, so that the source is known);
3. the **Basis Set Exchange** (the ``basis_set_exchange`` package, a dependency of mp2trn), which covers
   most published basis sets for every element they were made for.

An element none of them has is an :class:`~mp2trn.errors.InputError` naming the element. What was used
and where it came from is kept in a :class:`BasisSet` whose :meth:`BasisSet.record` goes into what-ran.

**ECPs** (:func:`resolve_ecp`): when the orbital basis defines an effective core potential for an element
(def2-* on Rb–Rn, cc-pVnZ-PP, LANL2DZ, ...), it is applied by default; ``ecp="none"`` on such a basis is
refused (the basis was optimised for the ECP: without it the energy is meaningless); ``ecp=NAME`` takes
the ECP of another basis name or file. Ghost atoms never get an ECP (PySCF gives them none).

**Fitting bases** (:func:`fitting_basis`), per element, the first rule that covers it:

=====  ============================================================  =========================================
rule   JK fit (SCF)                                                  RI fit (MP2)
=====  ============================================================  =========================================
given  ``--jkbasis``                                                 ``--auxbasis``
1      PySCF's partner table (``pyscf.df.addons.DEFAULT_AUXBASIS``)   the same table's RI partner
2      the BSE's declared ``jkfit`` auxiliary of the orbital basis   the BSE's declared ``rifit`` auxiliary
3      def2-universal-jkfit (Weigend 2008)                           def2-{SVP,TZVPP,QZVPP}-RIFIT by zeta
4      PySCF's even-tempered generated set (a warning)               the same
=====  ============================================================  =========================================

Rule 3 is what Psi4 (``DF_BASIS_SCF`` falls back to def2-universal-jkfit) and ORCA (def2/J, def2/JK and
the def2-XXX/C sets for any orbital basis) do for basis families without fitting partners.

**Other programs' names** (:func:`other_program_name`): a given fitting basis may be named as Psi4
(``def2-svp-ri``, ``def2-universal-jkfit``, ``cc-pvtz-jkfit``) or ORCA (``def2/J``, ``def2/JK``,
``def2-SVP/C``, ``aug-cc-pVTZ/C``) spell it. Each element is looked up under the name as typed first, then
under the name of the set it means (Psi4's ``def2-svp-ri`` is the BSE's def2-SVP-RIFIT), both through the
sources above; the record keeps the name typed and, per element, the set that ran.

**Spherical or Cartesian** (:func:`cartesian_convention`): the 6-31G family (3-21G, 6-31G, 6-31G*, ...)
is defined with Cartesian d functions, as the basis files Psi4 ships declare; other bases use the
convention the BSE records for them (Cartesian only when it lists no spherical form), else spherical.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from pyscf import gto
from pyscf.data import elements

from .errors import InputError

PYSCF_LIBRARY = "PySCF library"
#: where a generated fitting basis comes from
GENERATED = "generated (PySCF even-tempered)"
#: the def2 fitting sets of rule 3, and the RI set for each zeta level
DEF2_JKFIT = "def2-universal-jkfit"
DEF2_RIFIT = {2: "def2-svp-rifit", 3: "def2-tzvpp-rifit", 4: "def2-qzvpp-rifit"}
ROLES = ("jkfit", "rifit")


def bse_source() -> str:
    """'Basis Set Exchange 0.12' (the installed package's version)."""
    return f"Basis Set Exchange {_bse().version()}"


def _bse():
    try:
        import basis_set_exchange
    except ImportError:  # a dependency: only a broken install gets here
        raise InputError("the Basis Set Exchange package is missing: pip install basis-set-exchange") from None
    return basis_set_exchange


@functools.lru_cache(maxsize=1)
def _bse_metadata() -> dict[str, Any]:
    return _bse().get_metadata()


def _bse_key(name: str) -> str:
    return _bse().misc.transform_basis_name(name)


@dataclass(frozen=True)
class ElementBasis:
    """One element's basis: PySCF's input (a library name or parsed shells), its name and its source."""

    data: Any
    name: str
    source: str


@dataclass
class BasisSet:
    """A basis resolved for the elements of a molecule (orbital, JK fit or RI fit).

    per_element: symbol → ElementBasis; rules: symbol → the fitting rule that chose it (fitting bases).
    """

    role: str
    per_element: dict[str, ElementBasis]
    rules: dict[str, str] = field(default_factory=dict)
    #: the name the user typed (fitting bases named with --auxbasis/--jkbasis), None when chosen by the rules
    given: str | None = None
    #: symbol → the other program's name it was found under (a name PySCF and the BSE spell differently)
    read_as: dict[str, ForeignName] = field(default_factory=dict)

    def pyscf_basis(self) -> dict[str, Any]:
        """The basis as PySCF takes it: {symbol: name or shells}."""
        return {sym: eb.data for sym, eb in self.per_element.items()}

    @property
    def name(self) -> str:
        """'def2-svp', or 'H:cc-pvdz-ri, I:def2-svp-rifit' when the elements differ."""
        names = sorted({eb.name for eb in self.per_element.values()})
        if len(names) == 1:
            return names[0]
        return ", ".join(f"{s}:{eb.name}" for s, eb in sorted(self.per_element.items()))

    @property
    def coulomb_only(self) -> list[str]:
        """Elements whose set was made to fit Coulomb only (a J-fit set such as def2-universal-jfit,
        ORCA's def2/J): used for exchange too, it costs accuracy."""
        return sorted(s for s, eb in self.per_element.items() if re.search(r"(?<!k)jfit$", eb.name.lower()))

    @property
    def generated(self) -> list[str]:
        """Elements whose functions were generated (rule 4)."""
        return sorted(s for s, eb in self.per_element.items() if eb.source == GENERATED)

    def record(self) -> dict[str, Any]:
        """What-ran entry: name (the set that ran), the name typed when one was given, and per element the
        name and source (the fitting rule; the other program's name it was read as)."""
        out: dict[str, Any] = {"name": self.name,
                               **({"given": self.given} if self.given is not None else {}),
                               "elements": {s: self._element_record(s, eb) for s, eb in sorted(self.per_element.items())}}
        return out

    def _element_record(self, symbol: str, eb: ElementBasis) -> dict[str, str]:
        out = {"name": eb.name, "source": eb.source}
        if symbol in self.rules:
            out["rule"] = self.rules[symbol]
        if symbol in self.read_as:
            out["read_as"] = self.read_as[symbol].describe()
        return out


@dataclass(frozen=True)
class EcpSet:
    """The ECPs of a molecule: per element the PySCF data, name and source; core electrons per atom."""

    per_element: dict[str, ElementBasis]
    core_electrons: dict[int, int]  # atom index → electrons the ECP removes (real atoms only)
    symbols: dict[int, str]

    def pyscf_ecp(self) -> dict[str, Any]:
        return {sym: eb.data for sym, eb in self.per_element.items()}

    def record(self) -> dict[str, Any] | None:
        """What-ran entry (None without ECPs): per element name/source, per atom its core electrons."""
        if not self.per_element:
            return None
        return {"elements": {s: {"name": eb.name, "source": eb.source} for s, eb in sorted(self.per_element.items())},
                "atoms": [{"atom": i, "symbol": self.symbols[i], "core_electrons": n}
                          for i, n in sorted(self.core_electrons.items())],
                "core_electrons": sum(self.core_electrons.values())}


NO_ECP = EcpSet({}, {}, {})


# -- one element from one source ---------------------------------------------------------------------
def _pyscf_library_shells(name: str, symbol: str, ecp: bool = False) -> Any:
    """``symbol``'s shells (or ECP) of basis ``name`` from PySCF's bundled library files only, or None.

    PySCF's own ``gto.basis.load`` asks the BSE by itself for what its files lack; reading the library
    file the way ``load`` does (its ``ALIAS`` table: a .dat file, several, or a module) keeps the recorded
    source true and leaves the BSE (0.3 s to import) alone."""
    import importlib
    import os

    from pyscf.gto import basis as lib_basis
    from pyscf.gto.basis import parse_nwchem, parse_nwchem_ecp

    key = lib_basis._format_basis_name(name)
    entry = lib_basis.ALIAS.get(key)
    if entry is None:
        return None
    directory = os.path.dirname(lib_basis.__file__)
    files = [entry] if isinstance(entry, str) else list(entry) if isinstance(entry, (list, tuple)) else []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if files and all(str(f).endswith(".dat") for f in files):
                if ecp:
                    return parse_nwchem_ecp.load(os.path.join(directory, files[0]), symbol) or None
                shells = []
                for f in files:
                    shells += parse_nwchem.load(os.path.join(directory, f), symbol)
                return shells or None
            if ecp:
                return None
            module = importlib.import_module("pyscf.gto.basis." + str(entry))
            return getattr(module, symbol, None) or None
        except Exception:   # BasisNotFoundError, KeyError, ... : the file lacks the element
            return None


@functools.lru_cache(maxsize=1024)   # the pipeline, the SCF and the MP2 step resolve the same names
def _from_pyscf(name: str, symbol: str) -> ElementBasis | None:
    shells = _pyscf_library_shells(name, symbol)
    return ElementBasis(name.lower(), name.lower(), PYSCF_LIBRARY) if shells else None


def _pyscf_ecp(name: str, symbol: str) -> Any:
    return _pyscf_library_shells(name, symbol, ecp=True)


@functools.lru_cache(maxsize=256)
def _bse_text(name: str, z: int) -> str | None:
    """The BSE's basis ``name`` for element ``z`` in NWChem format (with its ECP), or None."""
    bse = _bse()
    key = _bse_key(name)
    meta = _bse_metadata().get(key)
    if meta is None or str(z) not in meta["versions"][meta["latest_version"]]["elements"]:
        return None
    return bse.get_basis(name, elements=[z], fmt="nwchem", header=False)


@functools.lru_cache(maxsize=1024)
def _from_bse(name: str, symbol: str) -> ElementBasis | None:
    text = _bse_text(name, elements.charge(symbol))
    if text is None:
        return None
    try:
        shells = gto.basis.parse(text, symbol)
    except Exception:   # an ECP-only entry for this element
        return None
    # PySCF takes the name: for a name its library lacks it asks the BSE itself, for the same functions
    return ElementBasis(name.lower(), name.lower(), bse_source()) if shells else None


def _bse_ecp(name: str, symbol: str) -> Any:
    text = _bse_text(name, elements.charge(symbol))
    if text is None or "ECP" not in text:
        return None
    try:
        return gto.basis.parse_ecp(text, symbol) or None
    except Exception:
        return None


def _is_file(name: str) -> bool:
    return "\n" not in name and os.path.isfile(name)


@functools.lru_cache(maxsize=32)
def _file_text(path: str) -> str:
    """A basis file as NWChem text: NWChem files as they are, Gaussian94 ones converted by the BSE."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read basis file {path}: {exc}") from None
    if re.search(r"^\s*(BASIS|ECP)\b", text, re.MULTILINE | re.IGNORECASE) or path.lower().endswith(".nw"):
        return text
    bse = _bse()
    try:
        data = bse.readers.read_formatted_basis_str(text, basis_fmt="gaussian94")
        return bse.writers.write_formatted_basis_str(data, "nwchem")
    except Exception as exc:
        raise InputError(f"basis file {path}: neither NWChem nor Gaussian94 format ({exc})") from None


def _from_file(path: str, symbol: str) -> ElementBasis | None:
    try:
        shells = gto.basis.parse(_file_text(path), symbol)
    except InputError:
        raise
    except Exception:
        return None
    if not shells:
        return None
    resolved = str(Path(path).resolve())
    nwchem = _file_text(path) == Path(path).read_text()   # PySCF reads NWChem files by path itself
    return ElementBasis(resolved if nwchem else shells, Path(path).name, f"file {resolved}")


def _file_ecp(path: str, symbol: str) -> Any:
    text = _file_text(path)
    if not re.search(r"^\s*ECP\b", text, re.MULTILINE | re.IGNORECASE):
        return None
    try:
        return gto.basis.parse_ecp(text, symbol) or None
    except Exception:
        return None


def load_element(name: str, symbol: str) -> ElementBasis | None:
    """``symbol``'s functions of basis ``name`` (a file path, a PySCF library name or a BSE name), or None."""
    if _is_file(name):
        return _from_file(name, symbol)
    return _from_pyscf(name, symbol) or _from_bse(name, symbol)


def element_ecp(name: str, symbol: str, source: str | None = None) -> tuple[Any, str] | None:
    """The ECP that basis (or ECP) ``name`` defines for ``symbol`` and its source, or None; ``source``
    (an ElementBasis source) looks only there — a basis's own ECP comes from where its functions came."""
    if _is_file(name):
        data = _file_ecp(name, symbol)
        return (data, f"file {Path(name).resolve()}") if data else None
    if source in (None, PYSCF_LIBRARY):
        data = _pyscf_ecp(name, symbol)
        if data:
            return data, PYSCF_LIBRARY
        if source == PYSCF_LIBRARY:
            return None
    data = _bse_ecp(name, symbol)
    return (data, bse_source()) if data else None


# -- other programs' names for fitting bases ----------------------------------------------------------
@dataclass(frozen=True)
class ForeignName:
    """A fitting-basis name as another program spells it, and the name of the set it means in PySCF's
    library or the BSE (``meaning``, looked up like any name)."""

    typed: str
    program: str   # "Psi4" or "ORCA"
    meaning: str

    def describe(self) -> str:
        """"ORCA's def2-SVP/C = def2-svp-rifit"."""
        return f"{self.program}'s {self.typed} = {self.meaning}"


#: (program, pattern on the lower-cased name, the set it means); the first match counts. Psi4's basis files
#: def2-*-jkfit all hold Weigend's universal JK-fit set (F. Weigend, J. Comput. Chem. 29, 167 (2008)), its
#: *-ri files the RI-fit sets the BSE calls *-rifit; ORCA names def2/J the universal Coulomb-fit set
#: (F. Weigend, Phys. Chem. Chem. Phys. 8, 1057 (2006)), def2/JK the universal JK-fit set, and a
#: correlation-fit set after its orbital basis with /C (ORCA manual, "Built-in basis sets").
OTHER_PROGRAM_NAMES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("ORCA", re.compile(r"^def2/j$"), "def2-universal-jfit"),
    ("ORCA", re.compile(r"^def2/jk$"), "def2-universal-jkfit"),
    ("ORCA", re.compile(r"^(?P<orbital>[^/]+)/c$"), "{orbital}-rifit"),
    ("ORCA", re.compile(r"^(?P<orbital>[^/]+)/jk$"), "{orbital}-jkfit"),
    ("Psi4", re.compile(r"^def2-(?!universal-)[a-z()]+-jkfit$"), "def2-universal-jkfit"),
    ("Psi4", re.compile(r"^(?P<orbital>.+)-ri$"), "{orbital}-rifit"),
)
#: names that no set stands for, with what to do instead
UNMAPPED_NAMES = {
    "autoaux": "ORCA's AutoAux generates a fitting set from the orbital basis at run time; mp2trn has no "
               "such generator: leave the flag out (the fitting rules of docs/bases.md choose a published set) "
               "or name one",
}


def other_program_name(name: str) -> ForeignName | None:
    """What Psi4's or ORCA's fitting-basis ``name`` means (see ``OTHER_PROGRAM_NAMES``), or None.

    Psi4 writes parentheses as underscores in its file names (def2-sv_p_-ri for def2-SV(P)-RI): both
    spellings are read."""
    key = _psi4_parentheses(name.strip().lower())
    for program, pattern, meaning in OTHER_PROGRAM_NAMES:
        match = pattern.match(key)
        if match:
            return ForeignName(name.strip(), program, meaning.format(**match.groupdict()))
    return None


def _psi4_parentheses(name: str) -> str:
    """'def2-sv_p_-ri' → 'def2-sv(p)-ri' (Psi4's file names write parentheses as underscores; PySCF's
    library would drop the underscores and read def2-SVP-RI)."""
    return re.sub(r"_([A-Za-z0-9]+)_", r"(\1)", name)


def near_matches(name: str, fitting: bool, count: int = 5) -> list[str]:
    """Up to ``count`` known basis names spelt like ``name`` (the BSE's and PySCF's library's, fitting sets
    or orbital bases as ``fitting`` says), closest first."""
    from pyscf.gto import basis as lib_basis

    def squash(text: str) -> str:
        return re.sub(r"[-_ /()]", "", text.lower())

    names = {meta["display_name"] for meta in _bse_metadata().values()
             if (meta.get("role") != "orbital") == fitting}
    for entry in lib_basis.ALIAS.values():
        if isinstance(entry, str) and entry.endswith(".dat"):
            stem = Path(entry).stem
            if bool(re.search(r"fit|-ri$", stem)) == fitting:
                names.add(stem)
    by_key: dict[str, str] = {}
    for known in sorted(names):
        by_key.setdefault(squash(known), known)
    return [by_key[k] for k in difflib.get_close_matches(squash(name), list(by_key), n=count, cutoff=0.7)]


def _load_named(name: str, symbol: str, other_programs: bool) -> tuple[ElementBasis | None, ForeignName | None]:
    """``symbol``'s functions under ``name``; failing that (``other_programs``), under the set another
    program's ``name`` means. Returns the functions (or None) and the other program's name when it was used."""
    if not other_programs or _is_file(name):
        return load_element(name, symbol), None
    eb = load_element(_psi4_parentheses(name), symbol)
    if eb is not None:
        return eb, None
    foreign = other_program_name(name)
    eb = load_element(foreign.meaning, symbol) if foreign is not None else None
    return eb, (foreign if eb is not None else None)


def _known_name(name: str) -> bool:
    """Whether PySCF's library or the BSE has a basis called ``name`` (for any element)."""
    return _in_pyscf_library(name) or _bse_key(name) in _bse_metadata()


def _unknown_name_hint(name: str, fitting: bool) -> str:
    """The end of an unknown name's error: what the name is, or the known names spelt like it."""
    if name.strip().lower() in UNMAPPED_NAMES:
        return f"; {UNMAPPED_NAMES[name.strip().lower()]}"
    foreign = other_program_name(name)
    if foreign is not None and fitting:
        return f" (nor {foreign.describe()} for them)"
    if foreign is not None and _known_name(foreign.meaning):
        return f" ({foreign.describe()}, a fitting basis: give it as --auxbasis or --jkbasis)"
    close = near_matches(name, fitting)
    return f"; near matches: {', '.join(close)}" if close else "; no known name is close"


# -- a whole molecule ------------------------------------------------------------------------------
def unique_symbols(symbols: Iterable[str]) -> list[str]:
    """Element symbols in first-seen order, without duplicates."""
    return list(dict.fromkeys(symbols))


_PER_ELEMENT = re.compile(r"^\s*[A-Za-z]{1,2}\s*:\s*[^,]+(,\s*[A-Za-z]{1,2}\s*:\s*[^,]+)*\s*$")


def parse_per_element(basis: str | dict) -> str | dict:
    """'I:def2-svp, H:cc-pvdz' (the CLI's per-element form) → {'I': 'def2-svp', 'H': 'cc-pvdz'};
    anything else unchanged."""
    if isinstance(basis, str) and not _is_file(basis) and _PER_ELEMENT.match(basis):
        pairs = (item.split(":", 1) for item in basis.split(","))
        return {sym.strip().capitalize(): name.strip() for sym, name in pairs}
    return basis


def resolve_orbital(basis: str | dict, symbols: Iterable[str]) -> BasisSet:
    """The orbital basis for ``symbols``: one name/path for all, or {symbol: name/path} per element.

    An element no source has is an InputError that names it and the sources tried.
    """
    return resolve_named("orbital", basis, symbols)


def resolve_named(role: str, basis: str | dict, symbols: Iterable[str]) -> BasisSet:
    """The basis of ``role`` named by ``basis`` (one name/path for all elements, or {symbol: name/path}) for
    ``symbols``, every element from its first source. Fitting bases (``role`` "jkfit"/"rifit") may be
    named as Psi4 or ORCA spell them (:func:`other_program_name`).

    An element no source has is an InputError that names it and the sources tried; a name known nowhere
    lists the known names spelt like it.
    """
    fitting = role != "orbital"
    basis = parse_per_element(basis)
    per_element: dict[str, ElementBasis] = {}
    read_as: dict[str, ForeignName] = {}
    missing = []
    for sym in unique_symbols(symbols):
        name = basis.get(sym, basis.get(sym.lower())) if isinstance(basis, dict) else basis
        if name is None:
            missing.append(sym)
            continue
        if not isinstance(name, str):   # already PySCF basis data
            per_element[sym] = ElementBasis(name, "custom", "given as data")
            continue
        eb, foreign = _load_named(name, sym, fitting)
        if eb is None:
            missing.append(sym)
            continue
        per_element[sym] = eb
        if foreign is not None:
            read_as[sym] = foreign
    if missing and not per_element and isinstance(basis, str) and not _is_file(basis):
        raise InputError(f"basis {basis!r} is not available: neither PySCF's library nor the Basis Set Exchange "
                         f"has it for {', '.join(missing)} (check the name, or give a basis file by path)"
                         + _unknown_name_hint(basis, fitting))
    if missing:
        label = basis if isinstance(basis, str) else "given basis"
        foreign = other_program_name(basis) if fitting and isinstance(basis, str) else None
        also = f", also as {foreign.describe()}" if foreign is not None else ""
        raise InputError(f"basis {label!r} has no functions for {', '.join(missing)} (looked in "
                         f"{'the file' if isinstance(basis, str) and _is_file(basis) else 'PySCF library and the Basis Set Exchange'}"
                         f"{also}); choose a basis that covers every element")
    given = _printable(basis) if fitting else None
    return BasisSet(role, per_element, given=given, read_as=read_as)


def _printable(basis: str | dict) -> str:
    """The name as typed: 'def2/J', or 'H:cc-pvdz-ri, I:def2-svp-ri' per element (data shows as 'custom')."""
    if isinstance(basis, str):
        return basis
    return ", ".join(f"{sym}:{name if isinstance(name, str) else 'custom'}" for sym, name in basis.items())


def resolve_ecp(ecp: str | None, orbital: BasisSet, atom_symbols: list[str], ghosts: list[bool],
                basis_label: str) -> EcpSet:
    """The ECPs of a molecule: ``ecp`` None/"auto" → the orbital basis's own; "none" → none (refused where
    the basis was made for an ECP); a name or file → that ECP where it defines one.

    atom_symbols/ghosts: per atom (ghost atoms get no ECP)."""
    choice = "auto" if ecp is None else str(ecp).strip()
    real = unique_symbols(s for s, g in zip(atom_symbols, ghosts) if not g)
    designed = {}
    for sym in real:
        eb = orbital.per_element.get(sym)
        if eb is not None and eb.source != "given as data":
            found = element_ecp(_source_name(eb), sym, eb.source)
            if found:
                designed[sym] = ElementBasis(found[0], eb.name, found[1])
    if choice.lower() == "none":
        if designed:
            raise InputError(
                f"basis {basis_label!r} was made for an effective core potential on {', '.join(sorted(designed))}: "
                "without it the energy is meaningless. Drop --ecp none (the ECP is applied by default), or use an "
                "all-electron basis for these elements (e.g. x2c-SVPall, ANO-RCC-VDZ, jorge-DZP-DKH)")
        return NO_ECP
    if choice.lower() == "auto":
        chosen = designed
    else:
        chosen = {}
        for sym in real:
            found = element_ecp(choice, sym)
            if found:
                chosen[sym] = ElementBasis(found[0], Path(choice).name.lower() if _is_file(choice) else choice.lower(),
                                           found[1])
        if not chosen:
            raise InputError(f"--ecp {choice!r} defines no ECP for any element of this molecule "
                             f"({', '.join(real)}); use --ecp auto or none")
        lacking = sorted(set(designed) - set(chosen))
        if lacking:
            raise InputError(f"basis {basis_label!r} was made for an ECP on {', '.join(lacking)}, but --ecp {choice!r} "
                             "has none for them")
    core = {}
    symbols = {}
    for i, (sym, ghost) in enumerate(zip(atom_symbols, ghosts)):
        if not ghost and sym in chosen:
            core[i] = _core_electrons(chosen[sym].data)
            symbols[i] = sym
    return EcpSet(chosen, core, symbols)


def _core_electrons(ecp_data: Any) -> int:
    """Electrons an ECP removes (PySCF's ECP data: [ncore, [...]])."""
    return int(ecp_data[0])


def _source_name(eb: ElementBasis) -> str:
    """The name or path to look an element's ECP up under (where its functions came from)."""
    if eb.source.startswith("file "):
        return eb.source[len("file "):]
    return eb.name


# -- fitting bases ------------------------------------------------------------------------------------
def _pyscf_partner(orbital_name: str, role: str) -> str | None:
    from pyscf.df.addons import DEFAULT_AUXBASIS

    key = re.sub(r"[-_ ]", "", orbital_name.lower())
    if _POPLE_631.match(orbital_name.strip()) or key.startswith("6311"):   # PySCF's table lists the bare family
        key = key.split("g")[0] + "g" + ("" if "+" not in key.split("g")[0] else "")
    pair = DEFAULT_AUXBASIS.get(key)
    if pair is None:
        return None
    return pair[0] if role == "jkfit" else pair[1]


def _bse_partner(orbital_name: str, role: str) -> str | None:
    if _is_file(orbital_name):
        return None
    meta = _bse_metadata().get(_bse_key(orbital_name))
    return None if meta is None else meta.get("auxiliaries", {}).get(role)


def zeta_level(orbital_name: str) -> int:
    """2, 3 or 4 for a double-, triple- or quadruple-zeta basis name (rule 3's RI set); 2 when unknown.
    Jensen's pc-n / pcseg-n (and aug-, pcJ-, pcS-, pcX-, pcH- variants) are (n+1)-zeta, capped at 4."""
    name = orbital_name.lower()
    jensen = re.search(r"(?:^|-)pc(?:seg|sseg|j|s|x|h)?-(\d)\b", name)
    if jensen:   # Jensen's polarisation-consistent pc(seg)-n sets are (n+1)-zeta
        return min(max(int(jensen.group(1)) + 1, 2), 4)
    if re.search(r"(q|5|6)z|qzv", name):
        return 4
    if re.search(r"tz|tzv|6-311|triple", name):
        return 3
    return 2


def fitting_basis(role: str, orbital: BasisSet, symbols: Iterable[str], given: str | dict | None = None,
                  mol: gto.Mole | None = None) -> BasisSet:
    """The JK-fit (``role="jkfit"``) or RI-fit (``"rifit"``) basis for ``symbols`` by the rules of the
    module docstring. ``given``: the user's choice (every element must be covered). ``mol``: the molecule,
    for rule 4's generated functions."""
    if role not in ROLES:
        raise ValueError(role)
    flag = "--jkbasis" if role == "jkfit" else "--auxbasis"
    if given:
        try:
            chosen = resolve_named(role, given, symbols)
        except InputError as exc:
            label = "auxiliary basis" if role == "rifit" else "JK-fit basis"
            detail = str(exc).split(": ", 1)[-1] if "is not available" in str(exc) else str(exc)
            raise InputError(f"{label} {given!r} is not usable for this molecule ({flag}): {detail}") from None
        return replace(chosen, rules={s: "given" for s in chosen.per_element})
    per_element: dict[str, ElementBasis] = {}
    rules: dict[str, str] = {}
    for sym in unique_symbols(symbols):
        eb_orb = orbital.per_element.get(sym)
        orbital_name = eb_orb.name if eb_orb is not None else ""
        candidates = [("1: PySCF partner", lambda: _pyscf_partner(orbital_name, role)),
                      ("2: BSE partner", lambda: _bse_partner(orbital_name, role)),   # the BSE only when needed
                      ("3: def2 fitting set",
                       lambda: DEF2_JKFIT if role == "jkfit" else DEF2_RIFIT[zeta_level(orbital_name)])]
        for rule, partner in candidates:
            name = partner()
            eb = load_element(name, sym) if name else None
            if eb is not None:
                per_element[sym], rules[sym] = eb, rule
                break
        else:
            per_element[sym], rules[sym] = _generated(sym, role, mol), "4: generated"
    return BasisSet(role, per_element, rules)


def _generated(symbol: str, role: str, mol: gto.Mole | None) -> ElementBasis:
    """PySCF's even-tempered fitting functions for ``symbol`` (the last resort)."""
    from pyscf import df

    if mol is None:
        raise InputError(f"no {role} fitting basis covers {symbol}; name one explicitly")
    shells = df.aug_etb(mol).get(symbol)
    if shells is None:   # aug_etb keys by the symbols in the molecule
        shells = next(v for k, v in df.aug_etb(mol).items() if gto.mole._std_symbol_without_ghost(k) == symbol)
    return ElementBasis(shells, "even-tempered", GENERATED)


# -- spherical or Cartesian ---------------------------------------------------------------------------
_POPLE_631 = re.compile(r"^(3-21|6-31)(\+{0,2})g", re.IGNORECASE)


def cartesian_convention(basis: str | dict) -> bool:
    """True when the orbital basis is defined with Cartesian functions (see the module docstring)."""
    names = {v for v in basis.values() if isinstance(v, str)} if isinstance(basis, dict) else {basis}
    return any(isinstance(n, str) and _cartesian_name(n) for n in names)


def _cartesian_name(name: str) -> bool:
    if _is_file(name):
        return bool(re.search(r"^\s*BASIS\b.*\bCARTESIAN\b", _file_text(name), re.MULTILINE | re.IGNORECASE))
    if _POPLE_631.match(name.strip()) and not name.strip().lower().startswith("6-311"):
        return True
    if _in_pyscf_library(name):   # PySCF's library files are spherical sets (the Pople ones are above)
        return False
    meta = _bse_metadata().get(_bse_key(name))
    if meta is None:
        return False
    kinds = meta.get("function_types", [])
    return "gto_cartesian" in kinds and "gto_spherical" not in kinds


def _in_pyscf_library(name: str) -> bool:
    """Whether PySCF's library knows ``name`` (without asking the BSE, whose import costs 0.3 s)."""
    from pyscf.gto import basis as pyscf_basis

    return pyscf_basis._format_basis_name(name) in pyscf_basis.ALIAS


def atom_symbols(mol_or_labels: gto.Mole | list[tuple[str, bool]]) -> tuple[list[str], list[bool]]:
    """Per atom: element symbol (ghosts as their element) and whether it is a ghost."""
    if isinstance(mol_or_labels, gto.Mole):
        out = []
        for i in range(mol_or_labels.natm):
            label = mol_or_labels.atom_pure_symbol(i)
            ghost = label.upper().startswith(("GHOST-", "X-"))
            sym = label.split("-", 1)[1].capitalize() if ghost else label
            out.append((sym, ghost))
        mol_or_labels = out
    return [s for s, _ in mol_or_labels], [g for _, g in mol_or_labels]


@dataclass(frozen=True)
class MoleculeBases:
    """What a molecule's basis choice resolved to: orbital basis, ECPs and the function convention."""

    orbital: BasisSet
    ecp: EcpSet
    cartesian: bool
    cartesian_source: str   # "basis convention" or "--cartesian/--spherical"

    def record(self) -> dict[str, Any]:
        return {"orbital": self.orbital.record(), "ecp": self.ecp.record(),
                "functions": ("cartesian" if self.cartesian else "spherical") + f" ({self.cartesian_source})"}


def resolve_bases(basis: str | dict, symbols: list[str], ghosts: list[bool], ecp: str | None = None,
                  cartesian: bool | None = None) -> MoleculeBases:
    """Orbital basis, ECPs and spherical/Cartesian functions for atoms ``symbols`` (ghost flags ``ghosts``)."""
    orbital = resolve_orbital(basis, symbols)
    label = basis if isinstance(basis, str) else orbital.name
    ecps = resolve_ecp(ecp, orbital, symbols, ghosts, label)
    if cartesian is None:
        cart, how = cartesian_convention(parse_per_element(basis)), "the basis's convention"
    else:
        cart, how = bool(cartesian), "--cartesian" if cartesian else "--spherical"
    return MoleculeBases(orbital, ecps, cart, how)


def mole_orbital_basis(mol: gto.Mole) -> BasisSet | None:
    """The orbital basis of a built Mole given by name (str or {symbol: name}), resolved; None for data."""
    basis = mol.basis
    if isinstance(basis, dict) and not all(isinstance(v, str) for v in basis.values()):
        return None
    if not isinstance(basis, (str, dict)):
        return None
    symbols, _ = atom_symbols(mol)
    try:
        return resolve_orbital(basis, symbols)
    except InputError:
        return None


def default_fitting(mol: gto.Mole, role: str, given: str | dict | None = None) -> BasisSet | None:
    """The fitting basis of ``role`` for a built Mole by the rules above (None: the orbital basis is given
    as data, so the rules cannot name a partner; PySCF's own choice is used then)."""
    symbols, _ = atom_symbols(mol)
    if given:
        return fitting_basis(role, BasisSet("orbital", {}), symbols, given, mol)
    orbital = mole_orbital_basis(mol)
    if orbital is None:
        return None
    return fitting_basis(role, orbital, symbols, None, mol)
