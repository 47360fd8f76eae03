"""The orbital response's Coulomb/exchange products through occupied-orbital factors of the SCF's own
JK-fit tensor (fp64): what the Z-vector iterations and the G[P] blocks need, at a fraction of a generic
J/K build's cost.

A generic build factors its density: Z + Zᵀ (Z = C_v z C_oᵀ) has rank 2·nocc and a relaxed density full
rank n, so its exchange costs 2× or n/nocc× an SCF build. The response only ever needs the columns of
G[X] on occupied orbitals, and with B_Q the Cholesky-decomposed tensor (B = L⁻¹(Q|μν), the SCF's):

    K[X] C_o = Σ_Q B_Q X (B_Q C_o)                          (any symmetric X: three GEMMs of rank nocc)
    C_vᵀ K[Z + Zᵀ] C_o = Σ_Q B^Q_vv (z B^Q_oo) + B^Q_vo (zᵀ B^Q_vo)   (MO-sized GEMMs only)
    J[X] = Σ_Q ρ_Q B_Q, ρ_Q = B_Q·X;  for Z + Zᵀ: ρ_Q = 2 Σ_ai B^Q_ai z_ai

with the MO blocks B^Q_vv, B^Q_ov = (B^Q_vo)ᵀ, B^Q_oo of the tensor made once, so that a Z-vector iteration costs
2·nvir²·nocc·naux FLOPs instead of a J/K build. The tensor is built once (packed μ ≥ ν,
:func:`mp2trn.df.cholesky_tensor`) and read in row chunks, each unpacked in a small buffer.
"""

from __future__ import annotations

import numpy as np
from pyscf import lib

from ..df import cholesky_tensor
from .orbitals import Channel

#: tensor rows unpacked at a time (bytes of the unpacked chunk)
_CHUNK_BYTES = 64e6


class ResponseJK:
    """G^σ = J[X^α + X^β] − K[X^σ] products (an RHF channel: J[2X] − K[X]) on occupied columns."""

    def __init__(self, mf, chans: list[Channel], tensor: np.ndarray):
        self.chans = chans
        self.nao = mf.mol.nao_nr()
        self.naux = tensor.shape[0]
        self.rows = max(1, int(_CHUNK_BYTES // (self.nao * self.nao * 8)))
        self.tensor = tensor         # (naux, nao(nao+1)/2) packed rows, or (naux, nao, nao) (the SCF's, unpacked)
        self.b_oo, self.b_ov, self.b_vv = [], [], []
        for ch in chans:
            o, v = len(ch.occ), ch.nvir
            c_o, c_v = ch.c[:, ch.occ], ch.c[:, ch.vir]
            oo, ov, vv = np.empty((self.naux, o, o)), np.empty((self.naux, o, v)), np.empty((self.naux, v, v))
            for q0, b in self._chunks():
                q = len(b)
                half = (b.reshape(-1, self.nao) @ ch.c).reshape(q, self.nao, -1)     # (Q, ν, p) = B_Q C
                mo = np.matmul(ch.c.T, half)                                          # (Q, p, p) = Cᵀ B_Q C
                oo[q0 : q0 + q] = mo[np.ix_(range(q), ch.occ, ch.occ)]
                ov[q0 : q0 + q] = mo[np.ix_(range(q), ch.occ, ch.vir)]
                vv[q0 : q0 + q] = mo[np.ix_(range(q), ch.vir, ch.vir)]
            self.b_oo.append(oo)
            self.b_ov.append(ov)   # (Q, i, a): its (Q·i, a) rows are Σ_Q B^Q_vo W_Q's contraction as they lie
            self.b_vv.append(vv)

    @classmethod
    def build(cls, mf, chans: list[Channel], chunk_mb: float = 256.0) -> ResponseJK | None:
        """The products from a tensor built here (its integrals solved in row chunks of ``chunk_mb`` MB), or
        None when the metric is not positive definite (then generic J/K builds). Whether the tensor and the MO
        blocks fit the budget is the gradient's memory plan's call (:func:`mp2trn.memory.plan_gradient`)."""
        tensor = cholesky_tensor(mf.mol, mf.with_df.auxmol, chunk_mb=chunk_mb, packed=True)
        return None if tensor is None else cls(mf, chans, tensor)

    def _chunks(self):
        for q0 in range(0, self.naux, self.rows):
            rows = self.tensor[q0 : q0 + self.rows]
            yield q0, rows if rows.ndim == 3 else lib.unpack_tril(rows).reshape(len(rows), self.nao, self.nao)

    # -- the Z-vector's operator -----------------------------------------------------------------------
    def zvector(self, zs: list[np.ndarray]) -> list[np.ndarray]:
        """G^σ[Z^σ + Z^σᵀ] in the (virtual, occupied) block per channel, for z^σ (nvir, nocc)."""
        rho = sum(ch.weight * 2.0 * (ov.reshape(self.naux, -1) @ z.T.ravel())
                  for ch, ov, z in zip(self.chans, self.b_ov, zs))
        out = []
        for ch, ov, oo, vv, z in zip(self.chans, self.b_ov, self.b_oo, self.b_vv, zs):
            o, v = len(ch.occ), ch.nvir
            coulomb = (rho @ ov.reshape(self.naux, -1)).reshape(o, v).T
            # Σ_Q B^Q_vv (z B^Q_oo): B^Q_vv is symmetric, so its (Q, a) rows are the contraction of one GEMM
            first = vv.reshape(-1, v).T @ np.matmul(z, oo).reshape(-1, o)
            # Σ_Q B^Q_vo (zᵀ B^Q_vo): B^Q_ov's (Q·i, a) rows, read transposed by the GEMM (no copy)
            second = ov.reshape(-1, v).T @ np.matmul(z.T, ov.transpose(0, 2, 1)).reshape(-1, o)
            out.append(coulomb - (first + second))
        return out

    # -- G of a general symmetric matrix, occupied columns ---------------------------------------------
    def occupied_columns(self, mats: list[np.ndarray]) -> list[np.ndarray]:
        """Cᵀ G^σ[X^σ] C_o (nmo, nocc) per channel for symmetric MO-basis X^σ (nmo, nmo)."""
        ao = [ch.c @ x @ ch.c.T for ch, x in zip(self.chans, mats)]
        total = sum(ch.weight * a for ch, a in zip(self.chans, ao))
        j = np.zeros((self.nao, self.nao))
        ks = [np.zeros((self.nao, len(ch.occ))) for ch in self.chans]
        for _, b in self._chunks():
            flat = b.reshape(len(b), -1)
            j += ((flat @ total.ravel()) @ flat).reshape(self.nao, self.nao)
            rows = b.reshape(-1, self.nao)                                          # (Q·μ, ν)
            for ch, a, k in zip(self.chans, ao, ks):
                o = len(ch.occ)
                y = (rows @ ch.c[:, ch.occ]).reshape(len(b), self.nao, o)          # B_Q C_o
                w = (a @ y.transpose(1, 0, 2).reshape(self.nao, -1)).reshape(self.nao, len(b), o)
                k += rows.T @ np.ascontiguousarray(w.transpose(1, 0, 2)).reshape(-1, o)   # Σ_Q B_Q (X B_Q C_o)
        return [ch.c.T @ (j @ ch.c[:, ch.occ] - k) for ch, k in zip(self.chans, ks)]
