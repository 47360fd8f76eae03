"""Validation reports: the terminal tables, CSV, JSON and Markdown files, and the error plot."""

from __future__ import annotations

import csv
import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from ..files import atomic_write, write_json_atomic, write_text_atomic
from ..machine import machine_info, machine_text
from .runner import ValidationConfig
from .sets import MoleculeSet


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
                      ("E_corr PySCF (Eh)", "right"), ("|Δ| µEh", "right"), ("|ΔE_SCF| µEh", "right"),
                      ("ECP e⁻", "right"), ("DF err µEh", "right"), ("t SCF", "right"), ("t mp2trn", "right"), ("t PySCF", "right"), ("t conv", "right"),
                      ("", "left")]:
        t.add_column(col, justify=just, no_wrap=True)
    for r in rows:
        if r.get("error"):
            t.add_row(r["name"], "", "", r["basis"], *[""] * 13, f"[red]ERROR[/] {r['error']}")
            continue
        status = "[green]ok[/]" if r["passed"] else "[red]FAIL[/]"
        name = r["name"] + ("" if not r["frozen"] else f" (fc {r['frozen']})")
        t.add_row(name, r["reference"], str(r["natm"]), r["basis"], r["nocc"], r["nvir"], str(r["naux"]),
                  f"{r['e_corr_mp2trn']:.10f}", f"{r['e_corr_pyscf']:.10f}", _ueh(r["abs_diff"]),
                  _ueh(r.get("scf_abs_diff")), str(r.get("ecp_core_electrons") or ""),
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
    if kind == "energy" and summary.get("max_scf_abs_diff") is not None:
        lines.append(f"max |E_SCF(mp2trn) − E_SCF(PySCF's own SCF, same bases and ECPs)| = {summary['max_scf_abs_diff']:.3g} Eh")
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
                "E_corr PySCF (Eh)", "\\|Δ\\| (µEh)", "\\|ΔE_SCF\\| vs PySCF's SCF (µEh)", "ECP core e⁻",
                "DF error (µEh)", "t SCF (s)", "t mp2trn (s)", "t PySCF (s)",
                "t conv. MP2 (s)"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            if r.get("error"):
                lines.append(f"| {r['name']} | ERROR: {r['error']} |" + " |" * (len(head) - 2))
                continue
            name = r["name"] + ("" if not r["frozen"] else f" (fc {r['frozen']})")
            cells = [name, r["reference"], r["natm"], r["basis"], r["nocc"], r["nvir"], r["naux"],
                     f"{r['e_corr_mp2trn']:.10f}", f"{r['e_corr_pyscf']:.10f}", _ueh(r["abs_diff"]),
                     _ueh(r.get("scf_abs_diff")), r.get("ecp_core_electrons") or 0,
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
    atomic_write(target, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    return target


def validation_document(mset: MoleculeSet, cfg: ValidationConfig, rows, summary, device: str, precision: str,
                        tolerance: float, command: str) -> dict[str, Any]:
    """The JSON document of one validation run (schema mp2trn_validation)."""
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
        "options": cfg.to_json(),
        "rows": rows,
        "summary": summary,
    }


def write_reports(out: Path, mset: MoleculeSet, doc: dict[str, Any], tol_text: str) -> list[str]:
    """Write the JSON, CSV and Markdown files of one run (atomically) and refresh the set's plot.

    Returns the names of the files written (the PNG only when matplotlib is installed)."""
    rows, summary = doc["rows"], doc["summary"]
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"validate_{mset.name}_{doc['device']}_{doc['precision']}"
    write_json_atomic(stem.with_suffix(".json"), doc)
    write_text_atomic(stem.with_suffix(".csv"), rows_csv(rows))
    md = (f"Command: `{doc['command']}`\n\nMachine: {machine_text(doc['machine'])}\n\n"
          + rows_markdown(mset.kind, rows) + "\n"
          + "\n".join(f"- {line}" for line in summary_lines(mset.kind, summary, tol_text)) + "\n")
    write_text_atomic(stem.with_suffix(".md"), md)
    png = plot_errors(out, mset.name, mset.kind)
    return [stem.with_suffix(s).name for s in (".csv", ".json", ".md")] + ([png.name] if png else [])
