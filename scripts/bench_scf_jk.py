"""Where an SCF with device J/K spends its time, and what the mixed-precision switch point changes.

    python scripts/bench_scf_jk.py                       # Inosine/cc-pVDZ, cpu
    python scripts/bench_scf_jk.py --trace               # ΔE and gradient per cycle, fp64 and mixed
    python scripts/bench_scf_jk.py --sweep 2e-6 1e-8 1e-9 1e-10
    python scripts/bench_scf_jk.py --grad-sweep 1e-3 1e-4 --reset-diis
    python scripts/bench_scf_jk.py --incremental --device cpu --xyz molecules/benzene.xyz
    python scripts/bench_scf_jk.py --mixed               # also the default mixed SCF's build times

Prints the time of PySCF's own 3-index (Cholesky) tensor build, then for an fp64 SCF with device J/K:
the first J/K build (which moves the tensor to the device), the median of the later builds, the number of
builds and the SCF wall time; with ``--mixed`` the same for the default mixed (fp32 → fp64) SCF, the median
of its later fp32 builds and of its fp64 builds. With ``--trace`` instead, an fp64 and a mixed SCF (the default switch
rules) cycle by cycle: precision, ΔE and the orbital-gradient norm. With ``--sweep``, fp32 (mixed) SCFs
that switch on the energy alone (|ΔE| per cycle below threshold·|E|): cycles in fp32 and in fp64, SCF time,
and the energy. With ``--grad-sweep``, fp32
SCFs that switch on the orbital gradient instead (norm of PySCF's ``norm_gorb`` below the threshold; the
energy rules off, at most 40 fp32 cycles), optionally clearing the DIIS history at the switch; prints the
last fp32 gradients too. With ``--incremental``, the device's mixed schedule with full and with
difference-density builds in one process (mp2trn.jk.PrecisionSchedule): cycles per precision, J/K seconds
and their ratio, the energy against the fp64 SCF's. A benchmark: it prints measurements and asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from pyscf import scf

from mp2trn.jk import PrecisionSchedule, density_fit_jk, precision_runs
from mp2trn.machine import machine_description
from mp2trn.memory import default_memory_mb
from mp2trn.molecule import build_mole

ROOT = Path(__file__).resolve().parents[1]


def scf_with_device_jk(mol, precision: str, device: str, switch_rel: float | None = None,
                       grad_switch: float | None = None, reset_diis: bool = False):
    mf = scf.RHF(mol).density_fit()
    mf.verbose, mf.conv_tol, mf.max_memory = 0, 1e-10, default_memory_mb()
    t0 = time.perf_counter()
    mf.with_df.build()
    t_tensor = time.perf_counter() - t0
    mf = density_fit_jk(mf, device=device, precision=precision, max_memory=default_memory_mb())
    if switch_rel is not None:   # the energy rule alone
        sched = mf.with_df.log.schedule
        sched.switch_rel, sched.switch_grad, sched.min_reduced = switch_rel, 0.0, 10**9
    if grad_switch is not None:
        _switch_on_gradient(mf, grad_switch, reset_diis)
    t0 = time.perf_counter()
    mf.kernel()
    return mf, t_tensor, time.perf_counter() - t0


def _switch_on_gradient(mf, threshold: float, reset_diis: bool) -> None:
    """The precision switch on a bare gradient threshold (no stall rule, at most 40 fp32 cycles); the fp32
    cycles' gradient norms go to ``mf.with_df.gradients``; ``reset_diis`` clears DIIS at the switch."""
    jk = mf.with_df
    log = jk.log
    log.schedule = PrecisionSchedule(log.schedule.start, switch_grad=threshold, min_reduced=10**9, max_reduced=40)
    jk.gradients = []

    def after_cycle(envs):   # PySCF calls it after check_convergence, where the schedule switched
        if not log.cycles[-1].startswith(log.schedule.start.name):
            return
        jk.gradients.append(envs["norm_gorb"])
        if reset_diis and not log.schedule.reduced and envs.get("mf_diis") is not None:
            d = envs["mf_diis"]   # PySCF's DIIS has no public reset: clear its history
            d._buffer, d._bookkeep, d._head, d._H, d._xprev = {}, [], 0, None, None

    mf.callback = after_cycle


def trace(mol, device: str) -> None:
    """Per cycle of an fp64 and a mixed (fp32, default switch rules) SCF: precision, ΔE and gradient norm."""
    for precision in ("fp64", "fp32"):
        mf = density_fit_jk(scf.RHF(mol).density_fit(), device=device, precision=precision,
                            max_memory=default_memory_mb())
        mf.verbose, mf.conv_tol, mf.max_memory = 0, 1e-10, default_memory_mb()
        rows = []
        mf.callback = lambda env: rows.append((env["cycle"], env["e_tot"] - env["last_hf_e"], env["norm_gorb"]))
        t0 = time.perf_counter()
        mf.kernel()
        t = time.perf_counter() - t0
        print(f"\n{precision} SCF: {t:.1f} s, cycles {precision_runs(mf.with_df.log.cycles)}, E = {mf.e_tot:.10f}")
        print("| cycle | precision | ΔE (Eh) | gradient norm |\n|---:|---|---:|---:|")
        for (cycle, de, g), label in zip(rows, mf.with_df.log.cycles):
            print(f"| {cycle} | {label} | {de:+.2e} | {g:.2e} |")


def incremental(mol, device: str) -> None:
    """The device's default precision schedule with full and with difference-density builds, one process."""
    ref, _, _ = scf_with_device_jk(mol, "fp64", "cpu")
    print("\n| builds | cycles | incremental builds | J/K (s) | SCF (s) | E − E(cpu fp64) (Eh) |")
    print("|---|---|---:|---:|---:|---:|")
    seconds = {}
    for inc in (False, True):
        mf = density_fit_jk(scf.RHF(mol).density_fit(), device=device, precision="fp32", incremental=inc)
        mf.conv_tol, mf.verbose = 1e-10, 0
        t0 = time.perf_counter()
        mf.kernel()
        t = time.perf_counter() - t0
        record = mf.with_df.jk_record()
        seconds[inc] = record["jk_seconds"]
        print(f"| {'difference density' if inc else 'full'} | {precision_runs(record['precision_per_cycle'])} | "
              f"{record['incremental_builds']} | {record['jk_seconds']:.2f} | {t:.2f} | {mf.e_tot - ref.e_tot:.1e} |")
    print(f"J/K seconds, difference-density / full: {seconds[True] / seconds[False]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xyz", default=str(ROOT / "molecules/gpu4pyscf/organic/031_Inosine.xyz"))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--trace", action="store_true", help="only: ΔE and gradient per cycle, fp64 and mixed SCF")
    ap.add_argument("--sweep", nargs="*", type=float, default=[],
                    help="energy switch thresholds for fp32 SCFs (the energy rule alone)")
    ap.add_argument("--grad-sweep", nargs="*", type=float, default=[], help="orbital-gradient switch thresholds")
    ap.add_argument("--incremental", action="store_true", help="only: full against difference-density builds")
    ap.add_argument("--reset-diis", action="store_true", help="with --grad-sweep: clear DIIS at the switch")
    ap.add_argument("--mixed", action="store_true",
                    help="also the default mixed (fp32 → fp64) SCF: the median of its fp32 and of its fp64 builds")
    args = ap.parse_args()
    mol = build_mole(args.xyz, basis=args.basis)
    print(f"{Path(args.xyz).stem}/{args.basis}, device {args.device}; {machine_description()}")
    if args.trace:
        trace(mol, args.device)
        return
    if args.incremental:
        incremental(mol, args.device)
        return
    mf, t_tensor, t_scf = scf_with_device_jk(mol, "fp64", args.device)
    builds = [b["seconds"] for b in mf.with_df.log.builds]
    print(f"PySCF 3-index tensor build: {t_tensor:.2f} s")
    print(f"fp64 SCF: {t_scf:.2f} s, {mf.cycles} cycles, {len(builds)} J/K builds; first build {builds[0]:.2f} s, "
          f"later builds median {statistics.median(builds[1:]):.3f} s")
    if args.mixed:
        mf, _, t_scf = scf_with_device_jk(mol, "fp32", args.device)
        by = {p: [b["seconds"] for b in mf.with_df.log.builds[1:] if b["precision"] == p] for p in ("fp32", "fp64")}
        print(f"mixed SCF: {t_scf:.2f} s, {mf.cycles} cycles; later builds median fp32 "
              f"{statistics.median(by['fp32']):.3f} s ({len(by['fp32'])}), fp64 {statistics.median(by['fp64']):.3f} s "
              f"({len(by['fp64'])})")
    if args.sweep:
        print("\n| switch threshold ·abs(E) | fp32 cycles | fp64 cycles | SCF (s) | E_SCF (Eh) |")
        print("|---:|---:|---:|---:|---:|")
    for rel in args.sweep:
        mf, _, t = scf_with_device_jk(mol, "fp32", args.device, rel)
        cyc = mf.with_df.log.cycles
        print(f"| {rel:g} | {cyc.count('fp32')} | {len(cyc) - cyc.count('fp32')} | {t:.1f} | {mf.e_tot:.10f} |")
    if args.grad_sweep:
        print(f"\n| gradient switch (DIIS {'cleared' if args.reset_diis else 'kept'}) | fp32 cycles | fp64 cycles | "
              "SCF (s) | E_SCF (Eh) | last fp32 gradients |")
        print("|---:|---:|---:|---:|---:|---|")
    for g in args.grad_sweep:
        mf, _, t = scf_with_device_jk(mol, "fp32", args.device, grad_switch=g, reset_diis=args.reset_diis)
        cyc = mf.with_df.log.cycles
        tail = " ".join(f"{x:.0e}" for x in mf.with_df.gradients[-4:])
        print(f"| {g:g} | {cyc.count('fp32')} | {len(cyc) - cyc.count('fp32')} | {t:.1f} | {mf.e_tot:.10f} | {tail} |")


if __name__ == "__main__":
    main()
