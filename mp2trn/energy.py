"""Pair-energy step: loop over blocks of occupied pairs, let the device form and reduce T, and sum
the per-pair results in fp64 on the host.

RHF (one channel):  E_os = Σ_ij os_ij,  E_ss = Σ_ij (os_ij − x_ij), over i ≤ j blocks with weight 2 for
i < j (T_ji = T_ijᵀ gives the same sums). UHF: αα and ββ give E_ss = Σ_{i<j} (os_ij − x_ij) per spin;
αβ gives E_os = Σ_ij os_ij over all α-i, β-j pairs. (os, x as in ``Device.pair_energies``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .devices.base import Device
from .orbitals import SpinOrbitals
from .progress import Progress
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


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    """``n`` occupied orbitals in blocks of at most ``size``, as equal as possible (46 by 9: five of 8 and
    one of 6, not five of 9 and one of 1) — so devices that pad the last block to one kernel signature
    (NKI) waste little."""
    count = -(-n // max(size, 1)) if n else 0
    even = -(-n // count) if count else size
    return [(i, min(n, i + even)) for i in range(0, n, even)]


def _channel(
    store: BStore, device: Device, spins: list[SpinOrbitals], si: int, sj: int, occ_block: int, progress, done_total
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Per-pair os and x for channel (si, sj); same-spin channels only fill i ≤ j."""
    a, b = spins[si], spins[sj]
    same = si == sj
    os_ = np.zeros((a.nocc, b.nocc))
    xx = np.zeros_like(os_) if same else None
    iblocks, jblocks = _blocks(a.nocc, occ_block), _blocks(b.nocc, occ_block)
    count = 0
    for bi, (i0, i1) in enumerate(iblocks):
        b_i = store.occ_block(si, a.nvir, i0, i1)
        for bj, (j0, j1) in enumerate(jblocks):
            if same and bj < bi:
                continue
            b_j = None if (same and bi == bj) else store.occ_block(sj, b.nvir, j0, j1)
            o, x = device.pair_energies(b_i, b_j, a.e_occ[i0:i1], b.e_occ[j0:j1], a.e_vir, b.e_vir, exchange=same)
            os_[i0:i1, j0:j1] = o
            if same:
                xx[i0:i1, j0:j1] = x
            count += 1
            done_total[0] += 1
            check_stopped()  # a signal swallowed inside a library call still ends the run within a block
            if progress:
                progress("pairs", done_total[0], done_total[1])
    if same:  # blocks below the diagonal were never formed; keep only i <= j
        os_ = np.triu(os_)
        xx = np.triu(xx)
    return os_, xx, count


def pair_energies(
    store: BStore,
    spins: list[SpinOrbitals],
    device: Device,
    occ_block: int,
    progress: Progress | None = None,
) -> PairEnergies:
    """Compute E_os and E_ss for RHF (one channel) or UHF (alpha, beta channels)."""
    result = PairEnergies()
    nb = [len(_blocks(s.nocc, occ_block)) for s in spins]
    if len(spins) == 1:
        total = nb[0] * (nb[0] + 1) // 2
        done = [0, total]
        os_, xx, count = _channel(store, device, spins, 0, 0, occ_block, progress, done)
        weight = 2.0 * np.triu(np.ones_like(os_), 1) + np.eye(os_.shape[0])
        result.e_os = float(np.sum(weight * os_))
        result.e_ss = float(np.sum(weight * (os_ - xx)))
        # pair energies e_ij (i <= j, Hartree): os and ss parts of the full (2T - Tᵀ) contraction
        result.pair_os = [weight * os_]
        result.pair_ss = [weight * (os_ - xx)]
        result.channels = ["rhf"]
        result.block_pairs = count
        return result
    total = sum(n * (n + 1) // 2 for n in nb) + nb[0] * nb[1]
    done = [0, total]
    for s, label in ((0, "alpha-alpha"), (1, "beta-beta")):
        os_, xx, count = _channel(store, device, spins, s, s, occ_block, progress, done)
        ss = np.triu(os_ - xx, 1)
        result.e_ss += float(np.sum(ss))
        result.pair_os.append(np.zeros_like(ss))
        result.pair_ss.append(ss)
        result.channels.append(label)
        result.block_pairs += count
    os_, _, count = _channel(store, device, spins, 0, 1, occ_block, progress, done)
    result.e_os = float(np.sum(os_))
    result.pair_os.append(os_)
    result.pair_ss.append(np.zeros_like(os_))
    result.channels.append("alpha-beta")
    result.block_pairs += count
    return result
