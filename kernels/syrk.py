"""syrk — the exchange build's rank update ``K = Zᵀ Z`` on TensorE, lower triangle only (NKI 0.3.0).

Dimensions
    R: rows of Z = (auxiliary function P, occupied orbital i) pairs of one tensor block, the contraction
    (SBUF partitions, streamed in groups of 128-row tiles); N = nao: columns of Z and the size of K.
    Any R, N (edge tiles are slices).

Args
    z (R, N) float32 in HBM: Z[(P, i), ν] = (C_occᵀ B_P)[i, ν], the half-transformed tensor block as
    ``batched_gemm`` writes it (with the identity as its second operand, which is TensorE's transpose).
    k_group: 128-row tiles per streamed group (0: from the target's SBUF budget, :func:`k_group_size`).
    ``syrk_x3``: the compensated planes z_hi, z_lo, z of mp2trn.precision (hi on a bf16-exact grid per
    column along the rows).

Returns
    k (N, N) float32: the tiles on and below the diagonal hold Zᵀ Z (the host mirrors them; tiles wholly
    above the diagonal are never computed). ``syrk_x3``: the pair (k_exact, k_rest), added in fp64.

Engines
    DMA: Z column panels in groups of 128-row tiles (one transfer per plane per group, access patterns),
    K tiles out. TensorE: ``nc_matmul`` accumulating over every row tile into one PSUM tile per output
    tile (stationary = Z[rows, M tile], moving = Z[rows, N chunk ≤ 512]). VectorE: PSUM evictions.

Pseudocode
    for each M tile (m0, ≤ 128 columns):
        for each N chunk (n0, ≤ 512 columns) with n0 < m0 + 128:      # on or below the diagonal
            acc = 0                                                     # PSUM
            for each group of row tiles:
                acc += Z[rows, M tile]ᵀ · Z[rows, N chunk]              # TensorE
            K[M tile, N chunk] = acc                                    # VectorE → DMA

Why a separate kernel: the half of Zᵀ Z above the diagonal repeats the half below, so skipping those
tiles halves the exchange build's rank-update flops (BLAS ``syrk``); ``gemm`` would compute both.

NumPy reference: :func:`syrk_reference`. Tests: tests/test_kernel_syrk.py.
"""

from __future__ import annotations

import numpy as np

from ._nki import nki, nl
from .tiles import FP32, MFMAX, NFMAX, PMAX, evict, load_operand_tiles, matmul_planes, sbuf_budget, tiles

__all__ = ["syrk", "syrk_x3", "syrk_reference", "k_group_size"]


def k_group_size(x3=False, budget=0):
    """Row tiles per streamed group: a stationary [rows, 128] and a moving [rows, 512] panel per group,
    double-buffered, within the per-partition SBUF budget (x3: hi16 + hi32 + lo, hi16 + lo + x)."""
    budget = budget or sbuf_budget()
    per_tile = (MFMAX + NFMAX) * (10 if x3 else FP32)
    return int(max(1, min(64, budget // (2 * per_tile))))


def _body(st_planes, mv_planes, out, out_rest, k_group):
    R, N = st_planes[0].shape
    ktiles = tiles(R, PMAX)
    compensated = len(st_planes) > 1
    g = k_group if k_group else k_group_size(compensated)
    for m0, msz in tiles(N, MFMAX):
        for n0, nsz in tiles(m0 + msz, NFMAX):      # chunks that reach the diagonal tile or lie below it
            outs = [out, out_rest] if compensated else [out]
            accs = [nl.ndarray((msz, nsz), dtype=nl.float32, buffer=nl.psum, name="k_acc") for _ in outs]
            for g0 in range(0, len(ktiles), g):
                grp = ktiles[g0:g0 + g]
                a = load_operand_tiles(st_planes, grp, m0, msz, stationary=True, name="z_m")
                b = load_operand_tiles(mv_planes, grp, n0, nsz, stationary=False, name="z_n")
                matmul_planes(accs, a, b)   # x3: exact part in accs[0], corrections in accs[1]
            for o, acc in zip(outs, accs):
                evict(o[m0:m0 + msz, n0:n0 + nsz], acc, msz, nsz, name="k_sb")


@nki.jit
def syrk(z, k_group=0):
    """fp32 ``Zᵀ Z`` (lower triangle): z (R, N) float32 -> (N, N) float32."""
    N = z.shape[1]
    k = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.shared_hbm)
    _body((z,), (z,), k, k, k_group)
    return k


@nki.jit
def syrk_x3(z_hi, z_lo, z, k_group=0):
    """Compensated ``Zᵀ Z`` (lower triangle): planes of Z split along the rows per column.
    Returns (k_exact, k_rest), (N, N) float32 each; K = k_exact + k_rest in fp64 on the host."""
    N = z.shape[1]
    k = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.shared_hbm)
    k_rest = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.shared_hbm)
    _body((z_hi, z_lo), (z_hi, z_lo, z), k, k_rest, k_group)
    return k, k_rest


def lower_to_full(k: np.ndarray) -> np.ndarray:
    """Host side: the symmetric matrix from the kernel's lower triangle (fp64)."""
    low = np.tril(np.asarray(k, dtype=np.float64))
    return low + np.tril(low, -1).T


def syrk_reference(z: np.ndarray) -> np.ndarray:
    """NumPy reference (fp64): Zᵀ Z."""
    z = np.asarray(z, dtype=np.float64)
    return z.T @ z
