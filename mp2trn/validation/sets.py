"""Molecule sets for validation: ``molecules/sets/<name>.txt``.

Set files: one entry per line, ``XYZ BASIS [key=value ...]`` with the XYZ path relative to the set
file; ``#`` starts a comment; a ``kind: energy|interaction`` line sets the kind. Keys: ``name``,
``frozen`` (auto/none/N), ``charge``, ``multiplicity``, ``auxbasis``, ``reference`` (rhf/uhf/rohf; energy
sets), and for interaction sets ``ref``
(reference ΔE, kcal/mol), ``split``, ``charges``, ``multiplicities``.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError


def molecules_dir() -> Path:
    """The ``molecules/`` folder of the source tree (sets live in ``molecules/sets``)."""
    env = os.environ.get("MP2TRN_MOLECULES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "molecules"


@dataclass
class SetEntry:
    name: str  # file stem unless name= is given
    path: Path
    basis: str
    options: dict[str, str] = field(default_factory=dict)
    line: int = 0

    def int_option(self, key: str) -> int | None:
        """An integer option of the entry (None when absent); anything else is an InputError."""
        value = self.options.get(key)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise InputError(f"set entry {self.name} (line {self.line}): {key}={value!r} is not an integer") from None

    @property
    def key(self) -> str:
        """Unique label: name/basis (+ /fc when frozen core)."""
        fz = self.options.get("frozen", "none")
        reference = self.options.get("reference")
        return (f"{self.name}/{self.basis}" + ("" if fz in ("none", "0") else f"/fc-{fz}")
                + (f"/{reference.lower()}" if reference else ""))


@dataclass
class MoleculeSet:
    name: str
    path: Path
    kind: str  # "energy" or "interaction"
    entries: list[SetEntry]
    description: str = ""


_ENTRY_KEYS = {"name", "frozen", "charge", "multiplicity", "auxbasis", "reference", "ref", "split", "charges",
               "multiplicities"}


def available_sets() -> list[str]:
    d = molecules_dir() / "sets"
    return sorted(p.stem for p in d.glob("*.txt")) if d.is_dir() else []


def resolve_set(name: str) -> Path:
    """A set name (``default``, ``s22``) or a path to a set file."""
    p = Path(name)
    if p.suffix == ".txt" or os.sep in name or "/" in name:
        if not p.is_file():
            raise InputError(f"no such set file: {p}")
        return p
    candidate = molecules_dir() / "sets" / f"{name}.txt"
    if not candidate.is_file():
        have = ", ".join(available_sets()) or "none found"
        raise InputError(f"unknown molecule set {name!r} (available: {have}; or give a path to a set file)")
    return candidate


def load_set(name: str) -> MoleculeSet:
    """Parse a set file; every XYZ it names must exist. Errors name the file and line."""
    path = resolve_set(name)
    kind, description, entries = "energy", "", []
    for lineno, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if raw.strip().startswith("#") and not description and lineno <= 3:
            description = raw.strip().lstrip("#").strip()
        if not line:
            continue
        head = line.split()[0]
        if head.endswith(":"):
            key, value = head[:-1].lower(), line[len(head):].strip()
            if key != "kind" or value not in ("energy", "interaction"):
                raise InputError(f"{path}:{lineno}: expected 'kind: energy' or 'kind: interaction', got {line!r}")
            kind = value
            continue
        parts = shlex.split(line)
        if len(parts) < 2:
            raise InputError(f"{path}:{lineno}: expected 'XYZ BASIS [key=value ...]', got {line!r}")
        options = {}
        for item in parts[2:]:
            if "=" not in item:
                raise InputError(f"{path}:{lineno}: option {item!r} is not key=value")
            k, v = item.split("=", 1)
            if k not in _ENTRY_KEYS:
                raise InputError(f"{path}:{lineno}: unknown option {k!r} (known: {', '.join(sorted(_ENTRY_KEYS))})")
            options[k] = v
        xyz = (path.parent / parts[0]).resolve()
        if not xyz.is_file():
            raise InputError(f"{path}:{lineno}: no such molecule file {parts[0]!r}")
        entries.append(SetEntry(options.pop("name", xyz.stem), xyz, parts[1].lower(), options, lineno))
    if not entries:
        raise InputError(f"{path}: the set has no entries")
    keys = [e.key for e in entries]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise InputError(f"{path}: duplicate entries {', '.join(dup)} (give them distinct name=)")
    return MoleculeSet(path.stem, path, kind, entries, description)


def select_entries(mset: MoleculeSet, only: str | None) -> list[SetEntry]:
    """Entries whose name (or name/basis key) is in the comma-separated ``only`` list."""
    if not only:
        return list(mset.entries)
    wanted = [w.strip().lower() for w in only.split(",") if w.strip()]

    def labels(e: SetEntry) -> set[str]:
        bare = re.sub(r"^\d+_", "", e.name.lower())  # "02_water_dimer" also answers to "water_dimer"
        return {e.name.lower(), e.key.lower(), bare}

    chosen = [e for e in mset.entries if labels(e) & set(wanted)]
    known = set().union(*(labels(e) for e in mset.entries))
    unknown = [w for w in wanted if w not in known]
    if unknown or not chosen:
        names = ", ".join(dict.fromkeys(e.name for e in mset.entries))
        missing = ", ".join(unknown) if unknown else only
        raise InputError(f"--only: no entry {missing} in set {mset.name!r} (entries: {names})")
    return chosen
