"""p_occ of kernels/mp2_density.py as the Gram matrix of one set of vectors (NKI 0.3.0 sub-kernels, inlined
into ``mp2_density``; never jitted themselves).

p_occ without storing two amplitude sets
    With σ = S + A (symmetric + antisymmetric in a↔b), t̃ = c_d σ − c_x σᵀ = (c_d − c_x) S + (c_d + c_x) A, and
    ⟨S, A'⟩ = 0, so ⟨σ_i, t̃_i'⟩ = ⟨u_i, u_i'⟩ with u = √(c_d − c_x) S + √(c_d + c_x) A = α σ + β σᵀ: p_occ is
    the Gram matrix of ONE set of vectors u_i (nva·nvb long), a matmul per column b with the a tile on the
    partitions and i on the free axis (M = N = i block). It couples every i at one k, so all u_i must be on
    chip together:
    * resident plan (everything fits, ni ≤ 128): the main pass keeps u_i for all i (at·ni·nvb·4 B per
      partition) and the Gram follows each k — no extra work.
    * stream plan: a second pass per k over tile pairs (X ≤ Y) of the virtual square: for every i, T_i[X, Y]
      and T_i[Y, X] again (one more T of work), u blocks for all i of an i block (≤ 128, sized by SBUF;
      several blocks: every pair of blocks, each block recomputed per pair), Gram of the blocks; p_occ is
      symmetric, so blocks I < J are mirrored at the end (TensorE transposes).
    The stream pass loads B_i's X (and Y) columns for ``i_group`` orbitals at once (one 4-level
    access-pattern DMA per plane of Q tiles: fewer, larger transfers, each with its fixed cost).

Dimensions
    ni: occupied orbitals i (i blocks of ≤ 128: the Gram's M = N); nva, nvb: virtuals (a, b tiles ≤ 128);
    naux: the Q tiles of the recomputed T blocks.

Args
    st: the launch's ``Strip`` (kernels/mp2_density.py): tilings, i blocks, i_group, q = β/α, the p_occ
    accumulators per i block [isz, ni] and, resident plan, the u store per a tile [asz, nvb, ni]. kc: the
    ``KColumn`` of the k. b_all: B of every i (naux, ni·nva), HBM.

Returns
    nothing: the Gram blocks are added into ``st.pocc`` in place (and mirrored by :func:`mirror_pocc`).

Helpers (engine)
    pocc_resident    the Gram of the u store after the main pass of a k (TensorE matmuls per b, VectorE add)
    pocc_stream      the stream plan's second pass of a k over virtual tile pairs and pairs of i blocks
    mirror_pocc      blocks J > I from blocks I < J at the end of the launch (TensorE transposes, GpSimd copy)

Pseudocode
    resident:  p_occ += Σ_ab U[a, b, ·]ᵀ U[a, b, ·]
    stream:    for (X, Y) tile pairs, for block pairs (I ≤ J):
                   for i in I ∪ J:  σ_i[X, Y] (and σ_i[Y, X]) again;  u_i[X, Y] = σ[X, Y] + q σ[Y, X]ᵀ
                   p_occ[I, J] += Σ_xy u[x, y, I] u[x, y, J]
    end:       p_occ[J, I] = p_occ[I, J]ᵀ  (I < J)

Reference: ``mp2_density_reference`` in kernels/mp2_density.py.
"""

from __future__ import annotations

from ._nki import nisa, nl
from .mp2_density_pair import scaled_recip
from .tiles import PMAX, load_column_runs

__all__ = ["pocc_resident", "pocc_stream", "mirror_pocc"]


def pocc_resident(st):
    """p_occ += the Gram of the u store (every i of the launch, resident plan)."""
    pg = nl.ndarray((st.ni, st.ni), dtype=nl.float32, buffer=nl.psum, name="pocc_ps")
    for at, (a0, asz) in enumerate(st.atiles):
        _gram(pg, st.u[at], (0, st.ni), (0, st.ni), st.nvb)
    _add_pocc(st, pg, 0, 0)


def pocc_stream(st, kc, b_all):
    """The stream plan's pass of one k: every virtual tile pair, every pair of i blocks (I ≤ J)."""
    nb = len(st.iblocks)
    for xt, yt in _vtile_pairs(st):
        for bi_ in range(nb):
            for bj_ in range(bi_, nb):
                _pocc_block_pair(st, kc, b_all, xt, yt, bi_, bj_)


def mirror_pocc(pocc, iblocks):
    """p_occ is symmetric: the blocks I < J of the stream plan give the blocks J > I (TensorE transposes)."""
    for bi_, (i0, isz) in enumerate(iblocks):
        for bj_ in range(bi_ + 1, len(iblocks)):
            j0, jsz = iblocks[bj_]
            tp = nl.ndarray((jsz, isz), dtype=nl.float32, buffer=nl.psum, name="pocc_t")
            nisa.nc_transpose(dst=tp, data=pocc[bi_][:, j0:j0 + jsz])
            nisa.tensor_copy(dst=pocc[bj_][:, i0:i0 + isz], src=tp)


def _gram(pg, u, rows, cols, ncol):
    """pg[I, J] += Σ_x Σ_y u[x, y, I] u[x, y, J] over the ncol columns y (one matmul per column: the
    contraction x on the partitions, the occupied orbitals on the free axis, contiguous)."""
    r0, rsz = rows
    c0, csz = cols
    for y in range(ncol):
        nisa.nc_matmul(dst=pg, stationary=u[:, y, r0:r0 + rsz], moving=u[:, y, c0:c0 + csz])


def _add_pocc(st, pg, bi_, bj_):
    """pocc[block I][:, J columns] += pg (VectorE)."""
    j0, jsz = st.iblocks[bj_]
    acc = st.pocc[bi_][:, j0:j0 + jsz]
    nisa.tensor_tensor(dst=acc, data1=acc, data2=pg, op=nl.add)


def _sigma_block(st, kc, bx, i, x0, xsz, y0, ysz, dst):
    """dst[x, y] = σ_i[x0 + x, y0 + y] for one [X, Y] block (bx: B_i's X columns per Q tile)."""
    t = nl.ndarray((xsz, ysz), dtype=nl.float32, buffer=nl.psum, name="tb_ps")
    for q in range(len(st.ktiles)):
        nisa.nc_matmul(dst=t, stationary=bx[q], moving=kc.bk[q][:, y0:y0 + ysz])
    r = scaled_recip(st, kc.erow, st.bias[x0 // PMAX][:, i:i + 1], xsz, y0, ysz)
    nisa.tensor_tensor(dst=dst, data1=t, data2=r, op=nl.multiply)


def _pocc_block_pair(st, kc, b_all, xt, yt, bi_, bj_):
    """Stream plan: the u blocks [X, Y] (and [Y, X]) of every i in i blocks bi_ ∪ bj_, and their Gram
    into pocc[bi_][:, bj_ columns]."""
    x0, xsz = xt
    y0, ysz = yt
    mirror = st.exchange and x0 != y0
    members = [st.iblocks[bi_]] if bi_ == bj_ else [st.iblocks[bi_], st.iblocks[bj_]]
    n = 0
    for _, isz in members:
        n += isz
    uxy = nl.ndarray((xsz, ysz, n), dtype=nl.float32, buffer=nl.sbuf, name="u_xy")
    uyx = nl.ndarray((ysz, xsz, n), dtype=nl.float32, buffer=nl.sbuf, name="u_yx") if mirror else None
    m = 0
    for i0, isz in members:
        for g0 in range(i0, i0 + isz, st.i_group):
            gsz = min(st.i_group, i0 + isz - g0)
            bxg = load_column_runs(b_all, st.ktiles, g0 * st.nva + x0, xsz, st.nva, gsz, "b_x")
            byg = load_column_runs(b_all, st.ktiles, g0 * st.nva + y0, ysz, st.nva, gsz, "b_y") if mirror else None
            for gl in range(gsz):
                i = g0 + gl
                bx = [v[:, gl, :] for v in bxg]
                if not st.exchange:
                    _sigma_block(st, kc, bx, i, x0, xsz, y0, ysz, uxy[:, :, m])   # u = σ
                    m += 1
                    continue
                sxy = nl.ndarray((xsz, ysz), dtype=nl.float32, buffer=nl.sbuf, name="s_xy")
                _sigma_block(st, kc, bx, i, x0, xsz, y0, ysz, sxy)
                syx = sxy
                if mirror:
                    syx = nl.ndarray((ysz, xsz), dtype=nl.float32, buffer=nl.sbuf, name="s_yx")
                    _sigma_block(st, kc, [v[:, gl, :] for v in byg], i, y0, ysz, x0, xsz, syx)
                tp = nl.ndarray((xsz, ysz), dtype=nl.float32, buffer=nl.psum, name="syx_t")
                nisa.nc_transpose(dst=tp, data=syx)                                   # σ[Y, X]ᵀ
                nisa.scalar_tensor_tensor(dst=uxy[:, :, m], data=tp, op0=nl.multiply, operand0=st.q,
                                          op1=nl.add, operand1=sxy)
                if mirror:
                    tq = nl.ndarray((ysz, xsz), dtype=nl.float32, buffer=nl.psum, name="sxy_t")
                    nisa.nc_transpose(dst=tq, data=sxy)
                    nisa.scalar_tensor_tensor(dst=uyx[:, :, m], data=tq, op0=nl.multiply, operand0=st.q,
                                              op1=nl.add, operand1=syx)
                m += 1
    isz_i = st.iblocks[bi_][1]
    isz_j = st.iblocks[bj_][1]
    rows = (0, isz_i)
    cols = (0, isz_i) if bi_ == bj_ else (isz_i, isz_j)
    pg = nl.ndarray((isz_i, isz_j), dtype=nl.float32, buffer=nl.psum, name="pocc_ps")
    _gram(pg, uxy, rows, cols, ysz)
    if mirror:
        _gram(pg, uyx, rows, cols, xsz)
    _add_pocc(st, pg, bi_, bj_)


def _vtile_pairs(st):
    """The blocks of the stream pass: tile pairs (X ≤ Y) of the square virtual space with exchange (a
    block and its mirror together), else every [a tile, b tile] block on its own."""
    if st.exchange:
        out = []
        for x, xt in enumerate(st.atiles):
            for yt in st.atiles[x:]:
                out.append((xt, yt))
        return out
    return [(xt, yt) for xt in st.atiles for yt in st.btiles]
