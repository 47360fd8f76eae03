"""Time one J/K build: PySCF's density-fitted ``get_jk`` against mp2trn's device J/K, same density.

    python scripts/bench_jk.py                      # Inosine/cc-pVDZ (JK-fit), cpu fp64 and fp32
    python scripts/bench_jk.py --xyz molecules/benzene.xyz --basis cc-pvtz --repeat 5
    python scripts/bench_jk.py --cast          # only: the tensor in fp32, kept copy vs reused buffer
    python scripts/bench_jk.py --peak          # only: this machine's DGEMM and SGEMM rates (4000² GEMM)
    python scripts/bench_jk.py --layouts       # also the unpacked layout (naux, nao, nao) on the cpu device
                                               # (the cpu device is also timed in one part, NumPy's pool in
                                               # each GEMM: the split over the cores alone)
    python scripts/bench_jk.py --parts         # only: the tensor build (integrals, triangular solve), then the
                                               # pieces of each precision's packed build and their shares
    python scripts/bench_jk.py --stream        # only: PySCF's tensor in its HDF5 file, streamed builds vs
                                               # PySCF's outcore get_jk on that file vs resident builds

Prints seconds per build (best of --repeat), GFLOP/s of the exchange build (counted as
4·naux·nao²·nocc: the half-transform B_P C and the rank update, as PySCF counts none of the syrk saving)
and its share of this run's DGEMM (fp64) or SGEMM (fp32) rate, the speed-up over PySCF and max |ΔJ|, |ΔK|. ``--cast`` times the two ways of having the fp64 tensor
(naux, nao, nao) in fp32 for an fp32 build: a kept copy (fresh memory, made once per SCF) against
converting at every build, either each 256-row block whole into one reused buffer before its GEMMs, or,
as the cpu device does, a few rows at a time, read by the GEMMs while still in cache; run it in a fresh
process, as a run meets the copy. A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from pyscf import scf

from mp2trn.devices import get_device
from mp2trn.devices.cpu import CpuDevice
from mp2trn.jk import density_fit_jk
from mp2trn.machine import machine_description
from mp2trn.memory import default_memory_mb
from mp2trn.molecule import build_mole
from mp2trn.roofline import GEMM_N, measure_gemm_rate

ROOT = Path(__file__).resolve().parents[1]


def best(fn, repeat):
    out, t_best = None, float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t0)
    return out, t_best


def cast_costs(mol, rows: int = 256) -> None:
    """An fp32 build from the fp64 tensor: the cost of a kept fp32 copy (once per SCF), and seconds per
    build converting each 256-row block whole into a reused buffer before its GEMMs (what the cpu device
    did until 2026-11-23) against the cpu device's build, which converts a few rows at a time."""
    from mp2trn.df import cholesky_tensor
    from pyscf import df

    full = cholesky_tensor(mol, df.addons.make_auxmol(mol, df.make_auxbasis(mol)))
    nao, nocc = full.shape[1], mol.nelectron // 2
    t0 = time.perf_counter()
    copies = [full[p0 : p0 + rows].astype(np.float32) for p0 in range(0, full.shape[0], rows)]
    t_copy = time.perf_counter() - t0
    del copies
    c = np.linalg.qr(np.random.default_rng(0).standard_normal((nao, nocc)))[0]
    ct = np.ascontiguousarray(c.T, dtype=np.float32)
    buf = np.empty((rows, nao, nao), np.float32)

    def whole_blocks():
        vj, vk = np.zeros(nao * nao, np.float32), np.zeros((nao, nao))
        for p0 in range(0, full.shape[0], rows):
            block = full[p0 : p0 + rows]
            b = buf[: len(block)]
            np.copyto(b, block, casting="same_kind")
            z = np.matmul(ct, b)
            vk += (z.reshape(-1, nao).T @ z.reshape(-1, nao))
            rho = z.reshape(len(b), -1) @ ct.ravel()
            vj += rho @ b.reshape(len(b), -1)
        return vj, vk

    dev = get_device("cpu", "fp32")
    handles = [dev.jk_tensor(full[p0 : p0 + rows], np.dtype(np.float32)) for p0 in range(0, full.shape[0], rows)]
    dm = c @ c.T

    def device_build():
        return [dev.jk_block(h, [(c, 1.0)], dm, True, True) for h in handles]

    _, t_whole = best(whole_blocks, 3)
    _, t_device = best(device_build, 3)
    print(f"tensor {full.nbytes / 1e9:.2f} GB fp64, nocc {nocc}: a kept fp32 copy {t_copy:.2f} s once; per fp32 "
          f"J/K build, whole 256-row blocks converted first {t_whole:.3f} s, the cpu device (a few rows at a "
          f"time) {t_device:.3f} s; {machine_description()}")


def part_costs(mol, precisions: list[str], repeat: int, threads: int | None) -> None:
    """Where the time of a packed build goes: the tensor build (integrals and triangular solve) once, then
    for each precision the cpu device's own builds (``CpuDevice.time_jk_parts``: the pieces timed inside
    the J/K core as a run executes them) — unpacking, fp32 conversion or copy, the half-transform
    Z = Cᵀ B_P, the exchange syrk, J's two passes — with each piece's seconds per build, GFLOP/s where it
    does arithmetic, and share of the build; "rest" is the build's wall time outside the timed pieces
    (Python, the block loop, J's unpack). CPU seconds (all threads) beside wall seconds: on a loaded machine
    their ratio says how much of the cores the build had. With ``threads`` 1 (``--threads 1``) every piece
    and the GEMM rates are timed in this thread's CPU time, which a loaded machine disturbs far less than
    wall time: the shares are then one core's, measured within one run."""
    from pyscf import df
    from scipy.linalg import blas as scipy_blas

    from mp2trn.df import _metric_factor, cholesky_tensor
    from mp2trn.threads import one_blas_pool

    auxmol = df.addons.make_auxmol(mol, df.make_auxbasis(mol))
    t0 = time.perf_counter()
    packed = cholesky_tensor(mol, auxmol, packed=True)
    t_tensor = time.perf_counter() - t0
    naux, nao = packed.shape[0], mol.nao_nr()
    low = _metric_factor(auxmol)
    rhs = np.asfortranarray(packed[:, : min(packed.shape[1], 20000)].T)   # (pairs, naux), a chunk's shape

    def solve_in_place() -> float:   # in place, as df._solved_rows solves (a copy's fresh pages are slow here)
        x = rhs.copy(order="F")
        with one_blas_pool("scipy"):   # SciPy's BLAS on the cores, as df._solved_rows runs it
            t0 = time.perf_counter()
            scipy_blas.dtrsm(1.0, low, x, side=1, lower=1, trans_a=1, overwrite_b=1)
            return time.perf_counter() - t0

    t_trsm = min(solve_in_place() for _ in range(2))
    print(f"nao {nao}, naux {naux}; {machine_description()}")
    print(f"tensor build (integrals + solve, packed): {t_tensor:.2f} s; triangular solve alone: "
          f"{naux * naux * rhs.shape[0] / t_trsm / 1e9:.0f} GFLOP/s, so ≈ {t_trsm * packed.shape[1] / rhs.shape[0]:.1f} s "
          f"of the build (the rest: integrals and copies)")
    del rhs
    dm = _guess_density(mol)
    clock = time.thread_time if threads == 1 else time.perf_counter
    rates = {p: measure_gemm_rate(np.float32 if p == "fp32" else np.float64, clock=clock) for p in ("fp64", "fp32")}
    how = "one BLAS thread, CPU time of this thread" if threads == 1 else "wall time"
    print(f"GEMM {GEMM_N}³ in this run ({how}): DGEMM {rates['fp64']:.0f}, SGEMM {rates['fp32']:.0f} GFLOP/s")
    for precision in precisions:
        _print_parts(mol, dm, get_device("cpu", precision), packed, precision, repeat, clock, rates[precision])
        _print_parts(mol, dm, PoolCpu(precision), packed, f"{precision}, one part, NumPy's pool in each GEMM", repeat, clock,
                     rates[precision])
        if precision == "fp32":   # without room for the copy: unpacked and converted at every build
            _print_parts(mol, dm, ConvertingCpu(precision), packed, "fp32, no copy: converted at every build",
                         repeat, clock, rates[precision])


def _guess_density(mol):
    """A converged-like density: the superposition-of-atoms guess diagonalised once, tagged with its
    orbitals as ``make_rdm1`` tags it."""
    ref = scf.RHF(mol).density_fit()
    mo_energy, mo_coeff = ref.eig(ref.get_hcore() + ref.get_veff(mol, ref.get_init_guess()), ref.get_ovlp())
    return ref.make_rdm1(mo_coeff, ref.get_occ(mo_energy, mo_coeff))


#: the arithmetic of each timed piece of a build, as a multiple of naux·nao²·nocc (None: data movement)
_PIECE_FLOPS = {"half-transform Z = C^T B_P": 2.0, "syrk K += Z^T Z": 1.0, "J: rho_P = B_P.D": None,
                "J: sum_P rho_P B_P": None}


def _print_parts(mol, dm, dev: CpuDevice, packed: np.ndarray, label: str, repeat: int, clock, gemm_rate: float) -> None:
    """Packed builds on ``dev``, piece by piece (the best build of ``repeat``), timed by ``clock``. A build
    split over the cores times each part in its thread: its pieces are core-seconds, set against the
    build's wall time × its parts, and each piece's rate against one core's share of the GEMM rate."""
    from mp2trn.threads import blas_threads

    mf = density_fit_jk(scf.RHF(mol).density_fit(), device=dev, max_memory=default_memory_mb())
    mf.with_df.tensor.full = packed   # the tensor just built: the first build makes only the device's blocks
    parts = dev.time_jk_parts(clock)
    mf.get_jk(mol, dm)
    once = {k: v for k, v in parts.items() if "once" in k}
    best_wall, best_parts, best_cpu = float("inf"), {}, 0.0
    for _ in range(repeat):
        parts = dev.time_jk_parts(clock)
        c0, t0 = time.process_time(), clock()
        mf.get_jk(mol, dm)
        wall, cpu = clock() - t0, time.process_time() - c0
        if wall < best_wall:
            best_wall, best_parts, best_cpu = wall, dict(parts), cpu
    naux, nao, nocc = packed.shape[0], mol.nao_nr(), mol.nelectron // 2
    n = blas_threads() if dev.split_over_cores and clock is not time.thread_time else 1
    flops = 3.0 * naux * nao * nao * nocc
    print(f"\n{label} packed build: {best_wall:.3f} s by the clock, {best_cpu:.3f} s CPU (all threads), best of "
          f"{repeat}, {n} part{'s' if n > 1 else ''}; K's Z and syrk (3·naux·nao²·nocc) at {flops / best_wall / 1e9:.0f} "
          f"GFLOP/s, {flops / best_wall / 1e9 / gemm_rate:.0%} of the GEMM rate {gemm_rate:.0f}; counted as "
          f"4·naux·nao²·nocc (PySCF's count, the issue's table): {flops * 4 / 3 / best_wall / 1e9 / gemm_rate:.0%}")
    print(f"| piece | {'core-' if n > 1 else ''}s per build | GFLOP/s | of the GEMM rate{' per core' if n > 1 else ''} "
          "| share of the build |")
    print("|---|---:|---:|---:|---:|")
    for piece, seconds in sorted(best_parts.items(), key=lambda kv: -kv[1]):
        factor = _PIECE_FLOPS.get(piece)
        rate = factor * naux * nao * nao * nocc / seconds / 1e9 if factor and seconds > 0 else None
        cells = f"{rate:.0f} | {rate * n / gemm_rate:.0%}" if rate else "- | -"
        print(f"| {piece} | {seconds:.3f} | {cells} | {seconds / (best_wall * n):.0%} |")
    rest = best_wall * n - sum(best_parts.values())
    print(f"| rest (Python, block loop, J unpack{', parts waiting' if n > 1 else ''}) | {rest:.3f} | - | - | "
          f"{rest / (best_wall * n):.0%} |")
    for piece, seconds in once.items():
        print(f"| {piece} | {seconds:.3f} | - | - | (not in the build) |")
    mf.with_df.release()


def gemm_peak(n: int = 4000) -> None:
    """GFLOP/s of one n×n×n GEMM in fp64 and fp32 (best of 3): the rate the J/K builds are measured against."""
    rng = np.random.default_rng(0)
    for dtype in (np.float64, np.float32):
        a = rng.standard_normal((n, n)).astype(dtype)
        _, t = best(lambda: a @ a, 3)
        print(f"{np.dtype(dtype).name} GEMM {n}x{n}x{n}: {2 * n**3 / t / 1e9:.0f} GFLOP/s; {machine_description()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xyz", default=str(ROOT / "molecules/gpu4pyscf/organic/031_Inosine.xyz"))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", nargs="+", default=["fp64", "fp32"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peak", action="store_true", help="only print this machine's DGEMM and SGEMM rates")
    ap.add_argument("--cast", action="store_true", help="only time the fp32 copy against per-build conversions")
    ap.add_argument("--layouts", action="store_true", help="also time the unpacked tensor layout")
    ap.add_argument("--stream", action="store_true", help="only time streamed builds from PySCF's HDF5 tensor")
    ap.add_argument("--parts", action="store_true", help="only time the pieces of the packed builds")
    ap.add_argument("--threads", type=int, default=None,
                    help="hold every BLAS pool to this many threads (1: --parts times CPU time, for a loaded machine)")
    args = ap.parse_args()
    mol = build_mole(args.xyz, basis=args.basis)
    if args.peak:
        gemm_peak()
        return
    if args.cast:
        cast_costs(mol)
        return
    if args.stream:
        stream_costs(mol, args.precision, args.repeat)
        return
    if args.threads:   # every BLAS pool held to this many threads (1: the pieces in this thread's CPU time)
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    if args.parts:
        part_costs(mol, args.precision, args.repeat, args.threads)
        return
    ref = scf.RHF(mol).density_fit()
    ref.with_df.build()
    # a converged-like density: the superposition-of-atoms guess, tagged with orbitals as make_rdm1 does
    mo_energy, mo_coeff = ref.eig(ref.get_hcore() + ref.get_veff(mol, ref.get_init_guess()), ref.get_ovlp())
    dm = ref.make_rdm1(mo_coeff, ref.get_occ(mo_energy, mo_coeff))
    nao, naux, nocc = mol.nao_nr(), ref.with_df.get_naoaux(), mol.nelectron // 2
    flops = 4.0 * naux * nao * nao * nocc
    (vj0, vk0), t_ref = best(lambda: ref.get_jk(mol, dm), args.repeat)
    rates = _gemm_rates()
    print(f"{Path(args.xyz).stem}/{args.basis}: nao {nao}, naux {naux}, nocc {nocc}; {machine_description()}")
    rows = []
    devices = [(args.device, None)] + ([("cpu", "one part, NumPy's pool in each GEMM")] if args.device == "cpu" else []) \
        + ([("cpu", "unpacked")] if args.layouts else [])
    for precision in args.precision:
        for name, variant in devices:
            device = {None: name, "unpacked": UnpackedCpu, "one part, NumPy's pool in each GEMM": PoolCpu}[variant]
            device = device(precision) if variant else device
            mf = density_fit_jk(scf.RHF(mol).density_fit(), device=device, precision=None if variant else precision,
                                max_memory=default_memory_mb())   # the budget of a run: the tensor stays resident
            mf.with_df._cderi = ref.with_df._cderi
            mf.get_jk(mol, dm)  # the first build moves the tensor to the device (once per SCF)
            (vj, vk), t = best(lambda: mf.get_jk(mol, dm), args.repeat)
            where = ("resident" if not mf.with_df.tensor.streamed else "streamed") + f", {mf.with_df.tensor.layout}" \
                + (f", {variant}" if variant and variant != "unpacked" else "")
            rows.append((f"mp2trn {name} {precision} ({where})", precision, t, np.abs(vj - vj0).max(),
                         np.abs(vk - vk0).max()))
            mf.with_df.release()
    rates = {p: max(r, rates[p]) for p, r in _gemm_rates().items()}   # the better of before and after the builds
    print(f"GEMM {GEMM_N}³ in this run (the better of before and after the builds): DGEMM {rates['fp64']:.0f}, "
          f"SGEMM {rates['fp32']:.0f} GFLOP/s")
    print("| code | s per J/K build | GFLOP/s (K) | of the GEMM rate | speed-up vs PySCF | max abs dJ | max abs dK |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| PySCF get_jk (fp64) | {t_ref:.3f} | {flops / t_ref / 1e9:.0f} | {flops / t_ref / 1e9 / rates['fp64']:.0%} "
          "| 1.00 | 0 | 0 |")
    for label, precision, t, dj, dk in rows:
        share = flops / t / 1e9 / rates["fp32" if precision == "fp32" else "fp64"]
        print(f"| {label} | {t:.3f} | {flops / t / 1e9:.0f} | {share:.0%} | {t_ref / t:.2f} | {dj:.1e} | {dk:.1e} |")


def _gemm_rates() -> dict[str, float]:
    """This moment's DGEMM and SGEMM rates (GFLOP/s, a GEMM_N³ GEMM, best of 3)."""
    return {p: measure_gemm_rate(np.float32 if p == "fp32" else np.float64) for p in ("fp64", "fp32")}


class UnpackedCpu(CpuDevice):
    """The cpu device reading the unpacked (naux, nao, nao) tensor, as it did before the packed layout."""

    jk_packed = False


class PoolCpu(CpuDevice):
    """The cpu device with its work in one part: NumPy's pool in each GEMM, the unpacking and the rest on
    the calling thread. The same code as the split, so the ratio is the split's alone; the builds before
    the split (commit 74e6f90) ran one wider GEMM per few rows, which suits a pool better: time those with
    this script in a worktree of that commit."""

    split_over_cores = False


class ConvertingCpu(CpuDevice):
    """The cpu device without room for its fp32 copy: fp32 builds unpack and convert the packed fp64 rows a
    few at a time at every build."""

    def jk_copy_itemsize(self, dtype) -> int:
        return 0

    def jk_tensor(self, block, dtype, keep_copy=True):
        return super().jk_tensor(block, dtype, keep_copy=False)


def stream_costs(mol, precisions: list[str], repeat: int) -> None:
    """PySCF's tensor in its HDF5 file: PySCF's outcore get_jk on it; mp2trn's streamed builds (a budget
    below the resident tensor; the reader thread overlaps reading and unpacking the next block with the
    build) from that file and from mp2trn's own tensor file (what a run makes when it streams); and
    mp2trn's resident build for reference."""
    ref = scf.RHF(mol).density_fit()
    ref.with_df.max_memory = 1   # MB: PySCF writes its tensor to its HDF5 file
    ref.with_df.build()
    assert not isinstance(ref.with_df._cderi, np.ndarray)
    mo_energy, mo_coeff = ref.eig(ref.get_hcore() + ref.get_veff(mol, ref.get_init_guess()), ref.get_ovlp())
    dm = ref.make_rdm1(mo_coeff, ref.get_occ(mo_energy, mo_coeff))
    nao, naux = mol.nao_nr(), ref.with_df.get_naoaux()
    packed_mb = naux * nao * (nao + 1) / 2 * 8 / 1e6
    ref.with_df.max_memory = default_memory_mb()
    (vj0, vk0), t_ref = best(lambda: ref.get_jk(mol, dm), repeat)
    print(f"nao {nao}, naux {naux}: packed tensor {packed_mb:.0f} MB in PySCF's HDF5 file; {machine_description()}")
    print("| code | s per J/K build | vs PySCF outcore | max abs dJ | max abs dK |")
    print("|---|---:|---:|---:|---:|")
    print(f"| PySCF get_jk, tensor in its HDF5 file | {t_ref:.3f} | 1.00 | 0 | 0 |")
    for precision in precisions:
        for label, budget in (("streamed from PySCF's HDF5 file", 0.5 * packed_mb),
                              ("streamed from mp2trn's tensor file", 0.5 * packed_mb),
                              ("resident", default_memory_mb())):
            mf = density_fit_jk(scf.RHF(mol).density_fit(), device="cpu", precision=precision, max_memory=budget)
            if "PySCF" in label:
                mf.with_df._cderi = ref.with_df._cderi
            t0 = time.perf_counter()
            mf.get_jk(mol, dm)
            if "mp2trn" in label:   # the first build writes the file
                print(f"(mp2trn's tensor file written in the first build: {time.perf_counter() - t0:.2f} s)")
            (vj, vk), t = best(lambda: mf.get_jk(mol, dm), repeat)
            assert mf.with_df.tensor.streamed == (label != "resident")
            print(f"| mp2trn cpu {precision}, {label} | {t:.3f} | {t_ref / t:.2f} | {np.abs(vj - vj0).max():.1e} "
                  f"| {np.abs(vk - vk0).max():.1e} |")
            mf.with_df.release()


if __name__ == "__main__":
    main()
