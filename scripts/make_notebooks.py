"""Write the research notebooks (outputs stripped) from the cell sources below.

    python scripts/make_notebooks.py            # rewrites notebooks/*.ipynb
    python scripts/make_notebooks.py 02 03      # only those

Keeping the source here makes diffs readable; the test suite executes the .ipynb files themselves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def write(name: str, cells: list[tuple[str, str]]) -> None:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
    for k, cell in enumerate(nb.cells):          # stable cell ids: regenerating gives a clean diff
        cell.id = f"{name[:2]}-{k:02d}"
    nbformat.write(nb, NOTEBOOKS / name)


QUICKSTART = [
    ("md", """# mp2trn quickstart

Density-fitted MP2 in a few lines: a molecule from an XYZ file, RHF and UHF references, SCS-MP2, frozen
core, the same calculation through PySCF side by side, and the JSON result read back. Everything runs on
the CPU in seconds."""),
    ("code", """import json, tempfile
from pathlib import Path

import mp2trn
from mp2trn.molecule import build_mole
from pyscf import df, scf
from pyscf.mp import dfmp2, dfump2

MOLECULES = Path("..") / "molecules"
print("mp2trn", mp2trn.__version__)"""),
    ("md", """## 1. A molecule from XYZ, then RHF + DF-MP2

`build_mole` reads standard XYZ (Angstrom by default) into a PySCF `Mole`; charge and multiplicity come from
the comment line when present. `mp2trn.DFMP2(mf)` follows PySCF's conventions (`e_corr`, `e_corr_os`,
`e_corr_ss`, `e_tot`)."""),
    ("code", """mol = build_mole(MOLECULES / "water.xyz", basis="cc-pvdz")
mf = scf.RHF(mol).density_fit().run(conv_tol=1e-10, verbose=0)
pt = mp2trn.DFMP2(mf).run()
print(f"E(HF)        = {mf.e_tot:.10f} Eh")
print(f"E_corr(MP2)  = {pt.e_corr:.10f} Eh  (os {pt.e_corr_os:.10f}, ss {pt.e_corr_ss:.10f})")
print(f"E(MP2)       = {pt.e_tot:.10f} Eh")
print("aux basis:", pt.result.what_ran["auxbasis"], "| device:", pt.result.what_ran["device"])"""),
    ("md", """## 2. An open shell: UHF + DF-UMP2

The hydroxyl radical's XYZ comment says `multiplicity=2`, so `mp2trn.run` builds a UHF reference.
For UHF, αα and ββ pairs give the same-spin part and αβ pairs the opposite-spin part."""),
    ("code", """res = mp2trn.run(MOLECULES / "hydroxyl.xyz", basis="cc-pvdz")
print(res.reference, "multiplicity", res.molecule["molecular_multiplicity"])
print(f"E_corr = {res.e_corr:.10f} Eh  (os {res.e_corr_os:.10f}, ss {res.e_corr_ss:.10f})")"""),
    ("md", """## 3. SCS-MP2 and frozen core

SCS-MP2 rescales the components, 6/5·E_os + 1/3·E_ss (Grimme 2003, as PySCF's `SCSMP2`).
`frozen="auto"` freezes noble-gas cores (here O 1s); an integer freezes the lowest N orbitals per spin."""),
    ("code", """for frozen in (None, "auto", 1):
    p = mp2trn.DFMP2(mf, frozen=frozen).run()
    print(f"frozen={str(frozen):5s} E_corr={p.e_corr:.10f}  SCS E_corr={p.e_scs_corr:.10f}  ({p.result.what_ran['frozen']})")"""),
    ("md", """## 4. The same calculations through PySCF, side by side

Set the MP2 fitting basis explicitly on both sides: PySCF's `DFMP2` on a density-fitted SCF would otherwise
reuse the SCF's JK-fit basis, which shifts E_corr by tens of µEh."""),
    ("code", """rows = []
for name, basis in [("water", "cc-pvdz"), ("ammonia", "def2-svp"), ("hydroxyl", "cc-pvdz"), ("oxygen_triplet", "cc-pvdz")]:
    m = build_mole(MOLECULES / f"{name}.xyz", basis=basis)
    mf_ = (scf.UHF(m) if m.spin else scf.RHF(m)).density_fit().run(conv_tol=1e-10, verbose=0)
    ref = (dfump2.DFUMP2 if m.spin else dfmp2.DFMP2)(mf_)
    ref.with_df = df.DF(m, auxbasis=df.make_auxbasis(m, mp2fit=True))
    ref.verbose = 0
    ref.run()
    ours = mp2trn.DFMP2(mf_).run()
    rows.append((name, basis, "UHF" if m.spin else "RHF", ref.e_corr, ours.e_corr, abs(ref.e_corr - ours.e_corr)))
print(f"{'molecule':16s}{'basis':10s}{'ref':5s}{'PySCF E_corr':>17s}{'mp2trn E_corr':>17s}{'|Δ| (Eh)':>11s}")
for r in rows:
    print(f"{r[0]:16s}{r[1]:10s}{r[2]:5s}{r[3]:17.10f}{r[4]:17.10f}{r[5]:11.1e}")
assert max(r[5] for r in rows) < 1e-8"""),
    ("md", """## 5. JSON output, read back

`mp2trn run --json out.json` (or `result.to_qcschema()`) writes a QCSchema `AtomicResult`-shaped document:
energies under `properties`, and what actually ran (device, precision, bases, frozen orbitals, timings)
under `extras.mp2trn`."""),
    ("code", """from mp2trn.result import write_json_atomic

with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "water.json"
    write_json_atomic(path, pt.result.to_qcschema())
    doc = json.loads(path.read_text())
props, extras = doc["properties"], doc["extras"]["mp2trn"]
print(doc["schema_name"], "| method", doc["model"]["method"], "| basis", doc["model"]["basis"])
for key in ("scf_total_energy", "mp2_opposite_spin_correlation_energy", "mp2_same_spin_correlation_energy",
            "mp2_correlation_energy", "return_energy"):
    print(f"{key:40s} {props[key]: .10f}")
print("ran on:", extras["device"], extras["precision"], "| aux:", extras["auxbasis"], "| SCS E_corr:", round(extras["scs_mp2_correlation_energy"], 10))"""),
]


MP2_ENERGY_ON_TRAINIUM = [
    ("md", """# The fused `mp2_energy` kernel on Trainium (in the NKI emulator)

The pair step of DF-MP2 is the O(N⁵) part. For occupied orbitals i, j of two blocks it forms

    T_ab = Σ_Q B[Q, i, a] B[Q, j, b]
    os[i, j] = Σ_ab T_ab² / D_ab          x[i, j] = Σ_ab T_ab T_ba / D_ab      (D_ab = e_i + e_j − ε_a − ε_b)

`kernels/mp2_energy.py` does this in one NKI launch per block pair: T lives only in PSUM, and only the
per-pair sums leave the chip. This notebook shows how the work is tiled, runs the kernel in the built-in NKI
emulator (`mp2trn.nkiemu`) against a NumPy reference, and reads the emulator's cost report.

**Every time in this notebook is a MODEL, not a measurement**: the emulator prices each executed instruction with
the cycle formulas of the NKI ISA docs and the engine clocks of each generation (docs/emulator.md lists the
assumptions and what is not modeled)."""),
    ("code", """import os
import time

os.environ.setdefault("MP2TRN_NKI", "emulator")   # the cost report needs the built-in emulator, not a real NKI install
import matplotlib.pyplot as plt
import numpy as np

import mp2trn.nkiemu as nki
from mp2trn.kernels import _nki
from mp2trn.kernels.gemm import NFMAX, PMAX
from mp2trn.kernels.mp2_energy import i_block_size, j_groups, mp2_energy, mp2_energy_reference

print("kernels bound to:", _nki.NKI_IMPL, "| emulator NKI API", nki.__version__)
ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
# SBUF bytes per partition the kernel plans with on each generation (85 % of the usable SBUF, as kernels/gemm.py)
BUDGET = {t: int(nki.get_target(t).sbuf_usable_bytes * 0.85) for t in ("trn1", "trn2")}
COLORS = dict(zip(ENGINES, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:gray")))"""),
    ("md", """## 1. How the work is tiled

B is stored **aux-major**, `B[Q, i·nv + a]`, so the contraction index Q lands on the 128 SBUF partitions, which
is what TensorE contracts over (`nc_matmul(dst[M, N], stationary[K, M], moving[K, N])`, K = partitions).

| piece | shape per instruction | lives in | engine |
|---|---|---|---|
| stationary = B_I[Q tile, a tile] | K = Q tile ≤ 128, M = a tile ≤ 128 | SBUF, **whole I block resident** for the launch | — |
| moving = B_J[Q tile, (j, b) columns] | K ≤ 128, N = nj·nvb ≤ 512 (a *j-group*) | SBUF, loaded once per j-group (a view of the I block on a diagonal block) | DMA |
| T[a, (j, b)] = Σ_Q-tiles stationaryᵀ·moving | [a ≤ 128, ≤ 512 fp32] = one 2 KiB PSUM bank | PSUM (accumulated over the Q tiles) | TensorE |
| D′ = (ε_b − e_j) + (ε_a − e_i) | same tile | SBUF | ScalarE (activation + per-partition bias) |
| R = 1/D′ (rsqrt, then square) | same tile | SBUF | GpSimd |
| W = T·R, T·W, segment sums over b per j | same tile | SBUF | VectorE |
| Σ over a (ones-vector matmul) → os[i, j] | [1, nj] | PSUM accumulator per pair | TensorE |
| exchange: Tᵀ by 128×128 transposes, W·Tᵀ | same tile | PSUM/SBUF | TensorE, VectorE |

Loop order per launch: for each I sub-block (all of it when it fits SBUF) → for each j-group → for each i →
for each a tile → Q tiles accumulate into PSUM. The cell below prints the tiling for a concrete block."""),
    ("code", """def tiling(naux, nocc, nvir, same=True):
    nk, nat = -(-naux // PMAX), -(-nvir // PMAX)
    groups = j_groups(nocc, nvir)
    per_group = groups[0][1]
    ncol = per_group * nvir
    n_pairs = nocc * (nocc + 1) // 2 if same else nocc * nocc
    # (i, j-group) combinations actually visited (diagonal block: only groups holding some j >= i)
    visits = sum(1 for j0, nj in groups for i in range(nocc) if not same or i < j0 + nj)
    t_mm = visits * nat * nk * (-(-ncol // NFMAX))
    print(f"naux={naux} nocc={nocc} nvir={nvir}: {nk} Q tile(s) of <=128 partitions, {nat} a tile(s) of <=128")
    print(f"  j-groups: {len(groups)} of {per_group} j's = {ncol} moving columns (PSUM bank holds {NFMAX} fp32)")
    blk = {t: i_block_size(naux, nocc, nocc, nvir, nvir, budget=b) for t, b in BUDGET.items()}
    print(f"  I block resident in SBUF: {blk['trn1']} of {nocc} occupied (trn1 budget), {blk['trn2']} (trn2)")
    print(f"  {n_pairs} pairs formed, {visits} (i, j-group) visits, {t_mm} T matmuls "
          f"[{min(naux, PMAX)}x{min(nvir, PMAX)}]ᵀ·[{min(naux, PMAX)}x{ncol}]")
    n_sums = visits * nat * (-(-ncol // NFMAX))     # ones-vector sums over a, per (visit, a tile, chunk)
    return {"T": t_mm, "ones": 2 * n_sums}          # os and x (exchange) each

demo_tiling = tiling(256, 8, 96)
tiling(1024, 32, 200);"""),
    ("md", """## 2. Run it in the emulator and check it against NumPy

A random but well-conditioned block: B ~ N(0, 1/naux), occupied energies in [−1.5, −0.5] Eh, virtual ones in
[0.2, 3.0] Eh, so every denominator D ≤ −1.4 Eh. `same=True` is a diagonal block (b_j is b_i; only pairs i ≤ j are
formed), which is how the `sim` device calls the kernel for molecules with up to 512 occupied orbitals.
The host passes ε_a, −e_i and ε_b − e_j in float32; the reference is fp64."""),
    ("code", """def random_block(naux, nocc, nvir, seed=0):
    rng = np.random.default_rng(seed)
    b = (rng.standard_normal((naux, nocc, nvir)) / np.sqrt(naux)).astype(np.float32)
    e_o = np.sort(rng.uniform(-1.5, -0.5, nocc))
    e_v = np.sort(rng.uniform(0.2, 3.0, nvir))
    return b, e_o, e_v

def kernel_args(b, e_o, e_v):
    naux, nocc, nvir = b.shape
    flat = np.ascontiguousarray(b.reshape(naux, nocc * nvir))
    return (flat, flat, e_v.astype(np.float32).reshape(nvir, 1), (-e_o).astype(np.float32).reshape(1, nocc),
            (e_v[None, :] - e_o[:, None]).astype(np.float32))

naux, nocc, nvir = 256, 8, 96
b, e_o, e_v = random_block(naux, nocc, nvir)
t0 = time.perf_counter()
os_k, x_k = nki.simulate(mp2_energy, target="trn2")(*kernel_args(b, e_o, e_v), exchange=True, same=True)
wall = time.perf_counter() - t0
report = mp2_energy.last_report
os_r, x_r = mp2_energy_reference(b, b, e_o, e_o, e_v, e_v)
upper = np.triu_indices(nocc)
rel = lambda k, r: np.max(np.abs(k[upper] - r[upper])) / np.max(np.abs(r[upper]))
print(f"emulated in {wall:.2f} s (wall time of this laptop, not a Trainium time)")
print(f"max |os - ref| / max|ref| = {rel(os_k, os_r):.1e}    max |x - ref| / max|ref| = {rel(x_k, x_r):.1e}   (fp32 kernel vs fp64)")
print(f"RHF-style pair sum  sum_ij<=  os - x : kernel {np.sum((os_k - x_k)[upper]):.8f}, reference {np.sum((os_r - x_r)[upper]):.8f}")
assert rel(os_k, os_r) < 1e-5 and rel(x_k, x_r) < 1e-5"""),
    ("md", """## 3. The cost report (a model)

`kernel.last_report` holds the modeled cost of that launch: instructions and busy time per engine, the modeled
time (engines overlap perfectly: max over engines + 15 µs launch overhead), a dependency-aware list schedule, and
a pessimistic no-overlap sum. The same instruction trace is re-priced for trn1 with `priced_for` (different clocks
and DMA bandwidth; the instruction stream is the one planned for trn2 — at this size trn1 plans the same blocks)."""),
    ("code", """print(report.table())
n_mm = report.instruction_counts["tensor"]["nc_matmul"]
print()
predicted = demo_tiling["T"] + demo_tiling["ones"]
print(f"nc_matmul count {n_mm}; section 1 predicts {demo_tiling['T']} T tiles + {demo_tiling['ones']} ones-vector sums = {predicted}"
      + ("" if n_mm == predicted else "  (differs: the kernel's loop structure changed since this notebook was written)"))
reports = {"trn1": report.priced_for("trn1"), "trn2": report}
print()
for t, r in reports.items():
    print(f"{t}: modeled {r.modeled_time_s * 1e6:7.2f} us, scheduled {r.scheduled_time_s * 1e6:7.2f} us, "
          f"bottleneck {r.bottleneck}, TensorE {r.tensor_peak_pct('fp32'):.1f}% of fp32 peak")"""),
    ("code", """fig, ax = plt.subplots(figsize=(7, 3.2))
w = 0.38
for k, (t, r) in enumerate(reports.items()):
    busy = [r.engine_busy_s.get(e, 0.0) * 1e6 for e in ENGINES]
    ax.bar(np.arange(len(ENGINES)) + (k - 0.5) * w, busy, w, label=f"{t} (modeled {r.modeled_time_s * 1e6:.0f} us incl. launch)")
ax.set_xticks(range(len(ENGINES)), ENGINES)
ax.set_ylabel("busy time (µs)")
ax.set_title(f"MODELED engine busy time, mp2_energy naux={naux} nocc={nocc} nvir={nvir}")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()"""),
    ("md", """The engine timeline below is the model's list schedule: each engine issues its instructions in program order, each
starting when its engine is free and the tensors it reads were written. It is not a hardware trace. The launch opens
with DMA loads (the I block, one transfer per Q tile, and constants) that TensorE waits for; after that the engines
pipeline per (i, j-group): TensorE forms T, ScalarE the denominators, GpSimd the reciprocals, VectorE the products
and sums. That start-up and the dependencies are why the scheduled time exceeds the perfect-overlap modeled time."""),
    ("code", """def plot_timeline(rep, n_instr=140, title=""):
    tl = sorted(rep.timeline(), key=lambda r: r[3])[:n_instr]
    t0 = min(r[3] for r in tl)
    fig, ax = plt.subplots(figsize=(8, 2.8))
    for row, e in enumerate(ENGINES):
        bars = [((s - t0) * 1e6, (f - s) * 1e6) for _, eng, _, s, f in tl if eng == e]
        ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=COLORS[e], edgecolor="k", linewidth=0.2)
    ax.set_yticks(range(len(ENGINES)), ENGINES)
    ax.invert_yaxis()
    ax.set_xlabel("µs after launch overhead")
    ax.set_title(title)
    fig.tight_layout()
    plt.show()

plot_timeline(report, title="MODELED engine timeline (list schedule), first 140 instructions, trn2")
tl = report.timeline()
print("instructions per engine in the schedule:", {e: sum(1 for r in tl if r[1] == e) for e in ENGINES})"""),
    ("md", """## 4. How modeled time scales with nvir and naux, trn1 vs trn2

One emulated launch per point (a diagonal block of nocc = 16, i.e. 136 pairs, RHF with exchange), priced for
trn2 and re-priced for trn1. TensorE time grows like naux·nvir² per pair; VectorE, ScalarE and GpSimd work on
the T tiles grows like nvir² per pair and does not depend on naux."""),
    ("code", """def sweep_point(naux, nocc, nvir):
    b, e_o, e_v = random_block(naux, nocc, nvir, seed=1)
    nki.simulate(mp2_energy, target="trn2")(*kernel_args(b, e_o, e_v), exchange=True, same=True)
    r2 = mp2_energy.last_report
    return {"trn1": r2.priced_for("trn1"), "trn2": r2}

NOCC = 16
t0 = time.perf_counter()
nvirs, nauxs = [32, 64, 96, 128, 192, 256], [128, 256, 384, 512, 768, 1024]
by_nvir = {nv: sweep_point(512, NOCC, nv) for nv in nvirs}
by_naux = {nq: sweep_point(nq, NOCC, 128) for nq in nauxs}
print(f"{len(nvirs) + len(nauxs)} launches emulated in {time.perf_counter() - t0:.1f} s (laptop wall time)")
points = [(512, v) for v in nvirs] + [(q, 128) for q in nauxs]
print("trn1 would plan the same (whole) I block at every point, so the re-priced trn2 trace is what trn1 would run:",
      all(i_block_size(q, NOCC, NOCC, v, v, budget=b) == NOCC for q, v in points for b in BUDGET.values()))
for t, r in by_nvir[32].items():
    print(f"{t} model parameters: clocks (GHz) " + ", ".join(f"{e} {hz / 1e9:.2f}" for e, hz in r.target.clock_hz.items())
          + f"; TensorE fp32 peak {r.target.peak_flops['fp32'] / 1e12:.0f} TFLOP/s")

def ceiling(naux, nvir):   # TensorE fill of the T matmuls: K = Q tile rows and M = a tile columns of the 128x128 array
    return 100 * naux / (PMAX * -(-naux // PMAX)) * nvir / (PMAX * -(-nvir // PMAX))

print(f"{'naux':>5} {'nvir':>5} | {'trn1 us':>8} {'bound':>7} {'TE%':>5} | {'trn2 us':>8} {'bound':>7} {'TE%':>5} | {'fill%':>5}")
for (nq, nv, reps) in [(512, nv, r) for nv, r in by_nvir.items()] + [(nq, 128, r) for nq, r in by_naux.items()]:
    cells = " | ".join(f"{r.modeled_time_s * 1e6:8.1f} {r.bottleneck:>7} {r.tensor_peak_pct('fp32'):5.1f}" for r in reps.values())
    print(f"{nq:5d} {nv:5d} | {cells} | {ceiling(nq, nv):5.1f}")"""),
    ("code", """fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
for ax, xs, data, xlabel, fixed in ((axes[0], nvirs, by_nvir, "nvir", "naux=512"), (axes[1], nauxs, by_naux, "naux", "nvir=128")):
    for t, style in (("trn1", "o-"), ("trn2", "s--")):
        ax.plot(xs, [data[x][t].modeled_time_s * 1e6 for x in xs], style, label=t)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("modeled time per launch (µs)")
    ax.set_title(f"MODELED, nocc={NOCC}, {fixed}", fontsize=10)
    ax.legend()
fig.tight_layout()
plt.show()"""),
    ("md", """### TensorE utilization (modeled)

Matmul FLOPs over (modeled time × fp32 TensorE peak). The dotted line is the fill of the 128×128 PE array by the T
matmuls alone: an `nc_matmul` costs the same cycles whatever K (Q rows) and M (a columns) are, so a Q tile or a
tile with fewer than 128 rows/columns wastes the rest of the array."""),
    ("code", """fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
for ax, xs, data, xlabel, fill in ((axes[0], nvirs, by_nvir, "nvir", [ceiling(512, v) for v in nvirs]),
                                   (axes[1], nauxs, by_naux, "naux", [ceiling(q, 128) for q in nauxs])):
    for t, style in (("trn1", "o-"), ("trn2", "s--")):
        ax.plot(xs, [data[x][t].tensor_peak_pct("fp32") for x in xs], style, label=t)
    ax.plot(xs, fill, "k:", label="PE-array fill")
    ax.set_ylim(0, 105)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("TensorE % of fp32 peak")
    ax.set_title("MODELED TensorE utilization", fontsize=10)
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
for t in ("trn1", "trn2"):
    busy = {e: by_nvir[32][t].engine_busy_s.get(e, 0) / by_nvir[32][t].modeled_time_s for e in ENGINES}
    print(f"{t}, naux=512 nvir=32: engine busy / modeled time =", {e: f"{100 * v:.0f}%" for e, v in busy.items()})"""),
    ("code", """r = by_naux[1024]["trn2"]
tensor_by_instr = {}
for _, eng, name, s0, s1 in r.timeline():
    if eng == "tensor":
        tensor_by_instr[name] = tensor_by_instr.get(name, 0.0) + (s1 - s0)
print(f"naux=1024 nvir=128 (trn2): modeled {r.modeled_time_s * 1e6:.1f} us = max engine busy "
      f"{max(r.engine_busy_s.values()) * 1e6:.1f} us + launch {r.launch_overhead_s * 1e6:.0f} us")
print("TensorE busy by instruction (us):", {k: round(v * 1e6, 1) for k, v in tensor_by_instr.items()},
      "(nc_matmul = T tiles + ones-vector sums over a)")"""),
    ("md", """**What bounds it (see the table and plots above):**

* **nvir**: an `nc_matmul` costs the same cycles whatever its M, so the a tiles fill nvir/128 of the PE array; at
  nvir = 32 the element-wise work on T (VectorE) is the bottleneck as well. nvir that is not a multiple of 128 leaves a
  partial a tile (the dip at 192 = 128 + 64).
* **naux**: T costs 4 TensorE cycles per moving column per Q tile (fp32), while the VectorE/ScalarE/GpSimd work on each
  T tile does not depend on naux. At naux ≤ 256 VectorE bounds the launch; from 384 on TensorE does and the
  utilization approaches the fill line.
* The remaining gap at large naux: TensorE's own non-FLOP work (the exchange transposes, printed above), the
  ones-vector reductions, and the fixed 15 µs launch overhead.
* **trn1 vs trn2 (per NeuronCore)**: the model's TensorE and VectorE clocks are higher on trn1 (2.8 vs 2.4 GHz and
  1.12 vs 0.96 GHz), so every point is modeled faster on a trn1 core, at about the same fraction of its own peak.
  What trn2 adds — more NeuronCores and HBM bandwidth per chip, a larger SBUF — does not show in one single-core launch.

The model ignores SBUF access bubbles, instruction-issue overheads and more (docs/emulator.md), so a real
NeuronCore will be slower than modeled; the scheduled time (dependencies, in-order engines) is the less optimistic
number of the two."""),
]

PRECISION = [
    ("md", """# Precision: every mode against fp64

How far each reduced-precision mode lands from the fp64 DF-MP2 correlation energy, on a few small molecules, and
where in the pair energies e_ij the error sits. All runs use the same SCF, fitting basis and orbitals; only the
device/precision of the three tensor stages (AO→MO transform, metric solve, pair step) changes.

| label | what runs | reduced precision where |
|---|---|---|
| `cpu fp64` | NumPy/BLAS | — (the reference) |
| `cpu fp32` | NumPy/BLAS | metric solve and pair step in fp32 (transform and per-pair sums fp64) |
| `sim fp32` | the NKI kernels in the emulator | every stage fp32 on TensorE (fp32 PSUM), per-pair sums fp32 on chip |
| `sim fp32x3` | the NKI kernels in the emulator | compensated: operands split into a bf16-exact hi part + fp32 lo part, 3 matmuls per tile |
| `bf16 pairs` | `sim fp32`, with B rounded to bf16 before the `mp2_energy` kernel | pair GEMM inputs bf16 (round-to-nearest-even), products accumulated in fp32 |

There is no bf16 mode on the `sim` device. `bf16 pairs` is emulated here by a small subclass of the `sim` device that
rounds B to bfloat16 (`ml_dtypes`) and hands the rounded values, stored as float32, to the fp32 `mp2_energy` kernel:
a product of two bf16 numbers is exact in fp32, so this is exactly the numerics of **bf16 inputs with fp32
accumulation** on TensorE (only the summation order may differ from hardware). The other stages stay fp32."""),
    ("code", """import time
from pathlib import Path

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
from matplotlib.colors import LogNorm
from pyscf import scf

import mp2trn
from mp2trn.devices.nki_device import SimDevice
from mp2trn.molecule import build_mole

MOLECULES = Path("..") / "molecules"


def to_bf16(x):
    \"\"\"Round to bfloat16 (round-to-nearest-even), return as float32.\"\"\"
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


class Bf16PairsDevice(SimDevice):
    \"\"\"sim fp32, but the mp2_energy kernel sees B rounded to bf16 (bf16 inputs, fp32 accumulation).\"\"\"
    name = "sim-bf16-pairs"

    def pair_energies(self, b_i, b_j, e_i, e_j, ev_a, ev_b, exchange):
        return super().pair_energies(to_bf16(b_i), None if b_j is None else to_bf16(b_j), e_i, e_j, ev_a, ev_b, exchange)


REFERENCE = {"cpu fp64": lambda: dict(device="cpu", precision="fp64")}
MODES = {   # label -> keyword arguments of mp2trn.DFMP2 (a fresh device per run)
    "cpu fp32": lambda: dict(device="cpu", precision="fp32"),
    "sim fp32": lambda: dict(device="sim", precision="fp32"),
    "sim fp32x3": lambda: dict(device="sim", precision="fp32x3"),
    "bf16 pairs": lambda: dict(device=Bf16PairsDevice(precision="fp32")),
}"""),
    ("md", """## 1. Runs

One SCF per molecule (density-fitted, tight convergence), then DF-MP2 with each mode (no frozen core). The `sim` runs
emulate every kernel launch on this CPU, so their wall time is emulation time, not Trainium time."""),
    ("code", """SYSTEMS = [("water", "cc-pvdz"), ("ammonia", "def2-svp"), ("ethylene", "cc-pvdz"), ("hydroxyl", "cc-pvdz"),
           ("water", "cc-pvtz"), ("benzene", "cc-pvdz")]

results = {}
t_all = time.perf_counter()
for name, basis in SYSTEMS:
    mol = build_mole(MOLECULES / f"{name}.xyz", basis=basis)
    mf = (scf.UHF(mol) if mol.spin else scf.RHF(mol)).density_fit().run(conv_tol=1e-10, verbose=0)
    runs = {}
    for label, kwargs in {**REFERENCE, **MODES}.items():
        t0 = time.perf_counter()
        pt = mp2trn.DFMP2(mf, keep_pair_energies=True, **kwargs()).run()
        runs[label] = dict(e_corr=pt.e_corr, pairs=pt.result.pair_energies, wall=time.perf_counter() - t0)
    key = f"{name}/{basis}"
    results[key] = dict(ref="UHF" if mol.spin else "RHF", sizes=pt.result.sizes, runs=runs)
    s = pt.result.sizes
    print(f"{key:18s} {results[key]['ref']}  nao={s['nao']:3d} naux={s['naux']:3d} nocc={s['nocc']} nvir={s['nvir']}  "
          + "  ".join(f"{k} {v['wall']:.2f}s" for k, v in runs.items()))
print(f"total {time.perf_counter() - t_all:.1f} s")"""),
    ("md", """## 2. Errors against fp64"""),
    ("code", """labels = list(MODES)
print(f"{'system':18s}{'ref':>4s}{'E_corr fp64 (Eh)':>18s}" + "".join(f"{l:>13s}" for l in labels) + "   |ΔE_corr| in µEh")
errors = {l: [] for l in labels}
for key, r in results.items():
    ref = r["runs"]["cpu fp64"]["e_corr"]
    row = f"{key:18s}{r['ref']:>4s}{ref:18.10f}"
    for l in labels:
        err = abs(r["runs"][l]["e_corr"] - ref)
        errors[l].append(err)
        row += f"{err * 1e6:13.4f}"
    print(row)
print(f"{'max':40s}" + "".join(f"{max(errors[l]) * 1e6:13.4f}" for l in labels))
print(f"{'max relative':40s}" + "".join(
    f"{max(e / abs(r['runs']['cpu fp64']['e_corr']) for e, r in zip(errors[l], results.values())):13.1e}" for l in labels))"""),
    ("code", """fig, ax = plt.subplots(figsize=(8, 3.6))
x = np.arange(len(results))
markers = dict(zip(labels, "os^D"))
for k, l in enumerate(labels):
    ax.scatter(x + (k - 1.5) * 0.12, np.maximum(errors[l], 1e-12), marker=markers[l], s=36, label=l)
ax.set_yscale("log")
ax.axhline(1e-6, color="gray", lw=0.8, ls="--")
ax.text(len(results) - 0.5, 1.15e-6, "1 µEh", color="gray", ha="right", fontsize=8)
ax.set_xticks(x, list(results), rotation=20, fontsize=8)
ax.set_ylabel("|E_corr − E_corr(fp64)| (Eh)")
ax.set_title("DF-MP2 correlation energy error vs cpu fp64")
ax.set_ylim(1e-10, 1e-2)
ax.legend(fontsize=8, ncol=4, loc="upper left")
fig.tight_layout()
plt.show()"""),
    ("md", """Reading the plot and table:

* **bf16 pairs** is orders of magnitude worse than the others, far above 1 µEh: bf16 keeps 8 significant bits (unit
  roundoff 2⁻⁹ ≈ 0.2 %), so every T_ab and hence every pair energy moves by up to that much, relatively (see the
  per-pair statistics in §3). That is why the device has no plain bf16 mode; fp32x3 uses bf16 only for hi parts that
  are exactly representable.
* **sim fp32** is worse than **cpu fp32**: on the device every stage (including the AO→MO transform) is fp32 and
  each pair's nva·nvb terms are summed in fp32 on chip, whereas the cpu fp32 path keeps the transform and the
  per-pair sums in fp64.
* **sim fp32x3** (compensated) recovers the device's fp32 loss and lands at about the cpu fp32 level, at the cost of
  three matmuls per tile and of writing per-pair row sums that the host finishes in fp64.

## 3. Where the error sits: pair energies e_ij

`keep_pair_energies=True` keeps e_ij (i ≤ j, Eh) per spin channel; for RHF, e_ij with i < j includes both ij and ji, and
Σ e_ij = E_corr. Below: the fp64 pair energies of the largest molecule, and the per-pair error of `sim fp32` and `bf16 pairs`."""),
    ("code", """key = "benzene/cc-pvdz"
runs = results[key]["runs"]
e64 = runs["cpu fp64"]["pairs"][0]
nocc = e64.shape[0]
upper = np.triu(np.ones((nocc, nocc), bool))
mask = lambda a: np.ma.masked_where(~upper, np.abs(a))
fig, axes = plt.subplots(1, 3, figsize=(8, 2.9), layout="constrained")
panels = [(e64, "|e_ij| fp64 (Eh)"),
          (runs["sim fp32"]["pairs"][0] - e64, "|Δe_ij| sim fp32"),
          (runs["bf16 pairs"]["pairs"][0] - e64, "|Δe_ij| bf16 pairs")]
for ax, (data, title) in zip(axes, panels):
    m = mask(data)
    im = ax.imshow(m, norm=LogNorm(vmin=max(m.min(), 1e-14), vmax=m.max()), cmap="viridis")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("j", fontsize=8)
    ax.set_ylabel("i", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.colorbar(im, ax=ax, shrink=0.8).ax.tick_params(labelsize=7)
fig.suptitle(f"{key}: pair energies, i <= j (occupied orbitals in energy order, core first)", fontsize=10)
plt.show()
print(f"{key}: {upper.sum()} pairs, largest |e_ij| = {np.abs(e64).max():.2e} Eh, smallest = {np.abs(e64[upper]).min():.2e} Eh")
for l in labels:
    d = (runs[l]["pairs"][0] - e64)[upper]
    rel = np.abs(d) / np.abs(e64[upper])
    print(f"  {l:11s} max |Δe_ij| = {np.abs(d).max():.1e} Eh,  |Σ Δe_ij| = {abs(d.sum()):.1e},  Σ |Δe_ij| = {np.abs(d).sum():.1e};"
          f"  |Δe_ij|/|e_ij| median {np.median(rel):.1e}, max {rel.max():.1e};  {100 * np.mean(d < 0):.0f}% of Δe_ij < 0")"""),
    ("md", """The error per pair roughly tracks the size of the pair energy: the valence–valence pairs (large e_ij, lower right)
carry most of it, the pairs with a carbon 1s orbital (first six rows) little. The pair errors have both signs, so the
error of E_corr, |Σ Δe_ij|, is smaller than Σ |Δe_ij| — partial cancellation, not something to rely on.

To try another system, add it to `SYSTEMS` (XYZ files in `../molecules/`) and pick it as `key` for the heat map; a UHF
molecule has three channels in `pair_energies` (αα, ββ, αβ)."""),
]


if __name__ == "__main__":
    notebooks = {"01": ("01_quickstart.ipynb", QUICKSTART),
                 "02": ("02_mp2_energy_on_trainium.ipynb", MP2_ENERGY_ON_TRAINIUM),
                 "03": ("03_precision.ipynb", PRECISION)}
    targets = sys.argv[1:] or list(notebooks)
    unknown = [t for t in targets if t not in notebooks]
    if unknown:
        sys.exit(f"unknown notebook(s) {', '.join(unknown)}: choose from {', '.join(notebooks)}")
    for t in targets:
        write(*notebooks[t])
    print("wrote", ", ".join(notebooks[t][0] for t in targets))
