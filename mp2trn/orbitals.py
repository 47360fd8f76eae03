"""Which orbitals MP2 correlates: frozen-core selection and the active orbitals of each spin channel.

RHF has one spin channel (label ""), UHF two ("alpha", "beta"). Frozen orbitals are chosen per
channel from a :data:`~mp2trn.options.Frozen` value; the active occupied and virtual coefficients and
energies of each channel form a :class:`SpinOrbitals`, the unit every later stage works on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyscf import gto, scf
from pyscf.data import elements

from .errors import InputError
from .options import Frozen, parse_frozen


@dataclass
class SpinOrbitals:
    """Active orbitals of one spin channel: coefficients (nao, n) and energies (Hartree)."""

    label: str  # "" (RHF), "alpha" or "beta"
    c_occ: np.ndarray
    c_vir: np.ndarray
    e_occ: np.ndarray
    e_vir: np.ndarray

    @property
    def nocc(self) -> int:
        return self.c_occ.shape[1]

    @property
    def nvir(self) -> int:
        return self.c_vir.shape[1]


@dataclass(frozen=True)
class FrozenSelection:
    """Frozen orbital indices per spin channel and a printable description."""

    per_spin: list[list[int]]
    text: str

    @property
    def count(self) -> int:
        """Orbitals frozen in the first channel (PySCF's ``frozen=N`` for RHF/UHF alike)."""
        return len(self.per_spin[0])


def is_uhf(mf) -> bool:
    """True for UHF, False for RHF; ROHF is refused (an InputError)."""
    if isinstance(mf, scf.rohf.ROHF):
        raise InputError("ROHF references are not supported; use UHF for open shells")
    return isinstance(mf, scf.uhf.UHF)


def _per_spin(mf, attr: str) -> list[np.ndarray]:
    value = getattr(mf, attr)
    return [np.asarray(value[0]), np.asarray(value[1])] if is_uhf(mf) else [np.asarray(value)]


def auto_frozen_count(mol: gto.Mole, nocc_min: int) -> int:
    """Noble-gas cores (PySCF's chemcore: ECP-aware, ghosts excluded), never all occupied orbitals.

    Charge-aware: for highly charged species whose core count would leave no active occupied orbital
    in some spin channel, nothing is frozen.
    """
    ncore = int(elements.chemcore(mol))
    return ncore if ncore < nocc_min else 0


def select_frozen(mf, frozen: Frozen) -> FrozenSelection:
    """Frozen orbitals per spin channel of ``mf`` for the user's choice ``frozen``."""
    frozen = parse_frozen(frozen)
    occ = _per_spin(mf, "mo_occ")
    nspin = len(occ)
    nocc = [int(np.count_nonzero(o > 0)) for o in occ]
    nmo = len(occ[0])
    if frozen is None:
        return FrozenSelection([[] for _ in range(nspin)], "none")
    if frozen == "auto":
        n = auto_frozen_count(mf.mol, min(nocc))
        return FrozenSelection([list(range(n)) for _ in range(nspin)],
                               f"auto ({n} core orbital{'s' if n != 1 else ''} per spin)")
    if isinstance(frozen, int):
        if frozen >= min(nocc):
            raise InputError(f"cannot freeze {frozen} orbitals: there are {min(nocc)} occupied orbitals per spin")
        return FrozenSelection([list(range(frozen)) for _ in range(nspin)],
                               f"{frozen} lowest orbital{'s' if frozen != 1 else ''} per spin")
    nested = bool(frozen) and isinstance(frozen[0], tuple)
    per_spin = [list(x) for x in frozen] if nested else [list(frozen)] * nspin
    if len(per_spin) != nspin:
        raise InputError(f"frozen lists: expected {nspin} (one per spin), got {len(per_spin)}")
    for s, idx in enumerate(per_spin):
        bad = [i for i in idx if not 0 <= i < nmo]
        if bad:
            raise InputError(f"frozen orbital indices out of range 0..{nmo - 1}: {bad}")
        if sum(1 for i in set(idx) if occ[s][i] > 0) >= nocc[s]:
            raise InputError("frozen list freezes every occupied orbital")
    return FrozenSelection(per_spin, "orbitals " + "; ".join(",".join(map(str, sorted(set(i)))) for i in per_spin))


def spin_orbitals(mf, frozen: FrozenSelection) -> list[SpinOrbitals]:
    """Active occupied/virtual coefficients and energies per spin channel."""
    labels = ("alpha", "beta") if is_uhf(mf) else ("",)
    channels = zip(labels, _per_spin(mf, "mo_coeff"), _per_spin(mf, "mo_energy"), _per_spin(mf, "mo_occ"),
                   frozen.per_spin)
    out = []
    for label, c, e, occ, fz in channels:
        skip = set(fz)
        io = [p for p in range(len(occ)) if occ[p] > 0 and p not in skip]
        iv = [p for p in range(len(occ)) if occ[p] == 0 and p not in skip]
        out.append(SpinOrbitals(label, c[:, io], c[:, iv], e[io], e[iv]))
    return out
