"""collectives — moving arrays between the ranks of a run with NKI collectives (NKI 0.3.0).

What travels when one molecule is spread over NeuronCores (mp2trn/parallel.py, ``NkiComm``): the
redistributions of the 3-index tensors (an all-to-all with uneven pieces), the B blocks of the pair step
(each rank to the rank ``step`` places behind it in the ring) and the fp64 sums of J, K and the pair
energies. Each is one kernel around one ``nki.collectives`` instruction.

Dimensions
    W: 32-bit words of one rank's buffer (the host views fp64/fp32 arrays as int32 words, so every value
    arrives bit for bit: NKI has no fp64 type, and a transport must not round; int32, not uint32,
    because XLA has no native unsigned integers); G: ranks in the group.

Args
    ``all_to_all_words(send, metadata, recv_words, group)``: send (Ws, 1) int32; metadata (3, G) int32
    (viewed as the uint32 that ``all_to_all_v`` requires): words to each rank, their offsets in ``send``,
    words from each rank; recv_words: compile-time size of
    the result (≥ their sum); group: tuple of the ranks.
    ``shift_words(send, pairs)``: send (W, 1) int32, the same W on every rank; pairs: tuple of
    (source, target) ranks forming rings.
    ``gather_words(send, group)``: send (W, 1) int32, the same W on every rank.

Returns
    ``all_to_all_words``: (recv_words, 1) int32, rank 0's words first, then rank 1's, ... (packed).
    ``shift_words``: (W, 1) int32, the buffer of this rank's source in ``pairs``.
    ``gather_words``: (G·W, 1) int32, every rank's buffer in group order.

Engines
    DMA: the kernel's input is copied into an internal HBM buffer and the collective's result out of one
    (a collective's operands must not be the kernel's own input/output tensors: vllm-project/vllm-neuron,
    ``nki/collectives`` wrappers, "NEFF I/O cannot also be collective I/O"). The collective cores move
    the data over NeuronLink inside an instance and EFA between instances (neuron-runtime/about/
    collectives.rst).

Pseudocode
    buf = copy(send); collective(buf → out_buf); result = copy(out_buf)

NumPy references: :func:`all_to_all_words_reference`, :func:`shift_words_reference`,
:func:`gather_words_reference` take every rank's input and return every rank's output.
Tests: tests/nkiemu/test_collectives.py (the emulator's instructions) and tests/test_kernel_collectives.py.
"""

from __future__ import annotations

import numpy as np

from ._nki import ncc, nisa, nki, nl

__all__ = ["all_to_all_words", "shift_words", "gather_words", "all_to_all_words_reference",
           "shift_words_reference", "gather_words_reference"]


def _staged(src):
    """An internal HBM copy of a kernel input (collective operands cannot be kernel I/O)."""
    buf = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=buf, src=src)
    return buf


def _returned(buf):
    out = nl.ndarray(buf.shape, dtype=buf.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=buf)
    return out


@nki.jit
def all_to_all_words(send, metadata, recv_words, group):
    """Uneven all-to-all of 32-bit words: ``ncc.all_to_all_v`` with known receive counts."""
    buf = _staged(send)
    meta = _staged(metadata.view(nl.uint32))
    got = nl.ndarray((recv_words, 1), dtype=send.dtype, buffer=nl.shared_hbm)
    ncc.all_to_all_v(srcs=[buf], dsts=[got], replica_group=ncc.ReplicaGroup([list(group)]),
                     metadata_tensor=meta, recv_counts_known=True)
    return _returned(got)


@nki.jit
def shift_words(send, pairs):
    """Each rank's buffer to its target in ``pairs``: ``ncc.collective_permute``."""
    buf = _staged(send)
    got = nl.ndarray(send.shape, dtype=send.dtype, buffer=nl.shared_hbm)
    ncc.collective_permute(srcs=[buf], dsts=[got], source_target_pairs=list(pairs))
    return _returned(got)


@nki.jit
def gather_words(send, group):
    """Every rank's buffer on every rank: ``ncc.all_gather`` along dim 0."""
    buf = _staged(send)
    got = nl.ndarray((send.shape[0] * len(group), send.shape[1]), dtype=send.dtype, buffer=nl.shared_hbm)
    ncc.all_gather(srcs=[buf], dsts=[got], replica_group=ncc.ReplicaGroup([list(group)]), collective_dim=0)
    return _returned(got)


# -- NumPy references: every rank's input in, every rank's output out --------------------------------------

def all_to_all_words_reference(sends: list[np.ndarray], metas: list[np.ndarray], recv_words: int) -> list[np.ndarray]:
    g = len(sends)
    outs = []
    for r in range(g):
        pieces = [sends[p].reshape(-1)[metas[p][1, r] : metas[p][1, r] + metas[p][0, r]] for p in range(g)]
        out = np.zeros(recv_words, dtype=sends[r].dtype)
        flat = np.concatenate(pieces)
        out[: flat.size] = flat
        outs.append(out.reshape(-1, 1))
    return outs


def shift_words_reference(sends: list[np.ndarray], pairs) -> list[np.ndarray]:
    outs = [np.zeros_like(s) for s in sends]
    for src, dst in pairs:
        outs[dst] = sends[src].copy()
    return outs


def gather_words_reference(sends: list[np.ndarray]) -> list[np.ndarray]:
    whole = np.concatenate(sends, axis=0)
    return [whole.copy() for _ in sends]
