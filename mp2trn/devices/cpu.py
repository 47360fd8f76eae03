"""``cpu``: the NumPy/BLAS reference device (fp64 by default, fp32 on request).

The pair step forms T for a block of occupied pairs one row i at a time, each row a GEMM against the
block's other side (BLAS-3 at near peak) taken by whichever core is free (one BLAS thread each), then
reduces each pair's nv×nv tile; on the diagonal block only i ≤ j pairs are formed (row i against rows
i..). The SCF's J/K builds split their tensor rows over the cores in one contiguous range per core.
"""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from pyscf import lib
from scipy.linalg import blas as scipy_blas

from ..memory import prefaulted_empty
from ..packed import UNPACK_CHUNK_BYTES, coulomb_weights, nao_of_pairs
from ..precision import converted_copy
from ..roofline import LONG_INNER_SHAPE, StageMeter, long_inner_transposed
from ..threads import blas_threads, one_blas_pool, one_thread_each
from .base import Device, PairDensities


class CpuDevice(Device):
    """NumPy device. ``precision`` is "fp64" (default) or "fp32" (GEMMs and storage in fp32)."""

    name = "cpu"
    supported_precisions = ("fp64", "fp32")

    #: the pair step's rows and a J/K build's tensor rows split over the cores, one BLAS thread per part
    #: (:meth:`_over_cores`); False: one part in the calling thread, NumPy's pool in each GEMM
    #: (``scripts/bench_jk.py`` and ``scripts/bench_pairs.py`` time both)
    split_over_cores = True

    def __init__(self, precision: str = "fp64"):
        self.precision = precision
        self._dtype = self.mode.compute
        # J/K work buffers kept between builds, per part k of a build: "z{k}" a group of Z rows, "k{k}" its
        # ZᵀZ; "unpacked{k}" and "cast{k}" a few tensor rows unpacked (fp64) and converted to the build's
        # dtype, rewritten for every few rows
        self._jk_bufs: dict[str, np.ndarray] = {}
        # bytes those buffers may hold, all parts together (:meth:`limit_jk_work`; None: the chunk and group
        # sizes below as they are)
        self._jk_work_bytes: float | None = None
        #: seconds per piece of the J/K builds since :meth:`time_jk_parts` (None: not timed)
        self.jk_parts: dict[str, float] | None = None
        self._clock = time.perf_counter
        # seconds and counted flops per stage and precision: the cost report's roofline (mp2trn.roofline)
        self._meter = StageMeter()
        # integrals packed over μ ≥ ν (half the integral work), unpacked a few rows at a time as the transform
        # reads them (:meth:`_packed_ao_to_mo`), in fp64 for both precisions: the transform is where fp32 loses
        # most accuracy; in fp32 the metric solve and the pair step (the O(N⁵) part) run in fp32
        self.ao_packed = True

    def describe(self) -> dict[str, Any]:
        info = {"device": self.name, "precision": self.precision, "backend": f"numpy {np.__version__} ({_blas_name()})"}
        if self.mode.compute != np.float64:
            info["precision_detail"] = ("AO->MO transform in fp64; metric solve and pair step in fp32; pair sums in fp64; "
                                        "reduced SCF builds: K in fp32, J in fp64")
        return info

    def ao_to_mo(self, ao: np.ndarray, c_occ: np.ndarray, c_vir: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        out = self._ao_to_mo(ao, c_occ, c_vir)
        nao, no, nv = c_occ.shape[0], c_occ.shape[1], c_vir.shape[1]
        flops = 2.0 * ao.shape[0] * nao * no * (nao + nv)   # the two half-transforms
        self._meter.add("ao_to_mo", "fp64" if self.ao_packed else self.precision, time.perf_counter() - t0, flops)
        return out

    def _ao_to_mo(self, ao: np.ndarray, c_occ: np.ndarray, c_vir: np.ndarray) -> np.ndarray:
        if self.ao_packed:
            return self._packed_ao_to_mo(ao, c_occ, c_vir).astype(self._dtype, copy=False)
        p, nao, _ = ao.shape
        ao = ao.astype(self._dtype, copy=False)
        c_occ = np.asarray(c_occ, dtype=self._dtype)
        c_vir = np.asarray(c_vir, dtype=self._dtype)
        no = c_occ.shape[1]
        # first half-transform over ν with the (smaller) occupied block: one GEMM (p·nao × nao)·(nao × no);
        # (P|μν) is symmetric, so the transposed result is (P|iμ), made contiguous for one more big GEMM
        half = np.ascontiguousarray((ao.reshape(p * nao, nao) @ c_occ).reshape(p, nao, no).transpose(0, 2, 1))
        return (half.reshape(p * no, nao) @ c_vir).reshape(p, no, -1)

    def _packed_ao_to_mo(self, ao: np.ndarray, c_occ: np.ndarray, c_vir: np.ndarray) -> np.ndarray:
        """(P|ia) (p, no, nv) fp64 from packed rows ``ao`` (p, nao(nao+1)/2), μ ≥ ν.

        The rows are split over the cores (:meth:`_over_cores`); each part unpacks a few rows at a time into
        a buffer of its own (a few MB: still in cache for the GEMMs), takes C_occᵀ (P|μν) row by row (one
        batched GEMM) and then one GEMM with C_vir over those rows. PySCF's ``_ao2mo.nr_e2`` on the packed
        rows did the same per row with OpenMP: 2.8–3.0× slower on Inosine/cc-pVDZ
        (``python scripts/bench_transform.py``)."""
        p = ao.shape[0]
        nao, no = c_occ.shape
        nv = c_vir.shape[1]
        ao = np.ascontiguousarray(ao, dtype=np.float64)
        c_occ_t = np.ascontiguousarray(c_occ.T, dtype=np.float64)
        c_vir = np.ascontiguousarray(c_vir, dtype=np.float64)
        out = np.empty((p, no, nv))
        chunk = max(1, int(_UNPACK_CHUNK_BYTES // (8 * nao * nao)))

        def rows(_: int, r0: int, r1: int) -> None:
            buf = np.empty((min(chunk, r1 - r0), nao, nao))
            for q0 in range(r0, r1, chunk):
                q1 = min(r1, q0 + chunk)
                unpacked = lib.unpack_tril(ao[q0:q1], out=buf[: q1 - q0])
                half = np.matmul(c_occ_t, unpacked)                       # (rows, no, nao) = Σ_μ C_μi (P|μν)
                out[q0:q1] = (half.reshape(-1, nao) @ c_vir).reshape(q1 - q0, no, nv)

        self._over_cores(np.ones(p), rows)
        return out

    def metric_solve(self, l_chol: np.ndarray, v: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        out = self._metric_solve(l_chol, v)
        self._meter.add("metric", self.precision, time.perf_counter() - t0, float(l_chol.shape[0]) ** 2 * out.shape[1])
        return out

    def _metric_solve(self, l_chol: np.ndarray, v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=self._dtype)
        if not v.flags.c_contiguous:
            v = np.ascontiguousarray(v)
        trsm = scipy_blas.dtrsm if self._dtype == np.float64 else scipy_blas.strsm
        # v (naux, n) in C order is vᵀ (n, naux) in Fortran order: solve X Lᵀ = vᵀ in place (X = Bᵀ)
        with one_blas_pool("scipy"):   # SciPy's trsm on the cores, NumPy's pool held back (mp2trn.threads)
            out = trsm(1.0, np.asarray(l_chol, dtype=self._dtype, order="F"), v.T, side=1, lower=1, trans_a=1,
                       overwrite_b=1)
        return out.T

    def pair_energies(self, b_i, b_j, e_i, e_j, ev_a, ev_b, exchange):
        t0 = time.perf_counter()
        out = self._pair_energies(b_i, b_j, e_i, e_j, ev_a, ev_b, exchange)
        naux, ni, nva = b_i.shape
        pairs_by_cols = ni * (ni + 1) / 2 * nva if b_j is None else ni * b_j.shape[1] * b_j.shape[2]
        self._meter.add("pairs", self.precision, time.perf_counter() - t0, 2.0 * naux * nva * pairs_by_cols)
        return out

    def _pair_energies(self, b_i, b_j, e_i, e_j, ev_a, ev_b, exchange):
        same = b_j is None
        naux, ni, nva = b_i.shape
        x_i = _as_matrix(b_i, self._dtype)
        x_j = x_i if same else _as_matrix(b_j, self._dtype)
        nj, nvb = (ni, nva) if same else b_j.shape[1:]
        os_ = np.zeros((ni, nj))
        xx = np.zeros_like(os_) if exchange else None
        e_ab = (ev_a[:, None] + (ev_a if same else ev_b)[None, :]).astype(self._dtype)

        def rows(_: int, i0: int, i1: int) -> None:   # the pairs of rows i0..i1-1: their GEMMs, then each pair's sums
            if same:   # pairs i ≤ j: one GEMM per row, against rows i..
                for i in range(i0, i1):
                    m = self.contract_aux(x_i[:, i * nva : (i + 1) * nva], x_i[:, i * nva :]).reshape(nva, ni - i, nva)
                    _reduce_row(m, e_i[i], e_j[i:], e_ab, os_[i, i:], None if xx is None else xx[i, i:])
                return
            m = self.contract_aux(x_i[:, i0 * nva : i1 * nva], x_j).reshape(i1 - i0, nva, nj, nvb)
            for i in range(i0, i1):
                _reduce_row(m[i - i0], e_i[i], e_j, e_ab, os_[i], None if xx is None else xx[i])

        work = np.arange(ni, 0, -1, dtype=float) if same else np.ones(ni)   # pairs per row
        # a row at a time to whichever core is free (a block's ~10 rows in two ranges left the cores 92-94 %
        # busy, 95-98 % row by row: scripts/bench_idle_cores.py pairs); the diagonal block's longest rows first
        self._over_cores(work, rows, by_row=True)
        return os_, xx

    def _over_cores(self, work: np.ndarray, run, parts: int | None = None, by_row: bool = False) -> None:
        """``run(k, i0, i1)`` for the k-th of contiguous ranges of rows of about equal ``work`` (per row), one
        range per BLAS thread, each on a thread of its own with BLAS held to one thread
        (:func:`mp2trn.threads.one_thread_each`); one range in the calling thread, BLAS as it is, with one
        BLAS thread, one row, or :attr:`split_over_cores` off. The ranges write disjoint rows of the outputs.
        ``by_row``: instead, each thread k takes the next row not yet taken, ``run(k, i, i + 1)``, until none
        is left (k is then the thread's, not the range's: per-thread buffers stay per thread), so that the
        threads end together where a few rows of unequal work would leave one waiting.

        Why: between its GEMMs a pair step reduces each pair's tile elementwise (NumPy, one thread), and a
        J/K build unpacks rows; with NumPy's pool in each GEMM that work runs on one core while the others
        wait, and small GEMMs pay the pool's hand-over at every call. ``parts``: this many ranges (None:
        one per BLAS thread)."""
        n = len(work)
        parts = min((blas_threads() if self.split_over_cores else 1) if parts is None else parts, n)
        if parts <= 1:
            run(0, 0, n)
            return
        part, count = (self._rows_taken_in_turn(n, run), parts) if by_row else self._row_ranges(work, parts, run)
        with one_thread_each(), ThreadPoolExecutor(count) as pool:
            for _ in pool.map(part, range(count)):
                pass

    @staticmethod
    def _row_ranges(work: np.ndarray, parts: int, run):
        """(part, ranges) for :meth:`_over_cores`: part k runs ``run(k, i0, i1)`` on the k-th contiguous range of
        about equal work, of ``ranges`` (fewer than ``parts`` where rows are few)."""
        n = len(work)
        cum = np.concatenate([[0.0], np.cumsum(work)])
        bounds = np.searchsorted(cum, np.linspace(0, cum[-1], parts + 1)[1:-1])
        edges = [0, *sorted({int(b) for b in bounds if 0 < b < n}), n]

        def part(k: int) -> None:
            with lib.with_omp_threads(1):   # a BLAS or PySCF built on OpenMP: one thread in this part too
                run(k, edges[k], edges[k + 1])

        return part, len(edges) - 1

    @staticmethod
    def _rows_taken_in_turn(n: int, run):
        """Part k of :meth:`_over_cores` with ``by_row``: take the next row not yet taken, ``run(k, i, i + 1)``,
        until none is left or another part's row raised."""
        rows = iter(range(n))
        taking = threading.Lock()
        failed = threading.Event()     # a row that raised: the other parts take no more rows

        def next_row() -> int | None:
            with taking:
                return None if failed.is_set() else next(rows, None)

        def part(k: int) -> None:
            with lib.with_omp_threads(1):
                while (i := next_row()) is not None:
                    try:
                        run(k, i, i + 1)
                    except BaseException:
                        failed.set()
                        raise

        return part

    # -- the gradient's pair step ----------------------------------------------------------------------
    has_pair_densities = True

    #: each pair's sums accumulated in fp64 (fp32 tiles too; :meth:`pair_energies` sums an fp32 tile's rows in
    #: fp32 first, within fp32 rounding of these)
    sweep_energies = True

    def pair_densities(self, b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch, vir_k, energies=False):
        t0 = time.perf_counter()
        out = self._pair_densities(b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch, vir_k, energies)
        naux, ni, nva = b_all.shape
        nk, nvb = b_k.shape[1], b_k.shape[2]
        # per k: τ and Γ̄ (2·naux·ni·nva·nvb each), P_occ, P_vir of all, P_vir of k
        per_k = 2.0 * ni * nva * nvb * (2 * naux + ni + nva + (nvb if vir_k else 0))
        self._meter.add("grad_pairs", self.precision, time.perf_counter() - t0, per_k * nk)
        return out

    def _pair_densities(self, b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch, vir_k, energies=False):
        naux, ni, nva = b_all.shape
        nk, nvb = b_k.shape[1], b_k.shape[2]
        dt = np.dtype(self._dtype).type
        x_all = _as_matrix(b_all, dt)                               # (naux, ni·nva)
        b_k = np.asarray(b_k, dtype=dt)
        denom = (e_all[:, None, None] - ev_all[None, :, None] - ev_k[None, None, :]).astype(dt)
        gamma = np.empty((naux, nk, nvb))
        sums: dict[int, list] = {}
        # each part writes its own k columns of these
        pair_os = np.zeros((ni, nk)) if energies else None
        pair_x = np.zeros((ni, nk)) if energies and c_exch else None

        # On two cores the strip's k split over them (:meth:`_over_cores`, one BLAS thread each, one k at a
        # time), so that one core's elementwise work runs beside the other's GEMMs; else one part, NumPy's
        # pool in each GEMM, two k at a time. Either way four amplitude-sized arrays beside the denominators
        # (the gradient's memory plan counts five), so no more than two parts: on more cores the pool.
        # τ and t̃ of kb columns of pairs lie as (i, a, (k, b)): the amplitudes' and Γ̄'s GEMMs are kb·nvb
        # wide, and P_ij and P_ab are GEMMs over the buffers as they lie (no reordered copies; a shorter
        # last block is a prefix of the flat buffers, contiguous too). Each pair's nva×nvb tile is divided
        # and exchanged while it is in cache (1.4x the whole-array passes). scripts/bench_pairs.py --sweep
        # times it against the one-k-at-a-time form it replaced and against one part
        threads = blas_threads() if self.split_over_cores else 1
        parts = min(threads if threads <= _SWEEP_COLUMNS else 1, nk)

        def run(part: int, q0: int, q1: int) -> None:
            kb = min(max(1, _SWEEP_COLUMNS // parts), q1 - q0)
            mine = sums[part] = [np.zeros((ni, ni)), np.zeros((nva, nva)), np.zeros((nvb, nvb)) if vir_k else None]
            p_occ, p_vir_all, p_vir_k = mine
            tau_flat = np.empty(ni * nva * kb * nvb, dtype=dt)
            tt_flat = np.empty_like(tau_flat)
            w, work = np.empty((nva, nvb), dtype=dt), np.empty((nva, nvb), dtype=dt)
            for k0 in range(q0, q1, kb):
                k1 = min(q1, k0 + kb)
                size = ni * nva * (k1 - k0) * nvb
                tau = tau_flat[:size].reshape(ni, nva, -1)
                tt = tt_flat[:size].reshape(ni, nva, -1)
                np.matmul(x_all.T, b_k[:, k0:k1].reshape(naux, -1), out=tau.reshape(ni * nva, -1))
                for j in range(k1 - k0):
                    cols = slice(j * nvb, (j + 1) * nvb)
                    for i in range(ni):
                        t, out = tau[i, :, cols], tt[i, :, cols]
                        np.add(denom[i], dt(e_k[k0 + j]), out=w)
                        np.divide(t, w, out=t)                      # τ_ik^ab
                        _exchanged(t, c_direct, c_exch, work, out)  # t̃ = c_direct τ − c_exch τᵀ (a ↔ b)
                        if energies:                                # T = τ·D (w still holds D)
                            np.multiply(w, t, out=w)
                            pair_os[i, k0 + j], x = _pair_sums(w, t, out, c_direct, c_exch, pair_x is not None)
                            if pair_x is not None:
                                pair_x[i, k0 + j] = x
                    if vir_k:
                        p_vir_k += tau[:, :, cols].reshape(-1, nvb).T @ tt[:, :, cols].reshape(-1, nvb)
                gamma[:, k0:k1, :] = (x_all @ tt.reshape(ni * nva, -1)).reshape(naux, k1 - k0, nvb)
                p_occ += tau.reshape(ni, -1) @ tt.reshape(ni, -1).T
                for i in range(ni):
                    p_vir_all += tau[i] @ tt[i].T

        self._over_cores(np.ones(nk), run, parts)
        # summed in part order (the parts finish in any order): the same result every run
        p_occ, p_vir_all, p_vir_k = (None if sums[0][x] is None else sum(sums[k][x] for k in sorted(sums))
                                     for x in range(3))
        return PairDensities(gamma, p_occ, p_vir_all, p_vir_k, pair_os, pair_x)

    # -- the orbital response's GEMMs: fp64 in either precision (the host's reference arithmetic); the
    # Z-vector's inner solves in fp32 on a copy of the blocks (reduced_response), refined by the fp64 products
    #: the response products' dtype (fp64; the :meth:`reduced_response` copy's fp32)
    _response_dtype = np.float64
    reduced_response_itemsize = 4

    @property
    def response_precision(self) -> str:
        return "fp32" if self._response_dtype == np.float32 else "fp64"

    def reduced_response(self):
        """This device with fp32 products of its own fp32 copy of each kept block (SGEMMs at twice the DGEMM
        rate, half the bytes streamed per product), counted in the same cost report; None from that copy."""
        if self._response_dtype == np.float32:
            return None
        other = copy.copy(self)
        other._response_dtype = np.float32
        other._operand_copies = {}
        return other

    #: the reduced copy's fp32 operands by the fp64 array they copy (its base array, data address and
    #: elements): the layouts of one C-contiguous block — B_ov as ((Q, i), a) rows, as (Q, (i, a)) and
    #: transposed as (a, (Q, i)) — share one copy. The base array is held beside its copy, so that no other
    #: array can take its address
    _operand_copies: dict | None = None

    def response_operand(self, a_t, moving=False):
        if self._response_dtype == np.float64:
            return a_t
        # each copy in pages faulted in and filled by every core (precision.converted_copy): NumPy's astype
        # filled 0.7 GB of fresh huge pages (Inosine/cc-pVDZ) from one thread in ~1 s of kernel time
        a_t = np.asarray(a_t)
        if not a_t.flags.c_contiguous:
            if a_t.ndim == 2 and a_t.T.flags.c_contiguous:
                # a transposed view of rows (B_ov as (a, (Q, i))): the rows' copy, transposed — one copy of
                # the block for both layouts; the GEMMs read it transposed at ~the same rate
                return self.response_operand(a_t.T).T
            return converted_copy(a_t, self._response_dtype)
        base = a_t if a_t.base is None else a_t.base
        key = (id(base), a_t.__array_interface__["data"][0], a_t.size)
        held = self._operand_copies.get(key)
        if held is None or held[0] is not base:
            held = self._operand_copies[key] = (base, converted_copy(a_t, self._response_dtype).ravel())
        return held[1].reshape(a_t.shape)

    def response_gemm(self, a_t, b, stage="zvector", out=None):
        a_t = np.asarray(a_t)
        k, m = a_t.shape
        # the Z-vector's exchange products contract ~10⁵ rows into a (nvir, nocc) result, in the form this
        # machine's BLAS runs faster, timed once per machine (mp2trn.roofline.long_inner_transposed) — asked
        # before the clock starts, and only for products at least the timed one's size (smaller ones, plain)
        transposed = (np.shape(b)[1] < m and k >= _LONG_INNER * m and k * m >= _LONG_INNER_TIMED
                      and long_inner_transposed(self.response_precision))
        t0 = time.perf_counter()
        b = np.asarray(b, dtype=a_t.dtype) if self._response_dtype != np.float64 else b
        if out is None:
            out = np.empty((m, np.shape(b)[1]))
        if transposed:
            out[...] = (b.T @ a_t).T
        elif a_t.dtype == np.float64:
            np.matmul(a_t.T, b, out=out)
        else:
            out[...] = a_t.T @ b
        self._meter.add(stage, self.response_precision, time.perf_counter() - t0, 2.0 * out.size * b.shape[0])
        return out

    def response_blocks(self, rows, channels, out):
        t0 = time.perf_counter()

        # the chunk's rows split over the cores, one BLAS thread each, a few rows at a time (their B_Q C in
        # a few MB): the per-row GEMMs of B_oo, B_ov and B_vv are small for a pool of threads
        # (Inosine/cc-pVDZ's 75-row chunks: 99 → 88 ms each)
        def run(_: int, i0: int, i1: int) -> None:
            for r0 in range(i0, i1, _BLOCK_ROWS):
                r1 = min(i1, r0 + _BLOCK_ROWS)
                Device.response_blocks(self, rows[r0:r1], channels, [tuple(a[r0:r1] for a in blocks) for blocks in out])

        self._over_cores(np.ones(rows.shape[0]), run)
        q, nao, _ = rows.shape
        flops = sum(2.0 * q * nao * (o.shape[1] + v.shape[1]) * (nao + o.shape[1]) + 2.0 * q * nao * v.shape[1] ** 2
                    for o, v in channels)
        self._meter.add("zvector", "fp64", time.perf_counter() - t0, flops)

    def response_grouped(self, a_t, b, width, stage="zvector", out=None):
        t0 = time.perf_counter()
        a_t = np.asarray(a_t, dtype=self._response_dtype)
        k, m = a_t.shape
        groups = np.shape(b)[1] // width
        # the caller's buffer where it hands one (the response reuses one for every product: fresh results of
        # 0.1-0.3 GB would be new pages from the OS each time, whose faults cost this VM more kernel time than
        # the GEMM itself)
        out = np.empty((groups, m, width), dtype=self._response_dtype) if out is None else \
            out.reshape(groups, m, width)
        b3 = np.asarray(b).reshape(k, groups, width)
        if k > m:
            # a small a_t (M^Q: nvir × nocc) against every group: one GEMM over a chunk of groups, then its
            # (m, groups, width) result copied into the row blocks, 1.9x the batched form's rate; the batched
            # one stays for k ≤ m (Y^Q: nocc × nvir), where the copy costs more than it saves
            step = max(1, int(_GROUPED_CHUNK_BYTES // (out.itemsize * m * width)))
            for g0 in range(0, groups, step):
                g1 = min(groups, g0 + step)
                out[g0:g1] = (a_t.T @ b3[:, g0:g1].reshape(k, -1)).reshape(m, g1 - g0, width).transpose(1, 0, 2)
        else:
            np.matmul(a_t.T, b3.transpose(1, 0, 2), out=out)
        out = out.reshape(groups * m, width)
        self._meter.add(stage, self.response_precision, time.perf_counter() - t0, 2.0 * out.size * a_t.shape[0])
        return out

    # -- SCF J/K --------------------------------------------------------------------------------------
    has_jk = True

    #: the J/K builds read the packed tensor (μ ≥ ν), unpacking a few rows at a time in cache (fp32 builds:
    #: its unpacked fp32 copy, made once per SCF)
    jk_packed = True

    def jk_copy_itemsize(self, dtype) -> int:
        # fp32 builds of the packed tensor read an unpacked fp32 copy of it (made once per SCF: nao² · 4
        # bytes per row, at most 8 per packed element), which the SCF's memory plan counts; fp64 builds and
        # the unpacked layout read the host tensor as it is
        return 8 if self.jk_packed and np.dtype(dtype) == np.float32 else 0

    #: without room for the fp32 copy, fp32 builds unpack and convert the host rows as they read them
    jk_copy_optional = True
    #: a resident tensor is one block: a build's parts run through all of its rows (Device.jk_resident_one_block)
    jk_resident_one_block = True

    def jk_tensor(self, block, dtype, keep_copy=True):
        # fp64: the host block itself. fp32, packed: an unpacked fp32 copy of the rows, made here once per
        # SCF (Inosine/cc-pVDZ: 0.68 GB beside the 0.68 GB fp64 tensor), which the builds' GEMMs read as it
        # is: unpacking at every build costs as much as the fp32 GEMMs themselves, and a packed fp32 copy
        # unpacked by ?tpttr into ?symm ran at about half the GEMM rate (docs/benchmarks.md, the --parts tables).
        # fp32, unpacked layout, or no room for the copy (keep_copy False): unpacked and/or converted a
        # few rows at a time at every build
        dtype = np.dtype(dtype)
        if block.ndim == 2 and dtype == np.float32 and keep_copy:
            t0 = self._clock()
            nao = nao_of_pairs(block.shape[1])
            copy = prefaulted_empty((block.shape[0], nao, nao), np.float32)   # fresh pages, mapped by every core
            chunk = max(1, int(self._jk_work_caps()[0] // (nao * nao * 8)))   # rows unpacked at a time, per part

            def fill(k: int, p0: int, p1: int) -> None:   # a few rows at a time, unpacked in the builds' buffers
                for r0 in range(p0, p1, chunk):
                    r1 = min(p1, r0 + chunk)
                    rows = self._unpacked_rows(k, block[r0:r1], np.dtype(np.float64), nao, chunk, {})
                    np.copyto(copy[r0:r1], rows, casting="same_kind")

            self._over_cores(np.ones(block.shape[0]), fill)
            self._record_parts({"fp32 copy (once per SCF)": self._clock() - t0})
            return _Fp32Copy(block, copy, nao)
        if block.ndim == 2:
            return _Cast(block, dtype, nao_of_pairs(block.shape[1]))
        return block if dtype == np.float64 else _Cast(block, dtype, block.shape[1])

    def jk_block(self, block, factors, dm, with_j, with_k):
        t0 = time.perf_counter()
        out = self._jk_block(block, factors, dm, with_j, with_k)
        rows = block.block if isinstance(block, (_Fp32Copy, _Cast)) else block
        nao, p = dm.shape[0], rows.shape[0]
        n = sum(c.shape[1] for c, _ in factors) if with_k else 0
        flops = (4.0 * rows.size if with_j else 0.0) + float(p) * n * nao * (3 * nao + 1)   # J; Z and the syrk
        precision = "fp32" if isinstance(block, (_Fp32Copy, _Cast)) and block.dtype == np.float32 else "fp64"
        self._meter.add("scf_jk", precision, time.perf_counter() - t0, flops)
        return out

    def cost_report(self, since: Any = None) -> dict[str, Any] | None:
        """Measured, not modeled: each stage's seconds, counted GFLOP, achieved GFLOP/s and share of this
        machine's DGEMM/SGEMM rate (measured once per machine and cached, :mod:`mp2trn.roofline`); None
        before any work."""
        return self._meter.report(since)

    def cost_checkpoint(self) -> Any:
        return self._meter.checkpoint()

    def _jk_block(self, block, factors, dm, with_j, with_k):
        if isinstance(block, _Fp32Copy):
            return self._jk_rows(block.block, block.dtype, block.nao, factors, dm, with_j, with_k, block.copy)
        if isinstance(block, _Cast):
            return self._jk_rows(block.block, block.dtype, block.nao, factors, dm, with_j, with_k)
        return self._jk_rows(block, np.dtype(np.float64), block.shape[1], factors, dm, with_j, with_k)

    # -- timing the pieces of a build (scripts/bench_jk.py --parts) --------------------------------------
    def time_jk_parts(self, clock=time.perf_counter) -> dict[str, float]:
        """Start timing the pieces of the J/K builds with ``clock`` (wall time; ``time.thread_time`` counts
        the calling thread's CPU time, which with one BLAS thread is the build's, however loaded the
        machine): returns the dict of seconds per piece that the builds add to from now on (``jk_parts``).
        A build split over the cores times each part in its own thread: the pieces are then core-seconds,
        summed over the parts."""
        self.jk_parts, self._clock = {}, clock
        return self.jk_parts

    def _record_parts(self, seconds: dict[str, float]) -> None:
        """Add seconds per piece to ``jk_parts`` (when timing); called from one thread at a time (a build's
        parts hand theirs back, :meth:`_jk_rows`)."""
        if self.jk_parts is not None:
            for piece, s in seconds.items():
                self.jk_parts[piece] = self.jk_parts.get(piece, 0.0) + s

    def _jk_rows(self, src: np.ndarray, dtype: np.dtype, nao: int, factors, dm, with_j: bool, with_k: bool,
                 copy: np.ndarray | None = None):
        """J/K of one block of fp64 tensor rows ``src``, packed (p, nao(nao+1)/2, μ ≥ ν) or unpacked
        (p, nao, nao), K in ``dtype`` (from ``copy``, the rows unpacked in fp32, when given); J in fp64.

        The rows are split over the cores (:meth:`_over_cores`), one part per BLAS thread, each part on a
        thread of its own with one BLAS thread (:meth:`_jk_part`): a part's unpacking, conversion and J
        passes then run beside the other parts' GEMMs instead of on one core between multi-threaded GEMMs
        (``python scripts/bench_jk.py --parts`` times both ways, docs/benchmarks.md). K and J are the
        parts' sums, added in fp64.
        """
        p = src.shape[0]
        packed = src.ndim == 2
        terms = [(np.ascontiguousarray(c.T, dtype=dtype), sign) for c, sign in factors if c.shape[1] and with_k]
        weights = coulomb_weights(dm, packed) if with_j else None
        outs: dict[int, tuple] = {}

        def rows(k: int, p0: int, p1: int) -> None:
            outs[p0] = self._jk_part(k, src, copy, p0, p1, dtype, nao, terms, weights)

        self._over_cores(np.ones(p), rows)
        outs = [outs[p0] for p0 in sorted(outs)]
        for *_, seconds in outs:   # in this thread, after the parts: their timings (scripts/bench_jk.py --parts)
            self._record_parts(seconds)
        vj = vk = None
        if with_j:
            vj = outs[0][0]
            for part_vj, _, _ in outs[1:]:
                vj += part_vj
            vj = _unpack_j(vj, packed, nao)
        if with_k:
            vk = np.zeros((nao, nao))   # zero when asked with no factor (an empty spin channel)
            for _, part_vk, _ in outs:
                if part_vk is not None:
                    vk += part_vk
        return vj, vk

    def _jk_part(self, k: int, src: np.ndarray, copy: np.ndarray | None, p0: int, p1: int, dtype: np.dtype,
                 nao: int, terms: list, weights: np.ndarray | None):
        """(J, K, seconds per piece) of rows [p0, p1) of ``src`` (J in the rows' stored form, None without
        weights; K (nao, nao) fp64, None without terms): the part ``k`` of a build, in the calling thread.

        A few rows at a time (``_UNPACK_CHUNK_BYTES`` of them unpacked): J's two GEMVs ρ_P = B_P·D and
        Σ_P ρ_P B_P on the fp64 rows as stored, then the rows unpacked (PySCF's unpack, one OpenMP thread)
        and/or converted into this part's buffers, or read from ``copy``, and Z_P = Cᵀ B_P (nocc, nao) for
        each of them (B_P is symmetric) written into the part's group of Z rows; K += Zᵀ Z is one syrk per
        group (its inner dimension, rows × nocc, in the thousands), accumulated in fp64. Without terms
        (J alone) nothing is unpacked and J reads ``_J_CHUNK_BYTES`` of rows at a time.
        """
        seconds: dict[str, float] = {}
        clock = self._clock

        def tick(piece: str, t0: float) -> float:
            now = clock()
            seconds[piece] = seconds.get(piece, 0.0) + now - t0
            return now

        flat_src = src.reshape(src.shape[0], -1)
        vj = np.zeros(flat_src.shape[1]) if weights is not None else None
        vk = np.zeros((nao, nao)) if terms else None
        width = sum(ct.shape[0] for ct, _ in terms)
        per_row = nao * nao * 8 if terms else flat_src.shape[1] * 8
        unpack_bytes, group_bytes = self._jk_work_caps()
        chunk = min(p1 - p0, max(1, int((unpack_bytes if terms else _J_CHUNK_BYTES) // per_row)))
        group = min(p1 - p0, chunk * max(1, int(group_bytes // (chunk * nao * max(width, 1) * dtype.itemsize))))
        zs = []
        if terms:
            product = self._jk_buffer(f"k{k}", nao * nao, dtype)[: nao * nao].reshape(nao, nao)   # one group's ZᵀZ
            z_buf = self._jk_buffer(f"z{k}", group * width * nao, dtype)
            offset = 0
            for ct, _ in terms:   # one Z (rows of the group, nocc, nao) per factor, side by side
                zs.append(z_buf[offset : offset + group * ct.shape[0] * nao].reshape(group, ct.shape[0], nao))
                offset += group * ct.shape[0] * nao
        with lib.with_omp_threads(1):   # PySCF's unpack: this thread only (the other parts have the cores)
            for g0 in range(p0, p1, group):
                g1 = min(p1, g0 + group)
                for r0 in range(g0, g1, chunk):
                    r1 = min(g1, r0 + chunk)
                    t0 = clock()
                    if vj is not None:   # both passes of J over the rows just read, still in cache
                        rho = flat_src[r0:r1] @ weights
                        t0 = tick("J: rho_P = B_P.D", t0)
                        vj += rho @ flat_src[r0:r1]
                        t0 = tick("J: sum_P rho_P B_P", t0)
                    if not terms:
                        continue
                    rows = copy[r0:r1] if copy is not None else \
                        self._unpacked_rows(k, src[r0:r1], dtype, nao, chunk, seconds)
                    t0 = clock()
                    for (ct, _), z in zip(terms, zs):
                        np.matmul(ct, rows, out=z[r0 - g0 : r1 - g0])   # Z_P = Cᵀ B_P for each row P
                    tick("half-transform Z = C^T B_P", t0)
                t0 = clock()
                for (_, sign), z in zip(terms, zs):
                    zz = z[: g1 - g0].reshape(-1, nao)
                    np.matmul(zz.T, zz, out=product)                   # NumPy calls syrk for a.T @ a
                    if sign > 0:
                        vk += product
                    else:
                        vk -= product
                tick("syrk K += Z^T Z", t0)
        return vj, vk, seconds

    def _unpacked_rows(self, k: int, rows: np.ndarray, dtype: np.dtype, nao: int, capacity: int,
                       seconds: dict[str, float]) -> np.ndarray:
        """Tensor rows (r, nao, nao) in ``dtype``: the rows themselves when they are unpacked fp64, else
        unpacked and/or converted into part ``k``'s buffers of ``capacity`` rows, kept between builds."""
        r = rows.shape[0]
        if rows.ndim == 3 and dtype == np.float64:
            return rows
        stage = rows
        t0 = self._clock()
        if rows.ndim == 2:   # PySCF unpacks fp64: unpack there, then convert in cache
            stage = self._jk_buffer(f"unpacked{k}", capacity * nao * nao, np.float64)[: r * nao * nao]
            stage = stage.reshape(r, nao, nao)
            lib.unpack_tril(rows, out=stage)
            now = self._clock()
            seconds["unpack (PySCF, fp64)"] = seconds.get("unpack (PySCF, fp64)", 0.0) + now - t0
            t0 = now
        if dtype != np.float64:
            cast = self._jk_buffer(f"cast{k}", capacity * nao * nao, dtype)[: r * nao * nao].reshape(r, nao, nao)
            np.copyto(cast, stage, casting="same_kind")
            stage = cast
            seconds["convert to fp32"] = seconds.get("convert to fp32", 0.0) + self._clock() - t0
        return stage

    def _jk_buffer(self, name: str, size: int, dtype) -> np.ndarray:
        """The work buffer ``name`` with at least ``size`` elements of ``dtype``, kept for the next J/K build:
        fresh arrays this large are new pages from the OS at every block (measured: 13 ms per copy in an SCF
        against 6 ms reused). Each part of a build asks for its own names (set from its own thread)."""
        buf = self._jk_bufs.get(name)
        if buf is None or buf.size < size or buf.dtype != dtype:
            buf = self._jk_bufs[name] = np.empty(size, dtype)
        return buf

    def release_jk(self) -> None:
        """Drop the J/K work buffers (after the SCF, and after the gradient's response)."""
        self._jk_bufs = {}

    def limit_jk_work(self, mb: float) -> None:
        self._jk_work_bytes = mb * 1e6
        self._jk_bufs = {}   # buffers sized under the old limit would stay as large

    def _jk_work_caps(self) -> tuple[float, float]:
        """(bytes of one part's unpacked rows, bytes of its group of Z rows): :data:`_UNPACK_CHUNK_BYTES` and
        :data:`_SYRK_GROUP_BYTES`, or less where :meth:`limit_jk_work` leaves each part less than their sum (a
        quarter and a half of its share: the fp32 conversion's buffer and ZᵀZ take the rest). The builds never
        take fewer than one row at a time, so a share below about 32·nao² bytes is exceeded by that one row."""
        if self._jk_work_bytes is None:
            return _UNPACK_CHUNK_BYTES, _SYRK_GROUP_BYTES
        share = self._jk_work_bytes / max(1, blas_threads() if self.split_over_cores else 1)
        return min(_UNPACK_CHUNK_BYTES, share / 4), min(_SYRK_GROUP_BYTES, share / 2)

    def contract_aux(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """T block = xᵀ y over the aux index: x (naux, m), y (naux, n) → (m, n).

        The one GEMM of the pair step; subclasses that study other arithmetic override only this.
        """
        return x.T @ y


#: occupied orbitals k per amplitude GEMM of the gradient's pair sweep (:meth:`CpuDevice._pair_densities`)
_SWEEP_COLUMNS = 2
#: an inner dimension this many times the result's rows: :meth:`CpuDevice.response_gemm` computes (bᵀ a_t)ᵀ where
#: this machine runs that form faster (:func:`mp2trn.roofline.long_inner_transposed`)
_LONG_INNER = 64
#: elements of a_t from which a long-inner product asks for the timed choice: the timed product's own
#: (mp2trn.roofline.LONG_INNER_SHAPE), so that the timing's arrays are never larger than the product's
_LONG_INNER_TIMED = LONG_INNER_SHAPE[0] * LONG_INNER_SHAPE[1]
#: bytes of one chunk of a grouped product's result (a few MB: the copy into row blocks reads it from cache)
_GROUPED_CHUNK_BYTES = 4e6
#: rows of the response's MO blocks one part of :meth:`CpuDevice.response_blocks` makes at a time
_BLOCK_ROWS = 16
#: tensor rows unpacked and/or converted at a time (as fp64): a few MB, so that they are still in cache
#: when the GEMMs read them (Inosine/cc-pVDZ: 4 rows, Cetirizine: 1); the NKI devices' copies use the same
_UNPACK_CHUNK_BYTES = UNPACK_CHUNK_BYTES
#: fp64 tensor rows J's two GEMVs read at a time: within a core's L2 (2 MB on the 2-core VM), so that the
#: second pass reads them from cache
_J_CHUNK_BYTES = 2e6
#: the half-transformed rows gathered for one exchange syrk: its inner dimension (rows × nocc) in the
#: thousands, the group a few MB (Cetirizine/cc-pVDZ: 38 rows)
_SYRK_GROUP_BYTES = 16e6


class _Cast:
    """A host tensor block to be used in ``dtype``, unpacked ((p, nao, nao)) or packed ((p, nao(nao+1)/2)),
    converted and/or unpacked when a build reads it."""

    __slots__ = ("block", "dtype", "nao")

    def __init__(self, block: np.ndarray, dtype: np.dtype, nao: int):
        self.block, self.dtype, self.nao = block, dtype, nao


def _unpack_j(vj: np.ndarray, packed: bool, nao: int) -> np.ndarray:
    """J (nao, nao) from its rows-as-stored form."""
    return lib.unpack_tril(vj) if packed else vj.reshape(nao, nao)


class _Fp32Copy:
    """A packed host tensor block (p, nao(nao+1)/2) fp64 (J reads it) with its rows unpacked in fp32,
    (p, nao, nao) (K reads them)."""

    __slots__ = ("block", "copy", "nao")
    dtype = np.dtype(np.float32)

    def __init__(self, block: np.ndarray, copy: np.ndarray, nao: int):
        self.block, self.copy, self.nao = block, copy, nao


def _reduce_row(m: np.ndarray, e_i: float, e_j: np.ndarray, e_ab: np.ndarray, os_row: np.ndarray, x_row) -> None:
    """m: (nva, nj, nvb) = T for pairs (i, j) over j. Fill os_row[j] and x_row[j] (fp64 sums).

    One preallocated nva×nvb buffer holds W = T / D for each pair in turn, so every pair's work stays
    in cache (measured 2-3x faster than fresh temporaries or a row-vectorised 3-D form).

    fp32 tiles: each row's nvb products are summed in fp32 and the nva row sums in fp64. A whole-tile
    einsum accumulating in fp64 (``dtype=float64``, the form before) casts every element through a buffer,
    which slowed the reduction (``scripts/bench_pairs.py`` times both); a row of nvb terms summed in fp32
    carries rounding of typically √nvb·6e-8 of its size, random in sign from row to row: Inosine's fp32 MP2
    energy stayed 0.16 µEh from the fp64 one, inside the fp32 mode's 1 µEh.
    """
    dt = m.dtype.type
    w = np.empty(e_ab.shape, dtype=m.dtype)
    rows = None if dt is np.float64 else np.empty(e_ab.shape[0], dtype=m.dtype)

    def total(spec: str, t: np.ndarray) -> float:   # Σ over the tile of W times t (spec "ab,ab") or tᵀ ("ab,ba")
        if rows is None:
            return np.einsum(spec + "->", w, t)
        return np.einsum(spec + "->a", w, t, out=rows).sum(dtype=np.float64)

    for j in range(m.shape[1]):
        t = m[:, j, :]
        np.subtract(dt(e_i + e_j[j]), e_ab, out=w)
        np.divide(t, w, out=w)
        os_row[j] = total("ab,ab", t)
        if x_row is not None:
            x_row[j] = total("ab,ba", t)


def _pair_sums(big_t: np.ndarray, tau: np.ndarray, tilde: np.ndarray, c_direct: float, c_exch: float,
               exchange: bool) -> tuple[float, float | None]:
    """One pair's energy sums from its tiles T = τ·D, τ and t̃ = c_direct τ − c_exch τᵀ: os = Σ_ab T_ab τ_ab and
    (``exchange``) x = Σ_ab T_ab τ_ba, fp64.

    fp64 tiles, contiguous: x from Σ T·t̃ = c_direct·os − c_exch·x, two BLAS dot products over the tiles as they
    lie, instead of a sum that reads a tile transposed (the slowest pass over a tile). fp32, or
    strided tiles: each sum by itself, accumulated in fp64 — recovering x from a difference would magnify fp32
    rounding, and a dot product would copy a strided tile."""
    if big_t.dtype == np.float64 and tau.flags.c_contiguous and tilde.flags.c_contiguous and (c_exch or not exchange):
        os_ = float(np.vdot(big_t, tau))
        return os_, ((c_direct * os_ - float(np.vdot(big_t, tilde))) / c_exch if exchange else None)
    acc = None if big_t.dtype == np.float64 else np.float64
    os_ = float(np.einsum("ab,ab->", big_t, tau, dtype=acc))
    return os_, (float(np.einsum("ab,ba->", big_t, tau, dtype=acc)) if exchange else None)


def _exchanged(t: np.ndarray, c_direct: float, c_exch: float, work: np.ndarray, out: np.ndarray) -> None:
    """out = c_direct·t − c_exch·tᵀ for one pair's square tile t (c_exch 0: any tile), ``work`` a tile of t's
    shape; two passes where c_exch is 1 (RHF MP2)."""
    dt = t.dtype.type
    if not c_exch:
        np.multiply(t, dt(c_direct), out=out)
        return
    np.multiply(t, dt(c_direct), out=work)
    if c_exch == 1.0:
        np.subtract(work, t.T, out=out)
    else:
        np.multiply(t.T, dt(c_exch), out=out)
        np.subtract(work, out, out=out)


def _as_matrix(b: np.ndarray, dtype) -> np.ndarray:
    """(naux, n, nv) → (naux, n·nv) without copying when the last two axes are contiguous."""
    b = np.asarray(b, dtype=dtype)
    naux = b.shape[0]
    try:
        return b.reshape(naux, -1)
    except ValueError:  # pragma: no cover - only for exotic strides
        return np.ascontiguousarray(b).reshape(naux, -1)


def _blas_name() -> str:
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name', 'blas')} {blas.get('version', '')}".strip()
    except Exception:  # pragma: no cover - depends on numpy build
        return "blas"
