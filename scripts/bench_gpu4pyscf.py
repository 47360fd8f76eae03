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
mp2trn: install it beside it on the GPU machine. A benchmark, not a test.
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
             "vitaminc": ORGANIC / "020_Vitamin_C.xyz"}
BASIS, JKBASIS, AUXBASIS, CONV_TOL = "cc-pvdz", "cc-pvdz-jkfit", "cc-pvdz-ri", 1e-10
BEGIN, END = "<!-- BEGIN bench_gpu4pyscf -->", "<!-- END bench_gpu4pyscf -->"


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
    mf.conv_tol = CONV_TOL
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
        subprocess.run([sys.executable, "-m", "mp2trn", "run", str(xyz), "--device", "cuda", "--precision", precision,
                        "--basis", BASIS, "--jkbasis", JKBASIS, "--auxbasis", AUXBASIS, "--frozen-core", "none",
                        "--conv-tol", str(CONV_TOL), "--json", str(out), "-q", *(["--gradient"] if gradient else [])],
                       check=True, cwd=ROOT, env=env)
        wall = time.perf_counter() - t0
        doc = json.loads(out.read_text())
    props, extras = doc["properties"], doc["extras"]["mp2trn"]
    timings = extras["timings"]
    return {"engine": "mp2trn", "version": doc["provenance"]["version"], "precision": precision,
            "converged": True, "scf_cycles": props["scf_iterations"], "e_scf": props["scf_total_energy"],
            "e_corr": props["mp2_correlation_energy"], "e_tot": props["mp2_total_energy"],
            "nao": props["calcinfo_nbasis"], "wall_s": wall, "scf_s": timings["scf"], "mp2_s": timings["mp2"],
            "gpu": extras.get("gpu", "?"), "timings": timings, "off": off, "gradient": gradient,
            "b_on_device": extras.get("b_on_device")}


def switch_records(switch: str, molecule: str, repeat: int, out: Path | None) -> list[dict]:
    """mp2trn's cuda energy and gradient runs with ``switch`` on and off, alternating."""
    records = []
    for gradient in (False, True):
        for attempt in range(1, repeat + 1):
            for off in (None, switch):
                records.append(_kept({"molecule": molecule, "run": attempt, "switch": switch,
                                      **run_mp2trn(MOLECULES[molecule], "fp64", gradient, off)}, out))
    return records


def _kept(record: dict, out: Path | None) -> dict:
    """Print ``record`` and append it to ``out`` (as it comes, so a killed benchmark keeps what it did)."""
    print(json.dumps(record), flush=True)
    if out:
        with out.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
    return record


def run_gpu4pyscf(xyz: Path, precision: str) -> dict:
    """One GPU4PySCF calculation in a fresh process (this script as its worker)."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--worker", str(xyz), "--precision", precision],
                          check=True, capture_output=True, text=True, cwd=ROOT)
    record = json.loads(done.stdout.strip().splitlines()[-1])
    record["wall_s"] = time.perf_counter() - t0
    return record


ENGINES = {"mp2trn": (run_mp2trn, ("fp64", "fp32")), "gpu4pyscf": (run_gpu4pyscf, ("fp64",))}


def measure(engines: list[str], molecules: list[str], repeat: int, out: Path | None) -> list[dict]:
    records = []
    for name in molecules:
        for engine in engines:
            runner, precisions = ENGINES[engine]
            for precision in precisions:
                for attempt in range(1, repeat + 1):
                    records.append(_kept({"molecule": name, "run": attempt, **runner(MOLECULES[name], precision)},
                                         out))
    return records


def table(records: list[dict]) -> list[str]:
    """Markdown rows: each engine's last (warm) run per molecule and precision, energies against GPU4PySCF's."""
    warm: dict[tuple, dict] = {}
    first: dict[tuple, dict] = {}
    for r in records:
        key = (r["molecule"], r["engine"], r["precision"])
        warm[key] = r if key not in warm or r["run"] >= warm[key]["run"] else warm[key]
        first.setdefault(key, r)
    rows = ["| molecule | engine | precision | nao | SCF cycles | SCF (s) | MP2 (s) | process wall, warm (s) | "
            "first run (s) | E(SCF) (Eh) | E(MP2 corr.) (Eh) | ΔE(total) vs GPU4PySCF (Eh) |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key in sorted(warm):
        r = warm[key]
        ref = warm.get((r["molecule"], "gpu4pyscf", "fp64"))
        delta = f"{r['e_tot'] - ref['e_tot']:+.1e}" if ref and ref is not r else "—"
        rows.append(f"| {r['molecule']} | {r['engine']} {r['version']} | {r['precision']} | {r['nao']} | "
                    f"{r['scf_cycles']} | {r['scf_s']:.2f} | {r['mp2_s']:.2f} | {r['wall_s']:.1f} | "
                    f"{first[key]['wall_s']:.1f} | {r['e_scf']:.8f} | {r['e_corr']:.8f} | {delta} |")
    gpus = sorted({r["gpu"] for r in records})
    return rows + ["", f"GPU: {', '.join(gpus)}."]


def write_docs(rows: list[str], command: str) -> None:
    """The table between this script's markers in docs/benchmarks.md (written atomically)."""
    from mp2trn.files import replace_marked_block

    replace_marked_block(ROOT / "docs" / "benchmarks.md", BEGIN, END, "\n".join([BEGIN, f"`{command}`", "", *rows, END]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=[*ENGINES, "both"], default="both")
    parser.add_argument("--molecules", nargs="+", choices=list(MOLECULES), default=["inosine", "penicillin"])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, help="append each record to this JSON-lines file")
    parser.add_argument("--table", nargs="+", type=Path, help="print the table from these JSON-lines files")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--compare", choices=list(SWITCHES), help="mp2trn cuda runs with this switch on and off")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="fp64", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(gpu4pyscf_worker(args.worker, args.precision.upper())))
        return
    if args.compare:
        switch_records(args.compare, args.molecules[0], args.repeat, args.out)
        return
    if args.table:
        records = [json.loads(line) for path in args.table for line in path.read_text().splitlines() if line.strip()]
        records = [r for r in records if not r.get("gradient") and not r.get("off") and r.get("overlap", True)]
    else:
        engines = list(ENGINES) if args.engine == "both" else [args.engine]
        records = measure(engines, args.molecules, args.repeat, args.out)
    rows = table(records)
    print("\n".join(rows))
    if args.write_docs:
        write_docs(rows, "python scripts/bench_gpu4pyscf.py" +
                   (" --table " + " ".join(str(t) for t in args.table) if args.table else ""))


if __name__ == "__main__":
    main()
