#!/usr/bin/env python
"""One molecule over several ranks: measured here, and MODELED for NeuronCores and trn1 instances.

    python scripts/bench_parallel.py measure      # 1 rank vs 2 ranks (torchrun, gloo) on this machine
    python scripts/bench_parallel.py model        # modeled table: 1…32 NeuronCores, 2 and 4 trn1.32xlarge
    python scripts/bench_parallel.py              # both

measure: Inosine/cc-pVDZ through `mp2trn run` three ways, each in a fresh process: one rank with one BLAS
thread, one rank with two threads (the whole 2-core machine), and two ranks of one thread each under
torchrun. Prints wall times per stage, the speedup, the parallel efficiency T(1 rank, 1 thread) /
(2 · T(2 ranks)), the energy differences and the bytes each rank sent per stage.

model (no hardware; every figure is a MODEL): one NeuronCore's time per stage comes from the NKI emulator's
cost model (fp32 kernels, trn1) on Vitamin C/cc-pVTZ shapes: the MP2 stages exactly as
scripts/bench_trainium_model.py emulates them, the SCF's J/K as one emulated 256-row block of the tensor
times the block count. Taxol/cc-pVTZ scales those per-stage times by the work ratio: bytes of the 3-index
tensor for the DMA-bound stages (J/K, AO→MO), FLOPs for the TensorE-bound ones (metric, pairs). N cores
divide the work evenly (the partition of mp2trn.parallel) and add the bytes each rank sends — the same
formulas as the counts a run records — over the links:

* within a trn1.32xlarge: the Trainium inter-chip interconnect, 384 GB/s per chip (Neuron 2.29 docs,
  about-neuron/arch/neuron-hardware/trainium2.rst, "Inter-chip Interconnect (GB/sec/chip)", Trainium
  column), shared by the chip's 2 NeuronCores: 192 GB/s per core (``mp2trn.nkiemu.targets.TRN1.link_bw``,
  the figure the emulator prices its collectives with);
* between instances: EFA, 800 Gbps per trn1.32xlarge (trn1-arch.rst) = 100 GB/s shared by its 32 cores,
  for the share of each rank's traffic that leaves its instance ((N − 32)/(N − 1) of it).

Not modeled: overlap of communication with compute (the sum is taken), message latency, load imbalance
of the pair blocks, and the host's share (PySCF's SCF driver, integral generation).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from mp2trn.nkiemu.targets import TRN1  # noqa: E402  (link_bw: the inter-chip links per NeuronCore)

MOLECULES = ROOT / "molecules" / "gpu4pyscf" / "organic"
EFA_GBS_PER_INSTANCE = 800 / 8       # 800 Gbps
CORES_PER_INSTANCE = 32
HBM_GIB_PER_CORE = 32 / 2
JK_BLOCK_ROWS = 256                  # mp2trn.jk: at most 256 auxiliary rows per device block
SCF_CYCLES = 15                      # cycles of a converged SCF priced (Inosine/cc-pVDZ needs 15, the issue's table)
CONFIGS = {"vitc": ("020_Vitamin_C", "cc-pvtz"), "taxol": ("113_Taxol", "cc-pvtz")}


# -- measured ---------------------------------------------------------------------------------------------

def _run(cmd: list[str], threads: int, out: Path) -> tuple[dict, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, "--json", str(out), "--quiet"], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(out.read_text()), wall


def measure(molecule: str, basis: str) -> list[str]:
    path = str(MOLECULES / f"{molecule}.xyz")
    run = [sys.executable, "-m", "mp2trn", "run", path, "--basis", basis]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "-m", "mp2trn", "run", path, "--basis", basis]
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            "1 rank, 1 thread": _run(run, 1, Path(tmp) / "a.json"),
            "1 rank, 2 threads": _run(run, 2, Path(tmp) / "b.json"),
            "2 ranks, 1 thread each": _run(torchrun, 1, Path(tmp) / "c.json"),
        }
    ref = rows["1 rank, 1 thread"][0]
    lines = [f"Measured: {molecule}/{basis} on {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"`python scripts/bench_parallel.py measure` ({time.strftime('%Y-%m-%d')}).", "",
             "| configuration | SCF s | MP2 s | run total s | process wall s | ΔE_MP2 vs 1 rank (Eh) | SCF cycles |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, (doc, wall) in rows.items():
        t = doc["extras"]["mp2trn"]["timings"]
        de = doc["return_result"] - ref["return_result"]
        lines.append(f"| {name} | {t['scf']:.2f} | {t['mp2']:.2f} | {t['total']:.2f} | {wall:.2f} | {de:.1e} | "
                     f"{doc['properties'].get('scf_iterations')} |")
    t1 = rows["1 rank, 1 thread"][0]["extras"]["mp2trn"]["timings"]["total"]
    t1b = rows["1 rank, 2 threads"][0]["extras"]["mp2trn"]["timings"]["total"]
    par = rows["2 ranks, 1 thread each"][0]["extras"]["mp2trn"]
    t2 = par["timings"]["total"]
    lines += ["", f"Speedup of 2 ranks over 1 rank with 1 thread: **{t1 / t2:.2f}×**, parallel efficiency "
                  f"T1/(2·T2) = **{t1 / (2 * t2):.0%}**; over 1 rank using both cores through BLAS threads: "
                  f"{t1b / t2:.2f}×.", "",
              "Per rank (2 ranks): peak resident memory, share of B, and MB sent per stage:", "",
              "| rank | peak memory MB | share of B | " + " | ".join(STAGES) + " |",
              "|---:|---:|---:|" + "---:|" * len(STAGES)]
    for r in par["parallel"]["per_rank"]:
        sent = " | ".join(f"{r['bytes_sent'].get(s, 0) / 1e6:.1f}" for s in STAGES)
        lines.append(f"| {r['rank']} | {r['peak_memory_mb']:.0f} | {r['b_share_fraction']:.2f} | {sent} |")
    return lines


STAGES = ("scf_tensor", "scf_jk", "ao_to_mo", "pairs", "reduce")


# -- modeled ----------------------------------------------------------------------------------------------

def sizes(molecule: str, basis: str) -> dict[str, int]:
    from pyscf import df

    from mp2trn.molecule import build_mole

    mol = build_mole(str(MOLECULES / f"{molecule}.xyz"), basis=basis)
    ri = df.addons.make_auxmol(mol, df.make_auxbasis(mol, mp2fit=True))
    jk = df.addons.make_auxmol(mol, df.make_auxbasis(mol, mp2fit=False))
    nocc = mol.nelectron // 2
    return {"nao": mol.nao_nr(), "naux": ri.nao_nr(), "naux_jk": jk.nao_nr(), "nocc": nocc,
            "nvir": mol.nao_nr() - nocc, "max_aux_shell": int(np.max(np.diff(ri.ao_loc_nr())))}


def one_core_seconds(s: dict[str, int]) -> dict[str, float]:
    """Modeled trn1 seconds per stage on one NeuronCore (fp32 kernels) for the shape ``s``."""
    from bench_trainium_model import emulate

    from mp2trn.devices.nki_device import SimDevice

    cost = emulate(s, "fp32")[0]
    out = {k: cost["stages"][k]["trn1"]["modeled_time_s"] for k in ("ao_to_mo", "metric", "pairs")}
    dev = SimDevice(precision="fp32", target="trn1")
    rng = np.random.default_rng(0)
    block = rng.standard_normal((JK_BLOCK_ROWS, s["nao"], s["nao"])).astype(np.float32) * 0.01
    block += block.transpose(0, 2, 1)
    c = rng.standard_normal((s["nao"], s["nocc"])) * 0.1
    dev.jk_block(dev.jk_tensor(block, np.float32), [(c, 1.0)], c @ c.T, True, True)
    per_block = dev.cost_report()["stages"]["scf_jk"]["trn1"]["modeled_time_s"]
    out["scf_jk"] = per_block * -(-s["naux_jk"] // JK_BLOCK_ROWS) * SCF_CYCLES
    return out


def scaled(base: dict[str, float], s0: dict[str, int], s: dict[str, int]) -> dict[str, float]:
    """Per-stage seconds of shape ``s`` from those of ``s0``: tensor bytes for the DMA-bound stages,
    FLOPs for the TensorE-bound ones."""
    def r(f):
        return f(s) / f(s0)
    return {
        "scf_jk": base["scf_jk"] * r(lambda x: x["naux_jk"] * x["nao"] ** 2),
        "ao_to_mo": base["ao_to_mo"] * r(lambda x: x["naux"] * x["nao"] ** 2),
        "metric": base["metric"] * r(lambda x: x["naux"] ** 2 * x["nocc"] * x["nvir"]),
        "pairs": base["pairs"] * r(lambda x: x["nocc"] ** 2 * x["nvir"] ** 2 * x["naux"]),
    }


def bytes_sent(s: dict[str, int], n: int, itemsize: int = 4) -> dict[str, float]:
    """Bytes one of ``n`` ranks sends per stage (RHF; B in ``itemsize``, SCF tensor and sums in fp64)."""
    if n == 1:
        return {k: 0.0 for k in STAGES}
    npair = s["nao"] * (s["nao"] + 1) // 2
    b = s["naux"] * s["nocc"] * s["nvir"] * itemsize
    ring = 2 * (n - 1) / n
    return {
        "scf_tensor": s["naux_jk"] * npair * 8 * (n - 1) / n ** 2,
        "scf_jk": SCF_CYCLES * 2 * s["nao"] ** 2 * 8 * ring,
        "ao_to_mo": b * (n - 1) / n ** 2,
        "pairs": (n - 1) / 2 * b / n,
        "reduce": 2 * s["nocc"] ** 2 * 8 * ring,
    }


def comm_seconds(nbytes: float, n: int) -> float:
    if n == 1:
        return 0.0
    off = max(0, n - CORES_PER_INSTANCE) / (n - 1)          # share of a rank's partners on other instances
    efa_per_core = EFA_GBS_PER_INSTANCE / CORES_PER_INSTANCE
    return nbytes * (1 - off) / TRN1.link_bw + nbytes * off / (efa_per_core * 1e9)


def model(cores=(1, 2, 8, 32, 64, 128)) -> list[str]:
    s_vitc = sizes(*CONFIGS["vitc"])
    base = one_core_seconds(s_vitc)
    lines = ["MODELED (NKI emulator cost model, trn1, fp32 kernels; links as stated in the script's docstring), "
             f"`python scripts/bench_parallel.py model`; the SCF priced as {SCF_CYCLES} J/K builds on the device.", ""]
    for key, (molecule, basis) in CONFIGS.items():
        s = sizes(molecule, basis)
        one = base if key == "vitc" else scaled(base, s_vitc, s)
        lines += [f"**{molecule}/{basis}** (nao {s['nao']}, naux {s['naux']}, JK naux {s['naux_jk']}, nocc {s['nocc']}, "
                  f"nvir {s['nvir']}){' — one-core times scaled from Vitamin C' if key != 'vitc' else ''}:", "",
                  "| NeuronCores | SCF J/K s | AO→MO s | metric s | pairs s | communication s | total s | speedup | "
                  "B + SCF tensor per core GiB |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        t1 = sum(one.values())
        for n in cores:
            compute = {k: v / n for k, v in one.items()}
            comm = comm_seconds(sum(bytes_sent(s, n).values()), n)
            total = sum(compute.values()) + comm
            mem = (s["naux"] * s["nocc"] * s["nvir"] * 4 + s["naux_jk"] * s["nao"] ** 2 * 4) / n / 2 ** 30
            fits = "" if mem <= HBM_GIB_PER_CORE else " (over 16 GiB HBM: streamed)"
            label = f"{n}" if n <= CORES_PER_INSTANCE else f"{n} ({n // CORES_PER_INSTANCE} × trn1.32xlarge)"
            lines.append(f"| {label} | {compute['scf_jk']:.3f} | {compute['ao_to_mo']:.3f} | {compute['metric']:.3f} | "
                         f"{compute['pairs']:.3f} | {comm:.3f} | {total:.3f} | {t1 / total:.1f}× | {mem:.2f}{fits} |")
        lines.append("")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", choices=("measure", "model", "both"), default="both")
    ap.add_argument("--molecule", default="031_Inosine")
    ap.add_argument("--basis", default="cc-pvdz")
    args = ap.parse_args(argv)
    if args.what in ("measure", "both"):
        print("\n".join(measure(args.molecule, args.basis)), "\n")
    if args.what in ("model", "both"):
        print("\n".join(model()))


if __name__ == "__main__":
    main()
