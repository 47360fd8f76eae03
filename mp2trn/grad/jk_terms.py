"""The two-electron gradient of the SCF's own density fitting: the SCF energy's J/K terms and the MP2
separable term, in one pass over the JK-fit basis' derivative integrals.

With D^σ = C^σ_occ C^σ_occᵀ (the SCF density per spin), P^σ the relaxed MP2 correction and
Z^σ = ½D^σ + P^σ, the energy these terms differentiate (integrals only, orbitals fixed) is

    E = Σ_PQ ρ[D]_P V⁻¹_PQ ρ[Z]_Q − Σ_σ Σ_i Σ_PQ (P|Z^σ C_i ⊗ C_i) V⁻¹ …   i.e.   ½D·J[D] + P·J[D] − Σ_σ Z^σ·K[D^σ]

(ρ[X]_P = Σ_μν (P|μν) X_μν). Exchange is factored through the occupied orbitals alone: with
A_P,μi = (P|μi), d = V⁻¹A and c_P,μi = Σ_ν Z_μν d_P,νi, Σ_σ Z^σ·K[D^σ] = Σ A·c, whose derivative is
2 Σ (P|μi)^R c_P,μi − Σ_PQ (Σ d_P c_Q) V^R_PQ. So the rank of every factor is the occupied count,
never the basis size (a relaxed density has full rank: factoring it, as a generic J/K gradient must,
costs n/o times more). Sources: the DF-SCF gradient of Weigend & Häser (1997) and PySCF's
``df/grad/rhf.py`` for the integral conventions.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from ..df import _shell_ranges, reused_buffer, tensor_rows_unpacked, unpacked_integrals
from ..memory import SpinShape, carved_bytes, prefaulted_empty
from ..parallel import Comm
from ..scratch import check_stopped
from ..transform import BStore, scratch_writes
from ..orbitals import SpinOrbitals
from .ri import _per_atom, contract_3c_derivatives, fitted_rows, metric_gradient


#: the derivative pass's block buffers, in nao² fp64 per fitting function of its largest block: the
#: symmetrised "density", one channel's product and the three derivative integrals (the first pass's one
#: buffer of unpacked rows is gone by then)
_PASS_BUFFERS = (1, 1, 3)


def arena_bytes(nao: int, naux: int, aux_block: int, columns: int, noccs: list[int], half_incore: bool) -> int:
    """Bytes the JK-fit pass holds at once, at most, in arrays it carves from an active
    :class:`mp2trn.memory.Arena` (:func:`mp2trn.memory.carved_bytes`): A = (P|iμ) per channel (``noccs``; in
    memory where ``half_incore``) for the whole pass, and beside it the first pass's unpacked rows, then c
    (naux, ``columns``·nao) of its metric solve, then the derivative pass's block buffers
    (:func:`mp2trn.df.reused_buffer`) for blocks of ``aux_block`` fitting functions."""
    square = aux_block * nao * nao * 8
    half = carved_bytes(*(naux * nao * o * 8 for o in noccs)) if half_incore else 0
    return half + max(carved_bytes(square), carved_bytes(naux * max(1, columns) * nao * 8),
                      carved_bytes(*(n * square for n in _PASS_BUFFERS)))


def two_electron_gradient(mf, chans: list[SpinOrbitals], p_spin: list[np.ndarray], aux_block: int,
                          comm: Comm | None = None, columns: int | None = None,
                          half_incore: bool = True, scf_tensor=None) -> np.ndarray:
    """(natm, 3) Eh/bohr: the derivative of ½D·J[D] − ½Σ_σ D^σ·K[D^σ] + Σ_σ P^σ·G^σ[D] through the JK-fit
    integrals (orbital and fitting-function centres). p_spin: one AO matrix per channel (per spin).

    Blocks: ``aux_block`` JK-fit functions per integral block; A = (P|iμ) per channel (naux, nocc·nao) in
    memory or, without ``half_incore``, in an HDF5 file of the scratch directory, solved with the metric
    ``columns`` occupied orbitals at a time (None: all) and overwritten by c. ``comm``: the
    derivative-integral blocks are shared over its ranks (the result, all-reduced, is the same on every rank).

    ``scf_tensor``: the SCF's own tensor (:class:`mp2trn.jk.JKTensor`) whose ``full`` rows are
    B = L⁻¹(Q|μν), every row, packed (naux, nao(nao+1)/2) or unpacked, with L the lower Cholesky factor of
    the metric (:func:`mp2trn.df.cholesky_tensor`). The first pass then reads B instead of computing the
    3-index integrals again: ρ and A come out as L⁻¹ρ and L⁻¹A, and V⁻¹ of them is one triangular solve
    with Lᵀ where the integrals' needs two. Its ``release()`` frees the tensor once the first pass is done
    with it, before the derivative integrals' blocks (no caller holds the rows themselves)."""
    comm = comm or Comm()
    mol = mf.mol
    auxmol = mf.with_df.auxmol
    nao, nbas, naux = mol.nao_nr(), mol.nbas, auxmol.nao_nr()
    pmol = mol + auxmol
    loc = auxmol.ao_loc_nr()
    blocks = list(_shell_ranges(loc, aux_block))
    chol = scipy.linalg.cho_factor(auxmol.intor("int2c2e", hermi=1), lower=True)
    low = np.asfortranarray(np.tril(chol[0]))
    occ = [ch.c[:, ch.occ] for ch in chans]
    d_spin = [o @ o.T for o in occ]
    z_spin = [0.5 * d + p for d, p in zip(d_spin, p_spin)]
    d_tot = sum(ch.weight * d for ch, d in zip(chans, d_spin))
    z_tot = sum(ch.weight * z for ch, z in zip(chans, z_spin))
    shapes = [SpinShape(o.shape[1], nao) for o in occ]      # (naux, nocc·nao): A[P, i·nao + μ]
    scf_rows = None if scf_tensor is None else scf_tensor.full
    from_tensor = scf_rows is not None      # A is then L⁻¹A: V⁻¹ of it is L⁻ᵀ alone
    if scf_rows is not None:      # ρ and A of L⁻¹(Q|μν): V⁻¹ = L⁻ᵀL⁻¹ needs only L⁻ᵀ more
        def fitted(x: np.ndarray) -> np.ndarray:
            return scipy.linalg.solve_triangular(chol[0], x, lower=True, trans="T", check_finite=False)
    else:
        def fitted(x: np.ndarray) -> np.ndarray:
            return scipy.linalg.cho_solve(chol, x, check_finite=False)
    with BStore(naux, shapes, np.float64, half_incore, made_ahead=True) as half, \
            scratch_writes("the JK-fit pass's (P|iμ)", naux * nao * sum(o.shape[1] for o in occ) * 8):
        # pass 1: ρ[D], ρ[Z] and the half-transformed A = (P|iμ) per channel (each L⁻¹ of it with scf_rows)
        rho_d, rho_z = np.zeros(naux), np.zeros(naux)
        # each pass's block-sized arrays in buffers made once for the largest block (as the RI pass's, and
        # within the plan's 7·nao² per fitting function)
        ao_buf = reused_buffer(blocks, loc, nao * nao)
        try:
            for s0, s1 in blocks:
                p0, p1 = int(loc[s0]), int(loc[s1])
                ao = unpacked_integrals(pmol, nbas, s0, s1, out=ao_buf) if scf_rows is None else \
                    tensor_rows_unpacked(scf_rows[p0:p1], out=ao_buf)
                flat = ao.reshape(p1 - p0, -1)
                rho_d[p0:p1] = flat @ d_tot.ravel()
                rho_z[p0:p1] = flat @ z_tot.ravel()
                for arr, o in zip(half.arrays, occ):
                    arr[p0:p1] = np.matmul(o.T, ao).reshape(p1 - p0, -1)             # Σ_ν C_νi (P|νμ)
                del ao, flat
                check_stopped()
        finally:     # freed once read, and on an early stop too
            scf_rows = ao_buf = None
            if scf_tensor is not None:
                scf_tensor.release()
        a = fitted(rho_z)      # V⁻¹ρ[Z]
        b = fitted(rho_d)      # V⁻¹ρ[D]
        gamma = 0.5 * (np.outer(b, a) + np.outer(a, b))
        # d = V⁻¹A and c_P,iμ = Σ_ν Z_μν d_P,iν, a block of occupied orbitals at a time; c replaces A
        for ch, arr, z, o in zip(chans, half.arrays, z_spin, occ):
            dc = np.zeros((naux, naux))
            step = max(1, columns or o.shape[1])
            for i0 in range(0, o.shape[1], step):
                cols = slice(i0 * nao, min(o.shape[1], i0 + step) * nao)
                d = fitted_rows(low, np.ascontiguousarray(arr[:, cols]), both=not from_tensor)
                # in pages made ahead (carved where the gradient's arena is active: the response's, reused)
                c = np.matmul(d.reshape(-1, nao), z, out=prefaulted_empty((d.shape[0] * d.shape[1] // nao, nao)))
                c = c.reshape(naux, -1)
                _add_symmetric_product(dc, d, c)
                del d
                arr[:, cols] = c
                del c
            gamma -= ch.weight * dc          # symmetric as made (_add_symmetric_product)
            del dc
        # pass 2: the derivative integrals, contracted with the AO "densities" of every fitting function
        per_ao = np.zeros((nao, 3))
        per_aux = np.zeros((naux, 3))
        dz = np.stack([_sym(d_tot).ravel(), _sym(z_tot).ravel()])         # (2, nao²): g + gᵀ's D and Z parts
        mine = blocks[comm.rank :: comm.size]
        sym_buf, m_buf = reused_buffer(mine, loc, nao * nao), reused_buffer(mine, loc, nao * nao)
        ip_buf = reused_buffer(mine, loc, 3 * nao * nao)
        for s0, s1 in mine:
            p0, p1 = int(loc[s0]), int(loc[s1])
            p = p1 - p0
            # g_P = a_P D + b_P Z − 2 Σ_σ w_σ c_Pᵀ C_oᵀ, symmetrised: D and Z are, so their part is a rank-2
            # GEMM written in place (no broadcast temporaries), and each channel's product added with its
            # transpose
            sym = np.matmul(np.stack([2.0 * a[p0:p1], 2.0 * b[p0:p1]], axis=1), dz,
                            out=sym_buf[: p * nao * nao].reshape(p, -1)).reshape(p, nao, nao)
            for ch, arr, o in zip(chans, half.arrays, occ):
                c = np.asarray(arr[p0:p1]).reshape(p, o.shape[1], nao)
                m = np.matmul(c.transpose(0, 2, 1), -2.0 * ch.weight * o.T,          # −2w Σ_i c_P,iμ C_λi
                              out=m_buf[: p * nao * nao].reshape(p, nao, nao))
                del c
                sym += m
                sym += m.transpose(0, 2, 1)
                del m
            contract_3c_derivatives(pmol, (0, nbas, 0, nbas, nbas + s0, nbas + s1), sym, per_ao, per_aux[p0:p1],
                                    out=ip_buf)
            del sym
            check_stopped()
        # the blocks' buffers, and the loop's last view of (P|iμ), go before the metric gradient's (P|Q)^R
        sym_buf = m_buf = ip_buf = arr = None
    shared = comm.allreduce(_per_atom(mol, mol.natm, per_ao) + _per_atom(auxmol, mol.natm, per_aux), "gradient")
    return shared + 2.0 * metric_gradient(auxmol, mol.natm, gamma)


#: row blocks of :func:`_add_symmetric_product`: the GEMMs make (blocks + 1) / (2·blocks) of the product
_SYMMETRIC_BLOCKS = 8


def _add_symmetric_product(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """out += a bᵀ (n, n) for a, b (n, m) whose product is symmetric (here d (1 ⊗ Z) dᵀ with Z symmetric): one
    GEMM per row block for the block's part left of and on the diagonal, the part right of it the transpose —
    (blocks + 1) / (2·blocks) of the full GEMM's flops (JK-fit pass, Inosine/cc-pVDZ: 1.2·10¹¹ in full). Each
    block's part goes straight into ``out``: at most one row block ((n/blocks) × n) beside it, where the full
    GEMM's result was n × n (the memory plan's five naux² arrays of that stage)."""
    n = a.shape[0]
    edges = [n * k // _SYMMETRIC_BLOCKS for k in range(_SYMMETRIC_BLOCKS + 1)]
    for r0, r1 in zip(edges[:-1], edges[1:]):
        if r1 == r0:
            continue
        part = a[r0:r1] @ b[:r1].T                     # rows r0..r1, columns up to the block's last
        out[r0:r1, :r0] += part[:, :r0]
        out[:r0, r0:r1] += part[:, :r0].T
        diag = part[:, r0:]                            # symmetric but for rounding: its lower triangle mirrored
        out[r0:r1, r0:r1] += np.tril(diag) + np.tril(diag, -1).T
        del part


def _sym(m: np.ndarray) -> np.ndarray:
    return 0.5 * (m + m.T)


__all__ = ["two_electron_gradient"]
