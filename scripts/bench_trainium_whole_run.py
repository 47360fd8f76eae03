#!/usr/bin/env python
"""What a Trainium user's whole run costs: host time measured here, host<->device transfers priced at the
documented host bandwidth, device time MODELED — per stage, for the energy and for the gradient, on
trn1.2xlarge, trn1.32xlarge and trn2.48xlarge. Writes a table into docs/benchmarks_trainium.md.

    python scripts/bench_trainium_whole_run.py measure --records docs/trainium_whole_run.jsonl   # ~45 min on 2 cores
    python scripts/bench_trainium_whole_run.py model-taxol --records docs/trainium_whole_run.jsonl
    python scripts/bench_trainium_whole_run.py table --records docs/trainium_whole_run.jsonl     # writes the doc

``measure`` runs each case in a fresh process on ``--device sim --precision fp32`` (the NKI kernels in the
emulator): the energy, then the gradient, with a cost checkpoint between them. Host time of a stage = its
wall time minus the time spent emulating the kernels it launched (the emulator is not host work on a
Trainium instance). Device time = the emulator's cost MODEL of the same launches (docs/emulator.md).
Transfers = the bytes of every kernel's array inputs and outputs as the launches pass them (mp2trn's neuron
launcher copies each launch's inputs to the device and its outputs back), and the smaller figure with an
array passed again (the SCF tensor's blocks) counted once — what a device-resident tensor would move.

Host time on an instance: this machine's times scaled by a thread-scaling curve MEASURED here — Inosine's
stages at 1 and 2 threads (OMP/OpenBLAS threads) give each stage's parallel fraction p (Amdahl:
t(n) = t(1)·(1 − p + p/n)), applied at the instance's physical cores. That is an extrapolation from two
points on a 2-core machine, not a measurement on the instance; the host CPU's speed per core is taken as
this machine's. Taxol/cc-pVDZ (113 atoms) is too large to emulate here (Penicillin V's gradient sweep
alone took 18 minutes of emulation; Taxol's would take days): its host stages are extrapolated from the
measured cc-pVDZ cases by a power law in the number of basis functions, and its modeled device stages are
Penicillin V's scaled by each stage's work — tensor bytes for the DMA-bound J/K and AO→MO stages, FLOPs
for the TensorE-bound metric, pair and pair-density stages (``model-taxol``), as docs/benchmarks.md
scales Taxol/cc-pVTZ for the NeuronCore table.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mp2trn.files import replace_marked_block  # noqa: E402

DOC = ROOT / "docs" / "benchmarks_trainium.md"
BEGIN, END = "<!-- BEGIN bench_trainium_whole_run -->", "<!-- END bench_trainium_whole_run -->"
ORGANIC = ROOT / "molecules" / "gpu4pyscf" / "organic"

#: case -> (xyz, basis); the cc-pVDZ cases also feed Taxol's extrapolation
CASES = {
    "vitaminc-dz": ("020_Vitamin_C.xyz", "cc-pvdz"),
    "inosine-dz": ("031_Inosine.xyz", "cc-pvdz"),
    "penicillin-dz": ("042_Penicillin_V.xyz", "cc-pvdz"),
    "vitaminc-tz": ("020_Vitamin_C.xyz", "cc-pvtz"),
}
REPORTED = ("inosine-dz", "vitaminc-tz", "taxol-dz")
#: the measured runs' memory budget, MB (records since 2026-11-27 20:50; before, the default: 60 % of the memory
#: available, ~14 GB on this 24 GB VM). The emulator keeps the device's copies in host memory, so its plan counts
#: them against the budget, where a neuron run counts them against the NeuronCore's HBM: at 14 GB Vitamin
#: C/cc-pVTZ's SCF tensor with its compensated copy (7.4 GB) no longer fit half the budget and was streamed,
#: which a trn1.2xlarge run (19.6 GB budget, the copy in HBM) would keep resident. 16 GB keeps the measured
#: cases resident, as on the instance, and fits this VM.
BUDGET_MB = 16000.0
TAXOL = ("113_Taxol.xyz", "cc-pvdz")
SCALING_CASE = "inosine-dz"    # measured at 1 and 2 threads: the thread-scaling curve

#: The instances. Cores: EC2 "Specifications for accelerated computing instances"
#: (docs.aws.amazon.com/ec2/latest/instancetypes/ac.html): trn1.2xlarge 8 vCPUs = 4 cores x 2 threads,
#: trn1.32xlarge 128 = 64 x 2, trn2.48xlarge 192 = 96 x 2. Host<->device bandwidth: AWS publishes no PCIe
#: figure for Trainium chips; the NKI memory-hierarchy figure (aws-neuron-sdk
#: nki/get-started/about/memory-hierarchy-overview.rst, image nki/img/pm-memory.png) gives host (CPU)
#: memory "~16 GB/sec", taken here per direction for the one chip a run uses. One run uses one NeuronCore.
#: Host memory (same EC2 page): 32, 512 and 2048 GiB; a run's default budget is 60 % of the memory available
#: (mp2trn.memory.default_memory_mb), taken here as 60 % of the instance's.
INSTANCES = {
    "trn1.2xlarge": {"cores": 4, "target": "trn1", "h2d_gbs": 16.0, "memory_gib": 32},
    "trn1.32xlarge": {"cores": 64, "target": "trn1", "h2d_gbs": 16.0, "memory_gib": 512},
    "trn2.48xlarge": {"cores": 96, "target": "trn2", "h2d_gbs": 16.0, "memory_gib": 2048},
}

#: host stages: (key, label)
ENERGY_STAGES = (
    ("scf_tensor", "SCF 3-index integrals + Cholesky (JK-fit)"),
    ("scf_driver", "SCF driver (Fock assembly, DIIS, diagonalisation)"),
    ("scf_jk_fp64", "SCF J/K builds on the host (fp64)"),
    ("scf_jk_glue", "SCF J/K host side of device builds"),
    ("scf_jk_pairs", "SCF J/K: the compensated blocks' second halves"),
    ("mp2_integrals", "MP2 3-index integrals (RI-fit) + AO blocks"),
    ("mp2_metric", "MP2 metric Cholesky + host side"),
    ("mp2_sums", "MP2 pair sums on the host"),
    ("energy_other", "other (I/O, setup)"),
)
GRADIENT_STAGES = (
    ("grad_b", "gradient: B (the energy's reused; built again only when not kept)"),
    ("grad_pairs_host", "gradient: host side of the pair sweep"),
    ("grad_ri", "gradient: 3-index derivative integrals + host side of Γ's back-transform"),
    ("grad_response", "gradient: Z-vector, host side (MO blocks, solver, fp64 sums)"),
    ("grad_integrals", "gradient: SCF-like derivative integrals"),
    ("grad_other", "other"),
)


#: host stages whose blocks are made ahead of a device stage's work on them (mp2trn.overlap: a device that
#: computes off the host's cores, as a NeuronCore does, gets the next block of 3-index integrals while it
#: transforms the current one): phase -> {host stage: device stage}. Such a stage counts as the longer of
#: its host part and the device stage's part (its modeled launches and their transfers).
OVERLAPPED = {"energy": {"mp2_integrals": "ao_to_mo"}, "gradient": {"grad_b": "ao_to_mo"}}
#: and made before their stage: on such a device the MP2 step's first 3-index blocks, as many as the budget
#: holds (mp2trn.transform.plan_early_integrals), are made while the SCF's builds run on the device (records
#: with "early_integrals", the code since 2026-11-27 20:30): that share of the host stage runs under the
#: device's J/K builds, the rest under its transforms
EARLY = ("mp2_integrals", "scf_jk")
#: and the compensated blocks' second halves, made during the SCF's fp32 builds on such a device (records with
#: "scf_jk_reduced", the modeled time of those builds): they run under the fp32 builds
SECOND_HALVES = "scf_jk_pairs"


# -- measuring one case (child process) -----------------------------------------------------------------

def _in_launches(cost: dict | None, *stages: str) -> float:
    """Wall seconds inside the stages' kernel launches (emulation, its checks, copies)."""
    if not cost:
        return 0.0
    return sum(cost["stages"].get(s, {}).get("launch_wall_s", 0.0) for s in stages)


def _device_part(cost: dict | None, transfers: dict | None) -> dict:
    """Modeled seconds per stage and target, and the stage's host<->device bytes."""
    out = {}
    for stage, entry in (cost or {}).get("stages", {}).items():
        out[stage] = {"trn1_s": entry["trn1"]["modeled_time_s"], "trn2_s": entry["trn2"]["modeled_time_s"],
                      "launches": entry["launches"], "launch_wall_s": entry["launch_wall_s"],
                      **(transfers or {}).get(stage, {})}
    return out


def _reduced_part(energy: dict | None, compensated: dict | None) -> dict | None:
    """Modeled seconds of the SCF builds before the precision switch: all J/K launches less those after it."""
    if not energy or not compensated:
        return None
    whole, after = energy["stages"]["scf_jk"], compensated["stages"].get("scf_jk")
    return {f"{t}_s": whole[t]["modeled_time_s"] - (after[t]["modeled_time_s"] if after else 0.0)
            for t in ("trn1", "trn2")}


def measure_case(name: str, xyz: str, basis: str) -> dict:
    """One case on the sim device: energy then gradient; host seconds per stage, device model, transfers."""
    import mp2trn.pipeline as pipeline
    from mp2trn.jk import JKTensor
    from mp2trn.options import RunOptions

    # one run with --gradient, as a user runs it: the gradient takes the energy's B and the SCF's JK-fit
    # tensor (nothing built twice); the energy/gradient boundary is marked where the pipeline enters the
    # gradient stage
    options = RunOptions(basis=basis, device="sim", precision="fp32", target="trn1", gradient=True,
                         max_memory=BUDGET_MB)
    at: dict = {}
    enter_gradient = pipeline.gradient_stage

    def marked_gradient_stage(*args, **kwargs):
        at["energy_end"], at["energy_pricing"] = time.perf_counter(), pricing[0]
        at["mark"] = dev.cost_checkpoint()
        at["e_cost"], at["e_moves"] = dev.cost_report(), dev.transfer_record()
        if "switch" in at:   # the SCF's builds after its precision switch (priced here, outside the SCF's time)
            at["compensated"] = dev.cost_report(since=at["switch"])
        pricing[0] = 0.0
        at["gradient_start"] = time.perf_counter()
        return enter_gradient(*args, **kwargs)

    blocks = JKTensor.blocks

    def marked_blocks(self, mode, device, *args, **kwargs):   # a checkpoint (no pricing) at the precision switch
        if mode.compensated and "switch" not in at:
            at["switch"] = device.cost_checkpoint()
        return blocks(self, mode, device, *args, **kwargs)

    pipeline.gradient_stage, JKTensor.blocks = marked_gradient_stage, marked_blocks
    with pipeline.open_device(options) as dev:
        pricing = _time_pricing(dev)   # the runs price their emulated launches: emulator work, not host work
        t0 = time.perf_counter()
        g, mf = pipeline.compute(str(ORGANIC / xyz), options, dev)
        t1 = time.perf_counter()
        wall_energy = at["energy_end"] - t0 - at["energy_pricing"]
        wall_gradient = t1 - at["gradient_start"] - pricing[0]
        e_cost, e_moves = at["e_cost"], at["e_moves"]
        g_cost, g_moves = dev.cost_report(since=at["mark"]), dev.transfer_record(since=at["mark"])
    pipeline.gradient_stage, JKTensor.blocks = enter_gradient, blocks
    result = g
    tm, scf = g.timings, result.scf
    host_builds = sum(b for b, p in zip(_build_seconds(mf), scf["build_precisions"]) if "(host" in p)
    device_builds_s = scf["jk_seconds"] - host_builds
    energy = {
        "scf_tensor": scf["tensor_seconds"],
        "scf_driver": tm["scf"] - scf["jk_seconds"],
        "scf_jk_fp64": host_builds,
        "scf_jk_glue": max(0.0, device_builds_s - scf["tensor_seconds"] - _in_launches(e_cost, "scf_jk")
                           - scf["compensated_blocks_seconds"]),
        "scf_jk_pairs": scf["compensated_blocks_seconds"],
        "mp2_integrals": max(0.0, tm["ao_to_mo"] - _in_launches(e_cost, "ao_to_mo")),
        "mp2_metric": max(0.0, tm["df_setup"] + tm["metric"] - _in_launches(e_cost, "metric")),
        "mp2_sums": max(0.0, tm["pairs"] - _in_launches(e_cost, "pairs")),
    }
    energy["energy_other"] = max(0.0, wall_energy - (e_cost or {}).get("launch_wall_s", 0.0) - sum(energy.values()))
    gradient = {
        "grad_b": max(0.0, tm["gradient_b"] - _in_launches(g_cost, "ao_to_mo", "metric")),
        "grad_pairs_host": max(0.0, tm["gradient_pairs"] - _in_launches(g_cost, "grad_pairs")),
        # the device's launches inside these stages (Γ's back-transformation, the Z-vector's GEMMs) are
        # emulator work, not host work
        "grad_ri": max(0.0, tm["gradient_ri"] - _in_launches(g_cost, "grad_gamma")),
        "grad_response": max(0.0, tm["gradient_response"] - _in_launches(g_cost, "zvector")),
        "grad_integrals": tm["gradient_integrals"],
    }
    gradient["grad_other"] = max(0.0, wall_gradient - (g_cost or {}).get("launch_wall_s", 0.0) - sum(gradient.values()))
    sizes = result.sizes
    return {
        "case": name, "xyz": xyz, "basis": basis, "threads": os.environ.get("OMP_NUM_THREADS", "all"),
        "nao": sizes["nao"], "naux": sizes["naux"], "nocc": sizes["nocc"], "nvir": sizes["nvir"],
        "natm": sizes["natm"], "scf_cycles": scf["cycles"], "build_precisions": scf["build_precisions"],
        "memory_mb": BUDGET_MB, "tensor": scf.get("tensor"),
        # the code measured makes the MP2 step's first integral blocks during the SCF on a device off the host's
        # cores (not on the emulator, which computes on them): the model counts them under the SCF's builds
        "early_integrals": True,
        # the modeled time of the SCF's device builds before its precision switch (the fp32 builds), under which
        # such a device makes the compensated blocks' second halves
        "scf_jk_reduced": _reduced_part(e_cost, at.get("compensated")),
        "gradient_reused": result.what_ran.get("gradient_reused"), "b_on_device": result.what_ran.get("b_on_device"),
        "host_energy_s": energy, "host_gradient_s": gradient,
        "device_energy": _device_part(e_cost, e_moves), "device_gradient": _device_part(g_cost, g_moves),
        "wall_energy_s": wall_energy, "wall_gradient_s": wall_gradient,
        # seconds inside the kernel launches (the records' name for it since the first measurement)
        "emulation_wall_s": {"energy": (e_cost or {}).get("launch_wall_s", 0.0),
                             "gradient": (g_cost or {}).get("launch_wall_s", 0.0)},
        "machine": _machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def _time_pricing(dev) -> list[float]:
    """Wrap ``dev.cost_report`` so the seconds spent pricing emulated launches add up in the returned cell."""
    spent = [0.0]
    price = dev.cost_report

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return price(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    dev.cost_report = timed
    return spent


def _build_seconds(mf) -> list[float]:
    return [b["seconds"] for b in mf.with_df.log.builds]


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run_child(name: str, threads: int | None) -> dict:
    """``measure_case`` in a fresh process (with ``threads`` OpenMP/OpenBLAS threads when given)."""
    env = dict(os.environ)
    if threads:
        for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[key] = str(threads)
    xyz, basis = CASES[name]
    code = ("import json, sys; sys.path.insert(0, %r); import bench_trainium_whole_run as b; "
            "print('RECORD ' + json.dumps(b.measure_case(%r, %r, %r)))" % (str(ROOT / "scripts"), name, xyz, basis))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{name}: the child failed:\n{out.stderr[-3000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("RECORD ")][-1]
    return json.loads(line[len("RECORD "):])


def _append(records: Path, rec: dict) -> None:
    with open(records, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


# -- Taxol: device stages scaled from the largest emulated case ------------------------------------------

@functools.lru_cache(maxsize=None)
def sizes(xyz: str, basis: str) -> dict:
    """nao, the JK-fit and RI-fit naux, nocc, nvir of a molecule in ``basis`` (cc-pVDZ fitting partners)."""
    from pyscf import df, gto

    mol = gto.M(atom=str(ORGANIC / xyz), basis=basis, verbose=0)
    nocc = mol.nelectron // 2
    return {"nao": mol.nao_nr(), "naux_jk": df.addons.make_auxmol(mol, basis + "-jkfit").nao_nr(),
            "naux": df.addons.make_auxmol(mol, basis + "-ri").nao_nr(), "nocc": nocc,
            "nvir": mol.nao_nr() - nocc, "natm": mol.natm}


def early_share(rec: dict, memory_gib: float) -> float:
    """The share (by bytes) of the MP2 step's 3-index blocks a neuron run of ``rec``'s case makes during the
    SCF at the default budget of an instance with ``memory_gib`` (0 for records of code that did not)."""
    if not rec.get("early_integrals"):
        return 0.0
    return _early_share(rec["xyz"], rec["basis"], memory_gib)


@functools.lru_cache(maxsize=None)
def _early_share(xyz: str, basis: str, memory_gib: float) -> float:
    from pyscf import gto

    from mp2trn.devices.nki_device import NeuronDevice
    from mp2trn.df import DFIntegrals, make_auxmol
    from mp2trn.transform import plan_early_integrals

    mol = gto.M(atom=str(ORGANIC / xyz), basis=basis, verbose=0)
    auxmol, _ = make_auxmol(mol, basis + "-ri")
    packed, itemsize = NeuronDevice.ao_packed, 4     # the fp32 run's B
    aux_block, count = plan_early_integrals(mol, auxmol, itemsize, packed, 0.6 * memory_gib * 1024)
    if not count:
        return 0.0
    loc = auxmol.ao_loc_nr()
    rows = [loc[b] - loc[a] for a, b in DFIntegrals(mol, auxmol, None, None).shell_ranges(aux_block)]
    return float(sum(rows[:count]) / sum(rows))


def second_halves_made(rec: dict, inst: dict) -> bool:
    """Whether a neuron run of ``rec``'s case on the instance makes the compensated blocks' second halves
    during the fp32 builds: its SCF tensor resident in the same blocks for both precisions
    (mp2trn.jk.JKTensor.blocks) at the instance's default budget and the NeuronCore's HBM."""
    return bool(rec.get("scf_jk_reduced")) and _second_halves_made(rec["xyz"], rec["basis"], inst["target"],
                                                                  inst["memory_gib"])


@functools.lru_cache(maxsize=None)
def _second_halves_made(xyz: str, basis: str, target: str, memory_gib: float) -> bool:
    from mp2trn.devices.nki_device import HBM_PER_CORE_GIB, NeuronDevice
    from mp2trn.jk import _same_blocks
    from mp2trn.memory import plan_scf_tensor

    z = sizes(xyz, basis)
    nao = z["nao"]
    dev = NeuronDevice.__new__(NeuronDevice)      # its plan's itemsizes only: no NeuronCore needed

    def plan(planes: int):
        return plan_scf_tensor(z["naux_jk"], nao * (nao + 1) // 2, dev.jk_copy_itemsize(None, planes),
                               dev.jk_copy_optional, nao * nao if dev.jk_streamed_unpacked else 0,
                               0.6 * memory_gib * 1024, HBM_PER_CORE_GIB[target] * 2 ** 30 / 1e6,
                               dev.jk_host_copy_itemsize(None, planes))

    return _same_blocks(plan(3), plan(1))


def stage_work(stage: str, z: dict) -> float:
    """The work a device stage's modeled time follows: bytes of the DMA-bound stages (the SCF tensor per
    build, the AO blocks), FLOPs of the TensorE-bound ones (metric solve, pair energies, pair densities)."""
    nao, naux, no, nv = z["nao"], z["naux"], z["nocc"], z["nvir"]
    return {"scf_jk": z["naux_jk"] * nao * nao,
            "ao_to_mo": naux * nao * nao,
            "metric": naux * naux * no * nv,
            "pairs": naux * no * no * nv * nv,
            "grad_pairs": no * no * (4 * naux * nv * nv + 2 * nv ** 3 + 2 * no * nv * nv),
            "zvector": z["naux_jk"] * no * nv * (nv + no),          # B_vv·Y and B_vo·M dominate a product
            "grad_gamma": naux * no * nao * nao}[stage]


def stage_bytes(stage: str, z: dict) -> float:
    """What a stage's host<->device bytes follow (the arrays its launches pass)."""
    nao, naux, no, nv = z["nao"], z["naux"], z["nocc"], z["nvir"]
    return {"scf_jk": z["naux_jk"] * nao * nao, "ao_to_mo": naux * nao * nao, "metric": naux * no * nv,
            "pairs": naux * no * nv * no, "grad_pairs": naux * no * nv,
            "zvector": z["naux_jk"] * (nv + no) ** 2, "grad_gamma": naux * no * nao}[stage]


def model_taxol(recs: list[dict]) -> dict:
    """Taxol/cc-pVDZ's device stages: each stage of the largest emulated cc-pVDZ case scaled by the ratio of
    the stage's work (:func:`stage_work`) and its transfers by :func:`stage_bytes`; the same number of SCF
    device builds as that case."""
    recs = split_before(recs)[1] or recs     # the newest records, when there are any
    base = max((r for r in (_latest(recs, c) for c in CASES if CASES[c][1] == "cc-pvdz") if r), key=lambda r: r["nao"])
    zb, zt = sizes(base["xyz"], base["basis"]), sizes(*TAXOL)
    out = {"case": "taxol-dz", "xyz": TAXOL[0], "basis": TAXOL[1], **zt, "scaled_from": base["case"],
           "early_integrals": bool(base.get("early_integrals")), "machine": _machine(),
           "date": time.strftime("%Y-%m-%d %H:%M")}
    for phase in ("device_energy", "device_gradient"):
        out[phase] = {}
        for stage, e in base[phase].items():
            w, b = stage_work(stage, zt) / stage_work(stage, zb), stage_bytes(stage, zt) / stage_bytes(stage, zb)
            out[phase][stage] = {"trn1_s": e["trn1_s"] * w, "trn2_s": e["trn2_s"] * w,
                                 **{k: int(e[k] * b) for k in ("to_device", "to_host", "to_device_reusing")}}
    if base.get("scf_jk_reduced"):   # the fp32 builds' share of the J/K stage, scaled as the stage is
        w = stage_work("scf_jk", zt) / stage_work("scf_jk", zb)
        out["scf_jk_reduced"] = {k: v * w for k, v in base["scf_jk_reduced"].items()}
    return out


# -- the model of a run on an instance --------------------------------------------------------------------

ALL_STAGES = ENERGY_STAGES + GRADIENT_STAGES
HERE_THREADS = 2


def load(records: Path) -> list[dict]:
    return [json.loads(line) for line in Path(records).read_text().splitlines() if line.strip()]


#: records dated on this day were measured before the device carried the run (issue 33: the SCF's last
#: builds in fp64 on the host, the SCF tensor sent at every build, B and the JK-fit tensor built again by the
#: gradient, the Z-vector on the host); ``table`` sets them beside the newer ones
BEFORE_DATE = "2026-11-25"
#: issue 33's goals on the modeled trn1.2xlarge, seconds: Inosine/cc-pVDZ energy and gradient
GOALS = {"energy": 5.0, "gradient": 25.0}


def split_before(recs: list[dict]) -> tuple[list[dict], list[dict]]:
    """(records measured before issue 33's changes, the others)."""
    before = [r for r in recs if r.get("date", "").startswith(BEFORE_DATE)]
    return before, [r for r in recs if not r.get("date", "").startswith(BEFORE_DATE)]


def _latest(recs: list[dict], case: str, threads: str = "all") -> dict | None:
    found = [r for r in recs if r["case"] == case and r.get("threads", "all") == threads]
    return found[-1] if found else None


def _host(rec: dict) -> dict[str, float]:
    """Host seconds per stage (0 for a stage an older record did not time apart: it is inside another)."""
    return {**{k: 0.0 for k, _ in ALL_STAGES}, **rec["host_energy_s"], **rec["host_gradient_s"]}


def parallel_fractions(recs: list[dict]) -> dict[str, float]:
    """Each host stage's parallel fraction p from the scaling case at 1 and 2 threads (Amdahl's law:
    t2/t1 = 1 - p + p/2, so p = 2 (1 - t2/t1)), clipped to [0, 1]: the newest pair measured together
    (:func:`scaling_pairs`), so that a newer all-thread record (``measure --no-scaling``, newer code) is never
    set against an older 1-thread one."""
    pairs = scaling_pairs(recs)
    if not pairs:
        raise SystemExit(f"the thread-scaling curve needs {SCALING_CASE} at 1 thread and at all threads: run measure")
    return _fractions(*pairs[-1])


def _fractions(one: dict, two: dict) -> dict[str, float]:
    h1, h2 = _host(one), _host(two)
    return {k: min(1.0, max(0.0, 2.0 * (1.0 - h2[k] / h1[k]))) if h1[k] > 0 else 0.0 for k, _ in ALL_STAGES}


#: the all-thread half of a thread-scaling pair ends within this long after its 1-thread half (one
#: ``measure`` run: the all-thread Inosine run takes ~17 min on the 2-core VM)
PAIR_MINUTES = 90


def scaling_pairs(recs: list[dict]) -> list[tuple[dict, dict]]:
    """Every (1-thread, all-thread) pair of the scaling case measured together: each 1-thread record with
    the next record of the case, when that one is an all-thread run ending within :data:`PAIR_MINUTES` (a
    1-thread record whose all-thread half failed pairs with nothing, not with a later ``--no-scaling`` run)."""
    from datetime import datetime

    def when(rec: dict) -> datetime:
        return datetime.strptime(rec["date"], "%Y-%m-%d %H:%M")

    pairs = []
    for i, one in enumerate(recs):
        if one["case"] == SCALING_CASE and one.get("threads") == "1":
            two = next((r for r in recs[i + 1:] if r["case"] == SCALING_CASE), None)
            if (two is not None and two.get("threads", "all") == "all"
                    and 0 <= (when(two) - when(one)).total_seconds() <= 60 * PAIR_MINUTES):
                pairs.append((one, two))
    return pairs


def sensitivity(recs: list[dict]) -> str:
    """The newest Inosine host times on trn1.2xlarge under each thread-scaling curve of ``recs`` (the records
    after :data:`BEFORE_DATE`, as :func:`tables` passes them): how much of a change in the modeled figures is
    the two-point fit's noise rather than the code."""
    newest = _latest(recs, SCALING_CASE)
    pairs = scaling_pairs(recs)
    if newest is None or len(pairs) < 2:
        return ""
    worst = max((k for k, _ in ALL_STAGES), key=lambda k: _host(newest)[k])
    lines = ["", f"How much the thread-scaling curve weighs: the newest {TITLES[SCALING_CASE]} host times "
             f"({newest['date']}) on the modeled trn1.2xlarge under each curve measured since {BEFORE_DATE} "
             f"(p of its largest stage, {LABELS[worst]}):", "",
             "| curve (1 thread / 2 threads) | p | energy s | gradient s |", "|---|---:|---:|---:|"]
    for one, two in pairs:
        f = _fractions(one, two)
        m = run_model(newest, _host(newest), f, "trn1.2xlarge")
        lines.append(f"| {one['date']} / {two['date']} | {f[worst]:.2f} | {m['energy']['total_s']:.1f} | "
                     f"{m['gradient']['total_s']:.1f} |")
    return "\n".join(lines)


def at_cores(t_here: float, p: float, cores: int) -> float:
    """A stage's time on ``cores`` from its time at this machine's thread count (Amdahl, fraction p)."""
    return t_here / (1.0 - p + p / HERE_THREADS) * (1.0 - p + p / cores)


def extrapolate_host(recs: list[dict], nao: int) -> tuple[dict[str, float], dict[str, float]]:
    """Host seconds per stage at ``nao`` (cc-pVDZ) from a least-squares power law t = a·nao^k over the
    measured cc-pVDZ cases; returns (seconds, exponent k) per stage."""
    import numpy as np

    dz = [r for r in (_latest(recs, c) for c in CASES if CASES[c][1] == "cc-pvdz") if r]
    if len(dz) < 2:
        raise SystemExit("Taxol's host stages need at least two measured cc-pVDZ cases")
    x = np.log([r["nao"] for r in dz])
    seconds, exps = {}, {}
    for key, _ in ALL_STAGES:
        t = np.array([max(_host(r)[key], 1e-3) for r in dz])
        k, a = np.polyfit(x, np.log(t), 1)
        exps[key], seconds[key] = float(k), float(math.exp(a) * nao ** k)
    return seconds, exps


def run_model(rec: dict, host_here: dict[str, float], fractions: dict[str, float], instance: str) -> dict:
    """One case on one instance: host (scaled), transfers (as launched and with kept inputs), device, per phase."""
    inst = INSTANCES[instance]
    bw = inst["h2d_gbs"] * 1e9
    out = {}
    for phase, stages in (("energy", ENERGY_STAGES), ("gradient", GRADIENT_STAGES)):
        host = {k: at_cores(host_here[k], fractions[k], inst["cores"]) for k, _ in stages}
        dev = rec[f"device_{phase}"]
        device_s = sum(e[inst["target"] + "_s"] for e in dev.values())
        launched = sum(e["to_device"] + e["to_host"] for e in dev.values()) / bw
        kept = sum(e["to_device_reusing"] + e["to_host"] for e in dev.values()) / bw
        def under(stage: str) -> float:   # a device stage's modeled launches and their transfers
            return dev[stage][inst["target"] + "_s"] + (dev[stage]["to_device"] + dev[stage]["to_host"]) / bw if \
                stage in dev else 0.0

        early = early_share(rec, inst["memory_gib"]) if phase == "energy" else 0.0
        overlap = sum(min(host[h] * (1 - early if h == EARLY[0] else 1), under(d))
                      for h, d in OVERLAPPED[phase].items() if d in dev)   # the shorter part, run under the longer
        if phase == "energy" and EARLY[1] in dev:   # both share the SCF builds' device time
            reduced = rec.get("scf_jk_reduced") if second_halves_made(rec, inst) else None
            halves = min(host[SECOND_HALVES], reduced[inst["target"] + "_s"]) if reduced else 0.0
            overlap += halves + min(host[EARLY[0]] * early, under(EARLY[1]) - halves)
        total = sum(host.values()) + launched + device_s - overlap
        out[phase] = {"host": host, "host_s": sum(host.values()), "transfer_s": launched, "transfer_kept_s": kept,
                      "device_s": device_s, "overlap_s": overlap, "total_s": total,
                      "device_share": device_s / total if total else 0.0}
    return out


def _cases(recs: list[dict]) -> dict[str, tuple[dict, dict[str, float], str]]:
    """Reported case -> (record, host seconds here, how the host seconds were obtained)."""
    out = {}
    for case in REPORTED:
        if case == "taxol-dz":
            rec = _latest(recs, case)
            if rec is None:
                continue
            seconds, exps = extrapolate_host(recs, rec["nao"])
            out[case] = (rec, seconds, "extrapolated")
            rec["host_exponents"] = exps
        else:
            rec = _latest(recs, case)
            if rec is not None:
                out[case] = (rec, _host(rec), "measured")
    return out


TITLES = {"inosine-dz": "Inosine / cc-pVDZ", "vitaminc-tz": "Vitamin C / cc-pVTZ", "taxol-dz": "Taxol / cc-pVDZ"}
LABELS = dict(ALL_STAGES)


def comparison(before: list[dict], now: list[dict]) -> str:
    """Inosine's and Vitamin C/cc-pVTZ's whole runs on trn1.2xlarge and their bytes to the device per stage,
    before issue 33's changes and now, and the goals."""
    fb, fn = parallel_fractions(before), parallel_fractions(now)
    lines = ["| case | phase | whole s before | whole s now | host s before → now | to device GB before → now "
             "(as launched) | device share now |", "|---|---|---:|---:|---|---|---:|"]
    goals = []
    for case in ("inosine-dz", "vitaminc-tz"):
        old, new = _latest(before, case), _latest(now, case)
        if old is None or new is None:
            continue
        mo = run_model(old, _host(old), fb, "trn1.2xlarge")
        mn = run_model(new, _host(new), fn, "trn1.2xlarge")
        for phase in ("energy", "gradient"):
            gb = [sum(e["to_device"] for e in r[f"device_{phase}"].values()) / 1e9 for r in (old, new)]
            lines.append(f"| {TITLES[case]} | {phase} | {mo[phase]['total_s']:.1f} | {mn[phase]['total_s']:.1f} | "
                         f"{mo[phase]['host_s']:.1f} → {mn[phase]['host_s']:.1f} | {gb[0]:.2f} → {gb[1]:.2f} | "
                         f"{100 * mn[phase]['device_share']:.1f} % |")
            if case == SCALING_CASE:
                met = "met" if mn[phase]["total_s"] <= GOALS[phase] else "missed"
                goals.append(f"{phase} {mn[phase]['total_s']:.1f} s (goal ≤ {GOALS[phase]:.0f} s: {met})")
    if goals:
        lines += ["", f"Issue 33's goals for Inosine/cc-pVDZ on the modeled trn1.2xlarge: {'; '.join(goals)}."]
    return "\n".join(lines)


def tables(recs: list[dict]) -> str:
    before, recs = split_before(recs)
    if not recs:     # only the first records: they are the table
        before, recs = [], before
    fractions = parallel_fractions(recs)
    cases = _cases(recs)
    lines = ["| case (nao) | instance | phase | host s | transfers s (kept inputs) | device s (MODELED) | "
             "overlapped s | whole s | device share | host stage that would pay most to move |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for case, (rec, host_here, how) in cases.items():
        for instance in INSTANCES:
            m = run_model(rec, host_here, fractions, instance)
            for phase in ("energy", "gradient"):
                r = m[phase]
                top = max(r["host"], key=r["host"].get)
                lines.append(f"| {TITLES[case]} ({rec['nao']}){' *' if how == 'extrapolated' else ''} | {instance} | "
                             f"{phase} | {r['host_s']:.1f} | {r['transfer_s']:.2f} ({r['transfer_kept_s']:.2f}) | "
                             f"{r['device_s'] * 1e3:.0f} ms | {r['overlap_s']:.2f} | {r['total_s']:.1f} | "
                             f"{100 * r['device_share']:.1f} % | "
                             f"{LABELS[top]}: {r['host'][top]:.1f} s ({100 * r['host'][top] / r['total_s']:.0f} %) |")
    fed = [f"{r['case']} (nao {r['nao']})" for r in (_latest(recs, c) for c in CASES if CASES[c][1] == "cc-pvdz") if r]
    one, two = scaling_pairs(recs)[-1]
    lines += ["", "Host seconds per stage measured on this machine (2 threads), the parallel fraction p of the "
              f"thread-scaling curve (the newest measured together: {one['date']} / {two['date']}), and Taxol's extrapolation (t ∝ nao^k fitted to {', '.join(fed)}):", "",
              "| host stage | p | " + " | ".join(f"{TITLES.get(c, c)}" for c in cases) + " | k (Taxol fit) |",
              "|---|---:|" + "---:|" * len(cases) + "---:|"]
    taxol = cases.get("taxol-dz")
    for key, label in ALL_STAGES:
        cells = " | ".join(f"{h[key]:.2f}{'*' if how == 'extrapolated' else ''}" for _, h, how in cases.values())
        k = f"{taxol[0]['host_exponents'][key]:.2f}" if taxol else "–"
        lines.append(f"| {label} | {fractions[key]:.2f} | {cells} | {k} |")
    lines += ["", "Host↔device bytes per device stage (GB, as launched / with kept inputs counted once; "
              "energy then gradient) and the modeled trn1 time:", "",
              "| case | stage | to device GB | to host GB | trn1 modeled ms |", "|---|---|---:|---:|---:|"]
    for case, (rec, _, _) in cases.items():
        for phase in ("energy", "gradient"):
            for stage, e in rec[f"device_{phase}"].items():
                lines.append(f"| {TITLES[case]} | {phase}: {stage} | {e['to_device'] / 1e9:.2f} / "
                             f"{e['to_device_reusing'] / 1e9:.2f} | {e['to_host'] / 1e9:.2f} | {e['trn1_s'] * 1e3:.1f} |")
    if before:
        # the machine of the before records, and of the newest record (the one the table's "now" comes from)
        machines = [next((r["machine"] for r in rs if r.get("threads") == "all"), "?")
                    for rs in (before, list(reversed(recs)))]
        same = machines[0].split(",")[0] == machines[1].split(",")[0]
        lines += ["", f"Before and now: the records of {BEFORE_DATE} (the SCF's last builds in fp64 on the host, the "
                  "SCF tensor sent at every build, B and the JK-fit tensor built again by the gradient, the Z-vector "
                  "on the host) against the newest, each with its own thread-scaling curve, on trn1.2xlarge. "
                  + ("Both measured on " + machines[1] + "." if same else
                     f"Measured on two machines — before: {machines[0]}; now: {machines[1]} — so the host "
                     "seconds compare two CPUs as well as two versions; the bytes and the modeled device times do "
                     "not depend on the machine."), "",
                  comparison(before, recs)]
    extra = sensitivity(recs)
    return "\n".join(lines) + ("\n" + extra if extra else "")


def cmd_table(args) -> None:
    recs = load(Path(args.records))
    text = tables(recs)
    machine = next((r["machine"] for r in reversed(recs) if r.get("threads") == "all"), "")   # the newest: the rows' records
    block = (f"{BEGIN}\nMODELED device times, measured host times. Produced by `python "
             f"scripts/bench_trainium_whole_run.py table` from docs/trainium_whole_run.jsonl (measured on {machine}; "
             f"* = extrapolated host stages). Overlapped s: host work done while the device works (mp2trn/overlap.py), "
             f"the shorter of the two parts counted once — the 3-index integral blocks made while the device transforms "
             f"the one before; in records since 2026-11-27 20:24, the MP2 step's first 3-index blocks (as many as the "
             f"instance's default budget holds) made while the device runs the SCF's builds, and the compensated blocks' "
             f"second halves made during its fp32 builds (where both precisions' tensors stay resident in its HBM); "
             f"whole s = host + transfers + device − overlapped.\n\n{text}\n{END}")
    print(text)
    if args.print_only:
        return
    replace_marked_block(DOC, BEGIN, END, block)
    print(f"wrote {DOC}")


def cmd_taxol(args) -> None:
    records = Path(args.records)
    rec = model_taxol(load(records))
    _append(records, rec)
    print(f"taxol-dz: nao {rec['nao']}, naux {rec['naux']} (JK {rec['naux_jk']}), nocc {rec['nocc']}; device stages "
          f"scaled from {rec['scaled_from']}")

def cmd_measure(args) -> None:
    records = Path(args.records)
    for name in args.cases:
        for threads in ([1, None] if name == SCALING_CASE and not args.no_scaling else [None]):
            t0 = time.perf_counter()
            rec = run_child(name, threads)
            _append(records, rec)
            print(f"{name} threads={threads or 'all'}: energy {rec['wall_energy_s']:.1f} s, gradient "
                  f"{rec['wall_gradient_s']:.1f} s wall (emulation {sum(rec['emulation_wall_s'].values()):.1f} s); "
                  f"child {time.perf_counter() - t0:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="run the cases in fresh processes and append their records")
    m.add_argument("--records", default=str(ROOT / "docs" / "trainium_whole_run.jsonl"))
    m.add_argument("--cases", nargs="*", default=list(CASES))
    m.add_argument("--no-scaling", action="store_true", help="skip the 1-thread run of the scaling case")
    m.set_defaults(func=cmd_measure)
    t = sub.add_parser("model-taxol", help="Taxol/cc-pVDZ's device stages scaled from the largest emulated case")
    t.add_argument("--records", default=str(ROOT / "docs" / "trainium_whole_run.jsonl"))
    t.set_defaults(func=cmd_taxol)
    w = sub.add_parser("table", help="the whole-run tables from the records, into docs/benchmarks_trainium.md")
    w.add_argument("--records", default=str(ROOT / "docs" / "trainium_whole_run.jsonl"))
    w.add_argument("--print-only", action="store_true")
    w.set_defaults(func=cmd_table)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
