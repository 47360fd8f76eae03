"""Gradient stage 3 for an ROHF reference (ROHF-MBPT(2), issue 37): the semicanonical orbitals' response,
the ROHF Z-vector, the relaxed density and the energy-weighted density.

The energy is E_ROHF + E2 with E2 the Hylleraas functional of the semicanonical orbitals C^σ = C U^σ
(C: the ROHF orbitals, U^σ block-diagonal over spin σ's occupied and virtual orbitals), H0 the occupied–
occupied and virtual–virtual blocks of F^σ = h + J[D^α + D^β] − K[D^σ], and the singles t_ia = f_ia/(ε_i − ε_a).
E2 is invariant to rotations within each spin's occupied and virtual spaces, so the semicanonicalisation
needs no response except the frozen-core/active split, fixed by F^σ_Ij = 0 (I frozen, j active).

Per spin σ, in its semicanonical basis, E2's stationary densities and orbital derivatives are

    D2_ij = P_ij − Σ_a t_ia t_ja,  D2_ab = P_ab + Σ_i t_ia t_ib,  D2_ia = D2_ai = t_ia    (δE2 = Σ D2·δF^σ_MO)
    Y^σ = X^σ + 2 F^σ D2^σ                                                             (Y = Cᵀ ∂E2/∂C^σ)
    D2_Ij = D2_jI = −½ (Y_Ij − Y_jI) / (ε_I − ε_j)                                       (frozen core)

with P, X the pair sweep's densities and the fitting-basis Lagrangian (:mod:`.densities`, :mod:`.ri`).
Through the ROHF density, δE2 = Σ_τ δD^τ·G^τ[P] with P^σ = C^σ D2^σ C^σᵀ, so in the ROHF orbital basis

    Y = Σ_σ U^σ (X^σ + 2 F^σ D2^σ) U^σᵀ + 2 Σ_τ G^τ[P]_pq n^τ_q            (n^τ: occupation of spin τ)

and the ROHF rotations κ_pq (q doubly occupied, p singly occupied or virtual; q singly, p virtual) move
E2 by L_pq = Y_pq − Y_qp. The Z-vector z solves H z = −L with H the ROHF orbital Hessian; written as a
rotation Z (antisymmetric, Z_pq = z_pq), its density per spin is Q^τ = Z n^τ − n^τ Z (the spin density's
change along Z) and

    (H z)_pq = [Σ_τ 2 F^τ Q^τ + 2 G^τ[C Q^τ Cᵀ]_pq n^τ_q]_pq − (the same)_qp

(exact for the SCF's own density-fitted J/K). The relaxed density per spin is D2^τ + Q^τ (in one basis),
and with Y recomputed from it the MP2 energy-weighted density is W = ½ (Y + Yᵀ)/2: the orbital
derivative of the whole Lagrangian E2 + z·g under C → C(1 − ½ S^x), summed per spin (the SCF's own
W is PySCF's ROHF one). The gradient then has the UHF form of :mod:`mp2trn.grad.dfmp2` with these per-spin
densities. Checked against central differences of mp2trn's ROHF-MBPT(2) energies in
tests/test_rohf_gradient.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse.linalg

from ..errors import ConvergenceError
from ..orbitals import Semicanonical, SpinOrbitals
from .response import ZVECTOR_TOL, Products, Response


@dataclass
class RohfSpace:
    """The ROHF orbitals and where each spin's semicanonical orbitals sit in them.

    ``u``: per spin (nmo, nmo), C^σ = C u^σ; ``occ``: per spin (nmo,) occupations n^σ (1/0) in the ROHF
    basis; ``fock``: per spin F^σ in the channel's semicanonical basis (nmo, nmo) Hartree; ``rotations``:
    (nmo, nmo) bool, True at (p, q) where q is more occupied than p (the ROHF rotations)."""

    u: list[np.ndarray]
    occ: list[np.ndarray]
    fock: list[np.ndarray]
    rotations: np.ndarray

    @classmethod
    def build(cls, orbs: Semicanonical, chans: list[SpinOrbitals]) -> RohfSpace:
        mf = orbs.mf
        c, occ = np.asarray(mf.mo_coeff), np.asarray(mf.mo_occ)
        s = mf.mol.intor_symmetric("int1e_ovlp")
        u = [c.T @ s @ ch.c for ch in chans]
        fock = []
        for ch, f_ov in zip(chans, orbs.fock_ov):
            f = np.diag(ch.e)
            f[np.ix_(ch.occ, ch.vir)] = f_ov
            f[np.ix_(ch.vir, ch.occ)] = f_ov.T
            fock.append(f)
        return cls(u, [(occ > 0).astype(float), (occ > 1.5).astype(float)], fock, occ[None, :] > occ[:, None])

    def to_rohf(self, mats: list[np.ndarray]) -> np.ndarray:
        """Σ_σ u^σ M^σ u^σᵀ: per-spin matrices of the semicanonical bases summed in the ROHF basis."""
        return sum(u @ m @ u.T for u, m in zip(self.u, mats))

    def antisymmetric(self, y: np.ndarray) -> np.ndarray:
        """The ROHF rotations' components Y_pq − Y_qp of an ROHF-basis matrix (a vector over ``rotations``)."""
        return (y - y.T)[self.rotations]

    def spin_densities(self, z: np.ndarray) -> list[np.ndarray]:
        """Q^σ = Z n^σ − n^σ Z per spin in its semicanonical basis, for the rotation vector ``z``."""
        big = np.zeros(self.rotations.shape)
        big[self.rotations] = z
        big -= big.T
        return [u.T @ (big * n[None, :] - n[:, None] * big) @ u for u, n in zip(self.u, self.occ)]


def energy_densities(chans: list[SpinOrbitals], spins: list[SpinOrbitals], p_occ: list[np.ndarray],
                     p_vir: list[np.ndarray]) -> list[np.ndarray]:
    """D2 per channel (nmo, nmo), semicanonical basis: the doubles' P_ij, P_ab and the singles' blocks."""
    out = []
    for ch, s, po, pv in zip(chans, spins, p_occ, p_vir):
        t = s.f_ov / (s.e_occ[:, None] - s.e_vir[None, :])           # (nact, nvir)
        d = np.zeros((ch.nmo, ch.nmo))
        d[np.ix_(ch.act, ch.act)] = po - t @ t.T
        d[np.ix_(ch.vir, ch.vir)] = pv + t.T @ t
        d[np.ix_(ch.act, ch.vir)] = t
        d[np.ix_(ch.vir, ch.act)] = t.T
        out.append(d)
    return out


def add_frozen_core(chans: list[SpinOrbitals], fock: list[np.ndarray], x: list[np.ndarray],
                    d2: list[np.ndarray]) -> list[np.ndarray]:
    """D2 with the core–active block that keeps F^σ_Ij = 0 (the frozen split of the semicanonical orbitals)."""
    out = []
    for ch, f, xx, d in zip(chans, fock, x, d2):
        d = d.copy()
        if len(ch.core):
            y = xx + 2.0 * f @ d
            core = -0.5 * (y[np.ix_(ch.core, ch.act)] - y[np.ix_(ch.act, ch.core)].T) \
                / (ch.e[ch.core][:, None] - ch.e[ch.act][None, :])
            d[np.ix_(ch.core, ch.act)] = core
            d[np.ix_(ch.act, ch.core)] = core.T
        out.append(d)
    return out


def orbital_derivative(products: Products, chans: list[SpinOrbitals], fock: list[np.ndarray], x: list[np.ndarray],
                       dens: list[np.ndarray]) -> list[np.ndarray]:
    """Y^σ = X^σ + 2 F^σ D^σ + 2 G^σ[D] n^σ per spin in its semicanonical basis, for densities ``dens``."""
    g = products.occupied_columns(dens)
    out = []
    for ch, f, xx, d, gg in zip(chans, fock, x, dens, g):
        y = xx + 2.0 * f @ d
        y[:, ch.occ] += 2.0 * gg
        out.append(y)
    return out


def hessian_product(products: Products, chans: list[SpinOrbitals], space: RohfSpace, z: np.ndarray) -> np.ndarray:
    """H z over the ROHF rotations (one Z-vector product of the SCF's J/K: the spins' (virtual, occupied) blocks)."""
    q = space.spin_densities(z)
    g_vo = products.zvector([qq[np.ix_(ch.vir, ch.occ)] for ch, qq in zip(chans, q)])
    ys = []
    for ch, f, qq, g in zip(chans, space.fock, q, g_vo):
        y = 2.0 * f @ qq
        y[np.ix_(ch.vir, ch.occ)] += 2.0 * g
        ys.append(y)
    return space.antisymmetric(space.to_rohf(ys))


def hessian_diagonal(space: RohfSpace) -> np.ndarray:
    """The one-electron part of H's diagonal, 2 Σ_σ (n^σ_q − n^σ_p)(F^σ_pp − F^σ_qq) (the preconditioner)."""
    diag = np.zeros(space.rotations.shape)
    for u, n, f in zip(space.u, space.occ, space.fock):
        e = np.einsum("pi,ij,pj->p", u, f, u)           # diagonal of F^σ in the ROHF basis
        diag += 2.0 * (n[None, :] - n[:, None]) * (e[:, None] - e[None, :])
    return diag[space.rotations]


#: what-ran's name for the ROHF Z-vector's preconditioner (:func:`hessian_diagonal`)
PRECONDITIONER = "the one-electron part of the ROHF orbital Hessian's diagonal"


def solve_zvector(products: Products, chans: list[SpinOrbitals], space: RohfSpace, lag: np.ndarray,
                  tol: float = ZVECTOR_TOL, max_iter: int = 100) -> tuple[np.ndarray, int, float]:
    """z from H z = −L by SciPy's preconditioned conjugate gradients (the Hessian of a stable ROHF is
    positive definite); stops at ‖r‖ < tol·‖L‖ and raises ConvergenceError after ``max_iter`` iterations."""
    norm = float(np.linalg.norm(lag))
    if norm == 0.0:
        return np.zeros_like(lag), 0, 0.0
    n = lag.size
    diag = hessian_diagonal(space)
    diag = np.where(np.abs(diag) > 1e-8, diag, 1e-8)
    # dtype given: SciPy would otherwise probe it with one more (J/K-building) product of a zero vector
    op = scipy.sparse.linalg.LinearOperator((n, n), matvec=lambda v: hessian_product(products, chans, space, v),
                                            dtype=np.float64)
    pre = scipy.sparse.linalg.LinearOperator((n, n), matvec=lambda v: v / diag, dtype=np.float64)
    count = [0]

    def tick(_):
        count[0] += 1

    z, info = scipy.sparse.linalg.cg(op, -lag, x0=-lag / diag, rtol=tol, atol=0.0, maxiter=max_iter, M=pre,
                                     callback=tick)
    residual = float(np.linalg.norm(op.matvec(z) + lag)) / norm
    if info != 0:
        raise ConvergenceError(f"the ROHF Z-vector equations did not converge in {max_iter} iterations (relative "
                               f"residual {residual:.1e}); the ROHF may be unstable (a lower-energy solution exists)")
    return z, count[0], residual


def relax(products: Products, orbs: Semicanonical, chans: list[SpinOrbitals], spins: list[SpinOrbitals],
          p_occ: list[np.ndarray], p_vir: list[np.ndarray], x: list[np.ndarray],
          tol: float = ZVECTOR_TOL) -> Response:
    """The relaxed and energy-weighted MP2 densities per spin (semicanonical bases) of ROHF-MBPT(2).

    ``p_relaxed``: D2 + Q (singles, frozen-core block and the ROHF response); ``p_unrelaxed``: D2 (amplitude
    and singles blocks); ``w``: the MP2 part of the energy-weighted density (the SCF's is PySCF's ROHF one)."""
    space = RohfSpace.build(orbs, chans)
    d2 = energy_densities(chans, spins, p_occ, p_vir)
    d2_fc = add_frozen_core(chans, space.fock, x, d2)
    lag = space.antisymmetric(space.to_rohf(orbital_derivative(products, chans, space.fock, x, d2_fc)))
    z, iterations, residual = solve_zvector(products, chans, space, lag, tol)
    p_rel = [d + q for d, q in zip(d2_fc, space.spin_densities(z))]
    ys = orbital_derivative(products, chans, space.fock, x, p_rel)
    w = [0.25 * (y + y.T) for y in ys]
    return Response(p_rel, d2, w, iterations, residual)
