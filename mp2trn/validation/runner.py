"""Running a validation set: every entry through the one compute path and through PySCF.

* energy sets (``kind: energy``, e.g. ``default``): the same converged SCF goes through mp2trn's
  DF-MP2 (the chosen device/precision) and PySCF's ``DFMP2``/``DFUMP2`` with the same, explicitly set
  MP2 fitting basis (:func:`~mp2trn.validation.pyscf_reference.pyscf_reference`); conventional MP2
  shows the DF error itself. An entry passes when |E_corr(mp2trn) − E_corr(PySCF)| ≤ the tolerance of
  the precision that ran (:func:`mp2trn.precision.tolerance_for`). Entries with ``reference=rohf`` compare
  with the spin-orbital ROHF-MBPT(2) formula instead (:mod:`~mp2trn.validation.rohf_oracle`).
* interaction sets (``kind: interaction``, e.g. ``s22``): each complex goes through
  :func:`mp2trn.interaction.interaction_energy` (counterpoise-corrected); ΔE(MP2) and ΔE(SCS-MP2) are
  compared with the published reference, and every calculation's E_corr with PySCF's DF-MP2 on the
  same SCF (the pass/fail criterion, as above).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..devices import Device
from ..errors import Mp2trnError
from ..interaction import interaction_energy
from ..options import RunOptions, parse_frozen
from ..orbitals import select_frozen
from ..pipeline import bind_device, compute, open_device
from ..precision import tolerance_for
from ..scratch import run_scratch
from .pyscf_reference import conventional_mp2, pyscf_reference, pyscf_scf_energy
from .rohf_oracle import pyscf_rohf_energy, rohf_conventional, rohf_reference
from .sets import MoleculeSet, SetEntry, molecules_dir


@dataclass(frozen=True)
class ValidationConfig:
    """How to validate a set: the run options shared by every entry and what to compare.

    basis / frozen: override every entry's own (None: each entry's); ``options.auxbasis`` likewise.
    tolerance: overrides the precision's tolerance. conventional: also conventional MP2 (energy sets);
    pyscf_check: cross-check interaction sets with PySCF.
    """

    options: RunOptions = RunOptions()
    basis: str | None = None
    frozen: str | None = None
    tolerance: float | None = None
    conventional: bool = True
    pyscf_check: bool = True

    def entry_options(self, entry: SetEntry) -> RunOptions:
        """The run options of one entry: the entry's basis, charge, multiplicity, fitting basis and
        frozen core unless overridden."""
        frozen = self.frozen if self.frozen is not None else entry.options.get("frozen", "none")
        return replace(self.options, basis=self.basis or entry.basis,
                       auxbasis=self.options.auxbasis or entry.options.get("auxbasis"),
                       charge=entry.int_option("charge"), multiplicity=entry.int_option("multiplicity"),
                       frozen=parse_frozen(frozen), reference=entry.options.get("reference", self.options.reference))

    def to_json(self) -> dict[str, Any]:
        o = self.options
        return {"device": o.device_name, "precision": o.precision, "basis": self.basis, "auxbasis": o.auxbasis,
                "frozen": self.frozen, "scf_df": o.scf_df, "jkbasis": o.jkbasis, "conv_tol": o.conv_tol,
                "conv_tol_grad": o.conv_tol_grad, "max_cycle": o.max_cycle, "max_memory": o.max_memory,
                "tolerance": self.tolerance,
                "conventional": self.conventional, "pyscf_check": self.pyscf_check}


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


def _guarded(run_entry: Callable[[SetEntry, ValidationConfig, Device], dict[str, Any]]):
    """One entry's failure becomes an error row: a bug in one molecule must not hide the others."""

    def guarded(entry: SetEntry, cfg: ValidationConfig, device: Device) -> dict[str, Any]:
        try:
            return run_entry(entry, cfg, device)
        except Mp2trnError as exc:
            return _error_row(entry, cfg.basis or entry.basis, exc)
        except Exception as exc:
            if os.environ.get("MP2TRN_DEBUG"):
                raise
            return _error_row(entry, cfg.basis or entry.basis, exc)

    return guarded


@_guarded
def validate_energy_entry(entry: SetEntry, cfg: ValidationConfig, device: Device) -> dict[str, Any]:
    """mp2trn vs PySCF DF-MP2 (and conventional MP2) on one molecule; a flat dict (one table row)."""
    opts = cfg.entry_options(entry)
    res, mf = compute(entry.path, bind_device(opts, device), device)
    rohf = res.reference == "ROHF"
    ref = rohf_reference(mf, opts) if rohf else pyscf_reference(mf, opts)
    e_conv = t_conv = None
    if cfg.conventional:
        t0 = time.perf_counter()
        e_conv = rohf_conventional(mf, opts) if rohf else conventional_mp2(mf, opts)
        t_conv = time.perf_counter() - t0
    w, s = res.what_ran, res.sizes
    tol = cfg.tolerance if cfg.tolerance is not None else tolerance_for(w.get("precision"))
    diff = abs(res.e_corr - ref.e_corr)
    mol = mf.mol
    e_scf_ref = independent_scf_energy(mf, opts) if cfg.pyscf_check else None
    scf_diff = None if e_scf_ref is None else abs(float(mf.e_tot) - e_scf_ref)
    return {
        "name": entry.name, "key": entry.key, "file": _display_path(entry.path), "reference": res.reference,
        "charge": int(mol.charge), "multiplicity": int(mol.spin) + 1, "natm": int(mol.natm),
        "basis": opts.basis, "auxbasis": w.get("auxbasis"), "jkbasis": w.get("jkbasis"),
        "frozen": len(w["frozen_orbitals"][0]) if rohf else select_frozen(mf, opts.frozen).count,
        "nao": s.get("nao"), "nocc": _fmt_counts(s.get("nocc")), "nvir": _fmt_counts(s.get("nvir")),
        "naux": s.get("naux"), "device": w.get("device"), "precision": w.get("precision"),
        "e_scf": float(mf.e_tot), "e_corr_mp2trn": res.e_corr, "e_corr_pyscf": ref.e_corr, "abs_diff": diff,
        "e_corr_conventional": e_conv, "df_error": None if e_conv is None else ref.e_corr - e_conv,
        "t_scf": res.timings["scf"], "t_mp2trn": res.timings["mp2"], "t_pyscf": ref.seconds,
        "t_conventional": t_conv, "tolerance": tol, "e_scf_pyscf": e_scf_ref, "scf_abs_diff": scf_diff,
        "ecp_core_electrons": int(sum(mol.atom_nelec_core(i) for i in range(mol.natm))),
        "passed": bool(diff <= tol and (scf_diff is None or scf_diff <= tol)), "error": None,
    }


def independent_scf_energy(mf, options: RunOptions) -> float:
    """PySCF's own SCF on the molecule mp2trn built (same bases, ECPs, JK-fit basis; PySCF's J/K builds
    and driver from scratch), for the end-to-end check of the SCF energy."""
    from pyscf import scf

    with_df = getattr(mf, "with_df", None)
    if isinstance(mf, scf.rohf.ROHF) and with_df is not None:
        return pyscf_rohf_energy(mf.mol, with_df.auxbasis, options.conv_tol)
    if with_df is None:
        ref = scf.RHF(mf.mol) if mf.mol.spin == 0 else scf.UHF(mf.mol)
        ref.conv_tol, ref.verbose = options.conv_tol, 0
        return float(ref.kernel())
    grid = int(mf.grids.level) if hasattr(mf, "xc") else None
    return float(pyscf_scf_energy(mf.mol, with_df.auxbasis, options.conv_tol, getattr(mf, "xc", None), grid).e_tot)


@_guarded
def validate_interaction_entry(entry: SetEntry, cfg: ValidationConfig, device: Device) -> dict[str, Any]:
    """A CP-corrected interaction energy against the set's reference, cross-checked with PySCF."""
    opts = cfg.entry_options(entry)
    if isinstance(opts.frozen, int):
        opts = replace(opts, frozen=str(opts.frozen))  # interaction_energy explains why a number is refused
    ie = interaction_energy(entry.path, split=entry.int_option("split"), charges=entry.options.get("charges"),
                            multiplicities=entry.options.get("multiplicities"), counterpoise=True,
                            options=bind_device(opts, device), keep_scf=cfg.pyscf_check)
    max_diff = ie_diff = t_ref = None
    if cfg.pyscf_check:
        diffs, ie_ref, t_ref = [], 0.0, 0.0
        for calc in ie.calculations:
            ref = pyscf_reference(calc.mf, opts)
            diffs.append(abs(calc.result.e_corr - ref.e_corr))
            ie_ref += calc.sign * ref.e_corr
            t_ref += ref.seconds
            calc.mf = None  # release memory
        max_diff = max(diffs)
        ie_diff = abs(ie.delta["mp2_correlation"] - ie_ref)
    w = ie.what_ran
    tol = cfg.tolerance if cfg.tolerance is not None else tolerance_for(w.get("precision"))
    ref_kcal = float(entry.options["ref"]) if "ref" in entry.options else None
    kcal = ie.delta_kcal
    return {
        "name": entry.name, "key": entry.key, "file": _display_path(entry.path),
        "natm": sum(len(f.atoms) for f in ie.fragments), "fragments": "+".join(f.formula for f in ie.fragments),
        "basis": opts.basis, "auxbasis": w.get("auxbasis"), "nao": w.get("nao"), "naux": w.get("naux"),
        "device": w.get("device"), "precision": w.get("precision"),
        "ie_scf": ie.delta["scf"], "ie_mp2_corr": ie.delta["mp2_correlation"], "ie_mp2": ie.delta["mp2_total"],
        "ie_scs_mp2": ie.delta["scs_mp2_total"], "ie_mp2_kcal": kcal["mp2_total"],
        "ie_scs_mp2_kcal": kcal["scs_mp2_total"], "ref_kcal": ref_kcal,
        "error_mp2_kcal": None if ref_kcal is None else kcal["mp2_total"] - ref_kcal,
        "error_scs_mp2_kcal": None if ref_kcal is None else kcal["scs_mp2_total"] - ref_kcal,
        "max_abs_diff_corr": max_diff, "abs_diff_ie": ie_diff, "abs_diff": max_diff,
        "t_scf": ie.timings["scf"], "t_mp2trn": ie.timings["mp2"], "t_total": ie.timings["total"],
        "t_pyscf": t_ref, "tolerance": tol,
        "passed": bool(max_diff is None or (max_diff <= tol and ie_diff <= 2 * len(ie.calculations) * tol)),
        "error": None,
    }


def run_validation(mset: MoleculeSet, entries: list[SetEntry], cfg: ValidationConfig,
                   on_row=None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run every entry on one device; returns the rows and the summary. ``on_row(row)`` after each entry."""
    validate_entry = validate_energy_entry if mset.kind == "energy" else validate_interaction_entry
    rows = []
    with run_scratch(cfg.options.scratch), open_device(cfg.options) as device:
        for entry in entries:
            row = validate_entry(entry, cfg, device)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    return rows, summarize(mset.kind, rows)


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
        scf = [r["scf_abs_diff"] for r in ok if r.get("scf_abs_diff") is not None]
        summary["max_scf_abs_diff"] = max(scf) if scf else None
        summary["time_conventional"] = sum(r.get("t_conventional") or 0.0 for r in ok)
    else:
        summary["mp2_vs_reference_kcal"] = statistics([r["error_mp2_kcal"] for r in ok if r.get("error_mp2_kcal") is not None])
        summary["scs_mp2_vs_reference_kcal"] = statistics(
            [r["error_scs_mp2_kcal"] for r in ok if r.get("error_scs_mp2_kcal") is not None])
    return summary
