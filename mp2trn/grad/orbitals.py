"""The orbitals of a gradient run: the energy's :class:`~mp2trn.orbitals.SpinOrbitals`, checked for what
the gradient can differentiate (RHF: one channel standing for both spins)."""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from ..orbitals import FrozenSelection, SpinOrbitals, spin_orbitals


#: frozen and active occupied orbitals closer than this (Eh) are one degenerate set
DEGENERATE = 1e-6


def channels(mf, frozen: FrozenSelection) -> list[SpinOrbitals]:
    """The spin channels of ``mf`` with ``frozen`` orbitals; frozen virtual orbitals are refused, and so is
    a frozen-core split through a degenerate set (the core–active response divides by ε_I − ε_j)."""
    out = spin_orbitals(mf, frozen)
    for ch in out:
        if len(ch.occ) + len(ch.vir) != ch.nmo:
            raise InputError("gradients with frozen virtual orbitals are not supported; freeze core orbitals only "
                             "(--frozen auto or a number)")
        if len(ch.core) and len(ch.act):
            gap = float(np.min(np.abs(ch.e[ch.core][:, None] - ch.e[ch.act][None, :])))
            if gap < DEGENERATE:
                raise InputError(f"the frozen orbitals split a degenerate set (a frozen and an active orbital {gap:.1e} Eh "
                                 "apart): the frozen-core energy depends on an arbitrary rotation and has no gradient; "
                                 "freeze whole shells (--frozen-core auto)")
    return out
