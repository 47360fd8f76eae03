"""Interaction energies of molecular complexes, with or without counterpoise (CP) correction.

    ΔE = E(complex) − Σ_k E(fragment k)

With counterpoise correction (Boys–Bernardi), every fragment is computed in the basis of the whole
complex: the atoms of the other fragments stay in place as ghost atoms (basis functions without nucleus
or electrons, PySCF's ``ghost-X``). The JK-fit basis of a density-fitted SCF and the MP2-fit basis are
built for the same full set of centres (``make_auxbasis`` gives ghost centres their fitting functions),
so the complex and its fragments share one orbital, one JK and one MP2 auxiliary basis. Without it
(``counterpoise=False``) each fragment is computed in its own basis only.

Fragments come from ``split=N`` (atoms 1..N are fragment 1, the rest fragment 2) or from ``--`` lines
between the atom lines of the XYZ file (two or more fragments). Charges and multiplicities are given
per fragment (``charges=[0, -1]``, ``multiplicities=[1, 2]``, or ``charges=0,-1 multiplicities=1,2``
in the XYZ comment line); by default every fragment is neutral and in its lowest spin state. The
complex has the sum of the charges and, unless given, the high-spin multiplicity 1 + Σ(m_k − 1).

Reported: ΔE for SCF, MP2 correlation, MP2 total and SCS-MP2 total, in Hartree (and kcal/mol).

    from mp2trn.interaction import interaction_energy
    ie = interaction_energy("molecules/s22/02_water_dimer.xyz", basis="cc-pvdz")
    ie.delta["mp2_total"] * 627.509474   # kcal/mol
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .version import __version__
from .errors import InputError, Mp2trnError
from .molecule import Atom, Geometry, check_charge_multiplicity, parse_xyz, read_geometry
from .options import RunOptions, parse_frozen
from .pipeline import build_molecule, check_before_scf, compute, open_device, open_ranks
from .result import HARTREE_TO_KCAL, MP2Result
from .scratch import run_scratch

#: the energy differences reported, in this order (keys of ``InteractionResult.delta``)
DELTA_KEYS = ("scf", "mp2_correlation", "mp2_total", "scs_mp2_total")
DELTA_LABELS = {
    "scf": "SCF",
    "mp2_correlation": "MP2 correlation",
    "mp2_total": "MP2 total",
    "scs_mp2_total": "SCS-MP2 total",
}

_LIST_KEY = re.compile(r"\b(charges|multiplicities|mults)\s*=\s*([+-]?\d+(?:\s*,\s*[+-]?\d+)*)", re.IGNORECASE)


@dataclass(frozen=True)
class Fragment:
    """One fragment: 0-based atom indices into the complex, charge, multiplicity."""

    index: int  # 1-based, as printed
    atoms: tuple[int, ...]
    charge: int
    multiplicity: int
    formula: str = ""

    def describe(self) -> str:
        first, last = self.atoms[0] + 1, self.atoms[-1] + 1
        span = f"atom {first}" if first == last else f"atoms {first}-{last}"
        return f"fragment {self.index} ({self.formula}, {span})"


@dataclass
class Calculation:
    """One SCF + DF-MP2 calculation that enters ΔE with ``sign`` (+1 complex, −1 fragment)."""

    label: str
    sign: int
    geometry: Geometry
    charge: int
    multiplicity: int
    result: MP2Result | None = None
    mf: Any = None  # the converged PySCF mean-field object (kept when asked for)
    t_scf: float = 0.0
    t_mp2: float = 0.0

    @property
    def n_real(self) -> int:
        return sum(not a.ghost for a in self.geometry.atoms)

    @property
    def n_ghost(self) -> int:
        return sum(a.ghost for a in self.geometry.atoms)

    def energies(self) -> dict[str, float]:
        r = self.result
        assert r is not None
        return {"scf": r.e_hf, "mp2_correlation": r.e_corr, "mp2_total": r.e_tot, "scs_mp2_total": r.e_scs}


@dataclass
class InteractionResult:
    """ΔE (Hartree) per quantity, the fragments and every calculation that went into it."""

    counterpoise: bool
    fragments: list[Fragment]
    calculations: list[Calculation]
    delta: dict[str, float]
    what_ran: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    source: str = ""

    @property
    def delta_kcal(self) -> dict[str, float]:
        return {k: v * HARTREE_TO_KCAL for k, v in self.delta.items()}

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document: ΔE under ``interaction_energy`` (Hartree), plus what went into it."""
        return {
            "schema_name": "mp2trn_interaction_energy",
            "schema_version": 1,
            "provenance": {"creator": "mp2trn", "version": __version__, "routine": "mp2trn.interaction"},
            "source": self.source,
            "units": "hartree",
            "interaction_energy": {**self.delta, "counterpoise": self.counterpoise},
            "interaction_energy_kcal_per_mol": self.delta_kcal,
            "fragments": [
                {"index": f.index, "atoms": [i + 1 for i in f.atoms], "formula": f.formula, "charge": f.charge,
                 "multiplicity": f.multiplicity}
                for f in self.fragments
            ],
            "calculations": [
                {
                    "label": c.label,
                    "sign": c.sign,
                    "charge": c.charge,
                    "multiplicity": c.multiplicity,
                    "real_atoms": c.n_real,
                    "ghost_atoms": c.n_ghost,
                    "energies": c.energies() if c.result else None,
                    "result": c.result.to_qcschema() if c.result else None,
                    "timings": {"scf": c.t_scf, "mp2": c.t_mp2},
                }
                for c in self.calculations
            ],
            "what_ran": self.what_ran,
            "timings": self.timings,
        }


# --------------------------------------------------------------------------------------------------
# input handling (all cheap, all before any SCF)


def parse_int_list(text: str | Sequence[int] | None, what: str) -> list[int] | None:
    """``"0,-1"`` → ``[0, -1]``; a sequence of ints passes through; None stays None."""
    if text is None:
        return None
    if not isinstance(text, str):
        try:
            return [int(x) for x in text]
        except (TypeError, ValueError):
            raise InputError(f"{what}: expected integers, got {text!r}") from None
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not re.fullmatch(r"[+-]?\d+", t) for t in items):
        raise InputError(f"{what} {text!r}: expected a comma-separated list of integers, one per fragment (e.g. 0,-1)")
    return [int(t) for t in items]


def comment_lists(comment: str) -> tuple[list[int] | None, list[int] | None]:
    """``charges=0,-1`` and ``multiplicities=1,2`` from an XYZ comment line (None where absent)."""
    charges = mults = None
    for key, value in _LIST_KEY.findall(comment):
        values = [int(v) for v in value.split(",")]
        if key.lower() == "charges":
            charges = values
        else:
            mults = values
    return charges, mults


def load_geometry(source: str | os.PathLike | Geometry) -> Geometry:
    """An XYZ path, XYZ text or a Geometry (PySCF atom strings carry no fragments: not accepted)."""
    if isinstance(source, Geometry):
        return source
    if isinstance(source, os.PathLike) or ("\n" not in str(source)):
        return read_geometry(source)
    return parse_xyz(str(source))


def fragment_atoms(geom: Geometry, split: int | None) -> list[tuple[int, ...]]:
    """0-based atom indices per fragment from ``split`` or the XYZ ``--`` separators."""
    natm = len(geom.atoms)
    if split is not None:
        if natm < 2:
            raise InputError(f"--split {split}: the molecule has {natm} atom; a complex needs at least 2")
        if not 1 <= split <= natm - 1:
            raise InputError(
                f"--split {split} is out of range: atoms 1..N form fragment 1, so N must be 1..{natm - 1} "
                f"for {natm} atoms (each fragment needs at least one atom)"
            )
        counts = [split, natm - split]
        if geom.fragments and list(geom.fragments) != counts:
            raise InputError(
                f"--split {split} disagrees with the '--' fragment separators in the XYZ file "
                f"(fragments of {', '.join(map(str, geom.fragments))} atoms); give one or the other"
            )
    elif geom.fragments:
        counts = list(geom.fragments)
        if len(counts) < 2:  # pragma: no cover - parse_xyz only records fragments when a separator exists
            raise InputError("a complex needs at least two fragments")
    else:
        raise InputError(
            "no fragments given: use --split N (atoms 1..N are fragment 1) or separate the fragments "
            "in the XYZ file with a line containing only '--'"
        )
    out, start = [], 0
    for n in counts:
        out.append(tuple(range(start, start + n)))
        start += n
    return out


def _formula(atoms: Sequence[Atom]) -> str:
    counts: dict[str, int] = {}
    for a in atoms:
        if not a.ghost:
            counts[a.symbol] = counts.get(a.symbol, 0) + 1
    if not counts:
        return "ghosts only"
    order = sorted(counts, key=lambda s: (s != "C", s != "H", s)) if "C" in counts else sorted(counts)
    return "".join(f"{s}{counts[s] if counts[s] > 1 else ''}" for s in order)


def _protons(atoms: Sequence[Atom]) -> int:
    from pyscf.data import elements

    return sum(0 if a.ghost else elements.charge(a.symbol) for a in atoms)


def resolve_fragments(
    geom: Geometry,
    split: int | None = None,
    charges: Sequence[int] | str | None = None,
    multiplicities: Sequence[int] | str | None = None,
    charge: int | None = None,
    multiplicity: int | None = None,
) -> tuple[list[Fragment], int, int]:
    """Fragments with validated charge/multiplicity, and the complex's charge and multiplicity.

    Explicit arguments win over ``charges=``/``multiplicities=`` (and ``charge=``/``multiplicity=``)
    in the XYZ comment line. Every fragment and the complex are checked with
    :func:`~mp2trn.molecule.check_charge_multiplicity`; problems are InputErrors naming the fragment.
    """
    groups = fragment_atoms(geom, split)
    nfrag = len(groups)
    c_comment, m_comment = comment_lists(geom.comment)
    charges_l = parse_int_list(charges, "--charges")
    mults_l = parse_int_list(multiplicities, "--multiplicities")
    if charges_l is None:
        charges_l = c_comment
    if mults_l is None:
        mults_l = m_comment
    total_charge = charge if charge is not None else geom.charge
    total_mult = multiplicity if multiplicity is not None else geom.multiplicity
    for name, values in (("charges", charges_l), ("multiplicities", mults_l)):
        if values is not None and len(values) != nfrag:
            raise InputError(f"{len(values)} {name} given ({','.join(map(str, values))}) for {nfrag} fragments")
    if charges_l is None:
        if total_charge not in (None, 0):
            raise InputError(
                f"the complex has charge {total_charge}: say how it is shared between the {nfrag} fragments "
                f"with --charges (e.g. --charges {total_charge},0)"
            )
        charges_l = [0] * nfrag
    if total_charge is not None and total_charge != sum(charges_l):
        raise InputError(
            f"fragment charges {','.join(map(str, charges_l))} add up to {sum(charges_l)}, "
            f"but the complex's charge is given as {total_charge}"
        )
    fragments = []
    for k, (idx, q) in enumerate(zip(groups, charges_l)):
        atoms = [geom.atoms[i] for i in idx]
        protons = _protons(atoms)
        label = Fragment(k + 1, idx, q, 0, _formula(atoms)).describe()
        if protons == 0:
            raise InputError(f"{label} has only ghost atoms: a fragment needs at least one real atom")
        if mults_l is None:
            nelec = protons - q
            m = 1 if nelec % 2 == 0 else 2
        else:
            m = mults_l[k]
        try:
            check_charge_multiplicity(protons, q, m)
        except InputError as exc:
            raise InputError(f"{label}: {exc}") from None
        fragments.append(Fragment(k + 1, idx, q, m, _formula(atoms)))
    q_total = sum(charges_l)
    high_spin = 1 + sum(f.multiplicity - 1 for f in fragments)
    m_total = high_spin if total_mult is None else int(total_mult)
    try:
        check_charge_multiplicity(_protons(geom.atoms), q_total, m_total)
    except InputError as exc:
        raise InputError(f"the complex: {exc}") from None
    spins = [f.multiplicity - 1 for f in fragments]  # 2S per fragment
    low_spin = 1 + max(0, max(spins) - (sum(spins) - max(spins)))
    if not low_spin <= m_total <= high_spin:
        raise InputError(
            f"the complex's multiplicity {m_total} cannot be formed from fragments of multiplicity "
            f"{','.join(str(f.multiplicity) for f in fragments)} (possible: {low_spin}..{high_spin})"
        )
    return fragments, q_total, m_total


def build_calculations(
    geom: Geometry, fragments: list[Fragment], charge: int, multiplicity: int, counterpoise: bool
) -> list[Calculation]:
    """The complex (+1) and one calculation per fragment (−1), ghosts in place when counterpoise."""
    calcs = [Calculation("complex", +1, Geometry(list(geom.atoms), geom.comment), charge, multiplicity)]
    for frag in fragments:
        members = set(frag.atoms)
        if counterpoise:
            atoms = [a if i in members else Atom(a.symbol, a.coords, ghost=True) for i, a in enumerate(geom.atoms)]
            label = f"fragment {frag.index} {frag.formula} (CP, complex basis)"
        else:
            atoms = [geom.atoms[i] for i in frag.atoms]
            label = f"fragment {frag.index} {frag.formula} (own basis)"
        calcs.append(Calculation(label, -1, Geometry(atoms), frag.charge, frag.multiplicity))
    return calcs


# --------------------------------------------------------------------------------------------------
# the calculation


def _check_frozen(frozen: Any) -> Any:
    """Only "auto" or nothing: a count or a list would mean different orbitals in each calculation."""
    choice = parse_frozen(frozen)
    if choice is None or choice == "auto":
        return choice
    raise InputError(
        f"frozen core {frozen!r} is ambiguous for an interaction energy (the complex and each fragment "
        "have different numbers of core orbitals): use auto or none"
    )


def interaction_energy(
    source: str | os.PathLike | Geometry,
    split: int | None = None,
    charges: Sequence[int] | str | None = None,
    multiplicities: Sequence[int] | str | None = None,
    counterpoise: bool = True,
    options: RunOptions | None = None,
    keep_scf: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    **changes: Any,
) -> InteractionResult:
    """Counterpoise-corrected (default) or uncorrected interaction energy of a complex.

    ``source``: XYZ path or text. ``split``: atoms 1..split form fragment 1 (else the ``--`` lines).
    ``options`` (and/or RunOptions fields as keywords) apply to every calculation; their charge and
    multiplicity are the complex's. With ``keep_scf`` each Calculation keeps its converged PySCF
    mean-field object (``.mf``). ``progress(label, k, n)`` is called before calculation k of n.
    """
    t_start = time.perf_counter()
    options = RunOptions.build(options, **changes)
    frozen = _check_frozen(options.frozen)
    # cheap checks first; over several ranks (torchrun) every calculation is spread over all of them
    with open_ranks(options) as comm, run_scratch(options.scratch), open_device(options) as device:
        geom = load_geometry(source)
        fragments, q_total, m_total = resolve_fragments(geom, split, charges, multiplicities, options.charge,
                                                        options.multiplicity)
        calcs = build_calculations(geom, fragments, q_total, m_total, counterpoise)
        per_calc = [replace(options, charge=c.charge, multiplicity=c.multiplicity, frozen=frozen) for c in calcs]
        mols = [build_molecule(c.geometry, o) for c, o in zip(calcs, per_calc)]
        if counterpoise and len({m.mol.nao_nr() for m in mols}) != 1:  # pragma: no cover - a guard, not expected
            raise Mp2trnError("internal error: counterpoise fragments do not share the complex's basis")
        for mol, opts in zip(mols, per_calc):
            check_before_scf(mol, opts, device)  # an unusable MP2 fitting basis is an error before any SCF
        for k, (calc, mol, opts) in enumerate(zip(calcs, mols, per_calc)):
            if progress is not None:
                progress(calc.label, k, len(calcs))
            calc.result, mf = compute(mol, opts, device, comm=comm)
            calc.t_scf = calc.result.timings["scf"]
            calc.t_mp2 = calc.result.timings["mp2"]
            if keep_scf:
                calc.mf = mf
    if counterpoise and len({c.result.sizes["naux"] for c in calcs}) != 1:  # pragma: no cover - a guard
        raise Mp2trnError("internal error: counterpoise fragments do not share the complex's MP2 fitting basis")
    delta = {key: sum(c.sign * c.energies()[key] for c in calcs) for key in DELTA_KEYS}
    timings = {
        "scf": sum(c.t_scf for c in calcs),
        "mp2": sum(c.t_mp2 for c in calcs),
        "total": time.perf_counter() - t_start,
    }
    src = str(source) if not isinstance(source, Geometry) and "\n" not in str(source) else "<xyz>"
    return InteractionResult(counterpoise, fragments, calcs, delta, _what_ran(calcs, counterpoise), timings, src)


def _what_ran(calcs: list[Calculation], counterpoise: bool) -> dict[str, Any]:
    """The complex's what-ran record, reduced to what all calculations share, plus each one's frozen core."""
    first = calcs[0].result
    w = first.what_ran
    what_ran = {
        "device": w.get("device"),
        "precision": w.get("precision"),
        "basis": w.get("basis"),
        "auxbasis": w.get("auxbasis"),
        "jkbasis": w.get("jkbasis"),
        "frozen": {c.label: c.result.what_ran.get("frozen") for c in calcs if c.result},
        "counterpoise": counterpoise,
        "nao": first.sizes.get("nao"),
        "naux": first.sizes.get("naux"),
    }
    for key in ("backend", "nki", "target", "device_selection"):
        if w.get(key):
            what_ran[key] = w[key]
    return what_ran


__all__ = [
    "DELTA_KEYS",
    "Fragment",
    "Calculation",
    "InteractionResult",
    "interaction_energy",
    "resolve_fragments",
    "fragment_atoms",
    "build_calculations",
    "parse_int_list",
]
