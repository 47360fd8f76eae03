"""coulomb — the SCF's Coulomb build for one block of the 3-index tensor as two matrix-vector products
(NKI 0.3.0)::

    ρ_P  = Σ_q B[P, q] D[q]          (q = (μ, ν): the density contracted with each B_P)
    J[q] = Σ_P ρ_P B[P, q]

Dimensions
    p: auxiliary functions of the block (SBUF partitions, tiles of 128); n2 = nao²: the flattened AO pair
    index (chunks of 512, one PSUM bank of fp32). Any p, n2.

Args
    b (p, n2) float32 in HBM: B_P rows, unpacked (B_P symmetric); dm (1, n2) float32: the density.

Returns
    (rho (p, 1), j (1, n2)) float32: the fitted density coefficients and this block's share of J.

Engines
    DMA: B tiles [P, 512 columns] (twice: once per product), the density row broadcast to all partitions
    with a stride-0 partition access pattern. VectorE: ρ — multiply by the broadcast density and reduce
    along the free axis, accumulating per P tile. TensorE: J — ρ tile stationary ([K = P, M = 1]), B chunk
    moving, accumulating over the P tiles in PSUM. VectorE evicts.

Pseudocode
    for each P tile:  ρ[P] = Σ_chunks reduce_add(B[P, chunk] · broadcast(D[chunk]))     # VectorE
    for each chunk:   J[chunk] = Σ_P-tiles ρ[P]ᵀ · B[P, chunk]                            # TensorE, PSUM
    store ρ, J

J is a small share of a J/K build (2·p·nao² flops against the exchange build's 4·p·nao²·nocc), so the
matrix-vector shapes (M = 1 on TensorE) cost little; what matters is reading B once per product.

NumPy reference: :func:`coulomb_reference`. Tests: tests/test_kernel_syrk.py (with the exchange kernels).
"""

from __future__ import annotations

import numpy as np

from ._nki import nki, nisa, nl
from .tiles import NFMAX, PMAX, evict, load_rows, tiles

__all__ = ["coulomb", "coulomb_reference"]


@nki.jit
def coulomb(b, dm):
    """fp32: ρ = B·D and J = Bᵀρ for one tensor block; b (p, n2), dm (1, n2) -> (rho (p, 1), j (1, n2))."""
    p, n2 = b.shape
    rho = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    j = nl.ndarray((1, n2), dtype=nl.float32, buffer=nl.shared_hbm)
    ptiles = tiles(p, PMAX)
    chunks = tiles(n2, NFMAX)
    rho_sb = []
    for p0, psz in ptiles:                              # ρ on VectorE
        acc = nl.ndarray((psz, 1), dtype=nl.float32, buffer=nl.sbuf, name="rho_acc")
        nisa.memset(dst=acc, value=0.0)
        for c0, csz in chunks:
            bt = load_rows(b, p0, psz, c0, csz, nl.float32, name="b_rho")
            dt = nl.ndarray((psz, csz), dtype=nl.float32, buffer=nl.sbuf, name="dm_bcast")
            nisa.dma_copy(dst=dt, src=dm.ap([[0, psz], [1, csz]], offset=c0))      # one row to every P
            prod = nl.ndarray((psz, csz), dtype=nl.float32, buffer=nl.sbuf, name="b_dm")
            nisa.tensor_tensor(dst=prod, data1=bt, data2=dt, op=nl.multiply)
            part = nl.ndarray((psz, 1), dtype=nl.float32, buffer=nl.sbuf, name="rho_part")
            nisa.tensor_reduce(dst=part, op=nl.add, data=prod, axis=1)
            nisa.tensor_tensor(dst=acc, data1=acc, data2=part, op=nl.add)
        nisa.dma_copy(dst=rho[p0:p0 + psz, :], src=acc)
        rho_sb.append(acc)
    for c0, csz in chunks:                              # J on TensorE
        acc_j = nl.ndarray((1, csz), dtype=nl.float32, buffer=nl.psum, name="j_acc")
        for (p0, psz), r in zip(ptiles, rho_sb):
            bt = load_rows(b, p0, psz, c0, csz, nl.float32, name="b_j")
            nisa.nc_matmul(dst=acc_j, stationary=r, moving=bt)
        evict(j[0:1, c0:c0 + csz], acc_j, 1, csz, name="j_sb")
    return rho, j


def coulomb_reference(b: np.ndarray, dm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy reference (fp64): ρ = B·D (p, 1) and J = Bᵀ ρ (1, n2)."""
    b = np.asarray(b, dtype=np.float64)
    rho = b @ np.asarray(dm, dtype=np.float64).reshape(-1)
    return rho.reshape(-1, 1), (rho @ b).reshape(1, -1)
