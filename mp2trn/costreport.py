"""Rendering of an accelerator cost report (the dict an NKI device returns from ``cost_report()``, also
stored in the JSON output under ``extras.mp2trn.cost``).

For ``--device sim`` the report is a MODEL: the NKI emulator prices every instruction the kernels
executed with the per-instruction cycle formulas of the NKI ISA docs and the engine clocks of each
generation, so one emulated run gives a trn1 and a trn2 estimate. The table says so in its title.
For ``--device neuron`` the report holds measured wall times. For ``--device cpu`` it is the roofline
(:mod:`mp2trn.roofline`): each stage's measured seconds, achieved GFLOP/s and share of this machine's
DGEMM/SGEMM rate.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

STAGE_NAMES = {"scf_jk": "SCF J/K", "ao_to_mo": "ao_to_mo", "metric": "metric", "pairs": "pairs",
               "grad_pairs": "gradient pairs", "zvector": "Z-vector", "grad_gamma": "Γ → AO",
               "comm": "between ranks"}
KERNELS = ("SCF J/K = batched_gemm + syrk + coulomb, ao_to_mo = batched_gemm, metric = trsm, "
           "pairs = mp2_energy, gradient pairs = mp2_density, Z-vector and Γ → AO = gemm, "
           "between ranks = all_to_all_words + shift_words + gather_words")
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma", "cc")
_SHORT = {"tensor": "T", "vector": "V", "scalar": "S", "gpsimd": "G", "dma": "D", "cc": "C"}


def add_run_summary(cost: dict[str, Any], scf: dict[str, Any] | None, timings: dict[str, float]) -> None:
    """Add to a modeled cost report the modeled time per SCF cycle on the device and a whole-run estimate:
    the modeled device time of every stage plus the measured wall time of what ran on the host (PySCF's
    integrals and Cholesky factors, the SCF driver, fp64 J/K builds the device has no kernels for, the
    host sums), which is the run's wall time minus the time spent emulating the device kernels."""
    if cost.get("kind") != "model":
        return
    stage = cost.get("stages", {}).get("scf_jk")
    device_builds = sum(1 for p in (scf or {}).get("build_precisions", []) if "(host" not in p)
    if stage and device_builds:
        stage["device_builds"] = device_builds
        stage["modeled_time_per_build_s"] = {t: stage[t]["modeled_time_s"] / device_builds for t in ("trn1", "trn2")}
    # everything inside the launches (emulation, its checks and copies) is not host work on an instance
    host_s = max(0.0, timings.get("total", 0.0) - cost.get("launch_wall_s", cost.get("emulation_wall_s", 0.0)))
    cost["whole_run"] = {
        "host_measured_s": host_s,
        "modeled_device_s": {t: cost["total"][t]["modeled_time_s"] for t in ("trn1", "trn2")},
        "modeled_total_s": {t: cost["total"][t]["modeled_time_s"] + host_s for t in ("trn1", "trn2")},
        "host_parts": "PySCF integrals and Cholesky factors, the SCF driver (DIIS, diagonalisation), the "
                      "SCF's fp64 J/K builds (no fp64 on Trainium), host sums and I/O — measured on this machine",
    }


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}"


def _te(cost: dict[str, Any], summary: dict[str, Any]) -> str:
    """TensorE FLOP/s as % of the fp32 peak; '-' for fp32x3, whose bf16 matmuls run 4x faster than fp32
    ones (its TensorE load is in the busy% column)."""
    if cost.get("precision") != "fp32":
        return "-"
    return f"{summary.get('tensor_peak_pct_fp32', 0):.1f}"


def _util(summary: dict[str, Any]) -> str:
    u = summary.get("engine_utilization", {})
    return " ".join(f"{_SHORT[e]}{100 * u.get(e, 0.0):.0f}" for e in ENGINES if e in u)


def cost_table(cost: dict[str, Any]) -> Table:
    """A rich table: per stage launches, modeled trn1/trn2 time, bottleneck, TensorE % of fp32 peak and
    engine utilization (busy time / modeled time) — or measured wall times for ``neuron``."""
    if cost.get("kind") == "measured":
        return _measured_table(cost)
    if cost.get("kind") == "roofline":
        return _roofline_table(cost)
    table = Table(
        title=(f"MODELED Trainium time (NKI emulator cost model, not a measurement); "
               f"blocks planned for {cost.get('target')}, precision {cost.get('precision')}"),
        title_justify="left",
        caption=(f"kernels: {KERNELS}. TE% = TensorE FLOP/s as % of fp32 peak (trn1, fp32 runs); "
                 "busy% = engine busy / modeled time on trn1 (T tensor, V vector, S scalar, G gpsimd, D dma, C collectives)"),
        caption_justify="left",
    )
    for col, just in (("stage", "left"), ("launches", "right"), ("compiles", "right"), ("trn1 ms", "right"),
                      ("trn2 ms", "right"), ("bound", "left"), ("TE%", "right"), ("busy%", "left")):
        table.add_column(col, justify=just)
    for stage, entry in cost.get("stages", {}).items():
        t1, t2 = entry.get("trn1", {}), entry.get("trn2", {})
        table.add_row(STAGE_NAMES.get(stage, stage), str(entry.get("launches", "")), str(entry.get("compiles", "")),
                      _ms(t1.get("modeled_time_s", 0)), _ms(t2.get("modeled_time_s", 0)), str(t1.get("bottleneck", "")),
                      _te(cost, t1), _util(t1))
    tot = cost.get("total", {})
    if tot:
        t1, t2 = tot.get("trn1", {}), tot.get("trn2", {})
        table.add_row("total", str(cost.get("launches", "")), str(cost.get("compiles", "")),
                      _ms(t1.get("modeled_time_s", 0)), _ms(t2.get("modeled_time_s", 0)), "", _te(cost, t1), _util(t1),
                      style="bold")
    for label, trn1, trn2 in summary_rows(cost):
        table.add_row(label, "", "", trn1, trn2, "", "", "", style="dim")
    return table


def summary_rows(cost: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, trn1 ms, trn2 ms) for the modeled SCF cycle and the whole-run estimate, when present."""
    rows = []
    per = cost.get("stages", {}).get("scf_jk", {}).get("modeled_time_per_build_s")
    if per:
        rows.append(("per SCF J/K build", _ms(per["trn1"]), _ms(per["trn2"])))
    whole = cost.get("whole_run")
    if whole:
        rows.append((f"whole run (host {whole['host_measured_s']:.2f} s measured)",
                     _ms(whole["modeled_total_s"]["trn1"]), _ms(whole["modeled_total_s"]["trn2"])))
    return rows


def _measured_table(cost: dict[str, Any]) -> Table:
    table = Table(title=f"NeuronCore wall time ({cost.get('target')}, measured, incl. host<->device copies)",
                  title_justify="left")
    table.add_column("stage")
    table.add_column("launches", justify="right")
    table.add_column("compiles", justify="right")
    table.add_column("wall ms", justify="right")
    for stage, entry in cost.get("stages", {}).items():
        table.add_row(STAGE_NAMES.get(stage, stage), str(entry.get("launches", "")), str(entry.get("compiles", "")),
                      _ms(entry.get("wall_s", 0.0)))
    cache = cost.get("compile_cache")
    if cache:
        table.caption = (f"compile cache {cache['directory']}: {cache['hits']} hits, {cache['misses']} misses "
                         "(a miss is a NEFF compile)")
    return table


def _stage_label(entry: dict[str, Any]) -> str:
    return f"{STAGE_NAMES.get(entry['stage'], entry['stage'])} ({entry['precision']})"


def _rates_note(cost: dict[str, Any]) -> str:
    rates = cost.get("gemm_rates", {})
    load = rates.get("load_average")
    return (f"this machine's DGEMM {rates.get('fp64_gflops', 0):.0f}, SGEMM {rates.get('fp32_gflops', 0):.0f} GFLOP/s "
            f"({rates.get('n')}³ GEMM measured {rates.get('measured')}"
            + (f" at load average {load:.1f}" if load is not None else "") + f"; cached in {rates.get('cache')}"
            + (f"; measured again: {rates['remeasured']}" if rates.get("remeasured") else "") + ")")


def _roofline_table(cost: dict[str, Any]) -> Table:
    table = Table(title="CPU roofline (measured): each stage's rate against this machine's GEMM rate",
                  title_justify="left", caption=f"{_rates_note(cost)}. Counted: {cost.get('counted')}.",
                  caption_justify="left")
    for col, just in (("stage", "left"), ("calls", "right"), ("s", "right"), ("GFLOP", "right"),
                      ("GFLOP/s", "right"), ("of", "left"), ("share", "right")):
        table.add_column(col, justify=just)
    for entry in cost.get("stages", {}).values():
        table.add_row(_stage_label(entry), str(entry["calls"]), f"{entry['seconds']:.3f}", f"{entry['gflop']:.2f}",
                      f"{entry['gflops_per_s']:.1f}", f"{entry['gemm']} {entry['gemm_gflops_per_s']:.0f}",
                      f"{100 * entry['share_of_gemm']:.0f}%")
    return table


def cost_lines(cost: dict[str, Any]) -> list[str]:
    """The same information as plain text lines (scripts, logs)."""
    lines = []
    if cost.get("kind") == "roofline":
        lines.append(f"CPU roofline (measured); {_rates_note(cost)}")
        for entry in cost.get("stages", {}).values():
            lines.append(f"  {_stage_label(entry):24s} {entry['seconds']:8.3f} s  "
                         f"{entry['gflops_per_s']:7.1f} GFLOP/s  {100 * entry['share_of_gemm']:3.0f}% of {entry['gemm']}")
        return lines
    if cost.get("kind") == "measured":
        lines.append(f"NeuronCore wall time ({cost.get('target')}), {cost.get('launches')} launches")
        for stage, e in cost.get("stages", {}).items():
            lines.append(f"  {stage:9s} launches {e['launches']:4d}  wall {_ms(e['wall_s'])} ms")
        return lines
    lines.append(f"MODELED Trainium cost (NKI emulator cost model, not a measurement); "
                 f"target {cost.get('target')}, precision {cost.get('precision')}, {cost.get('launches')} launches")
    rows = list(cost.get("stages", {}).items()) + [("total", {**cost.get("total", {}), "launches": cost.get("launches")})]
    for stage, e in rows:
        t1, t2 = e.get("trn1", {}), e.get("trn2", {})
        lines.append(f"  {stage:9s} launches {e.get('launches', 0):4d}  trn1 {_ms(t1.get('modeled_time_s', 0))} ms  "
                     f"trn2 {_ms(t2.get('modeled_time_s', 0))} ms  bottleneck {t1.get('bottleneck', '-')}  "
                     f"TensorE {_te(cost, t1)}% fp32 peak  util {_util(t1)}")
    lines += [f"  {label}: trn1 {trn1} ms  trn2 {trn2} ms" for label, trn1, trn2 in summary_rows(cost)]
    return lines
