"""Gradient stage 1: the pair sweep that builds the unrelaxed MP2 densities and the 3-index 2PDM.

From B = L⁻¹(P|ia) (per spin, as the energy builds it) the device forms the amplitudes strip by strip —
every occupied orbital i against a block K of occupied orbitals k — and returns per strip the
contractions of :meth:`mp2trn.devices.base.Device.pair_densities`. A strip gives the 2PDM rows of its
block K completely, so Γ̄ is written once per block (in memory, or in HDF5 beside B when it does not fit).

Per spin σ, in the spin-orbital convention (an RHF run keeps one channel standing for both spins):

    P^σ_ij = −Σ c·τ t̃ over pairs,  P^σ_ab = +Σ c·τ t̃,   Γ̄^σ_Q,kb = 2 Σ_ia t̃_ik^ab B_Q,ia

with t̃ = (c_os + c_ss) τ − c_ss τᵀ for RHF, c_ss (τ − τᵀ) for same-spin and c_os τ for opposite-spin
UHF pairs (Weigend & Häser, Theor. Chem. Acc. 97, 331 (1997); DiStasio et al., J. Comput. Chem. 28, 839
(2007)). Γ̄ is in the orthonormal fitting basis; :mod:`mp2trn.grad.ri` turns it back with L⁻ᵀ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..devices.base import Device, PairDensities
from ..energy import PairEnergies, _blocks, assemble, channel_labels
from ..orbitals import SpinOrbitals
from ..parallel import Comm
from ..progress import Progress
from ..scratch import check_stopped
from ..transform import BStore


@dataclass
class UnrelaxedDensities:
    """Per spin channel: P_ij (active occupied, nocc×nocc), P_ab (nvir×nvir), and Γ̄ in ``gamma``
    ((naux, nocc·nvir) per channel, orthonormal fitting basis)."""

    p_occ: list[np.ndarray]
    p_vir: list[np.ndarray]
    gamma: BStore
    strips: int
    #: the MP2 pair energies summed from the sweep's own amplitudes (with ``energies``), else None
    energies: PairEnergies | None = None


def strip_tasks(spins: list[SpinOrbitals], c_os: float, c_ss: float) -> list[tuple[int, int, float, float, bool, bool]]:
    """The strips' spin cases: (spin of the i side, spin of the k block, c_direct, c_exch, whether to take the
    i side's virtual density, whether to make and take the k side's).

    RHF: one case. UHF: same-spin pairs per spin, and the opposite-spin pairs twice — once with the k block
    on each side, because a strip completes only its own block's Γ̄ rows and its i side's P_ij; the virtual
    densities are taken from the first pass only."""
    if len(spins) == 1:
        return [(0, 0, c_os + c_ss, c_ss, True, False)]
    cases = []
    for s in (0, 1):
        if c_ss:
            cases.append((s, s, c_ss, c_ss, True, False))
        if c_os:
            cases.append((1 - s, s, c_os, 0.0, s == 0, s == 0))
    return cases


def gives_energies(nspins: int, c_os: float, c_ss: float) -> bool:
    """Whether the sweep's strips (:func:`strip_tasks`) meet every pair sum the MP2 energy reports: E_ss
    needs each same-spin pair's exchange sum, which a strip sums where its t̃ takes τᵀ (c_exch = c_ss ≠ 0;
    a UHF sweep runs no same-spin strip without c_ss), and a UHF sweep runs no opposite-spin strip without
    c_os."""
    return bool(c_ss) and (nspins == 1 or bool(c_os))


def sweep(store: BStore, spins: list[SpinOrbitals], device: Device, occ_block: int, c_os: float, c_ss: float,
          gamma: BStore, progress: Progress | None = None, comm: Comm | None = None,
          pair_block: int = 0, energies: bool = False) -> UnrelaxedDensities:
    """Run every strip on ``device``; fill ``gamma`` and return the unrelaxed densities.

    ``energies`` (one rank, a device with :attr:`~mp2trn.devices.Device.sweep_energies`, and
    :func:`gives_energies`): also the MP2 pair energies, summed by the device from the amplitudes each
    strip forms anyway — per pair os = Σ_ab T·τ and, same spin, x = Σ_ab T_ab τ_ba — so that a gradient run
    needs no pair step of its own for the energy (the amplitudes are not formed twice). The opposite-spin
    pairs of UHF are taken from the first of their two passes.

    ``pair_block`` 0: a strip reads B of every occupied orbital i of one spin at once. Else B is streamed in
    pairs of i blocks of ``pair_block`` orbitals (:func:`_pair_strip`), for a B that does not fit memory.
    With ``comm`` over several ranks each rank runs every size-th block (its Γ̄ columns; the others stay
    as they are, zero) and the densities are all-reduced; every rank holds the whole B."""
    comm = comm or Comm()
    if energies and (comm.size > 1 or not device.sweep_energies or not gives_energies(len(spins), c_os, c_ss)):
        raise ValueError("sweep: pair energies need one rank, a device that sums them and c_ss (and c_os for "
                         "UHF) non-zero")
    p_occ = [np.zeros((s.nocc, s.nocc)) for s in spins]
    p_vir = [np.zeros((s.nvir, s.nvir)) for s in spins]
    cases = strip_tasks(spins, c_os, c_ss)
    blocks = [_blocks(s.nocc, occ_block) for s in spins]
    mine = [(sk, k0, k1) for sk, kb in enumerate(blocks) for k0, k1 in kb]
    mine = mine[comm.rank :: comm.size]
    total = sum(1 for sk, *_ in mine for case in cases if case[1] == sk)
    done = 0
    # per channel of energy.channel_labels: (os, x) over ordered pairs, same spin; os α-i by β-k, opposite
    sums = ([(np.zeros((s.nocc, s.nocc)), np.zeros((s.nocc, s.nocc))) for s in spins]
            + ([(np.zeros((spins[0].nocc, spins[1].nocc)), None)] if len(spins) == 2 else [])) if energies else None
    for sk, k0, k1 in mine:              # one block of spin sk at a time: its Γ̄ rows are complete after it
        rows = None
        for si, sj, c_direct, c_exch, vir_all, vir_k in cases:
            if sj != sk:
                continue
            a, b = spins[si], spins[sk]
            b_k = store.occ_block(sk, b.nvir, k0, k1)
            args = (b_k, a.e_vir, b.e_vir, b.e_occ[k0:k1], c_direct, c_exch, vir_k)
            # opposite spins are swept twice (strip_tasks): their energies are taken from the first pass
            wanted = energies and (si == sk or vir_k)
            if pair_block and pair_block < a.nocc:
                out = _pair_strip(store, si, a, pair_block, device, *args, energies=wanted)
            else:
                out = device.pair_densities(store.occ_block(si, a.nvir, 0, a.nocc), b_k, a.e_occ, b.e_occ[k0:k1],
                                            a.e_vir, b.e_vir, c_direct, c_exch, vir_k, energies=wanted)
            if wanted and si == sk:
                os_, xx = sums[si]
                os_[:, k0:k1] = out.pair_os
                xx[:, k0:k1] = out.pair_x
            elif wanted:            # i of spin β (si = 1) against k of spin α: the α-β matrix's rows k0:k1
                sums[2][0][k0:k1, :] = out.pair_os.T
            p_occ[si] -= out.p_occ
            if vir_all:
                p_vir[si] += out.p_vir_all
            if out.p_vir_k is not None:
                p_vir[sk] += out.p_vir_k
            if rows is None:
                rows = 2.0 * out.gamma_k
            else:
                rows += 2.0 * out.gamma_k
            del out
            done += 1
            check_stopped()
            if progress:
                progress("gradient pairs", done, total)
        gamma.arrays[sk][:, k0 * spins[sk].nvir : k1 * spins[sk].nvir] = \
            np.asarray(rows).reshape(store_rows(gamma), -1)
        del rows
    p_occ = [comm.allreduce((p + p.T) / 2, "gradient") for p in p_occ]
    p_vir = [comm.allreduce((p + p.T) / 2, "gradient") for p in p_vir]
    pairs = None
    if energies:
        pairs = assemble(sums, PairEnergies(block_pairs=0, channels=channel_labels(len(spins))))
    return UnrelaxedDensities(p_occ, p_vir, gamma, total, pairs)


def _pair_strip(store: BStore, si: int, a: SpinOrbitals, block: int, device: Device, b_k: np.ndarray,
                ev_all: np.ndarray, ev_k: np.ndarray, e_k: np.ndarray, c_direct: float, c_exch: float,
                vir_k: bool, energies: bool = False) -> PairDensities:
    """One strip (every i of spin ``si`` against the block b_k) with B of the i side read as pairs of
    ``block``-orbital blocks I < J: each pair is one device call on [B_I; B_J].

    P_ij couples i and j through the amplitudes of both, so every pair of blocks must meet in one call; each
    block then takes part in n − 1 pairs (n blocks), so the pair calls' Γ̄ rows, P_ab and diagonal P_ij blocks
    are n − 1 times the strip's (summed, then divided), while each off-diagonal P_ij block comes from its one
    pair. The price: n − 1 times the amplitude work of a strip read whole."""
    edges = _blocks(a.nocc, block)
    if len(edges) < 2:
        edges = [(0, a.nocc)]
    repeats = max(1, len(edges) - 1)
    pairs = [(edges[x], edges[y]) for x in range(len(edges)) for y in range(x + 1, len(edges))] or [(edges[0], None)]
    gamma = p_vir_all = p_vir_k = None
    p_occ = np.zeros((a.nocc, a.nocc))
    # each pair's sums: every i block meets the strip in its n − 1 block pairs, summed, then divided as Γ̄
    pair_os = np.zeros((a.nocc, len(e_k))) if energies else None
    pair_x = np.zeros((a.nocc, len(e_k))) if energies and c_exch else None
    diagonal = np.zeros((a.nocc, a.nocc))
    buf = np.empty((store_rows(store), 2 * block if len(edges) > 1 else a.nocc, a.nvir), dtype=store.dtype)
    for first, second in pairs:
        parts = [first] + ([second] if second is not None else [])
        n = 0
        for i0, i1 in parts:
            store.read_occ_block(si, a.nvir, i0, i1, buf[:, n : n + i1 - i0])
            n += i1 - i0
        e_pair = np.concatenate([a.e_occ[i0:i1] for i0, i1 in parts])
        out = device.pair_densities(buf[:, :n], b_k, e_pair, e_k, ev_all, ev_k, c_direct, c_exch, vir_k,
                                    energies=energies)
        if energies:
            m = 0
            for i0, i1 in parts:
                pair_os[i0:i1] += out.pair_os[m : m + i1 - i0]
                if pair_x is not None:
                    pair_x[i0:i1] += out.pair_x[m : m + i1 - i0]
                m += i1 - i0
        gamma = out.gamma_k if gamma is None else gamma + out.gamma_k
        p_vir_all = out.p_vir_all if p_vir_all is None else p_vir_all + out.p_vir_all
        if out.p_vir_k is not None:
            p_vir_k = out.p_vir_k if p_vir_k is None else p_vir_k + out.p_vir_k
        (x0, x1), n0 = first, first[1] - first[0]
        diagonal[x0:x1, x0:x1] += out.p_occ[:n0, :n0]
        if second is not None:
            y0, y1 = second
            diagonal[y0:y1, y0:y1] += out.p_occ[n0:, n0:]
            p_occ[x0:x1, y0:y1] = out.p_occ[:n0, n0:]
            p_occ[y0:y1, x0:x1] = out.p_occ[n0:, :n0]
        del out
        check_stopped()
    p_occ += diagonal / repeats
    return PairDensities(gamma / repeats, p_occ, p_vir_all / repeats,
                         None if p_vir_k is None else p_vir_k / repeats,
                         None if pair_os is None else pair_os / repeats,
                         None if pair_x is None else pair_x / repeats)


def store_rows(store: BStore) -> int:
    """Rows (auxiliary functions) of a store's arrays."""
    return int(store.arrays[0].shape[0])
