"""The packed layout of symmetric rows: (p, nao(nao+1)/2), the lower triangle μ ≥ ν of each row's
(nao, nao) matrix row by row (PySCF's ``pack_tril`` order), half the memory of the unpacked (p, nao, nao).

The SCF's fitted tensor is kept so on the host (:class:`mp2trn.jk.JKTensor`) for the CPU and the NKI
devices: the CPU's builds unpack a few rows at a time as they read them (in buffers of their own, kept
between builds: ``CpuDevice._unpacked_rows``), an NKI device's copies (its fp32 rows, the compensated builds'
fp32 pair) are unpacked as they are made (:func:`each_unpacked_chunk` through
:func:`mp2trn.precision.fp32_copy`), and J's ρ_P = B_P·D reads the packed rows with :func:`coulomb_weights`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from pyscf import lib

#: bytes of unpacked fp64 rows per chunk (:func:`each_unpacked_chunk`): a few rows, in cache while used
UNPACK_CHUNK_BYTES = 4e6


def nao_of_pairs(npair: int) -> int:
    """nao for nao(nao+1)/2 = ``npair``."""
    n = int(round((np.sqrt(8 * npair + 1) - 1) / 2))
    if n * (n + 1) // 2 != npair:
        raise ValueError(f"{npair} is not a triangular number of pairs")
    return n


def coulomb_weights(dm: np.ndarray, packed: bool) -> np.ndarray:
    """D over the rows as stored: packed, the lower triangle with off-diagonal pairs counted twice
    (ρ_P = B_P·D then reads each pair once); unpacked, D flat."""
    dm = np.asarray(dm)
    return lib.pack_tril(2 * dm - np.diag(np.diag(dm))) if packed else dm.ravel()


def each_unpacked_chunk(rows: np.ndarray, fn: Callable[[int, int, np.ndarray], None],
                        chunk_bytes: float = UNPACK_CHUNK_BYTES) -> None:
    """Call ``fn(r0, r1, u)`` for consecutive chunks [r0, r1) of the packed ``rows`` (p, nao(nao+1)/2), with
    ``u`` their unpacked fp64 (r1 − r0, nao, nao) in one small buffer reused from chunk to chunk (valid until
    ``fn`` returns). PySCF unpacks with one OpenMP thread here: callers run parts of the rows side by side
    (:func:`mp2trn.precision.fp32_copy`)."""
    nao = nao_of_pairs(rows.shape[1])
    chunk = max(1, int(chunk_bytes // (nao * nao * 8)))
    buf = np.empty((min(chunk, rows.shape[0]), nao, nao))
    with lib.with_omp_threads(1):
        for r0 in range(0, rows.shape[0], chunk):
            r1 = min(rows.shape[0], r0 + chunk)
            u = buf[: r1 - r0]
            lib.unpack_tril(rows[r0:r1], out=u)
            fn(r0, r1, u)


__all__ = ["UNPACK_CHUNK_BYTES", "coulomb_weights", "each_unpacked_chunk", "nao_of_pairs"]
