"""Gradient stage 3: the orbital response — frozen-core block, Z-vector, relaxed density and the
energy-weighted density — with every Coulomb/exchange product a J/K build of the SCF's own
density-fitted tensor (``mf.get_jk``: on the device when the SCF's J/K ran there).

Per spin channel σ, with G^σ[X] = J[X^α + X^β] − K[X^σ] (an RHF channel: J[2X] − K[X]) and X the
Lagrangian of :mod:`mp2trn.grad.ri`; I frozen core, i, j active occupied, k any occupied, a virtual:

    P_Ij = −½ X_Ij / (ε_I − ε_j)
    L_ak = X_ak − X_ka + 2 G^σ[P]_ak
    (ε_a − ε_k) z_ak + G^σ[Z + Zᵀ]_ak = −L_ak          (Z: z at (a, k); solved by preconditioned CG)
    P_ak = P_ka = ½ z_ak
    W_ij = ½X_ij + ε_i P_ij,  W_ab = ½X_ab + ε_a P_ab,  W_Ij = 2 ε_j P_Ij,  W_ka = X_ka,  W_ak = ε_k z_ak;
    W ← ½(W + Wᵀ);  W_kl += G^σ[P]_kl  (P relaxed)

(Handy & Schaefer, J. Chem. Phys. 81, 5031 (1984) for the Z-vector; the blocks as in Weigend & Häser 1997,
checked against finite differences of mp2trn's energies in tests/test_gradient.py.)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import ConvergenceError
from ..orbitals import SpinOrbitals


@dataclass
class Response:
    """Relaxed MP2 density correction and energy-weighted density per channel (MO basis, (nmo, nmo)),
    the unrelaxed correction, and the Z-vector's iteration count and residual."""

    p_relaxed: list[np.ndarray]
    p_unrelaxed: list[np.ndarray]
    w: list[np.ndarray]
    iterations: int
    residual: float
    fallback: str | None = None     #: why the Z-vector was solved again with host fp64 products (None: it was not)
    #: what ran the Z-vector's products (what-ran): the products' ``describe()``, refined ones with the fp64
    #: products that refined them under ``refined_by`` (None: the caller's products, unrefined)
    zvector: dict | None = None


def fock_response(mf, chans: list[SpinOrbitals], mats: list[np.ndarray]) -> list[np.ndarray]:
    """G^σ[X] in each channel's MO basis for symmetric MO-basis matrices X^σ (one J/K build)."""
    ao = [ch.c @ x @ ch.c.T for ch, x in zip(chans, mats)]
    if len(ao) == 1:
        vj, vk = mf.get_jk(mf.mol, ao[0], hermi=1)
        g = [2.0 * vj - vk]
    else:
        vj, vk = mf.get_jk(mf.mol, np.array(ao), hermi=1)
        g = [vj[0] + vj[1] - vk[0], vj[0] + vj[1] - vk[1]]
    return [ch.c.T @ gg @ ch.c for ch, gg in zip(chans, g)]


def unrelaxed(chans: list[SpinOrbitals], p_occ: list[np.ndarray], p_vir: list[np.ndarray],
              x: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """P per channel (nmo, nmo): the active-occupied and virtual blocks, and the core–active block from
    the Lagrangian ``x`` (None: the amplitude blocks alone, the unrelaxed density's correction)."""
    out = []
    for ch, po, pv, xx in zip(chans, p_occ, p_vir, x if x is not None else [None] * len(chans)):
        p = np.zeros((ch.nmo, ch.nmo))
        p[np.ix_(ch.act, ch.act)] = po
        p[np.ix_(ch.vir, ch.vir)] = pv
        if len(ch.core) and xx is not None:
            core = -0.5 * xx[np.ix_(ch.core, ch.act)] / (ch.e[ch.core][:, None] - ch.e[ch.act][None, :])
            p[np.ix_(ch.core, ch.act)] = core
            p[np.ix_(ch.act, ch.core)] = core.T
        out.append(p)
    return out


#: what-ran's preconditioner when no solve asked for one (a zero right-hand side needs no product)
NOT_USED = "none (no product needed)"
#: relative residual at which the Z-vector stops; the finite-difference tests (tests/test_gradient.py) hold
#: the gradient to 1e-6 Eh/bohr with it
ZVECTOR_TOL = 1e-8
#: a residual this many times its lowest so far means reduced-precision products have lost the conjugacy CG
#: rests on (sim fp32x3 hydroxyl at --conv-tol 1e-10 climbed from 1.6e-8 to 4.8e-4 over 100 products): with a
#: host fp64 fallback at hand the solve stops there instead of running to ``max_iter``
ZVECTOR_STALL = 100.0
#: with reduced-precision products refined by fp64 ones (:func:`solve_zvector`'s ``exact``), the residual falls
#: by this factor between true (fp64) residuals. fp32 products alone stall between 1e-7 and 1e-8
#: (hydroxyl/cc-pVDZ on sim: 10 products to 1e-7, 25 to 1e-8); refined with reliable updates, Inosine/cc-pVDZ
#: needs 16 fp32 + 2 fp64 products at 1e-4, 16 + 3 at 1e-3 and 17 + 2 at 1e-5; restarted, 18 + 2, 21 + 3 and
#: 22 + 2; fp64 alone 16 (``scripts/bench_zvector.py --refine``)
REFINE_INNER_TOL = 1e-4
#: refinement cycles (one fp64 product each) at most
REFINE_CYCLES = 8
#: how fp64 products refine the reduced ones: "restart" (each cycle a PCG from zero on the true residual) or
#: "reliable" (one PCG whose residual is replaced by the true one at each update: :func:`_pcg`'s ``exact``)
REFINEMENT = "reliable"
#: the products' precisions whose Z-vector is refined by fp64 products (fp32x3 reaches 1e-8 alone)
REFINED_PRECISIONS = ("fp32",)


def solve_zvector(products: Products, chans: list[SpinOrbitals], lag: list[np.ndarray], tol: float = ZVECTOR_TOL,
                  max_iter: int = 100, stall: float | None = None,
                  exact: Products | None = None) -> tuple[list[np.ndarray], int, float]:
    """z per channel (nvir, nocc) from (ε_a − ε_k) z + G[Z + Zᵀ]_vo = −L by preconditioned conjugate
    gradients (the orbital Hessian of a stable SCF is positive definite), from z = 0: exactly one G product
    per iteration (none for the start). The preconditioner is the products' own where they have one
    (:meth:`ResponseJK.preconditioner`: the Hessian's Coulomb part whole and the rest of its diagonal;
    Inosine/cc-pVDZ 16 products against 20 with the diagonal alone and 21 with the orbital-energy
    differences; scripts/bench_zvector.py), else the Hessian's diagonal where they have it
    (:meth:`ResponseJK.diagonal`), else the orbital-energy differences. The vectors, the residual's recurrence
    and every dot product are fp64 on the host; only the products run on the device. Stops when
    ‖r‖ < tol·‖L‖; raises ConvergenceError after ``max_iter`` iterations, or with ``stall`` as soon as ‖r‖
    exceeds ``stall`` times its lowest value so far.

    ``exact``: the same operator in fp64 (:meth:`ResponseJK.on_host`: the host's GEMMs of the same blocks)
    for ``products`` in reduced precision. Then mixed-precision refinement, by :data:`REFINEMENT`: one PCG
    with ``products`` whose residual is replaced by the true one r = −L − A z, one ``exact`` product, each
    time it has fallen by :data:`REFINE_INNER_TOL` (reliable updates, :func:`_pcg`'s ``exact``; the default), or
    iterative refinement (Moler, J. ACM 14, 316 (1967)): each cycle solves A d = r by the PCG above to
    :data:`REFINE_INNER_TOL`·‖r‖, adds d to z and takes the true residual. Either way until ‖r‖ < tol·‖L‖ in
    fp64 — so the reduced products set the cost of the iterations and the fp64 ones the accuracy of z. The
    count returned is every product of either kind."""
    shapes = [(ch.nvir, len(ch.occ)) for ch in chans]
    diag = np.concatenate([(ch.e[ch.vir][:, None] - ch.e[ch.occ][None, :]).ravel() for ch in chans])

    def split(v):
        out, k = [], 0
        for n, m in shapes:
            out.append(v[k : k + n * m].reshape(n, m))
            k += n * m
        return out

    def operator(prods):
        return lambda v: diag * v + np.concatenate([g.ravel() for g in prods.zvector(split(v))])

    rhs = -np.concatenate([l.ravel() for l in lag])
    norm = float(np.linalg.norm(rhs))
    if norm == 0.0:
        return split(np.zeros_like(rhs)), 0, 0.0
    precondition = products.preconditioner()          # made only for a solve that takes a product
    if precondition is None:
        exact_diagonal = products.diagonal()
        scale = diag if exact_diagonal is None else exact_diagonal
        precondition = lambda v: v / scale                          # noqa: E731
    if exact is None:
        x, count, res = _pcg(operator(products), precondition, rhs, tol, max_iter, stall)
        return split(x), count, res / norm
    apply_inner, apply_exact = operator(products), operator(exact)
    if REFINEMENT == "reliable":
        x, count, res = _pcg(apply_inner, precondition, rhs, tol, max_iter, stall, exact=apply_exact)
        return split(x), count, res / norm
    x, r, count = np.zeros_like(rhs), rhs.copy(), 0
    for _ in range(REFINE_CYCLES):
        d, inner, _ = _pcg(apply_inner, precondition, r, REFINE_INNER_TOL, max_iter, stall)
        x += d
        r = rhs - apply_exact(x)
        count += inner + 1
        res = float(np.linalg.norm(r))
        if res < tol * norm:
            return split(x), count, res / norm
    raise ConvergenceError(f"the Z-vector's refinement did not converge in {REFINE_CYCLES} cycles (relative residual "
                           f"{res / norm:.1e}): the reduced-precision products do not solve for the fp64 ones, or the "
                           "SCF is unstable (a lower-energy solution exists)")


def _pcg(apply, precondition, rhs: np.ndarray, tol: float, max_iter: int, stall: float | None,
         exact=None) -> tuple[np.ndarray, int, float]:
    """x with ‖rhs − A x‖ < tol·‖rhs‖ by preconditioned CG from x = 0: (x, products, ‖r‖ of the recurrence).

    ``exact``: the same operator in fp64 for ``apply`` in reduced precision: then reliable updates (Sleijpen &
    van der Vorst, Computing 56, 141 (1996); as in mixed-precision lattice solvers, Clark et al., Comput. Phys.
    Commun. 181, 1517 (2010)): whenever the recurrence residual has fallen by :data:`REFINE_INNER_TOL` since the
    last true one, or below the tolerance, the residual is replaced by the true one, one exact product, and the
    iteration goes on with its search direction (a restarted solve starts its Krylov space afresh):
    Inosine/cc-pVDZ 16 fp32 + 2 fp64 products against 18 + 2 restarted, the fp64 solve's 16 (``python
    scripts/bench_zvector.py --refine``). The tolerance is the true residual's, the products counted are of
    either kind, the ‖r‖ returned the last true one; at most :data:`REFINE_CYCLES` updates."""
    norm = float(np.linalg.norm(rhs))
    x = np.zeros_like(rhs)
    r = rhs.copy()
    z = precondition(r)
    p = z.copy()
    rz = float(r @ z)
    since = lowest = norm
    count = updates = 0
    for _ in range(max_iter):
        ap = apply(p)
        count += 1
        alpha = rz / float(p @ ap)
        x += alpha * p
        r -= alpha * ap
        res = float(np.linalg.norm(r))
        if exact is None and res < tol * norm:
            return x, count, res
        if exact is not None and (res < REFINE_INNER_TOL * since or res < tol * norm):
            r = rhs - exact(x)
            count += 1
            updates += 1
            res = since = float(np.linalg.norm(r))
            if res < tol * norm:
                return x, count, res
            if updates == REFINE_CYCLES:
                break
        lowest = min(lowest, res)
        if stall is not None and res > stall * lowest:
            raise ConvergenceError(f"the Z-vector stalled after {count} products (residual {res / norm:.1e} of its "
                                   f"right-hand side, {res / lowest:.0f}x its lowest, {lowest / norm:.1e})")
        z = precondition(r)
        rz_new = float(r @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    if exact is not None:
        raise ConvergenceError(f"the Z-vector's refinement did not converge in {updates} cycles and {count} products "
                               f"(relative residual {res / norm:.1e}): the reduced-precision products do not solve "
                               "for the fp64 ones, or the SCF is unstable (a lower-energy solution exists)")
    raise ConvergenceError(f"the Z-vector equations did not converge in {max_iter} iterations (relative residual "
                           f"{res / norm:.1e}); the SCF may be unstable (a lower-energy solution exists)")


class Products:
    """What the response needs of G^σ: occupied columns Cᵀ G[X] C_o of symmetric MO-basis matrices, and the
    Z-vector's (virtual, occupied) block of G[Z + Zᵀ]. This one runs generic J/K builds (``mf.get_jk``: the
    SCF's, on its device); :class:`mp2trn.grad.cpks.ResponseJK` does the same through occupied factors."""

    def __init__(self, mf, chans: list[SpinOrbitals]):
        self.mf, self.chans = mf, chans
        self.products = 0
        self.preconditioner_used = NOT_USED   # what-ran: set when a solve asks for one

    def diagonal(self) -> None:
        """No orbital Hessian diagonal without the MO blocks: the solver preconditions with ε_a − ε_k."""
        return None

    def preconditioner(self) -> None:
        """No Coulomb factor without the MO blocks: the solver divides by :meth:`diagonal`'s fallback."""
        self.preconditioner_used = "orbital-energy differences"
        return None

    def on_host(self) -> None:
        """No host fp64 version to fall back to: these are the SCF's own J/K builds."""
        return None

    def reduced(self) -> None:
        """No reduced-precision version: the SCF's J/K builds run as its schedule says."""
        return None

    def describe(self) -> dict:
        """Where the Z-vector's products ran (what-ran)."""
        return {"device": "the SCF's J/K builds", "products": self.products,
                "preconditioner": self.preconditioner_used}

    def occupied_columns(self, mats: list[np.ndarray], rows: str | None = None) -> list[np.ndarray]:
        """Cᵀ G^σ[X^σ] C_o per channel, every row (one J/K build makes them all; ``rows`` as ResponseJK's)."""
        return [g[:, ch.occ] for ch, g in zip(self.chans, fock_response(self.mf, self.chans, mats))]

    def zvector(self, zs: list[np.ndarray]) -> list[np.ndarray]:
        self.products += 1
        return [g[np.ix_(ch.vir, ch.occ)] for ch, g in zip(self.chans, self._of_z(zs))]

    def zvector_occupied(self, zs: list[np.ndarray]) -> list[np.ndarray]:
        """G^σ[Z^σ + Z^σᵀ] in the (occupied, occupied) block (one J/K build; as ResponseJK's)."""
        return [g[np.ix_(ch.occ, ch.occ)] for ch, g in zip(self.chans, self._of_z(zs))]

    def _of_z(self, zs: list[np.ndarray]) -> list[np.ndarray]:
        mats = []
        for ch, z in zip(self.chans, zs):
            full = np.zeros((ch.nmo, ch.nmo))
            full[np.ix_(ch.vir, ch.occ)] = z
            mats.append(full + full.T)
        return fock_response(self.mf, self.chans, mats)


def relax(products: Products, chans: list[SpinOrbitals], p_occ: list[np.ndarray], p_vir: list[np.ndarray],
          x: list[np.ndarray], tol: float = ZVECTOR_TOL, reduced: bool = False) -> Response:
    """The relaxed density and the energy-weighted density from the unrelaxed blocks and the Lagrangian;
    ``products``: :class:`Products` or :class:`mp2trn.grad.cpks.ResponseJK`; ``tol``: the Z-vector's
    relative residual, in fp64 whatever the products' precision.

    Reduced-precision products are refined by fp64 ones (:func:`solve_zvector`'s ``exact``): ``products``
    in a precision of :data:`REFINED_PRECISIONS` (sim, neuron or cuda in fp32) by their host fp64 version
    (:meth:`ResponseJK.on_host`; fp32x3 and fp64 products solve alone, the host's a fallback), or, with
    ``reduced`` (the memory plan's room for it), fp64 ``products`` by themselves with their reduced version
    (:meth:`ResponseJK.reduced`: the cpu's fp32 copy of the blocks, made for the solve and freed after it)
    running the inner solves. The G[P] columns come from ``products``."""
    p = unrelaxed(chans, p_occ, p_vir, x)
    # (nmo, nocc) per channel: L reads the virtual rows, W the occupied ones (plus the z part's, below)
    g = products.occupied_columns(p, rows=None)
    lag = [xx[np.ix_(ch.vir, ch.occ)] - xx[np.ix_(ch.occ, ch.vir)].T + 2.0 * gg[ch.vir]
           for ch, xx, gg in zip(chans, x, g)]
    fallback = failed = None
    host = products.on_host()          # the same blocks through the host's fp64 GEMMs (None: these are they)
    # reduced-precision products are refined by fp64 ones (REFINED_PRECISIONS): the device's by the host's; on
    # the cpu the fp64 products by themselves, with their fp32 copy running the inner solves
    inner = products.reduced() if reduced and host is None else None
    if inner is not None:
        solver, exact = inner, products
    else:
        solver = products
        exact = host if products.describe().get("precision") in REFINED_PRECISIONS else None
    fp64 = exact if exact is not None else host          # what solves alone if these stall
    try:
        zs, iterations, residual = solve_zvector(solver, chans, lag, tol,
                                                 stall=None if fp64 is None else ZVECTOR_STALL, exact=exact)
    except ConvergenceError as err:
        # reduced-precision products near an unstable SCF (sim fp32x3 hydroxyl at --conv-tol 1e-10: a
        # near-singular orbital Hessian, 20 host fp64 products) can stall; the fp64 GEMMs of the same
        # blocks then solve it alone, and what-ran and a warning say so
        if fp64 is None:
            raise
        failed = solver.describe()
        fallback = (f"the {failed.get('precision')} products on {failed.get('device')} did not converge ({err}); "
                    "solved again with host fp64 products")
        warnings.warn(fallback, stacklevel=2)
        before = fp64.describe().get("products", 0)
        zs, iterations, residual = solve_zvector(fp64, chans, lag, tol)
        fallback_products = fp64.describe().get("products", 0) - before
    inner_ran = None if inner is None else inner.describe()
    solver = inner = None         # an inner solve's fp32 copy goes before the next products
    p_rel = []
    for ch, pp, z in zip(chans, p, zs):
        q = pp.copy()
        q[np.ix_(ch.vir, ch.occ)] = 0.5 * z
        q[np.ix_(ch.occ, ch.vir)] = 0.5 * z.T
        p_rel.append(q)
    # W reads G[P_rel]'s occupied rows: G[P]'s, and the z part's G[½(Z + Zᵀ)] (linear in P)
    g_z = products.zvector_occupied(zs)
    ws = []
    for ch, pp, xx, z, gg, gz in zip(chans, p, x, zs, g, g_z):
        e = ch.e
        w = np.zeros((ch.nmo, ch.nmo))
        w[np.ix_(ch.act, ch.act)] = 0.5 * xx[np.ix_(ch.act, ch.act)] + e[ch.act][:, None] * pp[np.ix_(ch.act, ch.act)]
        w[np.ix_(ch.vir, ch.vir)] = 0.5 * xx[np.ix_(ch.vir, ch.vir)] + e[ch.vir][:, None] * pp[np.ix_(ch.vir, ch.vir)]
        if len(ch.core):
            w[np.ix_(ch.core, ch.act)] = 2.0 * e[ch.act][None, :] * pp[np.ix_(ch.core, ch.act)]
        w[np.ix_(ch.occ, ch.vir)] = xx[np.ix_(ch.occ, ch.vir)]
        w[np.ix_(ch.vir, ch.occ)] = e[ch.occ][None, :] * z
        w = 0.5 * (w + w.T)
        w[np.ix_(ch.occ, ch.occ)] += gg[ch.occ] + 0.5 * gz
        ws.append(w)
    if failed is not None:        # z is the fp64 products' alone: theirs the record, the failed solve's beside it
        ran = {**fp64.describe(), "products": fallback_products, "failed": failed}
    elif exact is None:
        ran = None
    else:
        ran = ({**inner_ran, "refined_by": products.describe()} if inner_ran is not None
               else {**products.describe(), "refined_by": exact.describe()})
        ran["refined_by"].pop("preconditioner", None)    # the inner solves' preconditioner steers both
    return Response(p_rel, p, ws, iterations, residual, fallback, ran)
