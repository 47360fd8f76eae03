"""``mp2trn validate`` (an accuracy suite against PySCF) and ``mp2trn interaction`` (CP-corrected ΔE).

Validation of a molecule set (``molecules/sets/<name>.txt``):

* energy sets (``kind: energy``, e.g. ``default``): for each entry the same converged SCF goes through
  ``mp2trn.DFMP2`` (the chosen device/precision) and through PySCF's ``DFMP2``/``DFUMP2``, both with the
  same, explicitly set MP2 fitting basis (never the JK-fit basis, which PySCF's DF-MP2 would otherwise
  reuse on a density-fitted SCF). Conventional MP2 (PySCF ``RMP2``/``UMP2`` on the same orbitals with
  exact 4-index integrals, i.e. on ``mf.undo_df()``: ``RMP2`` on a DF mean-field object silently uses the
  JK-fit 3-index integrals) shows the size of the DF error itself. An entry passes when
  |E_corr(mp2trn) − E_corr(PySCF)| ≤ the tolerance of the precision that ran (:data:`TOLERANCES`).
* interaction sets (``kind: interaction``, e.g. ``s22``): each complex goes through
  :func:`mp2trn.interaction.interaction_energy` (counterpoise-corrected); ΔE(MP2) and ΔE(SCS-MP2) are
  compared with the published reference, and every calculation's E_corr with PySCF's DF-MP2 on the
  same SCF (the pass/fail criterion, as above).

Results go to the terminal (a table per entry, then a summary) and to ``--out``: CSV, JSON and a
Markdown table per set/device/precision, and a PNG plot of the errors (log scale) of every
device/precision run of that set found in the folder. The exit code is 0 when every entry passes, 1
when any entry exceeds its tolerance or fails to run.

Set files: one entry per line, ``XYZ BASIS [key=value ...]`` with the XYZ path relative to the set
file; ``#`` starts a comment; a ``kind: energy|interaction`` line sets the kind. Keys: ``name``,
``frozen`` (auto/none/N), ``charge``, ``multiplicity``, ``auxbasis``, and for interaction sets ``ref``
(reference ΔE, kcal/mol), ``split``, ``charges``, ``multiplicities``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import re
import shlex
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from . import __version__
from .cli import (
    AuxOpt,
    ConvOpt,
    DeviceOpt,
    JkOpt,
    MaxCycleOpt,
    MemOpt,
    PrecOpt,
    QuietOpt,
    ScfDfOpt,
    Target,
    TargetOpt,
    Unit,
    UnitOpt,
    app,
    check_output_path,
    cli_errors,
    console,
    err_console,
    parse_frozen,
    run_options,
)
from .errors import InputError, Mp2trnError
from .result import HARTREE_TO_KCAL, write_json_atomic

# --------------------------------------------------------------------------------------------------
# tolerances

#: |E_corr(mp2trn) − E_corr(PySCF)| allowed per precision (Hartree); rationale and measurements in
#: docs/accuracy.md. fp64: both codes do the same double-precision arithmetic; measured ≤ 1.1e-16 Eh on
#: the default set and ≤ 3.6e-15 Eh on S22 (up to 30 atoms, 321 basis functions), so 1e-8 Eh leaves
#: many orders of magnitude for other BLAS builds, blockings and GPUs, and for much larger molecules.
#: fp32 (storage, transforms and pair GEMMs in single precision, pair sums in fp64): measured ≤ 0.045 µEh
#: on the default set (worst of 5 runs with rotated orbitals), 0.2–1.7 µEh reported elsewhere for
#: whole fp32 pipelines on ≤ 30 atoms; 1 µEh is the issue's figure.
#: fp32x3 (the NKI kernels' compensated mode: operands split into an exact bf16 part and an fp32 rest,
#: three matmuls per tile, pair sums in fp64): measured on the sim device ≤ 0.012 µEh on the default set
#: (worst of 5 runs with rotated orbitals) and ≤ 0.018 µEh on S22 complexes up to 30 atoms, while the
#: same device in plain fp32 is off by 0.001–0.5 µEh per run; 0.1 µEh keeps a 5× margin over the worst
#: sample, and a silent drop to plain fp32 would fail about half the default set.
TOLERANCES: dict[str, float] = {"fp64": 1e-8, "fp32": 1e-6, "fp32x3": 1e-7}
#: Any other precision is taken to be a compensated mode (e.g. B split into bf16 terms, fp32
#: accumulation), which must deliver fp32-class accuracy. Measured with an emulation
#: (scripts/validate_compensated.py, default set, worst of 5 runs per molecule): 3-term bf16 split
#: ≤ 0.99 µEh, 6-term ≤ 0.05 µEh, while plain bf16 is off by 22–392 µEh. 2 µEh is twice the worst
#: 3-term sample and still fails plain bf16 by a factor of 10 or more.
COMPENSATED_TOLERANCE = 2e-6


def tolerance_for(precision: str | None) -> float:
    """The pass/fail threshold (Eh) of a precision label as reported by the device that ran."""
    return TOLERANCES.get(str(precision).lower(), COMPENSATED_TOLERANCE)


# --------------------------------------------------------------------------------------------------
# molecule sets


def molecules_dir() -> Path:
    """The ``molecules/`` folder of the source tree (sets live in ``molecules/sets``)."""
    env = os.environ.get("MP2TRN_MOLECULES")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "molecules"


@dataclass
class SetEntry:
    name: str  # file stem unless name= is given
    path: Path
    basis: str
    options: dict[str, str] = field(default_factory=dict)
    line: int = 0

    @property
    def key(self) -> str:
        """Unique label: name/basis (+ /fc when frozen core)."""
        fz = self.options.get("frozen", "none")
        return f"{self.name}/{self.basis}" + ("" if fz in ("none", "0") else f"/fc-{fz}")


@dataclass
class MoleculeSet:
    name: str
    path: Path
    kind: str  # "energy" or "interaction"
    entries: list[SetEntry]
    description: str = ""


_ENTRY_KEYS = {"name", "frozen", "charge", "multiplicity", "auxbasis", "ref", "split", "charges", "multiplicities"}


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


# --------------------------------------------------------------------------------------------------
# PySCF references


def pyscf_dfmp2(mf, auxbasis, nfrozen: int):
    """PySCF's DF-MP2 (RHF or UHF) with the MP2 fitting basis set explicitly; returns the object
    (``e_corr``, ``e_corr_os``, ``e_corr_ss``)."""
    from pyscf import df, scf
    from pyscf.mp import dfmp2, dfump2

    cls = dfump2.DFUMP2 if isinstance(mf, scf.uhf.UHF) else dfmp2.DFMP2
    ref = cls(mf, frozen=nfrozen or None)
    ref.with_df = df.DF(mf.mol, auxbasis=auxbasis)
    ref.verbose = 0
    ref.kernel(with_t2=False)  # energy only, as mp2trn (and a fair time)
    return ref


def conventional_mp2(mf, nfrozen: int) -> float:
    """Conventional (exact-integral) MP2 correlation energy on the orbitals of ``mf``.

    ``mf.undo_df()`` first: PySCF's RMP2/UMP2 on a density-fitted mean-field object use its JK-fit
    3-index integrals, which would make this a third DF-MP2 rather than the exact reference.
    """
    from pyscf import scf
    from pyscf.mp import mp2, ump2

    exact = mf.undo_df() if getattr(mf, "with_df", None) is not None else mf
    cls = ump2.UMP2 if isinstance(exact, scf.uhf.UHF) else mp2.RMP2
    pt = cls(exact, frozen=nfrozen or None)
    pt.verbose = 0
    return float(pt.kernel()[0])


def _nfrozen(mf, frozen) -> int:
    from .api import frozen_lists

    lists, _ = frozen_lists(mf, frozen)
    return len(lists[0])


# --------------------------------------------------------------------------------------------------
# running one entry


@dataclass
class RunConfig:
    device: str = "cpu"
    precision: str | None = None
    basis: str | None = None  # overrides the entries' basis
    auxbasis: str | None = None
    frozen: Any = None  # None: per entry
    scf_df: bool = True
    jkbasis: str | None = None
    conv_tol: float = 1e-10
    max_cycle: int = 100
    memory: float | None = None
    device_options: dict[str, Any] = field(default_factory=dict)
    tolerance: float | None = None  # overrides tolerance_for(precision)
    conventional: bool = True
    pyscf_check: bool = True


def _entry_frozen(entry: SetEntry, cfg: RunConfig):
    if cfg.frozen is not None:
        return cfg.frozen
    return parse_frozen(entry.options.get("frozen", "none"))


def _int_opt(entry: SetEntry, key: str) -> int | None:
    value = entry.options.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(f"set entry {entry.name} (line {entry.line}): {key}={value!r} is not an integer") from None


def _display_path(path: Path) -> str:
    """``molecules/...`` for files of the source tree, else the absolute path."""
    try:
        return str(path.relative_to(molecules_dir().parent))
    except ValueError:
        return str(path)


def _fmt_counts(value) -> str:
    return "/".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def _error_row(entry: SetEntry, basis: str, exc: BaseException) -> dict[str, Any]:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return {"name": entry.name, "key": entry.key, "basis": basis, "passed": False,
            "error": f"{type(exc).__name__}: {msg}"}


def validate_energy_entry(entry: SetEntry, cfg: RunConfig) -> dict[str, Any]:
    """mp2trn vs PySCF DF-MP2 (and conventional MP2) on one molecule; a flat dict (one table row)."""
    from pyscf import df

    from .api import DFMP2
    from .molecule import build_mole
    from .scf import ScfOptions, run_scf

    basis = cfg.basis or entry.basis
    try:
        mol = build_mole(entry.path, basis=basis, charge=_int_opt(entry, "charge"),
                         multiplicity=_int_opt(entry, "multiplicity"), max_memory=cfg.memory)
        aux = cfg.auxbasis or entry.options.get("auxbasis") or df.make_auxbasis(mol, mp2fit=True)
        frozen = _entry_frozen(entry, cfg)
        t0 = time.perf_counter()
        mf = run_scf(mol, ScfOptions(density_fit=cfg.scf_df, jkbasis=cfg.jkbasis, conv_tol=cfg.conv_tol,
                                     max_cycle=cfg.max_cycle))
        t_scf = time.perf_counter() - t0
        nfrozen = _nfrozen(mf, frozen)
        t0 = time.perf_counter()
        pt = DFMP2(mf, auxbasis=aux, frozen=frozen, device=cfg.device, precision=cfg.precision,
                   max_memory=cfg.memory, device_options=dict(cfg.device_options)).run()
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = pyscf_dfmp2(mf, aux, nfrozen)
        t_ref = time.perf_counter() - t0
        e_conv = t_conv = None
        if cfg.conventional:
            t0 = time.perf_counter()
            e_conv = conventional_mp2(mf, nfrozen)
            t_conv = time.perf_counter() - t0
    except Mp2trnError as exc:
        return _error_row(entry, basis, exc)
    except Exception as exc:  # a bug in one molecule must not hide the others' results
        if os.environ.get("MP2TRN_DEBUG"):
            raise
        return _error_row(entry, basis, exc)
    res = pt.result
    w, s = res.what_ran, res.sizes
    tol = cfg.tolerance if cfg.tolerance is not None else tolerance_for(w.get("precision"))
    diff = abs(res.e_corr - float(ref.e_corr))
    return {
        "name": entry.name,
        "key": entry.key,
        "file": _display_path(entry.path),
        "reference": res.reference,
        "charge": int(mol.charge),
        "multiplicity": int(mol.spin) + 1,
        "natm": int(mol.natm),
        "basis": basis,
        "auxbasis": w.get("auxbasis"),
        "jkbasis": w.get("jkbasis"),
        "frozen": nfrozen,
        "nao": s.get("nao"),
        "nocc": _fmt_counts(s.get("nocc")),
        "nvir": _fmt_counts(s.get("nvir")),
        "naux": s.get("naux"),
        "device": w.get("device"),
        "precision": w.get("precision"),
        "e_scf": float(mf.e_tot),
        "e_corr_mp2trn": res.e_corr,
        "e_corr_pyscf": float(ref.e_corr),
        "abs_diff": diff,
        "e_corr_conventional": e_conv,
        "df_error": None if e_conv is None else float(ref.e_corr) - e_conv,
        "t_scf": t_scf,
        "t_mp2trn": t_ours,
        "t_pyscf": t_ref,
        "t_conventional": t_conv,
        "tolerance": tol,
        "passed": bool(diff <= tol),
        "error": None,
    }


def validate_interaction_entry(entry: SetEntry, cfg: RunConfig) -> dict[str, Any]:
    """A CP-corrected interaction energy against the set's reference, cross-checked with PySCF."""
    from pyscf import df

    from .interaction import interaction_energy

    basis = cfg.basis or entry.basis
    try:
        frozen = _entry_frozen(entry, cfg)
        if isinstance(frozen, int):
            frozen = str(frozen)  # interaction_energy explains why a number is not accepted
        ie = interaction_energy(
            entry.path, split=_int_opt(entry, "split"), charges=entry.options.get("charges"),
            multiplicities=entry.options.get("multiplicities"), counterpoise=True, basis=basis,
            auxbasis=cfg.auxbasis or entry.options.get("auxbasis"), frozen=frozen, scf_df=cfg.scf_df,
            jkbasis=cfg.jkbasis, conv_tol=cfg.conv_tol, max_cycle=cfg.max_cycle, device=cfg.device,
            precision=cfg.precision, memory=cfg.memory, device_options=dict(cfg.device_options),
            keep_scf=cfg.pyscf_check,
        )
        max_diff = ie_diff = t_ref = None
        if cfg.pyscf_check:
            t0 = time.perf_counter()
            diffs, ie_ref = [], 0.0
            for calc in ie.calculations:
                aux = cfg.auxbasis or entry.options.get("auxbasis") or df.make_auxbasis(calc.mf.mol, mp2fit=True)
                ref = pyscf_dfmp2(calc.mf, aux, _nfrozen(calc.mf, frozen))
                diffs.append(abs(calc.result.e_corr - float(ref.e_corr)))
                ie_ref += calc.sign * float(ref.e_corr)
                calc.mf = None  # release memory
            t_ref = time.perf_counter() - t0
            max_diff = max(diffs)
            ie_diff = abs(ie.delta["mp2_correlation"] - ie_ref)
    except Mp2trnError as exc:
        return _error_row(entry, basis, exc)
    except Exception as exc:
        if os.environ.get("MP2TRN_DEBUG"):
            raise
        return _error_row(entry, basis, exc)
    w = ie.what_ran
    tol = cfg.tolerance if cfg.tolerance is not None else tolerance_for(w.get("precision"))
    ref_kcal = float(entry.options["ref"]) if "ref" in entry.options else None
    kcal = ie.delta_kcal
    return {
        "name": entry.name,
        "key": entry.key,
        "file": _display_path(entry.path),
        "natm": sum(len(f.atoms) for f in ie.fragments),
        "fragments": "+".join(f.formula for f in ie.fragments),
        "basis": basis,
        "auxbasis": w.get("auxbasis"),
        "nao": w.get("nao"),
        "naux": w.get("naux"),
        "device": w.get("device"),
        "precision": w.get("precision"),
        "ie_scf": ie.delta["scf"],
        "ie_mp2_corr": ie.delta["mp2_correlation"],
        "ie_mp2": ie.delta["mp2_total"],
        "ie_scs_mp2": ie.delta["scs_mp2_total"],
        "ie_mp2_kcal": kcal["mp2_total"],
        "ie_scs_mp2_kcal": kcal["scs_mp2_total"],
        "ref_kcal": ref_kcal,
        "error_mp2_kcal": None if ref_kcal is None else kcal["mp2_total"] - ref_kcal,
        "error_scs_mp2_kcal": None if ref_kcal is None else kcal["scs_mp2_total"] - ref_kcal,
        "max_abs_diff_corr": max_diff,
        "abs_diff_ie": ie_diff,
        "abs_diff": max_diff,
        "t_scf": ie.timings["scf"],
        "t_mp2trn": ie.timings["mp2"],
        "t_total": ie.timings["total"],
        "t_pyscf": t_ref,
        "tolerance": tol,
        "passed": bool(max_diff is None or (max_diff <= tol and ie_diff <= 2 * len(ie.calculations) * tol)),
        "error": None,
    }


# --------------------------------------------------------------------------------------------------
# summaries, tables and files


def statistics(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=float)
    return {"mae": float(np.mean(np.abs(a))), "max_abs": float(np.max(np.abs(a))), "mse": float(np.mean(a)),
            "rmse": float(np.sqrt(np.mean(a * a))), "n": len(values)}


def summarize(kind: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if not r.get("error")]
    diffs = [r["abs_diff"] for r in ok if r.get("abs_diff") is not None]
    summary: dict[str, Any] = {
        "entries": len(rows),
        "passed": sum(bool(r["passed"]) for r in rows),
        "failed": [r["key"] for r in rows if not r["passed"]],
        "errors": {r["key"]: r["error"] for r in rows if r.get("error")},
        "max_abs_diff": max(diffs) if diffs else None,
        "time_mp2trn": sum(r.get("t_mp2trn") or 0.0 for r in ok),
        "time_pyscf": sum(r.get("t_pyscf") or 0.0 for r in ok),
        "time_scf": sum(r.get("t_scf") or 0.0 for r in ok),
    }
    if kind == "energy":
        dfe = [abs(r["df_error"]) / r["natm"] for r in ok if r.get("df_error") is not None]
        summary["max_df_error_per_atom"] = max(dfe) if dfe else None
        summary["time_conventional"] = sum(r.get("t_conventional") or 0.0 for r in ok)
    else:
        summary["mp2_vs_reference_kcal"] = statistics([r["error_mp2_kcal"] for r in ok if r.get("error_mp2_kcal") is not None])
        summary["scs_mp2_vs_reference_kcal"] = statistics(
            [r["error_scs_mp2_kcal"] for r in ok if r.get("error_scs_mp2_kcal") is not None])
    return summary


def _ueh(x: float | None) -> str:
    if x is None:
        return "–"
    v = x * 1e6
    return f"{v:.2g}" if abs(v) < 0.1 else f"{v:.2f}"


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def energy_table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col, just in [("molecule", "left"), ("ref", "left"), ("atoms", "right"), ("basis", "left"),
                      ("nocc", "right"), ("nvir", "right"), ("naux", "right"), ("E_corr mp2trn (Eh)", "right"),
                      ("E_corr PySCF (Eh)", "right"), ("|Δ| µEh", "right"), ("DF err µEh", "right"),
                      ("t SCF", "right"), ("t mp2trn", "right"), ("t PySCF", "right"), ("t conv", "right"),
                      ("", "left")]:
        t.add_column(col, justify=just, no_wrap=True)
    for r in rows:
        if r.get("error"):
            t.add_row(r["name"], "", "", r["basis"], *[""] * 11, f"[red]ERROR[/] {r['error']}")
            continue
        status = "[green]ok[/]" if r["passed"] else "[red]FAIL[/]"
        name = r["name"] + ("" if not r["frozen"] else f" (fc {r['frozen']})")
        t.add_row(name, r["reference"], str(r["natm"]), r["basis"], r["nocc"], r["nvir"], str(r["naux"]),
                  f"{r['e_corr_mp2trn']:.10f}", f"{r['e_corr_pyscf']:.10f}", _ueh(r["abs_diff"]),
                  _ueh(r["df_error"]), _s(r["t_scf"]), _s(r["t_mp2trn"]), _s(r["t_pyscf"]), _s(r["t_conventional"]),
                  status)
    return t


def _kc(x: float | None, signed: bool = False) -> str:
    return "–" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")


def interaction_table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ["complex", "atoms", "basis", "nao", "ΔE MP2", "ΔE SCS-MP2", "reference", "err MP2",
                "err SCS", "max|Δ| µEh", "t mp2trn+SCF", "t PySCF", ""]:
        t.add_column(col, justify="left" if col in ("complex", "basis", "") else "right", no_wrap=True)
    for r in rows:
        if r.get("error"):
            t.add_row(r["name"], "", r["basis"], *[""] * 9, f"[red]ERROR[/] {r['error']}")
            continue
        status = "[green]ok[/]" if r["passed"] else "[red]FAIL[/]"
        t.add_row(r["name"], str(r["natm"]), r["basis"], str(r["nao"]), _kc(r["ie_mp2_kcal"]),
                  _kc(r["ie_scs_mp2_kcal"]), _kc(r["ref_kcal"]), _kc(r["error_mp2_kcal"], True),
                  _kc(r["error_scs_mp2_kcal"], True), _ueh(r["max_abs_diff_corr"]), _s(r["t_total"]),
                  _s(r["t_pyscf"]), status)
    return t


def summary_lines(kind: str, summary: dict[str, Any], tol_text: str) -> list[str]:
    lines = [f"{summary['passed']} of {summary['entries']} entries pass ({tol_text})"]
    if summary["max_abs_diff"] is not None:
        lines.append(f"max |E_corr(mp2trn) − E_corr(PySCF)| = {summary['max_abs_diff']:.3g} Eh")
    if kind == "energy" and summary.get("max_df_error_per_atom") is not None:
        lines.append(f"max DF error (PySCF DF-MP2 − conventional MP2) = {summary['max_df_error_per_atom'] * 1e6:.1f} µEh per atom")
    for label, key in (("MP2", "mp2_vs_reference_kcal"), ("SCS-MP2", "scs_mp2_vs_reference_kcal")):
        st = summary.get(key)
        if st:
            lines.append(f"{label} vs reference: MAE {st['mae']:.3f}, max |error| {st['max_abs']:.3f}, "
                         f"mean signed {st['mse']:+.3f} kcal/mol (n={st['n']})")
    times = f"time: SCF {summary['time_scf']:.1f} s, mp2trn {summary['time_mp2trn']:.1f} s, PySCF {summary['time_pyscf']:.1f} s"
    if kind == "energy":
        times += f", conventional MP2 {summary.get('time_conventional', 0.0):.1f} s"
    lines.append(times)
    return lines


def machine_info() -> dict[str, Any]:
    import pyscf

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": None if mem_gb is None else round(mem_gb, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyscf": pyscf.__version__,
        "mp2trn": __version__,
    }


def _atomic_write(path: Path, write) -> None:
    """Call ``write(tmp_path)`` then move the file into place, or leave ``path`` untouched."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _write_text_atomic(path: Path, text: str) -> None:
    _atomic_write(path, lambda tmp: tmp.write_text(text))


def rows_csv(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for r in rows:
        for k in r:
            if k not in columns:
                columns.append(k)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if r.get(k) is None else (repr(r[k]) if isinstance(r.get(k), float) else r[k]))
                         for k in columns})
    return buf.getvalue()


def rows_markdown(kind: str, rows: list[dict[str, Any]]) -> str:
    if kind == "energy":
        head = ["molecule", "ref", "atoms", "basis", "nocc", "nvir", "naux", "E_corr mp2trn (Eh)",
                "E_corr PySCF (Eh)", "\\|Δ\\| (µEh)", "DF error (µEh)", "t SCF (s)", "t mp2trn (s)", "t PySCF (s)",
                "t conv. MP2 (s)"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            if r.get("error"):
                lines.append(f"| {r['name']} | ERROR: {r['error']} |" + " |" * (len(head) - 2))
                continue
            name = r["name"] + ("" if not r["frozen"] else f" (fc {r['frozen']})")
            cells = [name, r["reference"], r["natm"], r["basis"], r["nocc"], r["nvir"], r["naux"],
                     f"{r['e_corr_mp2trn']:.10f}", f"{r['e_corr_pyscf']:.10f}", _ueh(r["abs_diff"]),
                     _ueh(r["df_error"]), _s(r["t_scf"]), _s(r["t_mp2trn"]), _s(r["t_pyscf"]),
                     _s(r["t_conventional"])]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
        return "\n".join(lines) + "\n"
    head = ["complex", "atoms", "basis", "nao", "ΔE MP2", "ΔE SCS-MP2", "reference", "error MP2",
            "error SCS-MP2", "max \\|ΔE_corr\\| vs PySCF (µEh)", "t mp2trn+SCF (s)", "t PySCF (s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['name']} | ERROR: {r['error']} |" + " |" * (len(head) - 2))
            continue
        cells = [r["name"], r["natm"], r["basis"], r["nao"], _kc(r["ie_mp2_kcal"]), _kc(r["ie_scs_mp2_kcal"]),
                 _kc(r["ref_kcal"]), _kc(r["error_mp2_kcal"], True), _kc(r["error_scs_mp2_kcal"], True),
                 _ueh(r["max_abs_diff_corr"]), _s(r["t_total"]), _s(r["t_pyscf"])]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


_PLOT_FLOOR = 1e-18  # exact agreement (|Δ| = 0) is drawn here on the log axis


def plot_errors(out_dir: Path, set_name: str, kind: str) -> Path | None:
    """One PNG with the |Δ| of every device/precision run of ``set_name`` in ``out_dir`` (log scale).

    Returns the path written, or None when matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    docs = []
    for p in sorted(out_dir.glob(f"validate_{set_name}_*.json")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("schema_name") == "mp2trn_validation" and doc.get("set") == set_name:
            docs.append(doc)
    if not docs:
        return None
    keys: list[str] = []
    for doc in docs:
        for r in doc["rows"]:
            if r["key"] not in keys:
                keys.append(r["key"])
    x = np.arange(len(keys))
    names = {}
    for doc in docs:
        names.update({r["key"]: r["name"] for r in doc["rows"]})
    short = [names.get(k, k) for k in keys]
    labels = short if len(set(short)) == len(short) else keys  # "02_water_dimer" rather than its full key
    nrows = 2 if kind == "interaction" else 1
    fig = Figure(figsize=(max(8.0, 0.42 * len(keys) + 3), 4.8 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(nrows, 1, 1)
    ax.set_yscale("log")
    markers = "osD^v<>p*h"
    tol_seen = set()
    plotted = 0
    for k, doc in enumerate(docs):
        by_key = {r["key"]: r for r in doc["rows"]}
        ys = [by_key.get(key, {}).get("abs_diff") for key in keys]
        xs = [xi for xi, y in zip(x, ys) if y is not None]
        ys = [max(y, _PLOT_FLOOR) for y in ys if y is not None]
        plotted += len(ys)
        label = f"{doc['device']} / {doc['precision']}"
        ax.plot(xs, ys, linestyle="none", marker=markers[k % len(markers)], label=f"mp2trn − PySCF, {label}")
        tol = doc["tolerance"]
        if tol not in tol_seen:
            tol_seen.add(tol)
            ax.axhline(tol, linestyle="--", linewidth=0.8, color=f"C{k}", label=f"tolerance {doc['precision']}: {tol:g} Eh")
    if kind == "energy":
        for doc in docs:
            by_key = {r["key"]: r for r in doc["rows"]}
            ys = [by_key.get(key, {}).get("df_error") for key in keys]
            if any(y is not None for y in ys):
                xs = [xi for xi, y in zip(x, ys) if y is not None]
                ax.plot(xs, [abs(y) for y in ys if y is not None], linestyle="none", marker="_", markersize=12,
                            color="0.5", label="|DF-MP2 − conventional MP2| (the DF error itself)")
                break
        ax.set_ylabel("|ΔE_corr| (Eh)")
    else:
        ax.set_ylabel("max |ΔE_corr| vs PySCF (Eh)")
    if not plotted:  # every entry failed to run: only the tolerance lines would set the limits
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # matplotlib's "identical low and high ylims"
            ax.set_ylim(_PLOT_FLOOR, 1e-2)
        ax.text(0.5, 0.5, "no results", transform=ax.transAxes, ha="center")
    ax.set_title(f"mp2trn validate --set {set_name}: agreement with PySCF DF-MP2 (|Δ| = 0 drawn at {_PLOT_FLOOR:g})")
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    if kind == "interaction":
        ax2 = fig.add_subplot(2, 1, 2)
        doc = docs[0]
        by_key = {r["key"]: r for r in doc["rows"]}
        for j, (field_name, label) in enumerate((("error_mp2_kcal", "MP2"), ("error_scs_mp2_kcal", "SCS-MP2"))):
            ys = [by_key.get(key, {}).get(field_name) for key in keys]
            xs = [xi + (j - 0.5) * 0.35 for xi, y in zip(x, ys) if y is not None]
            ax2.bar(xs, [y for y in ys if y is not None], width=0.35, label=label)
        ax2.axhline(0.0, color="k", linewidth=0.6)
        ax2.set_ylabel("ΔE − reference (kcal/mol)")
        ax2.set_title(f"counterpoise-corrected interaction energies vs reference ({doc['device']} / {doc['precision']})")
        ax2.set_xticks(x, labels, rotation=60, ha="right", fontsize=8)
        ax2.legend(fontsize=8)
        ax2.grid(True, axis="y", alpha=0.3)
    target = out_dir / f"validate_{set_name}.png"
    _atomic_write(target, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    return target


def check_output_dir(out: Path) -> None:
    """Fail before any work when ``out`` could not be created or written."""
    if out.exists():
        if not out.is_dir():
            raise InputError(f"--out {out}: exists and is not a directory")
        if not os.access(out, os.W_OK):
            raise InputError(f"--out {out}: directory is not writable")
        return
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise InputError(f"--out {out}: cannot create it ({parent} is not a writable directory)")


def run_validation(mset: MoleculeSet, entries: list[SetEntry], cfg: RunConfig,
                   on_row=None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run every entry; returns the rows and the summary. ``on_row(row)`` after each entry."""
    rows = []
    for entry in entries:
        row = (validate_energy_entry if mset.kind == "energy" else validate_interaction_entry)(entry, cfg)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows, summarize(mset.kind, rows)


def validation_document(mset: MoleculeSet, cfg: RunConfig, rows, summary, device: str, precision: str,
                        tolerance: float, command: str) -> dict[str, Any]:
    return {
        "schema_name": "mp2trn_validation",
        "schema_version": 1,
        "set": mset.name,
        "kind": mset.kind,
        "set_file": str(mset.path),
        "device": device,
        "precision": precision,
        "tolerance": tolerance,
        "command": command,
        "machine": machine_info(),
        "options": {k: v for k, v in cfg.__dict__.items() if k != "device_options"},
        "rows": rows,
        "summary": summary,
    }


# --------------------------------------------------------------------------------------------------
# CLI


def _wide_console() -> Console:
    """The normal console on a terminal; a wide one when piped, so tables are not truncated."""
    return console if console.is_terminal else Console(width=240, force_terminal=False, highlight=False)


@app.command()
@cli_errors
def validate(
    set_name: str = typer.Option("default", "--set", "-s", help="Molecule set: a name in molecules/sets (default, s22) or a set file."),
    device: str = DeviceOpt,
    precision: Optional[str] = PrecOpt,
    out: Path = typer.Option(Path("out/validate"), "--out", "-o", help="Folder for the CSV, JSON, Markdown and PNG files (created)."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated entry names (file stems) to run, e.g. water,hydroxyl."),
    basis: Optional[str] = typer.Option(None, "--basis", "-b", help="Orbital basis for every entry (default: each entry's own)."),
    auxbasis: Optional[str] = AuxOpt,
    frozen_core: Optional[str] = typer.Option(None, "--frozen-core", help="auto, none or N for every entry (default: each entry's own)."),
    scf_df: bool = ScfDfOpt,
    jkbasis: Optional[str] = JkOpt,
    conv_tol: float = ConvOpt,
    max_cycle: int = MaxCycleOpt,
    memory: Optional[float] = MemOpt,
    target: Optional[Target] = TargetOpt,
    tol: Optional[float] = typer.Option(None, "--tol", help="Pass/fail threshold in Eh (default: 1e-8 fp64, 1e-6 fp32, 1e-7 fp32x3, 2e-6 other compensated modes)."),
    conventional: bool = typer.Option(True, "--conventional/--no-conventional", help="Also run conventional MP2 to show the DF error (energy sets)."),
    pyscf_check: bool = typer.Option(True, "--pyscf/--no-pyscf", help="Interaction sets: cross-check every E_corr with PySCF's DF-MP2."),
    quiet: bool = QuietOpt,
) -> None:
    """Accuracy table against PySCF for a molecule set (exit code 1 when any entry exceeds its tolerance)."""
    from .devices import get_device
    from .molecule import read_xyz

    # every cheap check before any SCF: set, entries, options, output folder, device
    mset = load_set(set_name)
    entries = select_entries(mset, only)
    if tol is not None and not tol > 0:
        raise InputError(f"--tol must be positive, got {tol}")
    frozen = parse_frozen(frozen_core) if frozen_core is not None else None
    if mset.kind == "interaction" and isinstance(frozen, int):
        raise InputError(f"--frozen-core {frozen_core}: interaction sets take auto or none (the complex and each "
                         "fragment have different numbers of core orbitals)")
    opts = run_options(basis or "cc-pvdz", auxbasis, None, None, Unit.angstrom, frozen_core or "none", scf_df, jkbasis,
                       conv_tol, device, precision, memory, target, max_cycle)
    check_output_dir(out)
    probe = get_device(device, precision, **opts["device_options"])  # DeviceUnavailableError: a clear message
    dev_name, dev_precision = probe.name, probe.precision
    probe.close()
    for entry in entries:  # malformed XYZ files fail here, not half-way through the run
        read_xyz(entry.path)
    cfg = RunConfig(device=device, precision=precision, basis=basis, auxbasis=auxbasis, frozen=frozen, scf_df=scf_df,
                    jkbasis=jkbasis, conv_tol=conv_tol, max_cycle=max_cycle, memory=memory,
                    device_options=opts["device_options"], tolerance=tol, conventional=conventional,
                    pyscf_check=pyscf_check)
    tolerance = tol if tol is not None else tolerance_for(dev_precision)
    show = not quiet
    if show:
        _wide_console().print(f"validating set [bold]{mset.name}[/] ({len(entries)} {'molecules' if mset.kind == 'energy' else 'complexes'}) "
                      f"on device {dev_name}, precision {dev_precision}; tolerance {tolerance:g} Eh", highlight=False)

    def on_row(row):
        if show and err_console.is_terminal:
            status = "ERROR" if row.get("error") else ("ok" if row["passed"] else "FAIL")
            err_console.print(f"  {row['key']}: {status}", highlight=False)

    t0 = time.perf_counter()
    rows, summary = run_validation(mset, entries, cfg, on_row)
    summary["wall_time"] = time.perf_counter() - t0
    ran = [r for r in rows if not r.get("error")]
    device_ran = ran[0]["device"] if ran else dev_name
    precision_ran = ran[0]["precision"] if ran else dev_precision
    tol_text = f"tolerance {tolerance:g} Eh for {precision_ran}"
    command = "mp2trn " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if Path(sys.argv[0]).name == "mp2trn" else \
        f"mp2trn validate --set {mset.name} --device {device}" + (f" --precision {precision}" if precision else "")
    doc = validation_document(mset, cfg, rows, summary, device_ran, precision_ran, tolerance, command)

    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"validate_{mset.name}_{device_ran}_{precision_ran}"
    write_json_atomic(stem.with_suffix(".json"), doc)
    _write_text_atomic(stem.with_suffix(".csv"), rows_csv(rows))
    md = (f"Command: `{command}`\n\nMachine: {_machine_text(doc['machine'])}\n\n" + rows_markdown(mset.kind, rows)
          + "\n" + "\n".join(f"- {line}" for line in summary_lines(mset.kind, summary, tol_text)) + "\n")
    _write_text_atomic(stem.with_suffix(".md"), md)
    png = plot_errors(out, mset.name, mset.kind)

    if show:
        wide = _wide_console()
        title = f"{mset.name}: mp2trn ({device_ran}, {precision_ran}) vs PySCF"
        if mset.kind == "energy":
            wide.print(energy_table(rows, title + " DF-MP2 (energies Eh, |Δ| and DF error µEh, times s)"))
        else:
            wide.print(interaction_table(rows, title + " (ΔE kcal/mol, counterpoise-corrected; times s)"))
        for line in summary_lines(mset.kind, summary, tol_text):
            wide.print(line, highlight=False)
        files = [stem.with_suffix(s).name for s in (".csv", ".json", ".md")] + ([png.name] if png else [])
        wide.print(f"written to {out}: {', '.join(files)}" + ("" if png else " (no plot: matplotlib not installed)"),
                   highlight=False)
    failed = len(rows) - summary["passed"]
    if failed:
        err_console.print(f"[bold red]validation failed:[/] {failed} of {len(rows)} entries "
                          f"{'exceed the tolerance or did not run' if summary['errors'] else 'exceed the tolerance'} "
                          f"({', '.join(summary['failed'])})", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _machine_text(m: dict[str, Any]) -> str:
    return (f"{m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB RAM, {m['os']}; Python {m['python']}, "
            f"NumPy {m['numpy']}, PySCF {m['pyscf']}, mp2trn {m['mp2trn']}")


# ``mp2trn interaction``
@app.command()
@cli_errors
def interaction(
    xyz: Path = typer.Argument(..., help="The complex in XYZ format; fragments by --split or '--' lines."),
    split: Optional[int] = typer.Option(None, "--split", help="Atoms 1..N form fragment 1, the rest fragment 2."),
    charges: Optional[str] = typer.Option(None, "--charges", help="Charge per fragment, e.g. 0,-1 (default: comment line, else 0)."),
    multiplicities: Optional[str] = typer.Option(None, "--multiplicities", help="Multiplicity per fragment, e.g. 1,2 (default: comment line, else lowest)."),
    counterpoise: bool = typer.Option(True, "--cp/--no-cp", help="Counterpoise correction (fragments in the complex's basis, ghost atoms)."),
    basis: str = typer.Option("cc-pvdz", "--basis", "-b", help="Orbital basis set."),
    auxbasis: Optional[str] = AuxOpt,
    charge: Optional[int] = typer.Option(None, "--charge", "-c", help="Charge of the complex (default: the sum of the fragment charges)."),
    multiplicity: Optional[int] = typer.Option(None, "--multiplicity", "-m", help="Multiplicity of the complex (default: high spin, 1 + Σ(m_k − 1))."),
    unit: Unit = UnitOpt,
    frozen_core: str = typer.Option("none", "--frozen-core", help="auto (noble-gas cores of each calculation's real atoms) or none."),
    scf_df: bool = ScfDfOpt,
    jkbasis: Optional[str] = JkOpt,
    conv_tol: float = ConvOpt,
    max_cycle: int = MaxCycleOpt,
    device: str = DeviceOpt,
    precision: Optional[str] = PrecOpt,
    memory: Optional[float] = MemOpt,
    target: Optional[Target] = TargetOpt,
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write ΔE (under interaction_energy, Eh) and every calculation's result here (atomically)."),
    quiet: bool = QuietOpt,
) -> None:
    """Counterpoise-corrected interaction energy (SCF, MP2 and SCS-MP2) of a complex."""
    from .interaction import interaction_energy

    check_output_path(json_path)
    opts = run_options(basis, auxbasis, charge, multiplicity, unit, frozen_core, scf_df, jkbasis, conv_tol,
                       device, precision, memory, target, max_cycle)

    def progress(label: str, k: int, n: int) -> None:
        if not quiet and err_console.is_terminal:
            err_console.print(f"  [{k + 1}/{n}] {label}", highlight=False)

    ie = interaction_energy(xyz, split=split, charges=charges, multiplicities=multiplicities,
                            counterpoise=counterpoise, progress=progress, **opts)
    if json_path is not None:
        write_json_atomic(json_path, ie.to_json())
    if not quiet:
        print_interaction(ie, title=str(xyz))
        if json_path is not None:
            console.print(f"JSON written to {json_path}")


def print_interaction(ie, title: str) -> None:
    from .interaction import DELTA_KEYS, DELTA_LABELS

    out = _wide_console()

    cp = "counterpoise-corrected" if ie.counterpoise else "no counterpoise correction"
    t = Table(title=f"Interaction energy ({cp}): {title}", title_justify="left")
    t.add_column("ΔE")
    t.add_column("Eh", justify="right")
    t.add_column("kcal/mol", justify="right")
    for key in DELTA_KEYS:
        t.add_row(DELTA_LABELS[key], f"{ie.delta[key]:.10f}", f"{ie.delta[key] * HARTREE_TO_KCAL:.4f}")
    out.print(t)
    c = Table(title="Calculations (ΔE = complex − Σ fragments)", title_justify="left")
    for col in ("calculation", "atoms", "ghosts", "charge", "mult", "ref", "nao", "naux", "E_SCF (Eh)",
                "E_corr MP2 (Eh)", "t SCF (s)", "t MP2 (s)"):
        c.add_column(col, justify="left" if col in ("calculation", "ref") else "right")
    for calc in ie.calculations:
        r = calc.result
        c.add_row(calc.label, str(calc.n_real), str(calc.n_ghost), str(calc.charge), str(calc.multiplicity),
                  r.reference, str(r.sizes["nao"]), str(r.sizes["naux"]), f"{r.e_hf:.10f}", f"{r.e_corr:.10f}",
                  f"{calc.t_scf:.2f}", f"{calc.t_mp2:.2f}")
    out.print(c)
    w = ie.what_ran
    info = Table(title="What ran", title_justify="left", show_header=False)
    info.add_column("key")
    info.add_column("value")
    info.add_row("device", str(w.get("device")) + (f" ({w['backend']})" if w.get("backend") else ""))
    info.add_row("precision", str(w.get("precision")))
    info.add_row("basis / aux basis", f"{w.get('basis')} / {w.get('auxbasis')}")
    info.add_row("SCF", f"density-fitted ({w.get('jkbasis')})" if w.get("jkbasis") else "conventional integrals")
    frozen = sorted(set(map(str, w.get("frozen", {}).values())))
    info.add_row("frozen orbitals", "; ".join(frozen))
    info.add_row("fragments", "; ".join(f"{f.describe()}: charge {f.charge}, multiplicity {f.multiplicity}"
                                        for f in ie.fragments))
    info.add_row("time", f"{ie.timings['total']:.2f} s (SCF {ie.timings['scf']:.2f} s, MP2 {ie.timings['mp2']:.2f} s)")
    out.print(info)
