"""``cpu``: the NumPy/BLAS reference device (fp64 by default, fp32 on request).

The pair step forms T for a whole block of occupied pairs with one large GEMM (BLAS-3 at near peak),
then reduces each pair's nv×nv tile while it is cache-resident; on the diagonal block only i ≤ j pairs
are formed (one GEMM per row i against rows i..).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from pyscf import lib
from pyscf.ao2mo import _ao2mo
from scipy.linalg import blas as scipy_blas
from scipy.linalg import lapack as scipy_lapack

from ..roofline import StageMeter
from ..threads import one_blas_pool
from .base import Device, PairDensities


class CpuDevice(Device):
    """NumPy device. ``precision`` is "fp64" (default) or "fp32" (GEMMs and storage in fp32)."""

    name = "cpu"
    supported_precisions = ("fp64", "fp32")

    def __init__(self, precision: str = "fp64"):
        self.precision = precision
        self._dtype = self.mode.compute
        # J/K work buffers kept between builds: "z" a group of Z rows; "unpacked" and "cast" a few tensor
        # rows unpacked (fp64) and converted to the build's dtype, rewritten for every few rows
        self._jk_bufs: dict[str, np.ndarray] = {}
        #: seconds per piece of the J/K builds since :meth:`time_jk_parts` (None: not timed)
        self.jk_parts: dict[str, float] | None = None
        self._clock = time.perf_counter
        # seconds and counted flops per stage and precision: the cost report's roofline (mp2trn.roofline)
        self._meter = StageMeter()
        # integrals packed over μ ≥ ν (half the work) and PySCF's C transform on them, in fp64 for both
        # precisions: faster than unpacking for fp32 GEMMs, and the transform is where fp32 loses most
        # accuracy; in fp32 the metric solve and the pair step (the O(N⁵) part) run in fp32
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
            no, nv = c_occ.shape[1], c_vir.shape[1]
            coeff = np.asarray(np.hstack([c_occ, c_vir]), order="F")
            out = _ao2mo.nr_e2(np.ascontiguousarray(ao), coeff, (0, no, no, no + nv), aosym="s2", mosym="s1")
            return out.reshape(ao.shape[0], no, nv).astype(self._dtype, copy=False)
        p, nao, _ = ao.shape
        ao = ao.astype(self._dtype, copy=False)
        c_occ = np.asarray(c_occ, dtype=self._dtype)
        c_vir = np.asarray(c_vir, dtype=self._dtype)
        no = c_occ.shape[1]
        # first half-transform over ν with the (smaller) occupied block: one GEMM (p·nao × nao)·(nao × no);
        # (P|μν) is symmetric, so the transposed result is (P|iμ), made contiguous for one more big GEMM
        half = np.ascontiguousarray((ao.reshape(p * nao, nao) @ c_occ).reshape(p, nao, no).transpose(0, 2, 1))
        return (half.reshape(p * no, nao) @ c_vir).reshape(p, no, -1)

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
        os_ = np.zeros((ni, ni if same else b_j.shape[1]))
        xx = np.zeros_like(os_) if exchange else None
        e_ab = ev_a[:, None] + ev_b[None, :] if not same else ev_a[:, None] + ev_a[None, :]
        e_ab = e_ab.astype(self._dtype)
        if same:
            for i in range(ni):
                rows = x_i[:, i * nva : (i + 1) * nva]
                m = self.contract_aux(rows, x_i[:, i * nva :]).reshape(nva, ni - i, nva)
                _reduce_row(m, e_i[i], e_j[i:], e_ab, os_[i, i:], None if xx is None else xx[i, i:])
        else:
            nj, nvb = b_j.shape[1], b_j.shape[2]
            x_j = _as_matrix(b_j, self._dtype)
            m = self.contract_aux(x_i, x_j).reshape(ni, nva, nj, nvb)
            for i in range(ni):
                _reduce_row(m[i], e_i[i], e_j, e_ab, os_[i], None if xx is None else xx[i])
        return os_, xx

    # -- the gradient's pair step ----------------------------------------------------------------------
    has_pair_densities = True

    def pair_densities(self, b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch, vir_k):
        t0 = time.perf_counter()
        out = self._pair_densities(b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch, vir_k)
        naux, ni, nva = b_all.shape
        nk, nvb = b_k.shape[1], b_k.shape[2]
        # per k: τ and Γ̄ (2·naux·ni·nva·nvb each), P_occ, P_vir of all, P_vir of k
        per_k = 2.0 * ni * nva * nvb * (2 * naux + ni + nva + (nvb if vir_k else 0))
        self._meter.add("grad_pairs", self.precision, time.perf_counter() - t0, per_k * nk)
        return out

    def _pair_densities(self, b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch, vir_k):
        naux, ni, nva = b_all.shape
        nk, nvb = b_k.shape[1], b_k.shape[2]
        x_all = _as_matrix(b_all, self._dtype)                      # (naux, ni·nva)
        b_k = np.asarray(b_k, dtype=self._dtype)
        denom = (e_all[:, None, None] - ev_all[None, :, None] - ev_k[None, None, :]).astype(self._dtype)
        gamma = np.empty((naux, nk, nvb))
        p_occ = np.zeros((ni, ni))
        p_vir_all = np.zeros((nva, nva))
        p_vir_k = np.zeros((nvb, nvb)) if vir_k else None
        # one k at a time: the (i, a, b) amplitudes of a column of pairs stay a few MB, and every
        # contraction below is one GEMM over them
        for k in range(nk):
            tau = self.contract_aux(x_all, np.ascontiguousarray(b_k[:, k, :])).reshape(ni, nva, nvb)
            tau /= denom + e_k[k]
            tt = c_direct * tau - c_exch * tau.transpose(0, 2, 1) if c_exch else c_direct * tau
            gamma[:, k, :] = x_all @ tt.reshape(ni * nva, nvb)
            p_occ += tau.reshape(ni, -1) @ tt.reshape(ni, -1).T
            p_vir_all += _rows_by_a(tau) @ _rows_by_a(tt).T
            if vir_k:
                p_vir_k += tau.reshape(-1, nvb).T @ tt.reshape(-1, nvb)
        return PairDensities(gamma, p_occ, p_vir_all, p_vir_k)

    # -- the orbital response's GEMMs: fp64 in either precision (the host's reference arithmetic) --------------
    def response_gemm(self, a_t, b, stage="zvector"):
        t0 = time.perf_counter()
        out = np.asarray(a_t).T @ b
        self._meter.add(stage, "fp64", time.perf_counter() - t0, 2.0 * out.size * b.shape[0])
        return out

    # -- SCF J/K --------------------------------------------------------------------------------------
    has_jk = True

    #: the J/K builds read the packed tensor (μ ≥ ν), unpacking a few rows at a time in cache
    jk_packed = True

    def jk_copy_itemsize(self, dtype) -> int:
        # fp32 builds of the packed tensor read an fp32 copy of it (made once per SCF, 4 bytes per packed
        # element), which the SCF's memory plan counts; fp64 builds and the unpacked layout read the host
        # tensor as it is
        return 4 if self.jk_packed and np.dtype(dtype) == np.float32 else 0

    #: without room for the fp32 copy, fp32 builds convert the host rows as they read them
    jk_copy_optional = True

    #: fp64 builds of the packed tensor: ``dtpttr`` + ``dsymm`` row by row (:meth:`_jk_packed_symm`), else
    #: PySCF's unpack of a few rows then one GEMM over them (:meth:`_jk_rows`)
    fp64_packed_symm = False

    def jk_tensor(self, block, dtype, keep_copy=True):
        # fp64: the host block itself. fp32, packed: an fp32 copy of the packed rows, made here once per
        # SCF (Inosine/cc-pVDZ: 0.34 GB beside the 0.68 GB fp64 tensor), which the builds unpack with
        # LAPACK's ?tpttr and multiply with ssymm (_jk_fp32_copy): converting at every build cost as much
        # as the half-transform itself (``python scripts/bench_jk.py --parts``). fp32, unpacked layout, or
        # no room for the copy (keep_copy False): converted a few rows at a time at every build (_jk_rows)
        dtype = np.dtype(dtype)
        if block.ndim == 2 and dtype == np.float32 and keep_copy:
            t0 = self._clock()
            copy = np.empty(block.shape, np.float32)
            np.copyto(copy, block, casting="same_kind")
            self._tick("fp32 copy (once per SCF)", t0)
            return _Fp32Copy(block, copy, nao_of_pairs(block.shape[1]))
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
            return self._jk_fp32_copy(block, factors, dm, with_j, with_k)
        if isinstance(block, _Cast):
            if block.block.ndim == 2 and block.dtype == np.float64 and self.fp64_packed_symm:
                return self._jk_packed_symm(block.block, block.block, block.nao, factors, dm, with_j, with_k)
            return self._jk_rows(block.block, block.dtype, block.nao, factors, dm, with_j, with_k)
        return self._jk_rows(block, np.dtype(np.float64), block.shape[1], factors, dm, with_j, with_k)

    # -- timing the pieces of a build (scripts/bench_jk.py --parts) --------------------------------------
    def time_jk_parts(self, clock=time.perf_counter) -> dict[str, float]:
        """Start timing the pieces of the J/K builds with ``clock`` (wall time; ``time.thread_time`` counts
        the calling thread's CPU time, which with one BLAS thread is the build's, however loaded the
        machine): returns the dict of seconds per piece that the builds add to from now on (``jk_parts``)."""
        self.jk_parts, self._clock = {}, clock
        return self.jk_parts

    def _tick(self, piece: str, t0: float) -> float:
        """Add the seconds since ``t0`` to ``piece`` when timing; returns now (the next piece's start)."""
        now = self._clock()
        if self.jk_parts is not None:
            self.jk_parts[piece] = self.jk_parts.get(piece, 0.0) + now - t0
        return now

    def _jk_rows(self, src: np.ndarray, dtype: np.dtype, nao: int, factors, dm, with_j: bool, with_k: bool):
        """J/K of one block of fp64 tensor rows ``src``, packed (p, nao(nao+1)/2, μ ≥ ν) or unpacked
        (p, nao, nao), in ``dtype``.

        ``_UNPACK_CHUNK_BYTES`` of rows at a time are unpacked (PySCF's unpack, one thread) and/or
        converted to ``dtype`` into a reused buffer that stays in cache; from it, while still in cache,
        Z[i, (P, ν)] = Σ_μ C_μi B_P,μν as one GEMM with the long dimension last (B_P is symmetric), written
        straight into the group of Z rows of ``_SYRK_GROUP_BYTES``; K += Zᵀ Z is one syrk per group (its
        inner dimension, rows × nocc, in the thousands however large nao is), accumulated in fp64.
        J = Σ_P ρ_P B_P with ρ_P = B_P·D, both in fp64 on the rows as stored (packed: the lower triangle,
        unpacked at the end): both GEMVs on each chunk of rows just unpacked, still in cache; without K
        nothing is unpacked (:meth:`_coulomb`). So a reduced-precision build has fp32 K and fp64 J, which
        lets a mixed SCF follow the fp64 one further (:class:`mp2trn.jk.PrecisionSchedule`). This path runs
        fp64 builds, and fp32 builds of the unpacked layout; fp32 builds of the packed tensor read its fp32
        copy (:meth:`_jk_fp32_copy`). ``time_jk_parts`` times each piece (``scripts/bench_jk.py --parts``).

        Raffinose/cc-pVDZ (nao 636, one row per chunk), one build (``python scripts/bench_jk.py --xyz
        molecules/gpu4pyscf/organic/066_Raffinose.xyz``): fp64 9.3 s against 10.5 s when J took two passes
        of nao² over each unpacked row, PySCF's ``get_jk`` 16.7 s (ρ_P then read off Z; reading it off the
        row instead costs nothing visible: later, on a slower stretch of this VM, fp64 11.0 s against PySCF's
        21.0 s, fp32 6.8 s with J equal to PySCF's to 4e-14).
        Cetirizine/cc-pVDZ: 4.5-4.7 s against 6.7-7.0 s for a tall GEMM X = B C and a syrk per chunk; the
        GEMM Cᵀ Bᵀ runs at 83-86 GFLOP/s against 55 for B C (N = nocc is narrow, ``--parts``).
        """
        p = src.shape[0]
        packed = src.ndim == 2
        flat_src = src.reshape(p, -1)
        terms = [(np.ascontiguousarray(c.T, dtype=dtype), sign) for c, sign in factors if c.shape[1] and with_k]
        vj = np.zeros(flat_src.shape[1]) if with_j else None
        vk = np.zeros((nao, nao)) if with_k else None
        weights = _coulomb_weights(dm, packed) if with_j else None
        if not terms:   # nothing to unpack: J alone, one pass over the rows; K zero when asked (no factor)
            return (_unpack_j(self._coulomb(flat_src, weights), packed, nao) if with_j else None), vk
        rows = max(1, int(_UNPACK_CHUNK_BYTES // (nao * nao * 8)))
        width = sum(ct.shape[0] for ct, _ in terms)
        group = min(p, rows * max(1, int(_SYRK_GROUP_BYTES // (rows * nao * width * dtype.itemsize))))
        z_buf = self._jk_buffer("z", group * width * nao, dtype)
        for g0 in range(0, p, group):
            g1 = min(p, g0 + group)
            zs = []
            for ct, _ in terms:   # one Z (nocc·rows of the group, nao) per factor, side by side
                offset = sum(z.size for z in zs)
                zs.append(z_buf[offset : offset + ct.shape[0] * (g1 - g0) * nao])
            for r0 in range(g0, g1, rows):
                r1 = min(g1, r0 + rows)
                flat = self._unpacked_rows(src[r0:r1], dtype, nao, rows)
                t0 = self._clock()
                if with_j:   # both passes of J over the rows just read, still in cache
                    rho = flat_src[r0:r1] @ weights
                    t0 = self._tick("J: rho_P = B_P.D", t0)
                    vj += rho @ flat_src[r0:r1]
                    t0 = self._tick("J: sum_P rho_P B_P", t0)
                for (ct, _), z in zip(terms, zs):
                    n, m = ct.shape[0], (r1 - r0) * nao
                    part = z[n * (r0 - g0) * nao : n * (r1 - g0) * nao].reshape(n, m)
                    np.matmul(ct, flat.reshape(m, nao).T, out=part)   # (B_P C)ᵀ = Cᵀ B_P, B_P symmetric
                self._tick("half-transform Z = C^T B_P", t0)
            t0 = self._clock()
            for (ct, sign), z in zip(terms, zs):
                zz = z.reshape(-1, nao)
                vk += sign * (zz.T @ zz)                             # NumPy calls syrk for a.T @ a
            self._tick("syrk K += Z^T Z", t0)
        return (None if vj is None else _unpack_j(vj, packed, nao)), vk

    def _jk_fp32_copy(self, blk: "_Fp32Copy", factors, dm, with_j: bool, with_k: bool):
        """J/K of one block in fp32 from its packed fp32 copy: K in fp32, J in fp64 from the fp64 rows
        (:meth:`_jk_packed_symm`)."""
        return self._jk_packed_symm(blk.block, blk.copy, blk.nao, factors, dm, with_j, with_k)

    def _jk_packed_symm(self, src: np.ndarray, copy: np.ndarray, nao: int, factors, dm, with_j: bool,
                        with_k: bool):
        """J/K of one block of packed rows ``src`` (fp64) with K from ``copy`` (the same rows packed, fp32 or
        ``src`` itself for an fp64 build), in ``copy``'s precision; J in fp64 from ``src``.

        Row by row, LAPACK's ``stpttr`` copies the packed row into one triangle of a square (nao, nao) matrix
        (the row-major lower triangle is the column-major upper one), and ``ssymm`` multiplies it, reading
        that triangle only, by the occupied factor: Z_P = Cᵀ B_P, (nocc, nao), into the group of Z rows; one
        ``ssyrk`` per group adds ZᵀZ (upper triangle, fp32) into K in fp64. No fp64 unpacking and no
        conversion at build time: Inosine/cc-pVDZ on one BLAS thread, in that thread's CPU time, an fp32
        build took 0.59 s against 0.83 s converting at every build, and the fp64 build 0.99 s (2-core VM at
        load average 13, ``python scripts/bench_jk.py --parts --threads 1``). J
        as in fp64 builds: ρ_P = B_P·D and Σ_P ρ_P B_P over the fp64 rows, a few rows at a time so that
        the second pass reads them from cache. Everything runs on SciPy's BLAS pool (one pool at a time,
        :mod:`mp2trn.threads`).
        """
        p = src.shape[0]
        single = copy.dtype == np.float32
        tpttr, symm, syrk = ((scipy_lapack.stpttr, scipy_blas.ssymm, scipy_blas.ssyrk) if single else
                             (scipy_lapack.dtpttr, scipy_blas.dsymm, scipy_blas.dsyrk))
        terms = [(np.asarray(c, dtype=copy.dtype, order="F"), sign) for c, sign in factors if c.shape[1] and with_k]
        vj = vk_upper = None
        with one_blas_pool("scipy"):
            if with_j:
                vj = _unpack_j(self._coulomb(src, _coulomb_weights(dm, True), scipy_gemv=True), True, nao)
            if terms:
                width = sum(c.shape[1] for c, _ in terms)
                group = max(1, min(p, int(_SYRK_GROUP_BYTES // (nao * width * copy.itemsize))))
                z_buf = self._jk_buffer("z", group * width * nao, copy.dtype)
                vk_upper = np.zeros((nao, nao), order="F")
                for g0 in range(0, p, group):
                    g1 = min(p, g0 + group)
                    zs, offset = [], 0
                    for c, _ in terms:   # Z (rows of the group, nocc, nao) per factor
                        size = (g1 - g0) * c.shape[1] * nao
                        zs.append(z_buf[offset : offset + size].reshape(g1 - g0, c.shape[1], nao))
                        offset += size
                    for r in range(g0, g1):
                        t0 = self._clock()
                        square, info = tpttr(nao, copy[r], uplo="U")
                        t0 = self._tick("unpack (?tpttr)", t0)
                        for (c, _), z in zip(terms, zs):   # Z_Pᵀ = B_P C: z[r] (nocc, nao) C order = (nao, nocc) F
                            symm(1.0, square, c, side=0, lower=0, beta=0.0, c=z[r - g0].T, overwrite_c=1)
                        self._tick("half-transform Z = C^T B_P", t0)
                    t0 = self._clock()
                    for (_, sign), z in zip(terms, zs):
                        if z.size:
                            vk_upper += sign * syrk(1.0, z.reshape(-1, nao).T, trans=0, lower=0)
                    self._tick("syrk K += Z^T Z", t0)
        vk = np.zeros((nao, nao)) if with_k else None   # zero when asked with no factor (an empty spin channel)
        if vk_upper is not None:
            vk = np.triu(vk_upper)
            vk += np.triu(vk, 1).T
        return vj, vk

    def _coulomb(self, rows: np.ndarray, weights: np.ndarray, scipy_gemv: bool = False) -> np.ndarray:
        """Σ_P ρ_P B_P with ρ_P = B_P·weights over fp64 ``rows`` (p, n), both passes over a few rows at a time
        so that the second reads them from cache; NumPy's GEMVs, or SciPy's when ``scipy_gemv`` (the build
        runs on SciPy's pool). Returns (n,) fp64."""
        p, n = rows.shape
        chunk = max(1, int(_J_CHUNK_BYTES // (8 * n)))
        vj = np.zeros(n)
        for r0 in range(0, p, chunk):
            part = rows[r0 : r0 + chunk]
            t0 = self._clock()
            if scipy_gemv:   # part (r, n) C order = (n, r) F order: ρ = partᵀ·w, vj += part·ρ in those terms
                rho = scipy_blas.dgemv(1.0, part.T, weights, trans=1)
                t0 = self._tick("J: rho_P = B_P.D", t0)
                scipy_blas.dgemv(1.0, part.T, rho, beta=1.0, y=vj, overwrite_y=1)
            else:
                rho = part @ weights
                t0 = self._tick("J: rho_P = B_P.D", t0)
                vj += rho @ part
            self._tick("J: sum_P rho_P B_P", t0)
        return vj

    def _unpacked_rows(self, rows: np.ndarray, dtype: np.dtype, nao: int, capacity: int) -> np.ndarray:
        """Tensor rows (r, nao, nao) in ``dtype``, flat (r, nao²): the rows themselves when they are unpacked
        fp64, else unpacked (one thread: the GEMMs' BLAS threads still spin between calls, mp2trn.threads)
        and/or converted into buffers of ``capacity`` rows kept between builds."""
        r = rows.shape[0]
        if rows.ndim == 3 and dtype == np.float64:
            return rows.reshape(r, nao * nao)
        stage = rows
        t0 = self._clock()
        if rows.ndim == 2:   # PySCF unpacks fp64: unpack there, then convert in cache
            stage = self._jk_buffer("unpacked", capacity * nao * nao, np.float64)[: r * nao * nao].reshape(r, nao, nao)
            with lib.with_omp_threads(1):
                lib.unpack_tril(rows, out=stage)
            t0 = self._tick("unpack (PySCF, fp64)", t0)
        if dtype != np.float64:
            cast = self._jk_buffer("cast", capacity * nao * nao, dtype)[: r * nao * nao].reshape(r, nao, nao)
            np.copyto(cast, stage, casting="same_kind")
            stage = cast
            self._tick("convert to fp32", t0)
        return stage.reshape(r, nao * nao)

    def _jk_buffer(self, name: str, size: int, dtype) -> np.ndarray:
        """The work buffer ``name`` with at least ``size`` elements of ``dtype``, kept for the next J/K build:
        fresh arrays this large are new pages from the OS at every block (measured: 13 ms per copy in an SCF
        against 6 ms reused)."""
        buf = self._jk_bufs.get(name)
        if buf is None or buf.size < size or buf.dtype != dtype:
            buf = self._jk_bufs[name] = np.empty(size, dtype)
        return buf

    def release_jk(self) -> None:
        """Drop the J/K work buffers (after the SCF)."""
        self._jk_bufs = {}

    def contract_aux(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """T block = xᵀ y over the aux index: x (naux, m), y (naux, n) → (m, n).

        The one GEMM of the pair step; subclasses that study other arithmetic override only this.
        """
        return x.T @ y


#: tensor rows unpacked and/or converted at a time (as fp64): a few MB, so that they are still in cache
#: when the GEMMs read them (Inosine/cc-pVDZ: 4 rows, Cetirizine: 1)
_UNPACK_CHUNK_BYTES = 4e6
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


def nao_of_pairs(npair: int) -> int:
    """n with n(n+1)/2 = ``npair`` (the side of a packed lower triangle)."""
    n = int(round((np.sqrt(8 * npair + 1) - 1) / 2))
    if n * (n + 1) // 2 != npair:
        raise ValueError(f"{npair} is not a triangular number of pairs")
    return n


def _coulomb_weights(dm: np.ndarray, packed: bool) -> np.ndarray:
    """D over the rows as stored: packed, the lower triangle with off-diagonal pairs counted twice
    (ρ_P = B_P·D then reads each pair once); unpacked, D flat."""
    dm = np.asarray(dm)
    return lib.pack_tril(2 * dm - np.diag(np.diag(dm))) if packed else dm.ravel()


def _unpack_j(vj: np.ndarray, packed: bool, nao: int) -> np.ndarray:
    """J (nao, nao) from its rows-as-stored form."""
    return lib.unpack_tril(vj) if packed else vj.reshape(nao, nao)


class _Fp32Copy:
    """A packed host tensor block (p, nao(nao+1)/2) fp64 (J reads it) with its fp32 copy (K reads it)."""

    __slots__ = ("block", "copy", "nao")
    dtype = np.dtype(np.float32)

    def __init__(self, block: np.ndarray, copy: np.ndarray, nao: int):
        self.block, self.copy, self.nao = block, copy, nao


def _reduce_row(m: np.ndarray, e_i: float, e_j: np.ndarray, e_ab: np.ndarray, os_row: np.ndarray, x_row) -> None:
    """m: (nva, nj, nvb) = T for pairs (i, j) over j. Fill os_row[j] and x_row[j] (fp64 sums).

    One preallocated nva×nvb buffer holds W = T / D for each pair in turn, so every pair's work stays
    in cache (measured 2-3x faster than fresh temporaries or a row-vectorised 3-D form).
    """
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


def _rows_by_a(t: np.ndarray) -> np.ndarray:
    """(i, a, b) amplitudes as (a, i·b) rows (one copy), so that a sum over i and b is one GEMM."""
    return np.ascontiguousarray(t.transpose(1, 0, 2)).reshape(t.shape[1], -1)


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
