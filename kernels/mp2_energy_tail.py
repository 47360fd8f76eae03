"""The swapped a-tile tail of kernels/mp2_energy.py (NKI 0.3.0 sub-kernels, inlined into ``mp2_energy``;
never jitted themselves).

When the last a tile of a launch is short (``tsz`` ≤ 64 rows) and there are several b tiles, that tile is
computed with the roles swapped: T'[b, a] = Σ_Q B_J[Q, b] B_I[Q, a] with the b tiles stationary and the
tail columns moving. A TensorE matmul costs max(64, N) cycles, so 4 b tiles × 64 beat one 128-row pass
over all nvb columns (Vitamin C/cc-pVTZ: 256 vs 426 cycles per Q tile); the exchange pieces then come out
already transposed.

Dimensions
    tsz ≤ 64: tail rows from ``ta0``; btiles: the b tiles of nvb (≤ 128 each); nj: j's of the group.

Helpers (engine)
    tail_constants   the TailSwap of a launch: (ε_b − e_j) columns per b tile (DMA), the broadcast ε_a row
                     of the tail, the broadcast −e_i rows; () when no swap pays
    tail_pairs       per (j, b tile): T' (TensorE, PSUM), D' = ε_b − e_j − e_i + ε_a (VectorE/ScalarE),
                     1/D' (GpSimd rsqrt²), W' = T'/D', Σ_a W'T' (VectorE), Σ_b by a ones matmul into acc_os
    tail_exchange    Σ_b W'[b, a] T_ba: T_ba from the main T tiles, or the transpose of T' in the tail

Pseudocode
    for j in group, for b tile:  T' = B_J[:, b]ᵀ B_I[:, tail];  W' = T'/D';  os[j] += Σ W'·T'
                                 x[j]  += Σ W'·(T_ba)    (T_ba: main tile, or (T' of the tail b tile)ᵀ)

Reference: ``mp2_energy_reference`` in kernels/mp2_energy.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._nki import nisa, nl
from .tiles import PMAX, broadcast_row, matmul_planes, tiles

__all__ = ["TailSwap", "tail_constants", "tail_pairs", "tail_exchange"]


@dataclass
class TailSwap(nl.NKIObject):
    """The short last a tile (``tsz`` ≤ 64 rows from ``ta0``) computed as T'[b, a] = B_Jᵀ B_I with the
    b tiles stationary and the tail columns moving: a matmul costs max(64, N) cycles, so 4 b tiles × 64
    beat one 128-row-tile pass over all nvb columns (Vitamin C/cc-pVTZ: 256 vs 426 per Q tile). The
    exchange pieces then come out already transposed. Constants: (ε_b − e_j) columns per b tile, the
    broadcast ε_a row of the tail, the broadcast −e_i rows."""

    ta0: int
    tsz: int
    btiles: list
    bias_b: list
    ea_row: object
    nei: object


def tail_pairs(blk, grp, i, il, acc_os, acc_x, t_sb):
    """The swapped tail: for each j of the group and each b tile, T'[b, a] (a in the tail) by TensorE,
    its direct-term sums into acc_os[0:1, jl]; returns [(T' in SBUF, W' in SBUF)] per (jl, b tile)."""
    tail = blk.tail[0]
    out = []
    for jl in range(grp.nj):
        j = grp.j0 + jl
        for bt, (q0, bsz) in enumerate(tail.btiles):
            tp = nl.ndarray((bsz, tail.tsz), dtype=nl.float32, buffer=nl.psum, name="tail_ps")
            st = [tuple(p[:, jl * blk.nvb + q0:jl * blk.nvb + q0 + bsz] for p in planes) for planes in grp.jt]
            mv = [tuple(p[:, il * blk.nva + tail.ta0:il * blk.nva + tail.ta0 + tail.tsz] for p in planes)
                  for planes in blk.ip]
            matmul_planes((tp,), st, mv)
            col = nl.ndarray((bsz, 1), dtype=nl.float32, buffer=nl.sbuf, name="tail_bias")
            nisa.tensor_tensor(dst=col, data1=tail.bias_b[bt][:, j:j + 1], data2=tail.nei[0:bsz, i:i + 1],
                               op=nl.add)                                   # ε_b − e_j − e_i
            dn = nl.ndarray((bsz, tail.tsz), dtype=nl.float32, buffer=nl.sbuf, name="tail_denom")
            nisa.activation(dst=dn, op=nl.copy, data=tail.ea_row[0:bsz, :], bias=col)   # + ε_a
            y = nl.ndarray((bsz, tail.tsz), dtype=nl.float32, buffer=nl.sbuf, name="tail_rsqrt")
            nisa.tensor_scalar(dst=y, data=dn, op0=nl.rsqrt, operand0=0.0, engine=nisa.gpsimd_engine)
            r = nl.ndarray((bsz, tail.tsz), dtype=nl.float32, buffer=nl.sbuf, name="tail_recip")
            nisa.tensor_tensor(dst=r, data1=y, data2=y, op=nl.multiply, engine=nisa.gpsimd_engine)
            t_copy = nl.ndarray((bsz, tail.tsz), dtype=nl.float32, buffer=nl.sbuf, name="tail_t")
            nisa.activation(dst=t_copy, op=nl.copy, data=tp)
            w = nl.ndarray((bsz, tail.tsz), dtype=nl.float32, buffer=nl.sbuf, name="tail_w")
            nisa.tensor_tensor(dst=w, data1=tp, data2=r, op=nl.multiply)     # W' = T'/D'
            p1 = nl.ndarray((bsz, tail.tsz), dtype=nl.float32, buffer=nl.sbuf, name="tail_tw")
            nisa.tensor_tensor(dst=p1, data1=w, data2=tp, op=nl.multiply)
            red = nl.ndarray((bsz, 1), dtype=nl.float32, buffer=nl.sbuf, name="tail_sum")
            nisa.tensor_reduce(dst=red, op=nl.add, data=p1, axis=1)          # over a (tail)
            nisa.nc_matmul(dst=acc_os[0:1, jl:jl + 1], stationary=blk.ones[0:bsz, :], moving=red)   # over b
            out.append((t_copy, w))
    return out


def tail_exchange(blk, grp, acc_x, t_sb, swapped):
    """Σ_b W'[b, a] T_ba for a in the tail: T_ba is column block (j, tail) of the main T tile of b's tile,
    or, for b in the tail too, the transpose of T' of the tail b tile (a square block at partition 0)."""
    tail = blk.tail[0]
    nbt = len(tail.btiles)
    for jl in range(grp.nj):
        for bt, (q0, bsz) in enumerate(tail.btiles):
            t_copy, w = swapped[jl * nbt + bt]
            p2 = nl.ndarray((bsz, tail.tsz), dtype=nl.float32, buffer=nl.sbuf, name="tail_ttw")
            if bt < nbt - 1:
                c = jl * blk.nvb + tail.ta0
                nisa.tensor_tensor(dst=p2, data1=w, data2=t_sb[bt][:, c:c + tail.tsz], op=nl.multiply)
            else:
                tr = nl.ndarray((bsz, tail.tsz), dtype=nl.float32, buffer=nl.psum, name="tail_tr")
                nisa.nc_transpose(dst=tr, data=swapped[jl * nbt + bt][0])
                nisa.tensor_tensor(dst=p2, data1=w, data2=tr, op=nl.multiply)
            red = nl.ndarray((bsz, 1), dtype=nl.float32, buffer=nl.sbuf, name="tail_xsum")
            nisa.tensor_reduce(dst=red, op=nl.add, data=p2, axis=1)
            nisa.nc_matmul(dst=acc_x[0:1, jl:jl + 1], stationary=blk.ones[0:bsz, :], moving=red)


def tail_constants(atiles, nvb, nJ, ev_a, evb_ej, nei, ones_row, broadcast_dma):
    """The TailSwap of a launch, or () when the last a tile is full or longer than 64 rows."""
    ta0, tsz = atiles[-1]
    btiles = tiles(nvb, PMAX)
    if len(atiles) < 2 or tsz > 64 or len(btiles) * 64 >= nvb:
        return ()
    bias_b = []
    for q0, bsz in btiles:
        b = nl.ndarray((bsz, nJ), dtype=nl.float32, buffer=nl.sbuf, name="bias_b")
        nisa.dma_copy(dst=b, src=evb_ej.ap([[1, bsz], [nvb, nJ]], offset=q0))   # (ε_b − e_j), b on partitions
        bias_b.append(b)
    ea_row = nl.ndarray((PMAX, tsz), dtype=nl.float32, buffer=nl.sbuf, name="ea_tail")
    broadcast_row(ea_row, ev_a, ta0, tsz, ones_row, broadcast_dma)
    return (TailSwap(ta0, tsz, btiles, bias_b, ea_row, nei),)
