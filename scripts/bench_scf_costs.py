#!/usr/bin/env python
"""What bounds the whole-run speed-up of issue 11 (docs/benchmarks.md, "Whole runs"), measured:

    python scripts/bench_scf_costs.py                  # Inosine/cc-pVDZ, all five measurements
    python scripts/bench_scf_costs.py --only tensor touch
    python scripts/bench_scf_costs.py --only blocks --xyz molecules/gpu4pyscf/organic/020_Vitamin_C.xyz --basis cc-pvtz

1. ``tensor``  the SCF's 3-index tensor: mp2trn's direct build (``df.cholesky_tensor``) against PySCF's
               ``cholesky_eri`` plus the unpack the J/K builds need (two rounds, the second warm);
2. ``touch``   this machine's cost of touching fresh memory: filling a new array the size of the tensor,
               NumPy's against ``mp2trn.memory.prefaulted_empty``'s (a VM backs new guest pages on
               first touch, slowly for huge pages);
3. ``blocks``  the MP2 step's 3-index integral blocks (RI basis, packed, ≤ 256 MB each) computed into a new
               array per block, as PySCF's ``intor`` makes them, against one reused buffer
               (``mp2trn.df.reused_buffer``, what ``DFIntegrals.ao_blocks`` does);
4. ``rank``    the rank of ΔD = D_k − D_ref over PySCF's fp64 SCF (eigenvalues above 1e-6 / 1e-8 of
               |ΔD|): why incremental fp32 ΔK builds cost as much as fp64 K builds on a CPU;
5. ``guess``   SCF cycles of PySCF's DF-RHF from each initial guess (minao is the default), and of the SCF on
                mp2trn's J/K builds from a smaller basis's density projected up (sto-3g, 6-31g).
6. ``soscf``   PySCF's second-order SCF (``newton()``), from the start and after DIIS to |g| < 1e-3, against
                DIIS on mp2trn's J/K builds: cycles, J/K builds, seconds.
8. ``heap``    an 8 MB NumPy elementwise step with glibc's mmap threshold fixed at 128 kB (a fresh mapping
                for every temporary) and at the 32 MB a production budget gets
                (``memory.return_freed_memory``), each way in two fresh processes taking turns.
7. ``planes``  the host side of the sim/neuron device's J/K builds, no kernel run: the tensor's fp32 copy
                and its compensated planes (once per SCF and precision: ``NkiDevice.jk_tensor``), and per
                fp32x3 build the host's fp64 work around the kernels (Z's two planes added, ρ, Z split
                again for the syrk, K's triangle filled), on random data of the run's shapes.
9. ``copy``    the sim/neuron device's copies of the resident SCF tensor (its packed host rows in 256-row
                blocks, each copy kept): its unpacked fp32 rows by PySCF's ``unpack_tril`` and NumPy's
                ``astype`` against ``precision.fp32_copy``, and the compensated builds' fp32 pairs made
                afresh against with their first half taken from the fp32 rows (what the precision switch
                does), each in a fresh process, the ways taking turns.
10. ``refault`` memory freed and mapped again within one process: a prefaulted array the size of the tensor
                filled, freed, and after a pause (this VM reports freed pages to its host, which takes them
                back) made and filled again, against the same array carved twice from one
                ``mp2trn.memory.Arena`` (its pages stay mapped: the gradient's stages share them).

A benchmark: it prints measurements and asserts nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from pyscf import df, lib, scf

from mp2trn.df import _shell_ranges, build_df, cholesky_tensor, reused_buffer
from mp2trn.jk import DeviceJK
from mp2trn.machine import machine_description
from mp2trn.memory import Arena, prefaulted_empty
from mp2trn.molecule import build_mole

ROOT = Path(__file__).resolve().parents[1]


def tensor(mol) -> None:
    auxmol = df.addons.make_auxmol(mol, df.make_auxbasis(mol))
    for rnd in (1, 2):
        t0 = time.perf_counter()
        packed = df.incore.cholesky_eri(mol, auxmol=auxmol, max_memory=16000)
        t1 = time.perf_counter()
        full = lib.unpack_tril(packed)
        t2 = time.perf_counter()
        del packed, full
        t3 = time.perf_counter()
        ours = cholesky_tensor(mol, auxmol)
        t4 = time.perf_counter()
        del ours
        print(f"tensor round {rnd}: PySCF cholesky_eri {t1 - t0:.2f} s + unpack {t2 - t1:.2f} s = {t2 - t0:.2f} s; "
              f"mp2trn cholesky_tensor {t4 - t3:.2f} s (naux {auxmol.nao_nr()}, nao {mol.nao_nr()})")


#: the ways of making a new array that ``touch`` compares
_MAKERS = {"np.empty": np.empty, "prefaulted_empty": prefaulted_empty}


def _tensor_shape(mol) -> tuple[int, int, int]:
    """(naux, nao, nao) of the SCF's tensor, unpacked (the fitting basis PySCF picks for the SCF)."""
    return df.addons.make_auxmol(mol, df.make_auxbasis(mol)).nao_nr(), mol.nao_nr(), mol.nao_nr()


def _turns(flag: str, labels: list[str], shape: tuple[int, ...], rounds: int):
    """Yield (round, label, the child's output) for each way in a fresh process (``__file__ flag label
    shape``) after a 5 s pause, the ways taking turns and the lead swapped every round, so that none inherits
    another's freshly freed (still backed) memory more often."""
    for rnd in range(rounds):
        for label in labels if rnd % 2 == 0 else labels[::-1]:
            time.sleep(5)
            out = subprocess.run([sys.executable, __file__, flag, label, *map(str, shape)], check=True,
                                 capture_output=True, text=True).stdout.strip()
            yield rnd + 1, label, out


def touch(mol, rounds: int = 3) -> None:
    """Fill a new array the size of the tensor: NumPy's (huge pages advised) against
    :func:`mp2trn.memory.prefaulted_empty` (small pages, faulted in by one thread per core), each in a
    fresh process (:func:`_turns`)."""
    shape = _tensor_shape(mol)
    gb = np.prod(shape) * 8 / 1e9
    for rnd, label, out in _turns("--fill", list(_MAKERS), shape, rounds):
        print(f"touch round {rnd}: {label} of {gb:.2f} GB in a fresh process, then filled: {out} s")


def _fill(label: str, shape: tuple[int, ...]) -> None:
    t0 = time.perf_counter()
    a = _MAKERS[label](shape)
    a[...] = 1.0
    print(f"{time.perf_counter() - t0:.2f}")


#: the ways ``copy`` times, each in a fresh process: the resident tensor's 256-row blocks (the sim device's)
_COPIES = ["numpy unpack_tril + astype", "fp32_copy", "fp32 pairs afresh", "fp32 pairs from the fp32 rows"]


def copy(mol, rounds: int = 2) -> None:
    """Seconds to make the kept device copies of the SCF tensor's blocks (see the module docstring)."""
    shape = _tensor_shape(mol)
    for rnd, label, out in _turns("--copy", _COPIES, shape, rounds):
        print(f"copy round {rnd}: {label}, {shape[0]} packed rows of {shape[1]}² in 256-row blocks: {out}")


def _copy(label: str, shape: tuple[int, ...]) -> None:
    from mp2trn.precision import fp32_copy, fp32_pair

    full = prefaulted_empty((shape[0], shape[1] * (shape[1] + 1) // 2))   # the host keeps packed rows
    full[...] = 1.0
    starts = range(0, shape[0], 256)
    # every block padded to the largest block's whole 128-row tiles, as the device's row bucket does
    padded = [max(-(-len(full[p0:p0 + 256]) // 128) * 128 for p0 in starts)] * len(starts)
    rows = None
    if label == "fp32 pairs from the fp32 rows":   # made before the clock starts: the fp32 builds' rows
        rows = [fp32_copy(full[p0:p0 + 256], n) for p0, n in zip(starts, padded)]
    t0 = time.perf_counter()
    if label == "numpy unpack_tril + astype":
        kept = [lib.unpack_tril(full[p0:p0 + 256]).astype(np.float32) for p0 in starts]
    elif label == "fp32_copy":
        kept = [fp32_copy(full[p0:p0 + 256], n) for p0, n in zip(starts, padded)]
    else:
        kept = [fp32_pair(full[p0:p0 + 256], n, None if rows is None else rows[k])
                for k, (p0, n) in enumerate(zip(starts, padded))]
    print(f"{time.perf_counter() - t0:.2f} s")
    del kept


def blocks(mol) -> None:
    """Seconds for all MP2 integral blocks, new arrays against one reused buffer (two turns each)."""
    dfi = build_df(mol)
    pmol, nbas, loc = mol + dfi.auxmol, mol.nbas, dfi.auxmol.ao_loc_nr()
    npair = mol.nao_nr() * (mol.nao_nr() + 1) // 2
    ranges = list(_shell_ranges(loc, max(1, int(256e6 // (8 * npair)))))

    def compute(out_for):
        t0 = time.perf_counter()
        buf = out_for(ranges)
        for s0, s1 in ranges:
            pmol.intor("int3c2e", aosym="s2ij", shls_slice=(0, nbas, 0, nbas, nbas + s0, nbas + s1), out=buf)
        return time.perf_counter() - t0

    ways = {"a new array per block": lambda r: None,
            "one reused buffer (made and faulted in here)": lambda r: reused_buffer(r, loc, npair)}
    for rnd in (1, 2):
        for label, out_for in ways.items():
            time.sleep(3)
            print(f"blocks round {rnd}: {len(ranges)} blocks of (P|μν), {label}: {compute(out_for):.2f} s")


def rank(mol) -> None:
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.verbose = 1e-10, 0
    dms = []
    mf.callback = lambda env: dms.append(np.array(env["dm"]))
    mf.kernel()
    nocc = mol.nelectron // 2
    for ref in (6, 8, 10):
        if ref + 1 >= len(dms):
            continue
        w = np.abs(np.linalg.eigvalsh(dms[-1] - dms[ref]))
        print(f"rank: ΔD between cycle {ref} and the last ({len(dms)}): max |λ| {w.max():.1e}, "
              f"{int(np.sum(w > 1e-6))} / {int(np.sum(w > 1e-8))} eigenvalues above 1e-6 / 1e-8 of 2·nocc = {2 * nocc}")


def guess(mol) -> None:
    for name in ("minao", "atom", "huckel", "sap"):
        mf = scf.RHF(mol).density_fit()
        mf.conv_tol, mf.verbose, mf.init_guess = 1e-10, 0, name
        t0 = time.perf_counter()
        mf.kernel()
        print(f"guess {name}: {mf.cycles} cycles, {time.perf_counter() - t0:.1f} s, E = {mf.e_tot:.10f}")
    projected(mol)


def projected(mol) -> None:
    """The SCF on mp2trn's cpu J/K builds from minao and from a smaller basis's converged density projected
    up (PySCF's ``project_dm_nr2nr``): cycles, the small SCF's cost and the whole SCF's."""
    from mp2trn.jk import density_fit_jk

    for small in ("minao", "sto-3g", "6-31g"):
        t0 = time.perf_counter()
        dm0 = None
        if small != "minao":
            mol_small = mol.copy()
            mol_small.basis = small
            mol_small.build()
            mf_small = scf.RHF(mol_small).density_fit(auxbasis="def2-universal-jkfit")
            mf_small.verbose, mf_small.conv_tol = 0, 1e-6
            mf_small.kernel()
            dm0 = scf.addons.project_dm_nr2nr(mol_small, mf_small.make_rdm1(), mol)
        t_guess = time.perf_counter() - t0
        mf = density_fit_jk(scf.RHF(mol).density_fit(), device="cpu")
        mf.conv_tol, mf.verbose, mf.conv_check = 1e-10, 0, False
        t1 = time.perf_counter()
        mf.kernel(dm0=dm0)
        print(f"projected guess from {small}: small SCF {t_guess:.1f} s, then {mf.cycles} cycles, "
              f"{time.perf_counter() - t1:.1f} s (mp2trn cpu fp64 J/K), E = {mf.e_tot:.10f}")


def soscf(mol) -> None:
    """PySCF's second-order SCF (``newton()``) against DIIS, both on mp2trn's cpu fp64 J/K builds: cycles,
    J/K builds (each orbital-Hessian product is one) and time; and DIIS handing over to ``newton()`` once the
    orbital gradient is below 1e-3 ("near the end")."""
    from mp2trn.jk import density_fit_jk

    def counted(mf):
        # conv_tol_grad None: PySCF's default sqrt(conv_tol), for every run — the hand-over run must not
        # keep the loose 1e-3 of the DIIS part it starts from
        mf.conv_tol, mf.conv_tol_grad, mf.verbose, mf.conv_check = 1e-10, None, 0, False
        return mf

    runs = {}
    diis = counted(density_fit_jk(scf.RHF(mol).density_fit(), device="cpu"))
    t0 = time.perf_counter()
    diis.kernel()
    runs["DIIS"] = (diis, time.perf_counter() - t0)
    newton = counted(density_fit_jk(scf.RHF(mol).density_fit(), device="cpu").newton())
    t0 = time.perf_counter()
    newton.kernel()
    runs["newton() from the start"] = (newton, time.perf_counter() - t0)
    early = counted(density_fit_jk(scf.RHF(mol).density_fit(), device="cpu"))
    early.conv_tol, early.conv_tol_grad = 1e-6, 1e-3
    t0 = time.perf_counter()
    early.kernel()
    late = counted(early.newton())
    late.kernel(early.mo_coeff, early.mo_occ)
    runs["DIIS to |g| < 1e-3, then newton()"] = (late, time.perf_counter() - t0)
    for label, (mf, seconds) in runs.items():
        builds = len(mf.with_df.log.builds) if isinstance(mf.with_df, DeviceJK) else None
        print(f"soscf {label}: {mf.cycles} cycles, {builds} J/K builds, {seconds:.1f} s, E = {mf.e_tot:.10f} "
              f"({mf.e_tot - runs['DIIS'][0].e_tot:+.1e} Eh vs DIIS)")


def planes(mol) -> None:
    from mp2trn.devices import get_device
    from mp2trn.devices.nki_device import SYRK_X3_ROWS, _pad_rows
    from mp2trn.kernels.syrk import lower_to_full
    from mp2trn.precision import get_precision

    auxmol = df.addons.make_auxmol(mol, df.make_auxbasis(mol, mp2fit=False))
    naux, nao, nocc = auxmol.nao_nr(), mol.nao_nr(), mol.nelectron // 2
    rng = np.random.default_rng(0)
    rows = 256                                      # one block of the tensor's rows, timed and scaled
    block = rng.standard_normal((rows, nao, nao))
    block = lib.pack_tril(block + block.transpose(0, 2, 1))     # the host keeps the tensor's rows packed
    scale = naux / rows
    dev = get_device("sim", "fp32")
    t0 = time.perf_counter()
    dev.jk_tensor(block, np.float32)
    t1 = time.perf_counter()
    dev.jk_tensor(block, np.float64, planes=3)
    t2 = time.perf_counter()
    mode = get_precision("fp32x3")
    z = rng.standard_normal((rows * nocc, nao))
    rest = rng.standard_normal(z.shape).astype(np.float32)
    t3 = time.perf_counter()
    zz = z.astype(np.float32).astype(np.float64) + rest                        # mode.combine
    rho = np.einsum("pin,ni->p", zz.reshape(rows, nocc, nao), rng.standard_normal((nao, nocc)))
    vk = np.zeros((nao, nao))
    for r0 in range(0, zz.shape[0], SYRK_X3_ROWS):
        mode.split_operand(_pad_rows(zz[r0:r0 + SYRK_X3_ROWS], SYRK_X3_ROWS), axis=0, moving=True)
        vk += lower_to_full(np.tril(rng.standard_normal((nao, nao))))
    t4 = time.perf_counter()
    print(f"naux {naux} (JK fit), nao {nao}, nocc {nocc}; timed on {rows} rows, scaled to naux (x{scale:.2f}):")
    print(f"| host work of the sim/neuron J/K builds | s |\n|---|---:|")
    print(f"| fp32 copy of the tensor (once per SCF) | {(t1 - t0) * scale:.2f} |")
    print(f"| compensated planes of the tensor, split along mu and along P (once per SCF) | {(t2 - t1) * scale:.2f} |")
    print(f"| per fp32x3 build: Z's planes added, rho, Z split again for the syrk, K filled | {(t4 - t3) * scale:.2f} |")
    del rho


_HEAP_CHILD = """
import sys, time
import numpy as np
from mp2trn.memory import return_freed_memory
return_freed_memory(float(sys.argv[1]))
x = np.random.default_rng(0).standard_normal(1_000_000)      # 8 MB
t0 = time.perf_counter()
for _ in range(300):
    y = x * 2.0
    z = y + x
print((time.perf_counter() - t0) / 600 * 1e3)
"""


def refault(mol, rounds: int = 2, pause: float = 5.0) -> None:
    shape = _tensor_shape(mol)
    gb = np.prod(shape) * 8 / 1e9
    arena = Arena(int(np.prod(shape)) * 8)

    def filled(make) -> float:
        t0 = time.perf_counter()
        a = make()
        a[...] = 1.0
        return time.perf_counter() - t0

    for rnd in range(rounds):
        fresh = filled(lambda: prefaulted_empty(shape))     # freed again as the array goes
        time.sleep(pause)
        again = filled(lambda: prefaulted_empty(shape))
        first = filled(lambda: arena.carve(shape))
        time.sleep(pause)
        reused = filled(lambda: arena.carve(shape))
        print(f"refault round {rnd + 1}, {gb:.2f} GB: prefaulted_empty {fresh:.2f} s, again after {pause:.0f} s "
              f"{again:.2f} s; Arena.carve {first:.2f} s, again after {pause:.0f} s (pages kept) {reused:.2f} s")


def heap(mol) -> None:
    budgets = {"128 kB (budget None or < 13 MB)": 0.0, "32 MB (budget >= 3.2 GB)": 4000.0}
    times = {k: [] for k in budgets}
    for _ in range(2):
        for label, budget in budgets.items():
            out = subprocess.run([sys.executable, "-c", _HEAP_CHILD, str(budget)], capture_output=True, text=True,
                                 check=True, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
            times[label].append(float(out.stdout))
    for label, ts in times.items():
        print(f"mmap threshold {label}: {min(ts):.2f} ms per 8 MB elementwise step (best of {len(ts)} processes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xyz", default=str(ROOT / "molecules/gpu4pyscf/organic/031_Inosine.xyz"))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--only", nargs="+", default=["tensor", "touch", "blocks", "rank", "guess"],
                    choices=["tensor", "touch", "blocks", "rank", "guess", "soscf", "planes", "heap", "copy",
                             "refault"])
    ap.add_argument("--fill", nargs="+", help=argparse.SUPPRESS)   # touch's child process: LABEL N1 N2 N3
    ap.add_argument("--copy", nargs="+", help=argparse.SUPPRESS)   # copy's child process: LABEL N1 N2 N3
    args = ap.parse_args()
    if args.fill:
        _fill(args.fill[0], tuple(int(n) for n in args.fill[1:]))
        return
    if args.copy:
        _copy(args.copy[0], tuple(int(n) for n in args.copy[1:]))
        return
    mol = build_mole(args.xyz, basis=args.basis)
    print(f"{Path(args.xyz).stem}/{args.basis}; {machine_description()}")
    for what in args.only:
        globals()[what](mol)


if __name__ == "__main__":
    main()
