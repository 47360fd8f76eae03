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
:func:`mp2trn.df.cholesky_tensor`) and read in row chunks of 64 MB, each unpacked in turn.

The Z-vector's products are GEMMs on the gradient's device (:meth:`mp2trn.devices.Device.response_gemm`,
stage ``zvector``): the MO blocks are made there (:meth:`~mp2trn.devices.Device.response_blocks`), come back to
the host in fp64 and go to the device once per gradient, in the layouts the GEMMs contract
(C = A_Tᵀ B), and each product sends z, zᵀ and ρ:

    M^Q_ij = Σ_b z_bi B^Q_jb        A_T = z,   B = B_vo as (b, (Q, j)),   grouped → ((Q, i), j)
    Y^Q_bj = Σ_i z_bi B^Q_ij        A_T = zᵀ,  B = B_oo as (i, (Q, j)),   grouped → ((Q, b), j)
    Σ_Q B^Q_vv Y^Q                   A_T = B_vv as ((Q, b), a),   B = Y (in device memory)
    Σ_Q B^Q_vo M^Q                   A_T = B_ov as ((Q, i), a),   B = M (in device memory)
    J: ρ_Q = 2 Σ_ia B^Q_ia z_ai (host fp64);   A_T = B_ov as (Q, (i, a)),   B = ρ

where "grouped" (:meth:`mp2trn.devices.Device.response_grouped`) is one product of the small z with all of
the kept block's Q column groups, each group's result written as its own block of rows: M and Y come out
in the layouts the next products contract and stay in device memory, so an iteration moves only z, ρ and
(M, N)-sized results between host and device (before, Y — naux·nocc·nvir — came to the host, was transposed
there and sent back at every iteration). The products run in the device's precision (sim: the ``gemm``
kernel in fp32 or ``gemm_x3`` in fp32x3, a resident pair re-split on the chip by ``resplit_x3``; cuda:
torch; cpu: fp64), the solver's vectors and sums in fp64 on the host; fp32 products run the inner solves of
an iterative refinement by fp64 ones (:func:`mp2trn.grad.response.solve_zvector`), and on the cpu so do the
SGEMMs of an fp32 copy of the blocks where the memory plan has room (:meth:`ResponseJK.reduced`). The G[X]
columns for the Lagrangian and W are device GEMMs of the same blocks: G[P] of the unrelaxed density
(:meth:`ResponseJK.occupied_columns`, once per gradient) and the relaxed density's z part for W's occupied
block (:meth:`ResponseJK.zvector_occupied`).
"""

from __future__ import annotations

import copy
from typing import Callable

import numpy as np
import scipy.linalg

from ..devices import Device
from ..devices.cpu import CpuDevice
from ..df import cholesky_tensor, tensor_rows_unpacked
from ..memory import PRECONDITIONER_COLUMNS, carved_bytes, prefaulted_empty
from ..orbitals import SpinOrbitals
from ..threads import one_blas_pool
from .response import NOT_USED

#: tensor rows unpacked at a time (bytes of the unpacked chunk)
_CHUNK_BYTES = 64e6


#: what-ran's name for :meth:`ResponseJK.preconditioner`
PRECONDITIONER = "the orbital Hessian's Coulomb part and diagonal (Woodbury)"
#: what-ran's name when :meth:`ResponseJK.preconditioner` declines (the solver then divides by the diagonal)
DIAGONAL = "the orbital Hessian's diagonal (no Woodbury factor: some ε_a − ε_k not positive)"


def arena_bytes(naux: int, chans: list[SpinOrbitals], reduced_itemsize: int = 0) -> int:
    """Bytes the response holds at once, at most, in arrays it carves from an active
    :class:`mp2trn.memory.Arena` (:func:`mp2trn.memory.carved_bytes`), its MO blocks made from a tensor it did
    not build: the blocks, the products' scratch, and then G[X]'s W or (``reduced_itemsize`` > 0) the
    blocks' reduced copy, which take turns in one space."""
    blocks = carved_bytes(*(naux * n * 8 for ch in chans for n in (len(ch.occ) ** 2, len(ch.occ) * ch.nvir, ch.nvir ** 2)))
    scratch = _scratch_size(naux, chans) * 8
    copy = carved_bytes(*(naux * n * reduced_itemsize for ch in chans
                          for n in (len(ch.occ) ** 2, len(ch.occ) * ch.nvir, ch.nvir ** 2)))
    return blocks + carved_bytes(scratch) + max(carved_bytes(scratch), copy)


class ResponseJK:
    """G^σ = J[X^α + X^β] − K[X^σ] products (an RHF channel: J[2X] − K[X]) on occupied columns."""

    def __init__(self, mf, chans: list[SpinOrbitals], tensor: np.ndarray, device: Device | None = None):
        self.chans = chans
        self.device = device or CpuDevice()   # None: the host's fp64 GEMMs
        self.nao = mf.mol.nao_nr()
        self.naux = tensor.shape[0]
        self.rows = max(1, int(_CHUNK_BYTES // (self.nao * self.nao * 8)))
        shapes = [(len(ch.occ), ch.nvir) for ch in chans]
        # in pages faulted in by every core at once (memory.prefaulted_empty): B_vv alone is 0.84 GB on
        # Inosine, and a VM maps fresh memory slowly
        self.b_oo = [prefaulted_empty((self.naux, o, o)) for o, _ in shapes]
        # B_ov as (Q, i, a): its (Q·i, a) rows are Σ_Q B^Q_vo W_Q's contraction as they lie
        self.b_ov = [prefaulted_empty((self.naux, o, v)) for o, v in shapes]
        self.b_vv = [prefaulted_empty((self.naux, v, v)) for _, v in shapes]
        factors = [(np.ascontiguousarray(ch.c[:, ch.occ]), np.ascontiguousarray(ch.c[:, ch.vir])) for ch in chans]
        for q0, b in self._chunks(tensor):                 # each chunk read (and sent) once for every channel
            q = len(b)
            self.device.response_blocks(b, factors, [(oo[q0 : q0 + q], ov[q0 : q0 + q], vv[q0 : q0 + q])
                                                     for oo, ov, vv in zip(self.b_oo, self.b_ov, self.b_vv)])
        self._kept = [self._keep(oo, ov, vv) for oo, ov, vv in zip(self.b_oo, self.b_ov, self.b_vv)]
        #: the products' large host temporary, shared by the copies :meth:`on_host` and :meth:`reduced` make; made
        #: now, after the blocks, so that what the products make and drop later (G[X]'s W, the fp32 copy of the
        #: blocks) lies past it and shares one space in the gradient's arena (memory.Arena)
        self._scratch = _Scratch(_scratch_size(self.naux, chans))
        #: Z-vector products and GEMM launches so far
        self.products = self.launches = 0
        self._akak: list[np.ndarray] | None = None
        #: the preconditioner a solve used (what-ran): set by :meth:`preconditioner`
        self.preconditioner_used = NOT_USED

    def _keep(self, oo: np.ndarray, ov: np.ndarray, vv: np.ndarray) -> dict:
        """The blocks in the layouts the Z-vector's GEMMs contract, handed to the device once (as views of the
        host blocks: a device copies them into its own memory, the cpu reads them where they are)."""
        naux, o, v = ov.shape
        keep = self.device.response_operand
        return {"vo_by_vir": keep(ov.reshape(naux * o, v).T, moving=True),         # (b, (Q, j))
                "oo_by_occ": keep(oo.reshape(naux * o, o).T, moving=True),         # (i, (Q, j)): B^Q_oo symmetric
                "vv_rows": keep(vv.reshape(naux * v, v)),                          # ((Q, b), a)
                "ov_rows": keep(ov.reshape(naux * o, v)),                          # ((Q, i), a)
                "ov_by_aux": keep(ov.reshape(naux, o * v)),                        # (Q, (i, a))
                "oo_rows": keep(oo.reshape(naux * o, o)),                          # ((Q, j), i)
                "oo_by_aux": keep(oo.reshape(naux, o * o))}                        # (Q, (j, i))

    def _gemm(self, a_t, b, out: np.ndarray | None = None) -> np.ndarray:
        self.launches += 1
        return self.device.response_gemm(a_t, np.ascontiguousarray(b) if isinstance(b, np.ndarray) else b, "zvector",
                                         out=out)

    def _grouped(self, a_t: np.ndarray, kept, width: int, offset: int = 0):
        """A grouped product (:meth:`Device.response_grouped`); on a device that computes on the host, written
        into the scratch from ``offset`` elements on (M^Q at 0, Y^Q after it)."""
        self.launches += 1
        out = None
        if self.device.response_grouped_on_host:
            dtype = _HOST_DTYPES[self.device.response_precision]
            out = self._scratch.view((np.shape(kept)[1] // width * a_t.shape[1], width), dtype, offset)
        return self.device.response_grouped(np.ascontiguousarray(a_t), kept, width, "zvector", out=out)

    def on_host(self) -> ResponseJK | None:
        """The same products through the host's fp64 GEMMs (the MO blocks shared), or None when these are."""
        if self.device.response_precision == "fp64" and isinstance(self.device, CpuDevice):
            return None
        return self._sharing(CpuDevice())

    def reduced(self) -> ResponseJK | None:
        """The same products in the device's reduced response precision (the cpu's fp32: a copy of the blocks
        in fp32 beside the fp64 ones, which the memory plan must have counted) for the Z-vector's inner solves,
        refined by these (:func:`mp2trn.grad.response.solve_zvector`); None when the device offers none."""
        device = self.device.reduced_response()
        return None if device is None else self._sharing(device)

    def _sharing(self, device: Device) -> ResponseJK:
        """These products on ``device``: the MO blocks shared, their kept layouts handed to it, no products
        counted yet."""
        other = copy.copy(self)
        other.device = device
        other._kept = [other._keep(oo, ov, vv) for oo, ov, vv in zip(self.b_oo, self.b_ov, self.b_vv)]
        other.products = other.launches = 0
        return other

    @property
    def precision(self) -> str:
        """The arithmetic of the Z-vector's products."""
        return self.device.response_precision

    def describe(self) -> dict:
        """Where the Z-vector's products ran (what-ran): device, precision, products and GEMM launches."""
        return {"device": self.device.name, "precision": self.precision, "products": self.products,
                "gemm_launches": self.launches, "preconditioner": self.preconditioner_used}

    def diagonal(self) -> np.ndarray:
        """The orbital Hessian's diagonal per channel, concatenated over (a, k) in z's order (fp64):
        (ε_a − ε_k) + 2w (ak|ak) − (ak|ak) − (aa|kk) with w the channel's weight — the diagonal of the
        Z-vector's preconditioner (:meth:`preconditioner`)."""
        out = []
        for ch, oo, vv, akak in zip(self.chans, self.b_oo, self.b_vv, self._exchange_diagonals()):
            aakk = np.einsum("qaa,qkk->ak", vv, oo)
            out.append(((ch.e[ch.vir][:, None] - ch.e[ch.occ][None, :]) + (2.0 * ch.weight - 1.0) * akak - aakk).ravel())
        return np.concatenate(out)

    def _exchange_diagonals(self) -> list[np.ndarray]:
        """(ak|ak) = Σ_Q (B^Q_ka)² per channel, (nvir, nocc), computed once and kept (the diagonal and the
        preconditioner both read it)."""
        if self._akak is None:
            self._akak = [np.einsum("qka,qka->ak", ov, ov) for ov in self.b_ov]
        return self._akak

    def preconditioner(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """M⁻¹ for the Z-vector's PCG (fp64, on the host): M = D_x + U Uᵀ holds the orbital Hessian's Coulomb
        part whole — U = √(2w) B_ov stacked over the channels, rank naux — and the rest of its diagonal,
        D_x = :meth:`diagonal` − 2w (ak|ak), floored at a tenth of ε_a − ε_k so that M stays positive
        definite. Applied by Woodbury's identity, M⁻¹ = D_x⁻¹ − D_x⁻¹ U S⁻¹ Uᵀ D_x⁻¹ with S = 1 + Uᵀ D_x⁻¹ U
        (naux × naux: naux²·nocc·nvir FLOPs, an fp32 syrk summed in fp64; inverted once through its Cholesky
        factor); each application 2·channels + 1 GEMVs. None (the solver then divides by :meth:`diagonal`) where some
        ε_a − ε_k is not positive (a non-aufbau SCF): the floor would not keep M positive definite. Inosine/cc-pVDZ: 16 products to the 1e-8 residual against 20 with the diagonal alone
        (``scripts/bench_zvector.py``)."""
        gaps = np.concatenate([(ch.e[ch.vir][:, None] - ch.e[ch.occ][None, :]).ravel() for ch in self.chans])
        if np.any(gaps <= 0.0):
            self.preconditioner_used = DIAGONAL
            return None
        self.preconditioner_used = PRECONDITIONER
        exact = self.diagonal()
        coulomb = np.concatenate([2.0 * ch.weight * akak.ravel() for ch, akak in zip(self.chans, self._exchange_diagonals())])
        dinv = 1.0 / np.maximum(exact - coulomb, 0.1 * gaps)
        offsets = np.cumsum([0] + [ch.nvir * len(ch.occ) for ch in self.chans])
        scales = [np.sqrt(2.0 * ch.weight) for ch in self.chans]

        def by_ia(v: np.ndarray, c: int) -> np.ndarray:       # channel c's (a, k) slice in B_ov's (i, a) order
            ch = self.chans[c]
            return v[offsets[c] : offsets[c + 1]].reshape(ch.nvir, len(ch.occ)).T.ravel()

        s = np.zeros((self.naux, self.naux))
        # one fp32 buffer for every column chunk (new pages per chunk cost more than its syrk on the 2-core VM)
        chunk = np.empty((self.naux, PRECONDITIONER_COLUMNS), dtype=np.float32)
        for c, ov in enumerate(self.b_ov):
            flat, w = ov.reshape(self.naux, -1), scales[c] * np.sqrt(by_ia(dinv, c))
            for c0 in range(0, flat.shape[1], PRECONDITIONER_COLUMNS):
                c1 = min(flat.shape[1], c0 + PRECONDITIONER_COLUMNS)
                x = chunk[:, : c1 - c0]
                # rounded to fp32 as it is scaled; NumPy's syrk in fp32 (twice the rate; summed in fp64): M only
                # steers the solve, whose residuals stay fp64, and 1 + a sum of squares stays positive definite
                np.multiply(flat[:, c0:c1], w[c0:c1], out=x, casting="same_kind")
                s += x @ x.T
        del chunk
        s[np.diag_indices_from(s)] += 1.0
        # S⁻¹ once (naux³ FLOPs), so that each application is NumPy GEMVs only: a SciPy solve per iteration
        # would wait for NumPy's spinning BLAS threads (mp2trn.threads), ~10 ms a call on the 2-core VM
        # S and the identity passed as their (symmetric) transposes, Fortran-ordered: LAPACK works in place,
        # no copies (the plan counts S, the identity and the syrk's product)
        identity = np.eye(self.naux)
        with one_blas_pool("scipy"):
            factor = scipy.linalg.cho_factor(s.T, lower=True, overwrite_a=True, check_finite=False)
            s_inv = scipy.linalg.cho_solve(factor, identity.T, overwrite_b=True, check_finite=False)
        del s, factor, identity

        def apply(r: np.ndarray) -> np.ndarray:
            y = dinv * r
            t = sum(scales[c] * (ov.reshape(self.naux, -1) @ by_ia(y, c)) for c, ov in enumerate(self.b_ov))
            t = s_inv @ t
            for c, (ch, ov) in enumerate(zip(self.chans, self.b_ov)):
                u = scales[c] * (t @ ov.reshape(self.naux, -1))              # (i, a)
                y[offsets[c] : offsets[c + 1]] -= dinv[offsets[c] : offsets[c + 1]] * u.reshape(len(ch.occ), ch.nvir).T.ravel()
            return y
        return apply

    @classmethod
    def build(cls, mf, chans: list[SpinOrbitals], chunk_mb: float = 256.0, device: Device | None = None) -> ResponseJK | None:
        """The products from a tensor built here (its integrals solved in row chunks of ``chunk_mb`` MB), or
        None when the metric is not positive definite (then generic J/K builds). Whether the tensor and the MO
        blocks fit the budget is the gradient's memory plan's call (:func:`mp2trn.memory.plan_gradient`)."""
        tensor = cholesky_tensor(mf.mol, mf.with_df.auxmol, chunk_mb=chunk_mb, packed=True)
        return None if tensor is None else cls(mf, chans, tensor, device)

    def _chunks(self, tensor: np.ndarray):
        """Unpacked row chunks of ``tensor``: (naux, nao(nao+1)/2) packed rows, or (naux, nao, nao) (the SCF's,
        unpacked). Only the constructor reads the tensor: the products need the MO blocks alone, so a tensor
        built for them is freed once they are made (its memory is then the products' temporaries')."""
        for q0 in range(0, self.naux, self.rows):
            rows = tensor[q0 : q0 + self.rows]
            yield q0, tensor_rows_unpacked(rows)

    # -- the Z-vector's operator -----------------------------------------------------------------------
    def zvector(self, zs: list[np.ndarray]) -> list[np.ndarray]:
        """G^σ[Z^σ + Z^σᵀ] in the (virtual, occupied) block per channel, for z^σ (nvir, nocc): five device
        products per channel (module docstring) whose two large intermediates stay on the device, ρ on the
        host (fp64)."""
        self.products += 1
        exchange, rho = [], self._rho_of_z(zs)
        for ch, kept, z in zip(self.chans, self._kept, zs):
            o = len(ch.occ)
            m = self._grouped(z, kept["vo_by_vir"], o)            # ((Q, i), j) = M^Q_ij
            y = self._grouped(z.T, kept["oo_by_occ"], o, offset=self.naux * o * o)    # ((Q, b), j) = Y^Q_bj
            exchange.append(self._gemm(kept["vv_rows"], y) + self._gemm(kept["ov_rows"], m))
            del m, y                                              # device memory for the next channel
        return [self._gemm(kept["ov_by_aux"], rho[:, None]).reshape(len(ch.occ), ch.nvir).T - k
                for ch, kept, k in zip(self.chans, self._kept, exchange)]

    def _rho_of_z(self, zs: list[np.ndarray]) -> np.ndarray:
        """ρ_Q of Z + Zᵀ summed over the channels with their weights: 2 Σ_ia B^Q_ia z_ai = 2 tr M^Q (host fp64)."""
        rho = np.zeros(self.naux)
        for ch, ov, z in zip(self.chans, self.b_ov, zs):
            rho += ch.weight * 2.0 * (ov.reshape(self.naux, -1) @ z.T.ravel())
        return rho

    def zvector_occupied(self, zs: list[np.ndarray]) -> list[np.ndarray]:
        """G^σ[Z^σ + Z^σᵀ] in the (occupied, occupied) block per channel, for z^σ (nvir, nocc): what the
        relaxed density's z part adds to W's occupied block, from the Z-vector's first product M and one more:

            K[Z + Zᵀ]_ij = T_ij + T_ji,   T_ij = Σ_Q Σ_k B^Q_ik M^Q_kj,   M^Q_kj = Σ_b z_bk B^Q_jb

        (2·naux·nocc²·(nvir + nocc) FLOPs, where G[X] of the whole relaxed density's occupied rows costs
        :meth:`occupied_columns`' W and its reordered copies again)."""
        tees, rho = [], self._rho_of_z(zs)
        for ch, kept, z in zip(self.chans, self._kept, zs):
            o = len(ch.occ)
            m = self._grouped(z, kept["vo_by_vir"], o)            # ((Q, k), j) = M^Q_kj
            t = self._gemm(kept["oo_rows"], m)                    # (i, j): Σ_(Q, k) B^Q_ki M^Q_kj
            del m
            tees.append(t + t.T)
        return [self._gemm(kept["oo_by_aux"], rho[:, None]).reshape(len(ch.occ), len(ch.occ)) - k
                for ch, kept, k in zip(self.chans, self._kept, tees)]

    # -- G of a general symmetric matrix, occupied columns ---------------------------------------------
    def occupied_columns(self, mats: list[np.ndarray], rows: str | None = None) -> list[np.ndarray]:
        """Cᵀ G^σ[X^σ] C_o (nmo, nocc) per channel for symmetric MO-basis X^σ (nmo, nmo), from the MO blocks
        (Cᵀ B_Q (C X Cᵀ) B_Q C = B^Q X B^Q): with U^Q = B^Q[:, occ] and W^Q = X U^Q, K's columns are
        Σ_Q B^Q W^Q and J's Σ_Q ρ_Q U^Q with ρ_Q = tr(X B^Q) = ρ_oo + 2ρ_ov + ρ_vv — eight GEMMs per channel on
        the device (stage ``zvector``); ρ_oo + ρ_ov and ρ_ov are traces of W's two halves, and ρ_vv = Σ_ab
        B^Q_ab X_ab is a host fp64 GEMV (no kept layout has Q free with (a, b) to contract).

        ``rows`` "vir" or "occ": only those rows, the others NaN (the virtual rows' B_vv product is most of the
        cost); the gradient reads both (the Lagrangian G[P]'s virtual rows, W its occupied ones)."""
        if rows not in (None, "vir", "occ"):
            raise ValueError(f"occupied_columns: rows must be None, 'vir' or 'occ', got {rows!r}")
        rho = np.zeros(self.naux)
        exchange = []
        scratch = self._scratch
        for ch, kept, ov, vv, x in zip(self.chans, self._kept, self.b_ov, self.b_vv, mats):
            o, v, occ, vir = len(ch.occ), ch.nvir, _span(ch.occ), _span(ch.vir)
            # W[(Q, i), r] = Σ_s B^Q_si X_sr over virtual and over occupied s; tr over r = i: ρ_ov, ρ_oo + ρ_ov.
            # W in pages made ahead (carved from the gradient's arena, past the scratch: after this call the
            # fp32 copy of the blocks takes its space), its second product and reordered halves in the scratch
            w = self._gemm(kept["vo_by_vir"], x[vir], out=prefaulted_empty((self.naux * o, ch.nmo))).reshape(self.naux, o, -1)
            rho_ov = np.einsum("qii->q", w[:, :, occ])
            w += self._gemm(kept["oo_by_occ"], x[occ], out=scratch.view((self.naux * o, ch.nmo))).reshape(self.naux, o, -1)
            rho += ch.weight * (np.einsum("qii->q", w[:, :, occ]) + rho_ov
                                + vv.reshape(self.naux, -1) @ x[vir][:, vir].ravel())
            # W^Q_ri as ((Q, j), i) and ((Q, b), i) rows, copied into the scratch (its product is added)
            w_occ = scratch.view((self.naux, o, o))
            w_vir = scratch.view((self.naux, v, o), offset=self.naux * o * o)
            np.copyto(w_occ, w[:, :, occ].transpose(0, 2, 1))
            np.copyto(w_vir, w[:, :, vir].transpose(0, 2, 1))
            w_occ, w_vir = w_occ.reshape(-1, o), w_vir.reshape(-1, o)
            del w
            k = np.full((ch.nmo, o), np.nan)
            if rows != "occ":
                k[vir] = self._gemm(kept["vv_rows"], w_vir) + self._gemm(kept["ov_rows"], w_occ)
            if rows != "vir":
                vo_rows = prefaulted_empty((self.naux, v, o))     # ((Q, b), j) = B^Q_bj, in W's space
                np.copyto(vo_rows, ov.transpose(0, 2, 1))
                vo_rows = self.device.response_operand(vo_rows.reshape(-1, o))
                k[occ] = self._gemm(kept["oo_rows"], w_occ) + self._gemm(vo_rows, w_vir)
                del vo_rows          # before the next channel's W is carved
            exchange.append(k)
        out = []
        for ch, kept, k in zip(self.chans, self._kept, exchange):
            o = len(ch.occ)
            g = -k
            if rows != "occ":
                g[ch.vir] += self._gemm(kept["ov_by_aux"], rho[:, None]).reshape(o, -1).T
            if rows != "vir":
                g[ch.occ] += self._gemm(kept["oo_by_aux"], rho[:, None]).reshape(o, o)
            out.append(g)
        return out


def _scratch_size(naux: int, chans: list[SpinOrbitals]) -> int:
    """fp64 elements of the products' scratch: naux·nocc·nmo of the largest channel (M^Q and Y^Q together, or
    G[X]'s W)."""
    return naux * max(len(ch.occ) * ch.nmo for ch in chans)


class _Scratch:
    """One host buffer of ``size`` fp64 elements, made at once (in pages made ahead: carved from the
    gradient's arena while one is active) and reused by every product of one response and of the copies of
    it that share its blocks: M^Q and Y^Q of each Z-vector product where the device computes on the host, and
    G[X]'s second product and W's reordered halves in :meth:`ResponseJK.occupied_columns`. Fresh arrays of
    0.1-0.3 GB per product were new pages from the OS each time, whose faults cost this VM more kernel time
    than the GEMMs that filled them (the memory plan counts it with W: :func:`mp2trn.memory.plan_gradient`)."""

    def __init__(self, size: int):
        self.size = size
        self._buffer = prefaulted_empty((size,))

    def view(self, shape: tuple[int, ...], dtype=np.float64, offset: int = 0) -> np.ndarray:
        """A C-contiguous ``shape`` array of ``dtype`` in the buffer, from its ``offset``-th element of that
        dtype on."""
        flat = self._buffer.view(dtype)
        n = int(np.prod(shape))
        if offset + n > flat.size:
            raise ValueError(f"scratch view of {n} elements at {offset} exceeds the buffer's {flat.size}")
        return flat[offset : offset + n].reshape(shape)


#: the dtype of a host device's grouped results, by its response precision
_HOST_DTYPES = {"fp32": np.float32, "fp64": np.float64}


def _span(index: np.ndarray) -> slice | np.ndarray:
    """An ascending run of consecutive indices as the slice it is (basic indexing, no copy), else itself."""
    n = len(index)
    if n and int(index[-1]) - int(index[0]) == n - 1 and bool(np.all(np.diff(index) == 1)):
        return slice(int(index[0]), int(index[0]) + n)
    return index
