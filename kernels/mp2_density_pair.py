"""The main pass of kernels/mp2_density.py: everything of one (i, k) pair, complete on chip (NKI 0.3.0
sub-kernels, inlined into ``mp2_density``; never jitted themselves).

Dimensions
    naux: auxiliary functions (Q tiles of ≤ 128 on the partitions); nva, nvb: virtuals of the i and k sides
    (a tiles and b tiles of ≤ 128; column chunks of ≤ 512, one PSUM bank); ni: occupied orbitals i.

Args (shared by every helper)
    st: the launch's ``Strip`` (kernels/mp2_density.py): tilings, modes, c_d and c_x/c_d, the (ε_a − e_i)/c_d
    bias columns, the P_ab accumulators and, resident plan, the u store. kc: the ``KColumn`` of the k —
    B_k tiles [qsz, nvb], the broadcast ε_b − e_k row, the gamma accumulator. bi: B_i's Q tiles [qsz, nva]
    (SBUF). i: the orbital (bias column); il: its slot in the u store.

Returns
    σ per a tile [asz, nvb], σᵀ / t̃ / t̃ᵀ per tile (SBUF, dying with the pair step); gamma and P_ab (and the
    resident u store) are accumulated in place.

Helpers (engine)
    scaled_recip       R = c_d / D' (ScalarE activation with a per-partition bias, GpSimd rsqrt²)
    sigma_tiles        σ = T·R, T = Σ_Q B_iᵀ B_k in one PSUM bank per [a tile, ≤ 512 b] (TensorE, VectorE)
    transposed_tiles   σᵀ by 128×128 TensorE transposes (ScalarE evicts); exchange: t̃ = σ − r σᵀ, t̃ᵀ,
                       u = σ + q σᵀ (VectorE)
    gamma_update       gacc −= B_iᵀ t̃: B_iᵀ by TensorE transposes, then matmuls over the a tiles
    vir_densities      P_ab of both sides: matmuls over the contraction tiles into PSUM, VectorE adds
    pair_step          the four above for one pair (B_i loaded here, or the refilled single buffer)

Pseudocode
    σ[a, b]   = Σ_Q B_i[Q, a] B_k[Q, b] · c_d/D'
    σᵀ        = transposes of σ;   t̃ = σ − r σᵀ,  t̃ᵀ = σᵀ − r σ  (exchange; else t̃ = σ, t̃ᵀ = σᵀ)
    gacc[Q, b]  −= Σ_a B_iᵀ[a, Q] t̃[a, b]
    pvk[b, b']  += Σ_a σ[a, b] t̃[a, b']   (vir_k);     pva[a, a'] += Σ_b σᵀ[b, a] t̃ᵀ[b, a']

Reference: ``mp2_density_reference`` in kernels/mp2_density.py.
"""

from __future__ import annotations

from ._nki import nisa, nl
from .tiles import NFMAX, PMAX, load_ktiles, tiles

__all__ = ["scaled_recip", "sigma_tiles", "transposed_tiles", "gamma_update", "vir_densities", "pair_step"]


def scaled_recip(st, erow, bias_col, rows, c0, csz):
    """R = c_d / D' for ``rows`` a's (bias column (ε_a − e_i)/c_d) and b columns c0:c0+csz: D'/c_d on ScalarE
    (activation with a per-partition bias), 1/x = rsqrt(x)² on GpSimd (fp32 exact enough, no VectorE time)."""
    dn = nl.ndarray((rows, csz), dtype=nl.float32, buffer=nl.sbuf, name="denom")
    nisa.activation(dst=dn, op=nl.copy, data=erow[0:rows, c0:c0 + csz], bias=bias_col, scale=st.inv_cd)
    y = nl.ndarray((rows, csz), dtype=nl.float32, buffer=nl.sbuf, name="rsqrt")
    nisa.tensor_scalar(dst=y, data=dn, op0=nl.rsqrt, operand0=0.0, engine=nisa.gpsimd_engine)
    r = nl.ndarray((rows, csz), dtype=nl.float32, buffer=nl.sbuf, name="recip")
    nisa.tensor_tensor(dst=r, data1=y, data2=y, op=nl.multiply, engine=nisa.gpsimd_engine)
    return r


def sigma_tiles(st, kc, bi, i, il):
    """σ_i = c_d T_i / D' per a tile ([asz, nvb] SBUF); resident without exchange also u_i = σ_i into the
    store (GpSimd copy)."""
    sig = []
    for at, (a0, asz) in enumerate(st.atiles):
        s = nl.ndarray((asz, st.nvb), dtype=nl.float32, buffer=nl.sbuf, name="sigma")
        for c0, csz in tiles(st.nvb, NFMAX):
            t = nl.ndarray((asz, csz), dtype=nl.float32, buffer=nl.psum, name="t_ps")
            for q in range(len(st.ktiles)):
                nisa.nc_matmul(dst=t, stationary=bi[q][:, a0:a0 + asz], moving=kc.bk[q][:, c0:c0 + csz])
            r = scaled_recip(st, kc.erow, st.bias[at][:, i:i + 1], asz, c0, csz)
            nisa.tensor_tensor(dst=s[:, c0:c0 + csz], data1=t, data2=r, op=nl.multiply)     # T in PSUM
        if st.resident and not st.exchange:                      # u = σ without exchange (GpSimd is idle)
            nisa.tensor_copy(dst=st.u[at][:, :, il], src=s, engine=nisa.gpsimd_engine)
        sig.append(s)
    return sig


def transposed_tiles(st, sig, il):
    """σᵀ per b tile ([bsz, nva] SBUF, TensorE transposes of the σ blocks); with exchange also t̃ = σ − r σᵀ
    (per a tile), t̃ᵀ = σᵀ − r σ (per b tile) and, resident, u_i = σ + q σᵀ into the store.
    Returns (σᵀ, t̃, t̃ᵀ); without exchange t̃ is σ and t̃ᵀ is σᵀ."""
    sigt, tt, ttt = [], [], []
    for bt, (b0, bsz) in enumerate(st.btiles):
        s_t = nl.ndarray((bsz, st.nva), dtype=nl.float32, buffer=nl.sbuf, name="sigma_t")
        if st.exchange:
            x_t = nl.ndarray((bsz, st.nvb), dtype=nl.float32, buffer=nl.sbuf, name="ttilde")
            x_tt = nl.ndarray((bsz, st.nva), dtype=nl.float32, buffer=nl.sbuf, name="ttilde_t")
        for c0, csz in tiles(st.nva, NFMAX):
            tp = nl.ndarray((bsz, csz), dtype=nl.float32, buffer=nl.psum, name="sigt_ps")
            for at, (a0, asz) in enumerate(st.atiles):
                if a0 >= c0 and a0 < c0 + csz:
                    nisa.nc_transpose(dst=tp[:, a0 - c0:a0 - c0 + asz], data=sig[at][:, b0:b0 + bsz])
            nisa.activation(dst=s_t[:, c0:c0 + csz], op=nl.copy, data=tp)
            if st.exchange:
                # tiles of a and b coincide (nva == nvb): row tile bt of σ is sig[bt]
                own = sig[bt][:, c0:c0 + csz]
                nisa.scalar_tensor_tensor(dst=x_t[:, c0:c0 + csz], data=tp, op0=nl.multiply, operand0=-st.r,
                                          op1=nl.add, operand1=own)
                nisa.scalar_tensor_tensor(dst=x_tt[:, c0:c0 + csz], data=own, op0=nl.multiply, operand0=-st.r,
                                          op1=nl.add, operand1=tp)
                if st.resident:
                    nisa.scalar_tensor_tensor(dst=st.u[bt][:, c0:c0 + csz, il], data=tp, op0=nl.multiply,
                                              operand0=st.q, op1=nl.add, operand1=own)
        sigt.append(s_t)
        if st.exchange:
            tt.append(x_t)
            ttt.append(x_tt)
    if not st.exchange:
        return sigt, sig, sigt
    return sigt, tt, ttt


def gamma_update(st, kc, bi, tt):
    """gacc[Q, b] −= Σ_a B_iᵀ[a, Q] t̃[a, b]: B_iᵀ for ≤ 512 Q at a time by TensorE transposes of the
    resident B_i (ScalarE evicts), then per Q tile one PSUM accumulation over the a tiles."""
    kt = st.ktiles
    per = NFMAX // PMAX
    for g0 in range(0, len(kt), per):
        group = kt[g0:g0 + per]
        q_lo = group[0][0]
        width = group[-1][0] + group[-1][1] - q_lo
        bts = []
        for at, (a0, asz) in enumerate(st.atiles):
            tp = nl.ndarray((asz, width), dtype=nl.float32, buffer=nl.psum, name="bt_ps")
            for gq, (q0, qsz) in enumerate(group):
                nisa.nc_transpose(dst=tp[:, q0 - q_lo:q0 - q_lo + qsz], data=bi[g0 + gq][:, a0:a0 + asz])
            b_t = nl.ndarray((asz, width), dtype=nl.float32, buffer=nl.sbuf, name="b_i_t")
            nisa.activation(dst=b_t, op=nl.copy, data=tp)
            bts.append(b_t)
        for gq, (q0, qsz) in enumerate(group):
            for c0, csz in tiles(st.nvb, NFMAX):
                g = nl.ndarray((qsz, csz), dtype=nl.float32, buffer=nl.psum, name="gamma_ps")
                for at in range(len(st.atiles)):
                    nisa.nc_matmul(dst=g, stationary=bts[at][:, q0 - q_lo:q0 - q_lo + qsz],
                                   moving=tt[at][:, c0:c0 + csz])
                acc = kc.gacc[g0 + gq][:, c0:c0 + csz]
                nisa.tensor_tensor(dst=acc, data1=acc, data2=g, op=nl.subtract)


def vir_densities(st, sig, sigt, tt, ttt):
    """pvk[b, b'] += Σ_a σ[a, b] t̃[a, b'] (vir_k) and pva[a, a'] += Σ_b σᵀ[b, a] t̃ᵀ[b, a'] (PSUM over the
    contraction tiles, then VectorE into the SBUF accumulators)."""
    if st.vir_k:
        _gram_accumulate(st.pvk, st.btiles, st.nvb, len(st.atiles), sig, tt, "pvk_ps")
    _gram_accumulate(st.pva, st.atiles, st.nva, len(st.btiles), sigt, ttt, "pva_ps")


def _gram_accumulate(acc_tiles, row_tiles, ncol, ncontract, left, right, name):
    """acc[r][:, c] += Σ_t left[t][:, rows r]ᵀ right[t][:, c]: one PSUM bank per (row tile, column chunk),
    accumulated over the ``ncontract`` partition tiles, added into the SBUF accumulator."""
    for rt, (r0, rsz) in enumerate(row_tiles):
        for c0, csz in tiles(ncol, NFMAX):
            p = nl.ndarray((rsz, csz), dtype=nl.float32, buffer=nl.psum, name=name)
            for t in range(ncontract):
                nisa.nc_matmul(dst=p, stationary=left[t][:, r0:r0 + rsz], moving=right[t][:, c0:c0 + csz])
            acc = acc_tiles[rt][:, c0:c0 + csz]
            nisa.tensor_tensor(dst=acc, data1=acc, data2=p, op=nl.add)


def pair_step(st, kc, b_all, i, bi):
    """Everything of the (i, k) pair: σ, σᵀ (t̃, t̃ᵀ, u), gamma, p_vir. Its tiles are this helper's and die
    with it (B_i: loaded here, or the refilled single buffer ``bi``)."""
    if st.b_buffers != 1:
        bi = load_ktiles(b_all, st.ktiles, i * st.nva, st.nva, nl.float32, "b_i")
    sig = sigma_tiles(st, kc, bi, i, i)
    sigt, tt, ttt = transposed_tiles(st, sig, i)
    gamma_update(st, kc, bi, tt)
    vir_densities(st, sig, sigt, tt, ttt)
