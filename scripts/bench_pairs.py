"""Time the cpu device's MP2 pair step against this machine's DGEMM/SGEMM rate, piece by piece.

    python scripts/bench_pairs.py                         # nocc 24, nvir 300, naux 900, fp64 and fp32
    python scripts/bench_pairs.py --nocc 44 --nvir 400 --naux 1100 --threads 1

Random B (the step's time does not depend on the values) of the given sizes, paired as a run pairs it
(blocks of the memory plan's occupied block, i ≤ j over blocks): the whole step, its GEMMs alone, and so
the elementwise reduction T·(T or Tᵀ)/D as the rest; each as counted GFLOP/s (the T GEMMs' arithmetic)
and share of the GEMM rate measured in the same run. Beside the cpu device (its rows split over the cores,
one BLAS thread each, so that each core reduces its own pairs between its own GEMMs), the same step in one
part with NumPy's pool in each GEMM (the reduction, NumPy elementwise work, then runs on one core while the
others wait), a layout tried and found slower (every pair's tile contiguous) and, in fp32, the reduction
before its fp32 row sums (each pair's whole-tile sums accumulated in fp64). ``--threads 1`` holds every BLAS pool to one thread and times in this thread's CPU time, which a
loaded machine disturbs far less than wall time. A benchmark: it asserts nothing about speed; it checks
that the tried layout and the reduction before give the device's pair sums (1e-12 relative in fp64, 1e-5 in
fp32).

``--sweep`` times the gradient's pair step instead (:meth:`CpuDevice.pair_densities`, one strip: every i
against ``--nk`` orbitals k; Inosine/cc-pVDZ's sizes with ``--nocc 70 --nvir 256 --naux 1232``) against the
same in one part with NumPy's pool in each GEMM and against the form it replaced, one k at a time with
reordered copies for P_ab (:class:`OneColumnSweep`), round robin with the GEMM rate; counted GFLOP/s as
the device's meter counts them.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mp2trn.devices import cpu as cpu_module
from mp2trn.devices.base import PairDensities
from mp2trn.devices.cpu import CpuDevice, _as_matrix
from mp2trn.machine import machine_description
from mp2trn.memory import SpinShape, plan_blocks
from mp2trn.roofline import GEMM_N, measure_gemm_rate


class GemmOnly(CpuDevice):
    """The cpu device's pair step with the reduction left out: its GEMMs alone, one per row i as the device
    forms them (against rows i.. on the diagonal block, against the other block's rows off it), in this
    thread with NumPy's pool. (Before 2026-11-27's row-by-row pair step, one GEMM for a whole off-diagonal
    block, as the device formed it then.)"""

    def _pair_energies(self, b_i, b_j, e_i, e_j, ev_a, ev_b, exchange):
        same = b_j is None
        ni, nva = b_i.shape[1], b_i.shape[2]
        x_i = _as_matrix(b_i, self._dtype)
        if same:
            for i in range(ni):
                self.contract_aux(x_i[:, i * nva : (i + 1) * nva], x_i[:, i * nva :])
            return np.zeros((ni, ni)), None
        x_j = _as_matrix(b_j, self._dtype)
        for i in range(ni):
            self.contract_aux(x_i[:, i * nva : (i + 1) * nva], x_j)
        return np.zeros((ni, b_j.shape[1])), None


def _whole_tile_fp64_sums(m, e_i, e_j, e_ab, os_row, x_row) -> None:
    """The pair reduction before 2026-11-28: each pair's two sums over the whole tile in one einsum each,
    accumulated in fp64 (for fp32 tiles einsum casts every element through a buffer)."""
    dt = m.dtype.type
    acc = None if dt is np.float64 else np.float64
    w = np.empty(e_ab.shape, dtype=m.dtype)
    for j in range(m.shape[1]):
        t = m[:, j, :]
        np.subtract(dt(e_i + e_j[j]), e_ab, out=w)
        np.divide(t, w, out=w)
        os_row[j] = np.einsum("ab,ab->", w, t, dtype=acc)
        if x_row is not None:
            x_row[j] = np.einsum("ab,ba->", w, t, dtype=acc)


class WholeTileSumsCpu(CpuDevice):
    """The cpu device with its pair reduction as before 2026-11-28 (:func:`_whole_tile_fp64_sums`; the same
    in fp64, where only the fp32 sums changed): the device's own step, its module's reduction swapped in for
    the call. The swap is seen by the step's worker threads (they look the function up at each row), so
    no other variant may run at the same time."""

    def _pair_energies(self, *args):
        kept = cpu_module._reduce_row
        cpu_module._reduce_row = _whole_tile_fp64_sums
        try:
            return super()._pair_energies(*args)
        finally:
            cpu_module._reduce_row = kept


class ContiguousTilesCpu(CpuDevice):
    """Tried and not adopted (kept to show it): every pair's tile contiguous, (j, b, a) from one GEMM per
    row i, (nj·nvb × naux)·(naux × nva), the transpose of the device's row GEMM, so that the reduction reads
    it at unit stride; in one thread with NumPy's pool. Slower on the Intel VM (the GEMMs lost more than the
    reduction gained), level with the device's form on the EPYC VM."""

    def _pair_energies(self, b_i, b_j, e_i, e_j, ev_a, ev_b, exchange):
        same = b_j is None
        ni, nva = b_i.shape[1], b_i.shape[2]
        x_i = _as_matrix(b_i, self._dtype)
        x_j = x_i if same else _as_matrix(b_j, self._dtype)
        nvb = nva if same else b_j.shape[2]
        os_ = np.zeros((ni, x_j.shape[1] // nvb))
        xx = np.zeros_like(os_) if exchange else None
        e_ba = (ev_b[:, None] + ev_a[None, :]).astype(self._dtype)   # the tiles are Tᵀ (b, a)
        for i in range(ni):
            j0 = i if same else 0
            tiles = self.contract_aux(x_j[:, j0 * nvb :], x_i[:, i * nva : (i + 1) * nva]).reshape(-1, nvb, nva)
            w = np.empty(e_ba.shape, dtype=tiles.dtype)
            acc = None if tiles.dtype == np.float64 else np.float64
            for j in range(tiles.shape[0]):
                np.subtract(tiles.dtype.type(e_i[i] + e_j[j0 + j]), e_ba, out=w)
                np.divide(tiles[j], w, out=w)
                os_[i, j0 + j] = np.einsum("ab,ab->", w, tiles[j], dtype=acc)
                if xx is not None:
                    xx[i, j0 + j] = np.einsum("ab,ba->", w, tiles[j], dtype=acc)
        return os_, xx


def pair_step(dev: CpuDevice, b: np.ndarray, e_occ, e_vir, occ_block: int):
    """All pairs i ≤ j of one spin in blocks of ``occ_block`` occupied orbitals, as mp2trn.energy pairs them."""
    nocc = b.shape[1]
    blocks = [(i0, min(nocc, i0 + occ_block)) for i0 in range(0, nocc, occ_block)]
    out = np.zeros((nocc, nocc)), np.zeros((nocc, nocc))
    for bi, (i0, i1) in enumerate(blocks):
        for j0, j1 in blocks[bi:]:
            same = i0 == j0
            o, x = dev.pair_energies(b[:, i0:i1], None if same else b[:, j0:j1], e_occ[i0:i1], e_occ[j0:j1],
                                     e_vir, e_vir, exchange=True)
            out[0][i0:i1, j0:j1] += o
            if x is not None:
                out[1][i0:i1, j0:j1] += x
    return out


TABLE_HEAD = "| precision | code | s | GFLOP/s | of the GEMM rate |\n|---|---|---:|---:|---:|"


def random_orbitals(nocc: int, nvir: int, naux: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random B (naux, nocc, nvir) and occupied and virtual orbital energies (the step's time does not
    depend on the values)."""
    rng = np.random.default_rng(0)
    b = 0.05 * rng.standard_normal((naux, nocc, nvir))
    return b, -1.0 - rng.random(nocc), 0.2 + rng.random(nvir)


class OneColumnSweep(CpuDevice):
    """The gradient's pair step as it was before 2026-11-27: τ of one k per GEMM as (i, a, b), t̃ from it,
    and P_ab through (a, (i, b)) copies of both."""

    def _pair_densities(self, b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch, vir_k):
        naux, ni, nva = b_all.shape
        nk, nvb = b_k.shape[1], b_k.shape[2]
        x_all = _as_matrix(b_all, self._dtype)
        b_k = np.asarray(b_k, dtype=self._dtype)
        denom = (e_all[:, None, None] - ev_all[None, :, None] - ev_k[None, None, :]).astype(self._dtype)
        gamma = np.empty((naux, nk, nvb))
        p_occ, p_vir_all = np.zeros((ni, ni)), np.zeros((nva, nva))
        p_vir_k = np.zeros((nvb, nvb)) if vir_k else None

        def by_a(t):
            return np.ascontiguousarray(t.transpose(1, 0, 2)).reshape(t.shape[1], -1)

        for k in range(nk):
            tau = (x_all.T @ np.ascontiguousarray(b_k[:, k, :])).reshape(ni, nva, nvb)
            tau /= denom + e_k[k]
            tt = c_direct * tau - c_exch * tau.transpose(0, 2, 1) if c_exch else c_direct * tau
            gamma[:, k, :] = x_all @ tt.reshape(ni * nva, nvb)
            p_occ += tau.reshape(ni, -1) @ tt.reshape(ni, -1).T
            p_vir_all += by_a(tau) @ by_a(tt).T
            if vir_k:
                p_vir_k += tau.reshape(-1, nvb).T @ tt.reshape(-1, nvb)
        return PairDensities(gamma, p_occ, p_vir_all, p_vir_k)


def sweep(args) -> None:
    """``--sweep``: the gradient's pair step, the cpu device against :class:`OneColumnSweep`."""
    nocc, nvir, naux, nk = args.nocc, args.nvir, args.naux, args.nk
    b_all, e_occ, e_vir = random_orbitals(nocc, nvir, naux)
    b_k = np.ascontiguousarray(b_all[:, :nk])
    per_k = 2.0 * nocc * nvir * nvir * (2 * naux + nocc + nvir)
    print(f"nocc {nocc}, nvir {nvir}, naux {naux}, {nk} k: {per_k * nk / 1e9:.0f} GFLOP counted; "
          f"{machine_description()}; wall time, best of {args.repeat}")
    print(TABLE_HEAD)
    for precision in args.precision:
        dtype = np.float32 if precision == "fp32" else np.float64
        one_part = CpuDevice(precision)
        one_part.split_over_cores = False
        variants = {"cpu device (k split over the cores)": CpuDevice(precision),
                    "one part, NumPy's pool (k in columns of two)": one_part,
                    "before: one k at a time": OneColumnSweep(precision)}
        best = dict.fromkeys(list(variants) + ["gemm"], float("inf"))
        results = {}
        for _ in range(args.repeat):
            best["gemm"] = min(best["gemm"], 2.0 * GEMM_N**3 / 1e9 / measure_gemm_rate(dtype, repeats=1))
            for label, dev in variants.items():
                t0 = time.perf_counter()
                results[label] = dev.pair_densities(b_all.astype(dtype), b_k.astype(dtype), e_occ, e_occ[:nk],
                                                    e_vir, e_vir, 2.0, 1.0, False)
                best[label] = min(best[label], time.perf_counter() - t0)
        rate = 2.0 * GEMM_N**3 / 1e9 / best["gemm"]
        for label in variants:
            gflops = per_k * nk / best[label] / 1e9
            print(f"| {precision} | {label} | {best[label]:.3f} | {gflops:.0f} | {gflops / rate:.0%} |")
        print(f"| {precision} | {GEMM_N}³ GEMM | | {rate:.0f} | 100% |")
        old = results["before: one k at a time"]
        tol = 1e-12 if precision == "fp64" else 1e-5
        for label, new in results.items():
            for a, c in zip(new[:3], old[:3]):
                assert np.abs(a - c).max() <= tol * np.abs(c).max(), f"{label} disagrees with the form before"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nocc", type=int, default=24)
    ap.add_argument("--nvir", type=int, default=300)
    ap.add_argument("--naux", type=int, default=900)
    ap.add_argument("--precision", nargs="+", default=["fp64", "fp32"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="hold every BLAS pool to this many threads")
    ap.add_argument("--sweep", action="store_true", help="the gradient's pair step (see above)")
    ap.add_argument("--nk", type=int, default=8, help="--sweep: occupied orbitals k in the strip")
    args = ap.parse_args()
    if args.sweep:
        sweep(args)
        return
    if args.threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    nocc, nvir, naux = args.nocc, args.nvir, args.naux
    b64, e_occ, e_vir = random_orbitals(nocc, nvir, naux)
    occ_block = plan_blocks(nvir + nocc, naux, [SpinShape(nocc, nvir)], 50, 4000).occ_block
    flops = naux * nvir**2 * nocc * (nocc + 1)   # the T GEMMs of all pairs i ≤ j
    print(f"nocc {nocc}, nvir {nvir}, naux {naux}, occupied block {occ_block}: {flops / 1e9:.1f} GFLOP of T GEMMs; "
          f"{machine_description()}; {'one BLAS thread, CPU time' if args.threads == 1 else 'wall time'}")
    print(TABLE_HEAD)
    for precision in args.precision:
        dtype = np.float32 if precision == "fp32" else np.float64
        b = b64.astype(dtype)
        pool = CpuDevice(precision)
        pool.split_over_cores = False
        variants = {"cpu device": CpuDevice(precision), "one part, NumPy's pool in each GEMM": pool,
                    "its GEMMs alone": GemmOnly(precision), "tried: contiguous tiles": ContiguousTilesCpu(precision)}
        if precision == "fp32":
            variants["before: whole-tile sums in fp64"] = WholeTileSumsCpu(precision)
        best = dict.fromkeys(list(variants) + ["gemm"], float("inf"))
        results = {}
        for _ in range(args.repeat):   # round robin, the GEMM rate among them: a changing load meets all alike
            best["gemm"] = min(best["gemm"], 2.0 * GEMM_N**3 / 1e9 / measure_gemm_rate(dtype, repeats=1, clock=clock))
            for label, dev in variants.items():
                t0 = clock()
                results[label] = pair_step(dev, b, e_occ, e_vir, occ_block)
                best[label] = min(best[label], clock() - t0)
        rate = 2.0 * GEMM_N**3 / 1e9 / best["gemm"]
        for label in variants:
            print(f"| {precision} | {label} | {best[label]:.3f} | {flops / best[label] / 1e9:.0f} | "
                  f"{flops / best[label] / 1e9 / rate:.0%} |")
        print(f"| {precision} | {GEMM_N}³ GEMM | | {rate:.0f} | 100% |")
        tol = 1e-12 if precision == "fp64" else 1e-5
        for label in ("tried: contiguous tiles", "before: whole-tile sums in fp64"):
            for a, c in zip(results.get(label, ()), results["cpu device"]):
                assert np.abs(a - c).max() <= tol * np.abs(c).max(), f"{label} disagrees with the cpu device"


if __name__ == "__main__":
    main()
