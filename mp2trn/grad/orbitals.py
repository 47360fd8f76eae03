"""The orbitals of a gradient run, one :class:`Channel` per spin channel (RHF: one, standing for both)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..orbitals import FrozenSelection, _per_spin, is_uhf


#: frozen and active occupied orbitals closer than this (Eh) are one degenerate set
DEGENERATE = 1e-6


@dataclass
class Channel:
    """All MOs of one spin channel and where each kind sits: ``occ`` every occupied orbital, ``core`` the
    frozen occupied ones, ``act`` the correlated occupied ones, ``vir`` the virtual ones (indices into the
    MO columns of ``c``). ``weight``: spins the channel stands for (2 for RHF)."""

    label: str
    weight: float
    c: np.ndarray        # (nao, nmo)
    e: np.ndarray        # (nmo,) Hartree
    occ: np.ndarray
    core: np.ndarray
    act: np.ndarray
    vir: np.ndarray

    @property
    def nmo(self) -> int:
        return self.c.shape[1]

    @property
    def nact(self) -> int:
        return len(self.act)

    @property
    def nvir(self) -> int:
        return len(self.vir)


def channels(mf, frozen: FrozenSelection) -> list[Channel]:
    """The channels of ``mf`` with ``frozen`` orbitals; frozen virtual orbitals are refused."""
    uhf = is_uhf(mf)
    labels = ("alpha", "beta") if uhf else ("",)
    out = []
    for label, c, e, occ, fz in zip(labels, _per_spin(mf, "mo_coeff"), _per_spin(mf, "mo_energy"),
                                    _per_spin(mf, "mo_occ"), frozen.per_spin):
        occupied = np.flatnonzero(occ > 0)
        frozen_set = set(int(i) for i in fz)
        if any(occ[i] == 0 for i in frozen_set):
            raise InputError("gradients with frozen virtual orbitals are not supported; freeze core orbitals only "
                             "(--frozen auto or a number)")
        core = np.array([i for i in occupied if i in frozen_set], dtype=int)
        act = np.array([i for i in occupied if i not in frozen_set], dtype=int)
        if len(core) and len(act):
            gap = float(np.min(np.abs(e[core][:, None] - e[act][None, :])))
            if gap < DEGENERATE:   # the core-active response divides by ε_I − ε_j
                raise InputError(f"the frozen orbitals split a degenerate set (a frozen and an active orbital {gap:.1e} Eh "
                                 "apart): the frozen-core energy depends on an arbitrary rotation and has no gradient; "
                                 "freeze whole shells (--frozen-core auto)")
        out.append(Channel(label, 1.0 if uhf else 2.0, c, e, occupied, core, act, np.flatnonzero(occ == 0)))
    return out
