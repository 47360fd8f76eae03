"""How many orbital-Hessian products the Z-vector needs, by solver (numbers for docs/gradients.md).

    python scripts/bench_zvector.py                                   # water, hydroxyl, benzene (cc-pVDZ)
    python scripts/bench_zvector.py molecules/gpu4pyscf/organic/031_Inosine.xyz --memory 8000

Runs the gradient (cpu, fp64) up to the relaxed density and takes the Z-vector system it solves —
(ε_a − ε_k) z + G[Z + Zᵀ]_vo = −L, with the run's own products (the JK-fit tensor's MO blocks) — then
solves that same system with each solver, counting the products (G applications) each one makes until its
own stopping rule says done, and reports the true relative residual ‖L + A z‖/‖L‖ it reached:

- ``pcg-coulomb``: mp2trn's solver (:func:`mp2trn.grad.response.solve_zvector`): PCG from z = 0,
  preconditioned by the Hessian's Coulomb part (rank naux) plus the rest of its diagonal, inverted by
  Woodbury's identity (:meth:`mp2trn.grad.cpks.ResponseJK.preconditioner`), relative residual 1e-8;
- ``pcg-diagonal``: the solver before it: PCG from z = 0 preconditioned by the Hessian's diagonal
  (ε_a − ε_k + 2w(ak|ak) − (ak|ak) − (aa|kk));
- ``pcg-jacobi``: the solver before it: PCG from z = L/(ε_a − ε_k), preconditioned by ε_a − ε_k (one more
  product for the first residual);
- ``pyscf-krylov``: ``pyscf.lib.krylov`` (what ``pyscf.scf.cphf.solve`` uses) on the ε-scaled system, its
  tol 1e-8 relative to the scaled right-hand side and its linear-dependence cut-off lowered to 1e-30 (with the
  default, 1e-13 on the squared norm, it stops at a 1e-5 residual on water);
- ``scipy-cg`` / ``scipy-minres``: SciPy's, rtol 1e-8, with the exact-diagonal preconditioner.

``--gemms`` instead times the cpu device's Z-vector products on random operands of one product's shapes
(default Inosine/cc-pVDZ's: naux 1606, nocc 70, nvir 256; ``--sizes NAUX NOCC NVIR``) against the same
products as the base class computes them (``a_tᵀ b``; the grouped one as a batched matmul), round robin
with a DGEMM for the share of its rate, and prints GFLOP/s per form; then the two forms of a long-inner
product (:func:`mp2trn.roofline.measure_long_inner`) at the shape the cpu's per-machine choice times, at the
same with N = 64, and at Σ_Q B_vv Y's, with the form the cpu device takes on this machine.

``--refine`` instead solves each run's system (cpu) with fp64 PCG and with fp32 inner solves refined by fp64
products (:func:`mp2trn.grad.response.solve_zvector`'s ``exact``; the inner solves' tolerance
:data:`~mp2trn.grad.response.REFINE_INNER_TOL` set to 1e-3, 1e-4 and 1e-5 in turn), and prints the products of
each kind, the true residual, how far z is from the fp64 solve's and the seconds.

``--sim-check`` instead runs each molecule's gradient on sim (fp32, SCF to 1e-12) twice — the response's
GEMMs on the device, then on the host in fp64 (ResponseJK given no device) — and the cpu fp64 gradient, and
prints how far apart they are (Eh/bohr).

The system is captured by wrapping :func:`mp2trn.grad.response.solve_zvector` for the duration of the run
(a measurement script, not a test). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.sparse.linalg as sla
from pyscf import lib

import mp2trn
from mp2trn.grad import cpks, dfmp2, response

DEFAULT = ["molecules/water.xyz", "molecules/hydroxyl.xyz", "molecules/benzene.xyz"]
TOL = 1e-8


def capture(path: str, memory: float) -> tuple:
    """The products, channels and Lagrangian blocks of the Z-vector a cpu fp64 gradient run solves."""
    captured = {}
    solve = response.solve_zvector

    def keep(products, chans, lag, *args, **kwargs):
        # the run's fp64 products (with a refined solve, the products refining the inner ones)
        captured.update(products=kwargs.get("exact") or products, chans=chans, lag=lag)
        return solve(products, chans, lag, *args, **kwargs)

    response.solve_zvector = keep
    try:
        mp2trn.run(path, gradient=True, max_memory=memory)
    finally:
        response.solve_zvector = solve
    return captured["products"], captured["chans"], captured["lag"]


class System:
    """A (ε_a − ε_k) + G[Z + Zᵀ] operator that counts its products."""

    def __init__(self, products, chans, lag):
        self.products, self.chans = products, chans
        self.shapes = [(ch.nvir, len(ch.occ)) for ch in chans]
        self.energies = np.concatenate([(ch.e[ch.vir][:, None] - ch.e[ch.occ][None, :]).ravel() for ch in chans])
        self.rhs = -np.concatenate([x.ravel() for x in lag])
        self.count = 0

    def split(self, v):
        out, k = [], 0
        for n, m in self.shapes:
            out.append(v[k:k + n * m].reshape(n, m))
            k += n * m
        return out

    def coupling(self, v):
        self.count += 1
        return np.concatenate([g.ravel() for g in self.products.zvector(self.split(v))])

    def apply(self, v):
        return self.energies * v + self.coupling(v)

    def residual(self, z) -> float:
        count = self.count
        r = np.linalg.norm(self.rhs - self.apply(z)) / np.linalg.norm(self.rhs)
        self.count = count        # the check is not the solver's
        return float(r)


def pcg(system: System, precondition, start: np.ndarray) -> np.ndarray:
    if not callable(precondition):
        diagonal = precondition
        precondition = lambda r: r / diagonal                         # noqa: E731
    x = start.copy()
    r = system.rhs - system.apply(x) if np.any(start) else system.rhs.copy()
    z = precondition(r)
    p, rz, norm = z.copy(), float(r @ z), np.linalg.norm(system.rhs)
    for _ in range(200):
        ap = system.apply(p)
        alpha = rz / float(p @ ap)
        x += alpha * p
        r -= alpha * ap
        if np.linalg.norm(r) < TOL * norm:
            return x
        z = precondition(r)
        rz_new = float(r @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x


def solvers(system: System) -> dict:
    exact = system.products.diagonal()
    op = sla.LinearOperator((len(system.rhs),) * 2, matvec=system.apply, dtype=float)
    pre = sla.LinearOperator((len(system.rhs),) * 2, matvec=lambda v: v / exact, dtype=float)
    e = system.energies
    return {
        "pcg-coulomb": lambda: np.concatenate([z.ravel() for z in
                                             response.solve_zvector(_Counting(system), system.chans,
                                                                    [-x for x in system.split(system.rhs)])[0]]),
        "pcg-jacobi": lambda: pcg(system, e, system.rhs / e),
        "pcg-diagonal": lambda: pcg(system, exact, np.zeros_like(e)),
        "pyscf-krylov": lambda: lib.krylov(lambda xs: np.array([system.coupling(v) / e for v in
                                                                np.asarray(xs).reshape(-1, len(e))]),
                                           system.rhs / e, tol=TOL * np.linalg.norm(system.rhs / e),
                                           lindep=1e-30, max_cycle=200),
        "scipy-cg": lambda: sla.cg(op, system.rhs, rtol=TOL, M=pre, maxiter=200)[0],
        "scipy-minres": lambda: sla.minres(op, system.rhs, rtol=TOL, M=pre, maxiter=200)[0],
    }


class _Counting:
    """The run's products, counted by the System (for mp2trn's own solver)."""

    def __init__(self, system: System):
        self.system = system

    def zvector(self, zs):
        self.system.count += 1
        return self.system.products.zvector(zs)

    def diagonal(self):
        return self.system.products.diagonal()

    def preconditioner(self):
        return self.system.products.preconditioner()


def sim_check(paths: list[str], precision: str = "fp32") -> None:
    """max |Δg| between the sim gradient with the device response, with the host's, and cpu fp64."""

    class HostResponse(cpks.ResponseJK):
        def __init__(self, mf, chans, tensor, device=None):
            super().__init__(mf, chans, tensor, None)

    print(f"| molecule | sim {precision}: device response − host response | device response − cpu fp64 | "
          "host response − cpu fp64 | products |")
    print("|---|---|---|---|---|")
    for path in paths:
        kw = dict(gradient=True, conv_tol=1e-12)
        cpu = mp2trn.run(path, **kw).gradient
        on_device = mp2trn.run(path, device="sim", precision=precision, **kw)
        original, dfmp2.ResponseJK = dfmp2.ResponseJK, HostResponse
        try:
            on_host = mp2trn.run(path, device="sim", precision=precision, **kw).gradient
        finally:
            dfmp2.ResponseJK = original
        g = on_device.gradient
        print(f"| {path.rsplit('/', 1)[-1]} | {np.abs(g - on_host).max():.1e} | {np.abs(g - cpu).max():.1e} | "
              f"{np.abs(on_host - cpu).max():.1e} | {on_device.what_ran['zvector']['products']} |", flush=True)


def gemms(naux: int, nocc: int, nvir: int, repeat: int) -> None:
    """The cpu device's forms of one Z-vector product's GEMMs against the base class's (module docstring)."""
    from mp2trn.devices.base import Device
    from mp2trn.devices.cpu import CpuDevice
    from mp2trn.roofline import LONG_INNER_SHAPE, long_inner_transposed, measure_gemm_rate, measure_long_inner
    rng = np.random.default_rng(1)
    dev = CpuDevice()
    z = rng.standard_normal((nvir, nocc))
    # as the response keeps them (grad/cpks.py ResponseJK._keep): transposed views of ((Q, j), ·) rows
    vo_by_vir = rng.standard_normal((naux * nocc, nvir)).T
    oo_by_occ = rng.standard_normal((naux * nocc, nocc)).T
    vv_rows = rng.standard_normal((naux * nvir, nvir))
    ov_rows = rng.standard_normal((naux * nocc, nvir))
    y = rng.standard_normal((naux * nvir, nocc))
    m = rng.standard_normal((naux * nocc, nocc))
    cases = [("M = z · B_vo (grouped)", "grouped", z, vo_by_vir, nocc),
             ("Y = zᵀ · B_oo (grouped)", "grouped", np.ascontiguousarray(z.T), oo_by_occ, nocc),
             ("Σ_Q B_vv Y", "gemm", vv_rows, y, 0),
             ("Σ_Q B_ov M", "gemm", ov_rows, m, 0)]
    best: dict[tuple[str, str], float] = {}
    rates = []
    for _ in range(repeat):
        rates.append(measure_gemm_rate(np.float64))
        for name, kind, a_t, b, width in cases:
            for form, owner in (("cpu device", CpuDevice), ("base class", Device)):
                t0 = time.perf_counter()
                if kind == "grouped":
                    out = owner.response_grouped(dev, a_t, b, width)
                else:
                    out = owner.response_gemm(dev, a_t, b)
                seconds = time.perf_counter() - t0
                flops = 2.0 * out.size * a_t.shape[0]
                best[name, form] = max(best.get((name, form), 0.0), flops / seconds / 1e9)
    rate = max(rates)
    print(f"naux {naux}, nocc {nocc}, nvir {nvir}; best of {repeat}; DGEMM {rate:.0f} GFLOP/s (1536³, same run)")
    print("| product | cpu device GFLOP/s | base class GFLOP/s | cpu device / base |")
    print("|---|---:|---:|---:|")
    for name, *_ in cases:
        mine, base = best[name, "cpu device"], best[name, "base class"]
        print(f"| {name} | {mine:.0f} ({100 * mine / rate:.0f} %) | {base:.0f} ({100 * base / rate:.0f} %) | "
              f"{mine / base:.2f} |")
    # the per-machine timing that picks the cpu's long-inner form, at its own shape and at Σ_Q B_vv Y's
    print("\n| long-inner a_tᵀ b (K, M, N) | dtype | plain GFLOP/s | (bᵀ a_t)ᵀ GFLOP/s | the cpu device takes |")
    print("|---|---|---:|---:|---|")
    k, m, n = LONG_INNER_SHAPE
    for shape in (LONG_INNER_SHAPE, (k, m, 64), (naux * nvir, nvir, nocc)):
        for dtype, precision in ((np.float64, "fp64"), (np.float32, "fp32")):
            forms = measure_long_inner(dtype, shape=shape, repeats=repeat)
            print(f"| {shape} | {precision} | {forms['plain']:.0f} | {forms['transposed']:.0f} | "
                  f"{'(bᵀ a_t)ᵀ' if long_inner_transposed(precision) else 'a_tᵀ b'} |")


def refine(paths: list[str], memory: float) -> None:
    """fp64 PCG against fp32 inner solves refined by fp64 products (module docstring), on each run's system."""
    print("| molecule | solve | fp32 products | fp64 products | true relative residual | max Δz / max z | solve s |")
    print("|---|---|---:|---:|---|---|---:|")
    default, how_default = response.REFINE_INNER_TOL, response.REFINEMENT
    for path in paths:
        fp64, chans, lag = capture(path, memory)
        name = path.rsplit("/", 1)[-1]
        system = System(fp64, chans, lag)
        fp64.products = 0
        t0 = time.perf_counter()
        want = response.solve_zvector(fp64, chans, lag)[0]
        seconds = time.perf_counter() - t0
        flat = np.concatenate([z.ravel() for z in want])
        print(f"| {name} | fp64 PCG | 0 | {fp64.products} | {system.residual(flat):.1e} | 0 | {seconds:.2f} |",
              flush=True)
        reduced = fp64.reduced()
        if reduced is None:
            continue
        for how, inner in (("restart", 1e-3), ("restart", 1e-4), ("restart", 1e-5), ("reliable", 1e-3),
                           ("reliable", 1e-4), ("reliable", 1e-5)):
            response.REFINE_INNER_TOL, response.REFINEMENT = inner, how
            fp64.products = reduced.products = 0
            try:
                t0 = time.perf_counter()
                got = response.solve_zvector(reduced, chans, lag, exact=fp64)[0]
                seconds = time.perf_counter() - t0
            finally:
                response.REFINE_INNER_TOL, response.REFINEMENT = default, how_default
            z = np.concatenate([g.ravel() for g in got])
            print(f"| {name} | refined ({how}), inner {inner:.0e} | {reduced.products} | {fp64.products} | "
                  f"{system.residual(z):.1e} | {np.abs(z - flat).max() / np.abs(flat).max():.1e} | {seconds:.2f} |",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("molecules", nargs="*", default=DEFAULT)
    ap.add_argument("--memory", type=float, default=4000, help="MB for the gradient run (--memory)")
    ap.add_argument("--sim-check", action="store_true", help="device vs host response on sim (see above)")
    ap.add_argument("--gemms", action="store_true", help="time the cpu device's product forms (see above)")
    ap.add_argument("--sizes", type=int, nargs=3, default=(1606, 70, 256), metavar=("NAUX", "NOCC", "NVIR"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--refine", action="store_true", help="fp64 PCG vs fp32 inner solves refined (see above)")
    args = ap.parse_args()
    if args.refine:
        refine(args.molecules, args.memory)
        return
    if args.gemms:
        gemms(*args.sizes, args.repeat)
        return
    if args.sim_check:
        sim_check(args.molecules)
        return
    print("| molecule | unknowns | solver | products | true relative residual | solve s |")
    print("|---|---|---|---|---|---|")
    for path in args.molecules:
        products, chans, lag = capture(path, args.memory)
        system = System(products, chans, lag)
        for name, solve in solvers(system).items():
            system.count = 0
            t0 = time.perf_counter()
            z = solve()
            seconds = time.perf_counter() - t0
            print(f"| {path.rsplit('/', 1)[-1]} | {len(system.rhs)} | {name} | {system.count} | "
                  f"{system.residual(z):.1e} | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
