"""Pieces of the cpu gradient timed alone (numbers for docs/benchmarks.md, "Analytic gradients (measured)").

    python scripts/bench_gradient_parts.py                       # Inosine/cc-pVDZ, every part
    python scripts/bench_gradient_parts.py --only ip1 gather

Parts (each timed ``--repeat`` times in this process, the fastest kept; fp64):

- ``ip1``: libcint's ``int3c2e_ip1`` over all (μ, ν) for each fitting basis (cc-pVDZ-RI, cc-pVDZ-JKFIT) in
  the derivative passes' blocks of 150 fitting functions — into a fresh array per block, and into one
  buffer reused by every block (``out=``);
- ``gather``: the response's (Q, r, i) → ((Q, b), i) copy of W (naux_jk × nmo × nocc) with the virtual
  orbitals picked by an index array against a slice (:meth:`mp2trn.grad.cpks.ResponseJK.occupied_columns`);
- ``solve``: the JK-fit pass's metric solve of (P|iμ) (naux_jk × nocc·nao) followed by its (naux·nocc, nao)
  GEMM: SciPy's left-side ``solve_triangular`` (a Fortran-ordered result, reshaped by a copy) against the
  right-side BLAS trsm in place (:func:`mp2trn.grad.ri.fitted_rows`), with each GEMM's GFLOP/s;
- ``trsm``: the SCF tensor's triangular solves in :func:`mp2trn.df.cholesky_tensor` and their GFLOP/s;
- ``vv``: one Z-vector product against B^Q_vv (naux_jk·nvir × nvir by nvir·… × nocc, random operands) as the
  cpu device computes it, (bᵀ a)ᵀ, against the same K rows split over the cores (one BLAS thread each);
- ``xta``: the fitting-basis pass's X_ta = Σ_iP (ti|P) Γ^P_ia for the whole RI basis (random symmetric
  integrals in blocks of 150): Γ half-transformed over i first (Σ_Pν (P|μν) Σ_i C_νi Γ^P_ia, before) against
  the integrals half-transformed to (P|iμ) first (:func:`mp2trn.grad.ri.ri_pass`);
- ``syrk``: the Z-vector preconditioner's S = Σ x xᵀ over B_ov's scaled columns (naux_jk × nocc·nvir, in
  chunks of ``PRECONDITIONER_COLUMNS``), in fp64 against fp32 summed in fp64
  (:meth:`mp2trn.grad.cpks.ResponseJK.preconditioner`);
- ``dc``: the JK-fit pass's Σ_iμ d_P,iμ c_Q,iμ (naux_jk × naux_jk over nocc·nao, c = d (1 ⊗ Z), Z symmetric) as
  one GEMM against its lower block triangle mirrored (:func:`mp2trn.grad.jk_terms._add_symmetric_product`).

Sizes come from the molecule (``--xyz``, cc-pVDZ); the orbitals are random orthonormal columns (the timings
do not depend on their values).
"""

from __future__ import annotations

import argparse
import platform
import threading
import time

import numpy as np
import scipy.linalg
from pyscf import df, gto

from mp2trn.df import _shell_ranges, cholesky_tensor
from mp2trn.grad.ri import fitted_rows
from mp2trn.memory import prefaulted_empty
from mp2trn.threads import one_blas_pool, one_thread_each

PARTS = ("ip1", "gather", "solve", "trsm", "vv", "xta", "syrk", "dc")


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def part_ip1(mol, repeat):
    nao, nbas = mol.nao_nr(), mol.nbas
    for name in ("cc-pvdz-ri", "cc-pvdz-jkfit"):
        aux = df.addons.make_auxmol(mol, name)
        pmol, loc = mol + aux, aux.ao_loc_nr()
        blocks = list(_shell_ranges(loc, 150))
        rows = max(int(loc[b] - loc[a]) for a, b in blocks)
        buf = prefaulted_empty((3 * rows * nao * nao,))

        def run(reuse: bool):
            for s0, s1 in blocks:
                p = int(loc[s1] - loc[s0])
                pmol.intor("int3c2e_ip1", comp=3, aosym="s1", shls_slice=(0, nbas, 0, nbas, nbas + s0, nbas + s1),
                           out=buf[: 3 * p * nao * nao] if reuse else None)

        fresh, reused = best(lambda: run(False), repeat), best(lambda: run(True), repeat)
        print(f"ip1 {name} (naux {aux.nao_nr()}, {len(blocks)} blocks): fresh arrays {fresh:.2f} s, "
              f"one reused buffer {reused:.2f} s")


def part_gather(sizes, repeat):
    naux, nmo, nocc = sizes["naux_jk"], sizes["nao"], sizes["nocc"]
    w = np.random.default_rng(0).random((naux, nocc, nmo)).transpose(0, 2, 1)   # (Q, r, i) view
    index, span = np.arange(nocc, nmo), slice(nocc, nmo)
    t_index = best(lambda: w[:, index].reshape(-1, nocc), repeat)
    t_slice = best(lambda: w[:, span].reshape(-1, nocc), repeat)
    print(f"gather W[:, vir] ({naux}×{nmo}×{nocc}): index array {t_index:.3f} s, slice {t_slice:.3f} s")


def part_solve(mol, sizes, repeat):
    aux = df.addons.make_auxmol(mol, "cc-pvdz-jkfit")
    low = scipy.linalg.cholesky(aux.intor("int2c2e", hermi=1), lower=True)
    naux, nao, nocc = aux.nao_nr(), sizes["nao"], sizes["nocc"]
    rng = np.random.default_rng(1)
    a = rng.random((naux, nocc * nao))
    z = rng.random((nao, nao))
    gemm_flop = 2.0 * naux * nocc * nao * nao

    def left():
        with one_blas_pool("scipy"):
            d = scipy.linalg.solve_triangular(low, a, lower=True, trans="T", check_finite=False)
        t0 = time.perf_counter()
        d.reshape(-1, nao) @ z
        return time.perf_counter() - t0

    def right():
        d = fitted_rows(np.asfortranarray(low), a.copy(), both=False)
        t0 = time.perf_counter()
        d.reshape(-1, nao) @ z
        return time.perf_counter() - t0

    for name, fn in (("left-side solve_triangular", left), ("right-side trsm in place", right)):
        walls, gemms = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            gemms.append(fn())
            walls.append(time.perf_counter() - t0)
        print(f"solve {name}: solve + GEMM {min(walls):.2f} s, the GEMM (with any copy) {min(gemms):.2f} s, "
              f"{gemm_flop / min(gemms) / 1e9:.0f} GFLOP/s")


def part_trsm(mol, repeat):
    import mp2trn.df as mdf
    aux = df.addons.make_auxmol(mol, "cc-pvdz-jkfit")
    original = mdf.scipy_blas.dtrsm
    spent = [0.0]

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        spent[0] += time.perf_counter() - t0
        return out

    results = []
    for _ in range(repeat):
        spent[0] = 0.0
        mdf.scipy_blas.dtrsm = timed
        try:
            t0 = time.perf_counter()
            with one_blas_pool():
                x = cholesky_tensor(mol, aux, packed=True)
            results.append((time.perf_counter() - t0, spent[0], x.shape[1]))
        finally:
            mdf.scipy_blas.dtrsm = original
    wall, solve, npair = min(results)
    naux = aux.nao_nr()
    print(f"trsm: SCF tensor {wall:.2f} s, its triangular solves {solve:.2f} s = "
          f"{naux * naux * npair / solve / 1e9:.0f} GFLOP/s")


def part_vv(sizes, repeat):
    naux, nocc, nvir = sizes["naux_jk"], sizes["nocc"], sizes["nao"] - sizes["nocc"]
    rng = np.random.default_rng(2)
    a_t, b = rng.random((naux * nvir, nvir)), rng.random((naux * nvir, nocc))
    k = a_t.shape[0]
    flop = 2.0 * k * nvir * nocc

    def split():
        half, outs = k // 2, [None, None]

        def part(i):
            rows = slice(0, half) if i == 0 else slice(half, k)
            outs[i] = b[rows].T @ a_t[rows]

        with one_thread_each():
            other = threading.Thread(target=part, args=(1,))
            other.start()
            part(0)
            other.join()
        return (outs[0] + outs[1]).T

    for name, fn in (("(bᵀ a)ᵀ (the cpu device)", lambda: np.ascontiguousarray((b.T @ a_t).T)),
                     ("rows split over the cores", split)):
        t = best(fn, repeat)
        print(f"vv {name}: {t:.3f} s, {flop / t / 1e9:.0f} GFLOP/s")


def part_xta(mol, sizes, repeat):
    nao, nocc = sizes["nao"], sizes["nocc"]
    nvir, naux = nao - nocc, df.addons.make_auxmol(mol, "cc-pvdz-ri").nao_nr()
    rng = np.random.default_rng(3)
    p = 150
    ao = rng.random((p, nao, nao))
    ao += ao.transpose(0, 2, 1)
    ao_flat = ao.reshape(p * nao, nao)
    c = np.linalg.qr(rng.random((nao, nao)))[0]
    c_o, g = c[:, :nocc], rng.random((p, nocc, nvir))
    blocks = -(-naux // p)

    def gamma_first():
        for _ in range(blocks):
            c.T @ (ao_flat.T @ np.matmul(c_o, g).reshape(p * nao, -1))

    def integrals_first():
        for _ in range(blocks):
            occ_ao = np.ascontiguousarray((ao_flat @ c_o).reshape(p, nao, -1).transpose(0, 2, 1))
            c.T @ (occ_ao.reshape(-1, nao).T @ g.reshape(-1, nvir))

    for name, fn in (("Γ half-transformed first (before)", gamma_first),
                     ("integrals half-transformed first (ri_pass)", integrals_first)):
        print(f"xta {name}: {best(fn, repeat):.3f} s for {blocks} blocks of {p} RI functions")


def part_syrk(sizes, repeat):
    from mp2trn.memory import PRECONDITIONER_COLUMNS
    naux, nocc = sizes["naux_jk"], sizes["nocc"]
    flat = np.random.default_rng(4).random((naux, nocc * (sizes["nao"] - nocc)))
    for dtype in (np.float64, np.float32):
        def syrk():
            s = np.zeros((naux, naux))
            for c0 in range(0, flat.shape[1], PRECONDITIONER_COLUMNS):
                x = flat[:, c0 : c0 + PRECONDITIONER_COLUMNS].astype(dtype)
                s += x @ x.T
        print(f"syrk {np.dtype(dtype).name}: {best(syrk, repeat):.3f} s")


def part_dc(sizes, repeat):
    from mp2trn.grad.jk_terms import _add_symmetric_product
    naux, nocc, nao = sizes["naux_jk"], sizes["nocc"], sizes["nao"]
    rng = np.random.default_rng(5)
    d = rng.random((naux, nocc * nao))
    z = rng.random((nao, nao))
    c = (d.reshape(-1, nao) @ (z + z.T)).reshape(naux, -1)

    def lower_blocks():
        _add_symmetric_product(np.zeros((naux, naux)), d, c)

    for name, fn in (("one GEMM (before)", lambda: d @ c.T), ("lower block triangle (jk_terms)", lower_blocks)):
        print(f"dc {name}: {best(fn, repeat):.3f} s")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform module says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xyz", default="molecules/gpu4pyscf/organic/031_Inosine.xyz")
    ap.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    mol = gto.M(atom=args.xyz, basis="cc-pvdz", verbose=0)
    sizes = {"nao": mol.nao_nr(), "nocc": mol.nelectron // 2,
             "naux_jk": df.addons.make_auxmol(mol, "cc-pvdz-jkfit").nao_nr()}
    print(f"machine: {cpu_name()}, {args.xyz}, cc-pVDZ, sizes {sizes}")
    for name in args.only:
        if name == "ip1":
            part_ip1(mol, args.repeat)
        elif name == "gather":
            part_gather(sizes, args.repeat)
        elif name == "solve":
            part_solve(mol, sizes, args.repeat)
        elif name == "trsm":
            part_trsm(mol, args.repeat)
        elif name == "xta":
            part_xta(mol, sizes, args.repeat)
        elif name == "syrk":
            part_syrk(sizes, args.repeat)
        elif name == "dc":
            part_dc(sizes, args.repeat)
        else:
            part_vv(sizes, args.repeat)


if __name__ == "__main__":
    main()
