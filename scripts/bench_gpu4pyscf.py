"""mp2trn's ``cuda`` device against GPU4PySCF on one NVIDIA GPU: DF-RHF followed by DF-MP2, same molecules,
same bases, energies and wall times side by side.

    python scripts/bench_gpu4pyscf.py                       # both engines, Inosine and Penicillin V, cc-pVDZ
    python scripts/bench_gpu4pyscf.py --engine mp2trn --out a.jsonl      # one engine's records only
    python scripts/bench_gpu4pyscf.py --table a.jsonl b.jsonl [--write-docs]
    python scripts/bench_gpu4pyscf.py --compare overlap --out c.jsonl  # mp2trn cuda, host blocks made ahead or not
    python scripts/bench_gpu4pyscf.py --compare hold --out d.jsonl     # mp2trn cuda, B held on the GPU or sent

Both engines get the same problem: cc-pVDZ, the SCF fitted with cc-pVDZ-JKFIT and MP2 with cc-pVDZ-RI, all
electrons correlated, SCF converged to 1e-10 Eh. Every calculation is a fresh process, timed from outside
(process wall, imports and CUDA start included) and inside (SCF and MP2 stages, each engine's own clock);
each case runs ``--repeat`` times so the first run's one-off costs (CUDA context, kernel compilation and
caches) show next to the warm ones. GPU4PySCF (``gpu4pyscf-cuda12x``/``-cuda13x``) is not a dependency of
mp2trn: install it beside it on the GPU machine (where nothing can be fetched: ``scripts/pack_gpu4pyscf.py``).
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORGANIC = ROOT / "molecules" / "gpu4pyscf" / "organic"
MOLECULES = {"inosine": ORGANIC / "031_Inosine.xyz", "penicillin": ORGANIC / "042_Penicillin_V.xyz",
             "vitaminc": ORGANIC / "020_Vitamin_C.xyz", "water": ROOT / "molecules" / "water.xyz"}
BASIS, JKBASIS, AUXBASIS = "cc-pvdz", "cc-pvdz-jkfit", "cc-pvdz-ri"
#: the SCF's convergence: energy change (Eh) and, where set, orbital gradient (each engine's default otherwise,
#: PySCF's being √conv_tol); ``--conv-tol``/``--conv-tol-grad`` change both for one invocation
CONV = {"conv_tol": 1e-10, "conv_tol_grad": None}
BEGIN, END = "<!-- BEGIN bench_gpu4pyscf -->", "<!-- END bench_gpu4pyscf -->"


def _converge(mf) -> None:
    """The invocation's convergence settings (:data:`CONV`) on a PySCF or GPU4PySCF mean-field object."""
    mf.conv_tol = CONV["conv_tol"]
    if CONV["conv_tol_grad"]:
        mf.conv_tol_grad = CONV["conv_tol_grad"]


def gpu4pyscf_worker(xyz: Path, fp_type: str) -> dict:
    """One DF-RHF + DF-MP2 with GPU4PySCF in this process; energies (Eh) and stage times (s)."""
    t_start = time.perf_counter()
    import cupy
    import gpu4pyscf
    from gpu4pyscf import scf
    from gpu4pyscf.mp import dfmp2
    from pyscf import gto
    t_import = time.perf_counter()
    mol = gto.M(atom=str(xyz), basis=BASIS, verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=JKBASIS)
    _converge(mf)
    e_scf = float(mf.kernel())
    cupy.cuda.Device().synchronize()
    t_scf = time.perf_counter()
    mp = dfmp2.DFMP2(mf, auxbasis=AUXBASIS)
    mp.fp_type = fp_type
    e_corr = float(mp.kernel()[0])
    cupy.cuda.Device().synchronize()
    t_mp2 = time.perf_counter()
    return {"engine": "gpu4pyscf", "version": gpu4pyscf.__version__, "precision": fp_type.lower(),
            "converged": bool(mf.converged), "scf_cycles": int(getattr(mf, "cycles", -1)),
            "e_scf": e_scf, "e_corr": e_corr, "e_tot": e_scf + e_corr, "nao": mol.nao,
            "import_s": t_import - t_start, "scf_s": t_scf - t_import, "mp2_s": t_mp2 - t_scf,
            "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()}


def pyscf_worker(xyz: Path) -> dict:
    """PySCF's own DF-RHF + DFMP2 on the host's CPU cores, the same problem: the reference energies both GPU
    engines are held to (its times are this machine's CPU, not a GPU)."""
    t_start = time.perf_counter()
    import pyscf
    from pyscf import df, gto, scf
    from pyscf.mp import dfmp2
    t_import = time.perf_counter()
    mol = gto.M(atom=str(xyz), basis=BASIS, verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=JKBASIS)
    _converge(mf)
    mf.max_memory = 16000
    e_scf = float(mf.kernel())
    t_scf = time.perf_counter()
    mp = dfmp2.DFMP2(mf)
    mp.with_df, mp.max_memory = df.DF(mol, auxbasis=AUXBASIS), 16000
    e_corr = float(mp.kernel()[0])
    t_mp2 = time.perf_counter()
    return {"engine": "pyscf", "version": pyscf.__version__, "precision": "fp64", "converged": bool(mf.converged),
            "scf_cycles": int(getattr(mf, "cycles", -1)), "e_scf": e_scf, "e_corr": e_corr, "e_tot": e_scf + e_corr,
            "nao": mol.nao, "import_s": t_import - t_start, "scf_s": t_scf - t_import, "mp2_s": t_mp2 - t_scf,
            "gpu": f"none (PySCF on {os.cpu_count()} CPU cores)", "cpu_cores": os.cpu_count()}


WORKERS = {"gpu4pyscf": lambda xyz, precision: gpu4pyscf_worker(xyz, precision.upper()),
           "pyscf": lambda xyz, precision: pyscf_worker(xyz)}


#: the benchmark switches of the cuda device: host blocks made ahead of the GPU (mp2trn.overlap), B held in GPU
#: memory between the pair launches (TorchDevice.hold); each on unless its variable is 0
SWITCHES = {"overlap": "MP2TRN_OVERLAP", "hold": "MP2TRN_HOLD_B"}


def run_mp2trn(xyz: Path, precision: str, gradient: bool = False, off: str | None = None) -> dict:
    """One ``mp2trn run --device cuda`` in a fresh process; its record from the JSON document. ``off``: a
    switch of :data:`SWITCHES` turned off."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        env = {**os.environ, **{var: "0" if name == off else "1" for name, var in SWITCHES.items()}}
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "mp2trn", "run", str(xyz), "--device", "cuda", "--precision",
                               precision, "--basis", BASIS, "--jkbasis", JKBASIS, "--auxbasis", AUXBASIS,
                               "--frozen-core", "none", *_conv_flags(), "--json", str(out), "-q",
                               *(["--gradient"] if gradient else [])],
                              capture_output=True, text=True, cwd=ROOT, env=env)
        wall = time.perf_counter() - t0
        if done.returncode != 0:   # mp2trn's CLI prints one line on failure
            print(done.stderr[-4000:], file=sys.stderr)
            return {"engine": "mp2trn", "precision": precision, "gradient": gradient, "off": off, "wall_s": wall,
                    "error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
        doc = json.loads(out.read_text())
    props, extras = doc["properties"], doc["extras"]["mp2trn"]
    timings = extras["timings"]
    return {"engine": "mp2trn", "version": doc["provenance"]["version"], "precision": precision,
            "converged": True, "scf_cycles": props["scf_iterations"], "e_scf": props["scf_total_energy"],
            "e_corr": props["mp2_correlation_energy"], "e_tot": props["mp2_total_energy"],
            "nao": props["calcinfo_nbasis"], "wall_s": wall, "scf_s": timings["scf"], "mp2_s": timings["mp2"],
            "gpu": extras.get("gpu", "?"), "timings": timings, "off": off, "gradient": gradient,
            "b_on_device": extras.get("b_on_device"),
            "scf_detail": {k: extras["scf"].get(k) for k in ("tensor_seconds", "jk_seconds", "jk_builds",
                                                              "build_precisions", "tensor", "seconds")}}


def switch_records(switch: str, molecule: str, repeat: int, out: Path | None) -> list[dict]:
    """mp2trn's cuda energy and gradient runs with ``switch`` on and off, alternating."""
    records = []
    for gradient in (False, True):
        for attempt in range(1, repeat + 1):
            for off in (None, switch):
                records.append(_kept({"molecule": molecule, "run": attempt, "switch": switch,
                                      **run_mp2trn(MOLECULES[molecule], "fp64", gradient, off)}, out))
    return records


def _conv_flags() -> list[str]:
    """:data:`CONV` as command-line flags (mp2trn's and this script's worker's are the same)."""
    return [f"--{k.replace('_', '-')}={v}" for k, v in CONV.items() if v is not None]


def _kept(record: dict, out: Path | None) -> dict:
    """Print ``record`` and append it to ``out`` (as it comes, so a killed benchmark keeps what it did)."""
    record = {**record, **{k: v for k, v in CONV.items() if v is not None and "error" not in record}}
    print(json.dumps(record), flush=True)
    if out:
        with out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
    return record


def run_worker(engine: str, xyz: Path, precision: str) -> dict:
    """One GPU4PySCF (or PySCF) calculation in a fresh process (this script as its worker). A failed run is
    kept as a record with its error (the last lines the worker wrote), so the engines that did run still get
    their rows."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--worker", str(xyz), "--worker-engine", engine,
                           "--precision", precision, *_conv_flags()], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-3:]
        print(done.stderr[-4000:], file=sys.stderr)
        return {"engine": engine, "precision": precision, "error": " / ".join(tail) or f"exit {done.returncode}",
                "wall_s": time.perf_counter() - t0}
    record = json.loads(done.stdout.strip().splitlines()[-1])
    record["wall_s"] = time.perf_counter() - t0
    return record


#: engine -> (runner, precisions); PySCF only as the CPU reference for the energies ("--engine pyscf", once)
ENGINES = {"mp2trn": (run_mp2trn, ("fp64", "fp32")),
           "gpu4pyscf": (lambda xyz, precision: run_worker("gpu4pyscf", xyz, precision), ("fp64", "fp32")),
           "pyscf": (lambda xyz, precision: run_worker("pyscf", xyz, precision), ("fp64",))}


def measure(engines: list[str], molecules: list[str], repeat: int, out: Path | None,
            gradients: int = 0) -> list[dict]:
    """Each engine's energies (``repeat`` fresh processes per precision), then ``gradients`` mp2trn fp64
    gradient runs per molecule."""
    records = []
    for name in molecules:
        for engine in engines:
            runner, precisions = ENGINES[engine]
            for precision in precisions:
                for attempt in range(1, repeat + 1):
                    records.append(_kept({"molecule": name, "run": attempt, **runner(MOLECULES[name], precision)},
                                         out))
                    if "error" in records[-1]:
                        break          # the same failure again would only cost GPU time
        if "mp2trn" in engines:
            for attempt in range(1, gradients + 1):
                records.append(_kept({"molecule": name, "run": attempt,
                                      **run_mp2trn(MOLECULES[name], "fp64", gradient=True)}, out))
    return records


def table(records: list[dict]) -> list[str]:
    """Markdown rows: each engine's last (warm) run per molecule and precision, energies against GPU4PySCF's."""
    warm: dict[tuple, dict] = {}
    first: dict[tuple, dict] = {}
    failed = [r for r in records if "error" in r]
    for r in (r for r in records if "error" not in r and not r.get("gradient")):
        key = (r["molecule"], r["engine"], r["precision"], r.get("conv_tol", 1e-10), r.get("conv_tol_grad"))
        warm[key] = r if key not in warm or r["run"] >= warm[key]["run"] else warm[key]
        first.setdefault(key, r)
    rows = ["| molecule | engine | precision | nao | SCF cycles | SCF (s) | MP2 (s) | process wall, warm (s) | "
            "first run (s) | E(SCF) (Eh) | E(MP2 corr.) (Eh) | ΔE(total) vs GPU4PySCF (Eh) | "
            "ΔE(total) vs PySCF, CPU (Eh) |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key in sorted(warm, key=lambda k: (*k[:3], -k[3], k[4] or 0.0)):   # the default tolerance first
        r = warm[key]
        deltas = []
        for engine in ("gpu4pyscf", "pyscf"):
            ref = warm.get((r["molecule"], engine, "fp64", *key[3:]))
            deltas.append(f"{r['e_tot'] - ref['e_tot']:+.1e}" if ref and ref is not r else "—")
        label = f"{r['engine']} {r['version']}" + (" on the CPU" if r["engine"] == "pyscf" else "")
        if key[3:] != (1e-10, None):
            label += f", SCF to {key[3]:g} Eh" + (f" / gradient {key[4]:g}" if key[4] else "")
        rows.append(f"| {r['molecule']} | {label} | {r['precision']} | {r['nao']} | "
                    f"{r['scf_cycles']} | {r['scf_s']:.2f} | {r['mp2_s']:.2f} | {r['wall_s']:.1f} | "
                    f"{first[key]['wall_s']:.1f} | {r['e_scf']:.8f} | {r['e_corr']:.8f} | {' | '.join(deltas)} |")
    gpus = sorted({r["gpu"] for r in records if "gpu" in r and r["engine"] != "pyscf"})
    notes = [f"- {r['engine']} {r['precision']} on {r['molecule']} failed: {r['error']}" for r in failed]
    return rows + ([""] + [f"GPU: {', '.join(gpus)}."] if gpus else []) + ([""] + notes if notes else [])


def gradient_table(records: list[dict]) -> list[str]:
    """Markdown rows: mp2trn's gradient runs on the GPU, their stage clocks against the warm energy run's."""
    energy = {r["molecule"]: r for r in records
              if r.get("engine") == "mp2trn" and r.get("precision") == "fp64" and not r.get("gradient")
              and "error" not in r}
    rows = ["| molecule | run | gradient run, stages (s) | of which gradient stages (s) | energy run, stages (s) | "
            "ratio | process wall (s) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in (r for r in records if r.get("gradient") and not r.get("off") and "error" not in r):
        e = energy.get(r["molecule"])
        total, e_total = r["timings"]["total"], e["timings"]["total"] if e else float("nan")
        grad = total - r["timings"]["scf"] - r["timings"]["mp2"]
        rows.append(f"| {r['molecule']} | {r['run']} | {total:.1f} | {grad:.1f} | {e_total:.2f} | "
                    f"{total / e_total:.1f}x | {r['wall_s']:.1f} |")
    return rows if len(rows) > 2 else []


def write_docs(rows: list[str], command: str) -> None:
    """The table between this script's markers in docs/benchmarks.md (written atomically)."""
    from mp2trn.files import replace_marked_block

    replace_marked_block(ROOT / "docs" / "benchmarks.md", BEGIN, END, "\n".join([BEGIN, f"`{command}`", "", *rows, END]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both",
                        help="both: mp2trn and GPU4PySCF on the GPU machine; pyscf: the CPU reference energies")
    parser.add_argument("--molecules", nargs="+", choices=list(MOLECULES), default=["inosine", "penicillin"])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--gradients", type=int, default=0, help="mp2trn fp64 gradient runs per molecule")
    parser.add_argument("--out", type=Path, help="append each record to this JSON-lines file")
    parser.add_argument("--table", nargs="+", type=Path, help="print the table from these JSON-lines files")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--compare", choices=list(SWITCHES), help="mp2trn cuda runs with this switch on and off")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="fp64", help=argparse.SUPPRESS)
    parser.add_argument("--conv-tol", type=float, default=CONV["conv_tol"], help="the SCF's energy convergence (Eh)")
    parser.add_argument("--conv-tol-grad", type=float, help="the SCF's orbital-gradient convergence (default: √conv-tol)")
    parser.add_argument("--worker-engine", choices=list(WORKERS), default="gpu4pyscf", help=argparse.SUPPRESS)
    args = parser.parse_args()
    CONV.update(conv_tol=args.conv_tol, conv_tol_grad=args.conv_tol_grad)
    if args.worker:
        print(json.dumps(WORKERS[args.worker_engine](args.worker, args.precision)))
        return
    if args.compare:
        switch_records(args.compare, args.molecules[0], args.repeat, args.out)
        return
    if args.table:
        records = [json.loads(line) for path in args.table for line in path.read_text().splitlines() if line.strip()]
        records = [r for r in records if not r.get("off") and r.get("overlap", True)]
    else:
        engines = ["mp2trn", "gpu4pyscf"] if args.engine == "both" else [args.engine]
        records = measure(engines, args.molecules, args.repeat, args.out, args.gradients)
    rows = table(records) + ([""] + gradient_table(records) if gradient_table(records) else [])
    print("\n".join(rows))
    if args.write_docs:
        write_docs(rows, "python scripts/bench_gpu4pyscf.py" +
                   (" --table " + " ".join(str(t) for t in args.table) if args.table else ""))


if __name__ == "__main__":
    main()
