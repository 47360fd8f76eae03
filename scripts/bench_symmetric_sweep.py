"""Tried and not adopted: the gradient's pair sweep over unordered pairs, timed against the sweep mp2trn runs
(numbers for docs/gradients.md, "Why the pair sweep does not use the i↔j symmetry").

    python scripts/bench_symmetric_sweep.py                       # Inosine/cc-pVDZ's sizes, RHF MP2, fp64
    python scripts/bench_symmetric_sweep.py --sizes 300 12 40 --block 4 --repeat 1

The sweep mp2trn runs (:func:`mp2trn.grad.densities.sweep` on the cpu device) forms every ordered pair (i, k)
once: a strip is every i against a block K of k. The experiment below forms each unordered pair once — the
strip of K takes only the orbitals from K on, a pair (i, k) past K standing for (k, i) too — which halves the
amplitude GEMM and the elementwise work, but:

- Γ̄ still takes two GEMMs per pair (one into the rows of k, one into the rows of i, gathered in an array
  beside Γ̄ until i's own strip comes);
- P_ij = Σ_kab τ_ik^ab t̃_jk^ab pairs two amplitudes that share k, which sit in different strips, so τ of
  every ordered pair is kept (o²·v² numbers, 2.57 GB for Inosine, in pages mapped ahead:
  :func:`mp2trn.memory.prefaulted_empty`) and P_ij comes after the strips from it.

Both run on random B (naux × nocc·nvir) and orbital energies, the cores split as the cpu device splits them
(the experiment by rows, one BLAS thread each), in this process, alternating, the faster of ``--repeat``
kept; the experiment's Γ̄, P_ij and P_ab are checked against the sweep's. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy.linalg import blas as scipy_blas

from mp2trn.devices import get_device
from mp2trn.devices.cpu import _exchanged
from mp2trn.grad import densities
from mp2trn.machine import machine_description
from mp2trn.memory import prefaulted_empty
from mp2trn.orbitals import SpinOrbitals
from mp2trn.threads import one_blas_pool, one_thread_each
from mp2trn.transform import BStore

#: k per amplitude GEMM, as the cpu device's sweep
COLUMNS = 2


def symmetric_strip(x: np.ndarray, nk: int, e_rows: np.ndarray, ev: np.ndarray, c_direct: float, c_exch: float,
                    mirror: np.ndarray, tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One strip: rows (naux, nr·nv) of B from the block's first orbital on, the block its first ``nk``.
    Returns Γ̄ of the block's k from these rows (naux, nk·nv) and P_ab; adds the mirrored pairs' Γ̄ into
    ``mirror`` (naux, nr − nk, nv) and writes τ_ik and, past the block, τ_ki into ``tiles`` (nr, nr, nv, nv)."""
    naux = x.shape[0]
    nr, nv = len(e_rows), len(ev)
    denom = e_rows[:, None, None] - ev[None, :, None] - ev[None, None, :]
    gemm = scipy_blas.get_blas_funcs("gemm", dtype=np.float64)
    parts: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def run(part: int, r0: int, r1: int) -> None:
        rp, m0 = r1 - r0, max(nk, r0)
        p_vir, g_k = np.zeros((nv, nv)), np.zeros((naux, nk * nv))
        back = np.zeros((naux, (r1 - m0) * nv)) if r1 > m0 else None
        tau_flat = np.empty(rp * nv * COLUMNS * nv)
        tt_flat = np.empty_like(tau_flat)
        w = np.empty((nv, nv))
        x_part = x[:, r0 * nv : r1 * nv]
        for c0 in range(0, nk, COLUMNS):
            c1 = min(nk, c0 + COLUMNS)
            size = rp * nv * (c1 - c0) * nv
            tau, tt = tau_flat[:size].reshape(rp, nv, -1), tt_flat[:size].reshape(rp, nv, -1)
            b_k = np.ascontiguousarray(x[:, c0 * nv : c1 * nv])
            np.matmul(x_part.T, b_k, out=tau.reshape(rp * nv, -1))
            for j in range(c1 - c0):
                k, cols = c0 + j, slice(j * nv, (j + 1) * nv)
                for r in range(rp):
                    i = r0 + r
                    t, out = tau[r, :, cols], tt[r, :, cols]
                    np.add(denom[i], e_rows[k], out=w)
                    np.divide(t, w, out=t)
                    _exchanged(t, c_direct, c_exch, w, out)
                    tiles[i, k] = t
                    if i >= nk:
                        tiles[k, i] = t.T
                if back is not None:
                    p_vir += tau[m0 - r0 :, :, cols].reshape(-1, nv).T @ tt[m0 - r0 :, :, cols].reshape(-1, nv)
            g_k[:, c0 * nv : c1 * nv] += x_part @ tt.reshape(rp * nv, -1)
            if back is not None:         # Σ_kb B_Q,kb t̃_ik^ab into the rows past the block, in place (β = 1)
                gemm(1.0, tt[m0 - r0 :].reshape((r1 - m0) * nv, -1).T, b_k.T, beta=1.0, c=back.T, trans_a=1,
                     overwrite_c=1)
            for r in range(rp):
                p_vir += tau[r] @ tt[r].T
        if back is not None:
            mirror[:, m0 - nk : r1 - nk] += back.reshape(naux, r1 - m0, nv)
        parts[part] = (g_k, p_vir)

    work = np.where(np.arange(nr) < nk, 2.0, 3.0)        # a row past the block: its mirrored pair's GEMMs too
    cum = np.concatenate([[0.0], np.cumsum(work)])
    cut = int(np.searchsorted(cum, cum[-1] / 2))
    ranges = [(0, cut), (cut, nr)] if 0 < cut < nr else [(0, nr)]
    with one_thread_each(), ThreadPoolExecutor(len(ranges)) as pool:
        list(pool.map(lambda p: run(p, *ranges[p]), range(len(ranges))))
    return sum(parts[p][0] for p in sorted(parts)), sum(parts[p][1] for p in sorted(parts))


def occupied_from_tiles(tiles: np.ndarray, c_direct: float, c_exch: float) -> np.ndarray:
    """Σ_kab τ_ik^ab t̃_jk^ab from τ of every ordered pair: Σ_k F_k (c_direct F_k − c_exch G_k)ᵀ."""
    n = tiles.shape[0]
    p = np.zeros((n, n))
    for k in range(n):
        col = tiles[:, k].reshape(n, -1)
        p += c_direct * (col @ col.T) - c_exch * (col @ tiles[k].reshape(n, -1).T)
    return p


def symmetric_sweep(b: np.ndarray, spin: SpinOrbitals, block: int, c_direct: float, c_exch: float):
    """(Γ̄ (naux, nocc·nvir), P_ij, P_ab) as :func:`mp2trn.grad.densities.sweep` returns them (RHF)."""
    naux, (nocc, nv) = b.shape[0], (spin.nocc, spin.nvir)
    tiles = prefaulted_empty((nocc, nocc, nv, nv))
    mirror = np.zeros((naux, nocc, nv))
    gamma = np.empty((naux, nocc * nv))
    p_vir = np.zeros((nv, nv))
    for k0 in range(0, nocc, block):
        k1 = min(nocc, k0 + block)
        g_k, pv = symmetric_strip(b[:, k0 * nv :], k1 - k0, spin.e_occ[k0:], spin.e_vir, c_direct, c_exch,
                                  mirror[:, k1:], tiles[k0:, k0:])
        p_vir += pv
        gamma[:, k0 * nv : k1 * nv] = 2.0 * (g_k + mirror[:, k0:k1].reshape(naux, -1))
    p_occ = -occupied_from_tiles(tiles, c_direct, c_exch)
    return gamma, (p_occ + p_occ.T) / 2, (p_vir + p_vir.T) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs=3, type=int, default=(1232, 70, 256), metavar=("NAUX", "NOCC", "NVIR"))
    ap.add_argument("--block", type=int, default=10, help="occupied orbitals k per strip")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    naux, nocc, nvir = args.sizes
    rng = np.random.default_rng(1)
    spin = SpinOrbitals.from_active("", rng.normal(size=(8, nocc)), rng.normal(size=(8, nvir)),
                                    np.sort(rng.uniform(-2.0, -0.4, nocc)), np.sort(rng.uniform(0.2, 3.0, nvir)))
    device = get_device("cpu")
    print(f"machine: {machine_description()}; naux {naux}, nocc {nocc}, nvir {nvir}, {args.block} k per strip, "
          f"RHF MP2, fp64; τ kept: {nocc * nocc * nvir * nvir * 8 / 1e9:.2f} GB")
    times: dict[str, list[float]] = {"ordered (mp2trn)": [], "unordered pairs, τ kept": []}
    with BStore(naux, [spin], np.float64, True) as store, BStore(naux, [spin], np.float64, True) as gamma:
        store.arrays[0][...] = rng.normal(scale=0.05, size=store.arrays[0].shape)
        for _ in range(args.repeat):
            with one_blas_pool():
                t0 = time.perf_counter()
                ordered = densities.sweep(store, [spin], device, args.block, 1.0, 1.0, gamma)
                times["ordered (mp2trn)"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                g, p_occ, p_vir = symmetric_sweep(store.arrays[0], spin, args.block, 2.0, 1.0)
                times["unordered pairs, τ kept"].append(time.perf_counter() - t0)
        diffs = [np.max(np.abs(g - gamma.arrays[0])), np.max(np.abs(p_occ - ordered.p_occ[0])),
                 np.max(np.abs(p_vir - ordered.p_vir[0]))]
    print("| sweep | s (best of %d) |" % args.repeat)
    print("|---|---:|")
    for name, ts in times.items():
        print(f"| {name} | {min(ts):.2f} |")
    print(f"max abs difference: Γ̄ {diffs[0]:.1e}, P_ij {diffs[1]:.1e}, P_ab {diffs[2]:.1e}")


if __name__ == "__main__":
    main()
