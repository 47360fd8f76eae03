"""Pair-energy step: loop over blocks of occupied pairs, let the device form and reduce T, and sum
the per-pair results in fp64 on the host.

RHF (one channel):  E_os = Σ_ij os_ij,  E_ss = Σ_ij (os_ij − x_ij), over i ≤ j blocks with weight 2 for
i < j (T_ji = T_ijᵀ gives the same sums). UHF: αα and ββ give E_ss = Σ_{i<j} (os_ij − x_ij) per spin;
αβ gives E_os = Σ_ij os_ij over all α-i, β-j pairs. (os, x as in ``Device.pair_energies``.)

Semicanonical ROHF orbitals (ROHF-MBPT(2), :func:`mp2trn.orbitals.semicanonical`) run the UHF pair step
unchanged and add the singles energy of their occupied–virtual Fock blocks (:func:`singles_energy`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .devices.base import Device
from .orbitals import SpinOrbitals
from .progress import Progress
from .parallel import Comm
from .scratch import check_stopped
from .transform import BStore


@dataclass
class PairEnergies:
    """Correlation energy components (Hartree) and the per-pair matrices they came from."""

    e_os: float = 0.0
    e_ss: float = 0.0
    pair_os: list[np.ndarray] = field(default_factory=list)  # per channel: (nocc_i, nocc_j)
    pair_ss: list[np.ndarray] = field(default_factory=list)
    channels: list[str] = field(default_factory=list)
    block_pairs: int = 0

    @property
    def e_corr(self) -> float:
        return self.e_os + self.e_ss


def singles_energy(spins: list[SpinOrbitals]) -> float:
    """E_singles = Σ_σ Σ_ia |f^σ_ia|² / (ε_i − ε_a) in Hartree (≤ 0), over the channels that carry an
    occupied–virtual Fock block (semicanonical ROHF); 0 for canonical RHF/UHF orbitals. Summed in fp64
    on the host: (nocc, nvir) per spin, no device work worth the name."""
    total = 0.0
    for s in spins:
        if s.f_ov is not None:
            total += float(np.sum(s.f_ov ** 2 / (s.e_occ[:, None] - s.e_vir[None, :])))
    return total


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    """``n`` occupied orbitals in blocks of at most ``size``, as equal as possible (46 by 9: five of 8 and
    one of 6, not five of 9 and one of 1) — so devices that pad the last block to one kernel signature
    (NKI) waste little."""
    count = -(-n // max(size, 1)) if n else 0
    even = -(-n // count) if count else size
    return [(i, min(n, i + even)) for i in range(0, n, even)]


#: one block pair of a channel: i-range, B_i, j-range, B_j (None: the diagonal block, B_j = B_i)
Task = tuple[tuple[int, int], np.ndarray, tuple[int, int], "np.ndarray | None"]


def _local_tasks(store: BStore, spins: list[SpinOrbitals], si: int, sj: int, occ_block: int):
    """All block pairs of channel (si, sj) from one store (same spin: i ≤ j blocks only). Returns
    (count, iterator of :data:`Task`)."""
    a, b = spins[si], spins[sj]
    same = si == sj
    iblocks, jblocks = _blocks(a.nocc, occ_block), _blocks(b.nocc, occ_block)
    pairs = [(bi, bj) for bi in range(len(iblocks)) for bj in range(len(jblocks)) if not (same and bj < bi)]

    def tasks():
        for bi, bj in pairs:
            (i0, i1), (j0, j1) = iblocks[bi], jblocks[bj]
            b_i = store.occ_block(si, a.nvir, i0, i1)
            b_j = None if (same and bi == bj) else store.occ_block(sj, b.nvir, j0, j1)
            yield (i0, i1), b_i, (j0, j1), b_j

    return len(pairs), tasks()


def _channel(device: Device, spins: list[SpinOrbitals], si: int, sj: int, tasks, progress,
             done_total: list[int]) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-pair os and x for channel (si, sj) from its block pairs; same-spin channels fill i ≤ j only
    (a block pair with i > j, as ranks meet them, is stored transposed: os_ji = os_ij)."""
    a, b = spins[si], spins[sj]
    same = si == sj
    os_ = np.zeros((a.nocc, b.nocc))
    xx = np.zeros_like(os_) if same else None
    for (i0, i1), b_i, (j0, j1), b_j in tasks:
        o, x = device.pair_energies(b_i, b_j, a.e_occ[i0:i1], b.e_occ[j0:j1], a.e_vir, b.e_vir, exchange=same)
        if same and i0 > j0:
            os_[j0:j1, i0:i1] = o.T
            xx[j0:j1, i0:i1] = x.T
        else:
            os_[i0:i1, j0:j1] = o
            if same:
                xx[i0:i1, j0:j1] = x
        done_total[0] += 1
        check_stopped()  # a signal swallowed inside a library call still ends the run within a block
        if progress:
            progress("pairs", done_total[0], done_total[1])
    if same:  # blocks below the diagonal were never formed; keep only i <= j
        os_ = np.triu(os_)
        xx = np.triu(xx)
    return os_, xx


def pair_energies(
    store: BStore,
    spins: list[SpinOrbitals],
    device: Device,
    occ_block: int,
    progress: Progress | None = None,
    comm: Comm | None = None,
) -> PairEnergies:
    """Compute E_os and E_ss for RHF (one channel) or UHF (alpha, beta channels).

    With ``comm`` over several ranks, ``store`` is this rank's :class:`~mp2trn.transform.SharedB`; the
    block pairs are shared out by :func:`ring_tasks` and the per-pair sums all-reduced in fp64.
    """
    comm = comm or Comm()
    channels = list(zip((0, 1, 0), (0, 1, 1), channel_labels(len(spins))))
    streams = [(ring_tasks(store, spins, si, sj, occ_block, comm) if comm.size > 1
                else _local_tasks(store, spins, si, sj, occ_block)) for si, sj, _ in channels]
    done = [0, sum(count for count, _ in streams)]
    result = PairEnergies(block_pairs=done[1], channels=[label for *_, label in channels])
    parts = []
    for (si, sj, _), (_, tasks) in zip(channels, streams):
        os_, xx = _channel(device, spins, si, sj, tasks, progress, done)
        parts.append((comm.allreduce(os_, "reduce"), None if xx is None else comm.allreduce(xx, "reduce")))
    return assemble(parts, result)


def channel_labels(nspins: int) -> list[str]:
    """The pair step's channels: one for RHF, the two same-spin ones and the opposite-spin one for UHF."""
    return ["rhf"] if nspins == 1 else ["alpha-alpha", "beta-beta", "alpha-beta"]


def assemble(parts: list[tuple[np.ndarray, np.ndarray | None]], result: PairEnergies) -> PairEnergies:
    """E_os, E_ss and the pair matrices into ``result`` from each channel's per-pair (os, x) (the order of
    :func:`channel_labels`; same-spin matrices read on and above the diagonal, i ≤ j, the opposite-spin
    one whole, α-i by β-j): the one place the pair sums become energies, for the pair step and for a
    gradient's sweep that summed them (:mod:`mp2trn.grad.densities`)."""
    if len(parts) == 1:
        os_, xx = np.triu(parts[0][0]), np.triu(parts[0][1])
        weight = 2.0 * np.triu(np.ones_like(os_), 1) + np.eye(os_.shape[0])
        result.e_os = float(np.sum(weight * os_))
        result.e_ss = float(np.sum(weight * (os_ - xx)))
        # pair energies e_ij (i <= j, Hartree): os and ss parts of the full (2T - Tᵀ) contraction
        result.pair_os = [weight * os_]
        result.pair_ss = [weight * (os_ - xx)]
        return result
    for os_, xx in parts[:2]:
        ss = np.triu(os_ - xx, 1)
        result.e_ss += float(np.sum(ss))
        result.pair_os.append(np.zeros_like(ss))
        result.pair_ss.append(ss)
    os_ = parts[2][0]
    result.e_os = float(np.sum(os_))
    result.pair_os.append(os_)
    result.pair_ss.append(np.zeros_like(os_))
    return result


def _ring_share(r: int, q: int, step: int, size: int, rows: list, cols: list, same: bool) -> list[tuple[Any, list]]:
    """At ring ``step``, which blocks of rank ``q = r + step`` rank ``r`` pairs with which of its own:
    [(q's block, [r's blocks])], only entries with work. Opposite spins: everything. Same spin (the pair
    {r, q} meets twice, at steps s and N − s): below N/2 the whole rectangle, above it nothing, and at the
    middle step of an even N a checkerboard — the lower rank takes block pairs (i, j) with i + j even,
    counted in its own (i) and q's (j) block order, the higher rank the odd ones."""
    if not same or 2 * step < size:
        return [(c, list(rows)) for c in cols] if rows else []
    if 2 * step > size:
        return []
    parity = 0 if r < q else 1
    # r < q: i indexes r's blocks (rows), j q's (cols); r > q: q's blocks are the i side
    share = [(c, [x for k, x in enumerate(rows) if (k + jc) % 2 == parity]) for jc, c in enumerate(cols)]
    return [(c, mine) for c, mine in share if mine]


def ring_tasks(store, spins: list[SpinOrbitals], si: int, sj: int, occ_block: int, comm: Comm):
    """This rank's block pairs of channel (si, sj) when B is shared by occupied orbitals over ranks.

    Rank r holds B for its occupied range. At ring step s it pairs its blocks with those of rank
    q = (r + s) mod N, received one block at a time while it sends its own blocks to rank (r − s) mod N
    (which needs them at the same step), so a rank holds its share plus one block in flight. All ranks
    go through the same number of rounds per step (:meth:`Comm.shift` may be a collective). Step 0 (its
    own blocks) is the single-rank triangle for the same spin. Returns (count, iterator of :data:`Task`).
    """
    r, n = comm.rank, comm.size
    a, b = spins[si], spins[sj]
    same = si == sj
    def rank_blocks(spin: int, rank: int) -> list[tuple[int, int]]:
        lo, hi = store.occ_range(spin, rank)
        return [(lo + i0, lo + i1) for i0, i1 in _blocks(hi - lo, occ_block)]

    blocks_i = [rank_blocks(si, p) for p in range(n)]
    blocks_j = [rank_blocks(sj, p) for p in range(n)]

    def plan(p: int, step: int) -> tuple[list, list]:
        """Rank p at ``step``: its work with rank p + step's blocks, and the blocks of its own that rank
        p − step needs (in that rank's order)."""
        q, d = (p + step) % n, (p - step) % n
        work = _ring_share(p, q, step, n, blocks_i[p], blocks_j[q], same)
        wanted = [c for c, _ in _ring_share(d, p, step, n, blocks_i[d], blocks_j[p], same)] if step else []
        return work, wanted

    steps = []
    count = 0
    for step in range(n):
        if same and step == 0:
            mine = blocks_i[r]
            pairs = [(x, y) for k, x in enumerate(mine) for y in mine[k:]]
            steps.append((pairs, [], 0))
            count += len(pairs)
            continue
        work, wanted = plan(r, step)
        # every rank takes part in every round of a step (collective transports need lockstep)
        rounds = max(max(len(w), len(x)) for w, x in (plan(p, step) for p in range(n))) if step else len(work)
        steps.append((work, wanted, rounds))
        count += sum(len(rows) for _, rows in work)
    widest = max((j1 - j0 for blocks in blocks_j for j0, j1 in blocks), default=0)
    capacity = store.naux * widest * b.nvir   # elements of the largest B block any rank passes

    def tasks():
        for step, (work, wanted, rounds) in enumerate(steps):
            if same and step == 0:
                for (i0, i1), (j0, j1) in work:
                    b_j = None if i0 == j0 else store.occ_block(sj, b.nvir, j0, j1)
                    yield (i0, i1), store.occ_block(si, a.nvir, i0, i1), (j0, j1), b_j
                continue
            for c in range(rounds):
                if step == 0:   # opposite spins, own β blocks: nothing to pass
                    b_j = store.occ_block(sj, b.nvir, *work[c][0])
                else:
                    send = store.occ_block(sj, b.nvir, *wanted[c]) if c < len(wanted) else None
                    shape = (store.naux, work[c][0][1] - work[c][0][0], b.nvir) if c < len(work) else None
                    b_j = comm.shift(send, step, shape, store.dtype, capacity, "pairs")
                if b_j is None:
                    continue
                for i0, i1 in work[c][1]:
                    yield (i0, i1), store.occ_block(si, a.nvir, i0, i1), work[c][0], b_j

    return count, tasks()
