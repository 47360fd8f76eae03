"""Which orbitals MP2 correlates: frozen-core selection and the active orbitals of each spin channel.

RHF has one spin channel (label ""), UHF two ("alpha", "beta"). Frozen orbitals are chosen per
channel from a :data:`~mp2trn.options.Frozen` value; the active occupied and virtual coefficients and
energies of each channel form a :class:`SpinOrbitals`, the unit every later stage works on.

ROHF enters as two channels too, through :func:`semicanonical` (ROHF-MBPT(2): Lauderdale, Stanton,
Gauss, Watts & Bartlett, Chem. Phys. Lett. 187, 21 (1991); the same second-order energy as the RMP2 of
Knowles, Andrews, Amos, Handy & Pople, Chem. Phys. Lett. 186, 130 (1991)). Each spin's Fock matrix
F^σ = h + J[D^α + D^β] − K[D^σ], built from the ROHF density, is diagonalised within that spin's
occupied orbitals (α: doubly and singly occupied; β: doubly occupied) and within its virtual orbitals.
The semicanonical orbitals keep the ROHF determinant; the occupied–virtual blocks f^σ_ia they leave are
not zero (ROHF is no eigenfunction of either spin's Fock operator) and give the singles energy
Σ_σ Σ_ia |f^σ_ia|² / (ε_i − ε_a). As in Psi4's DF-MP2, the whole occupied and virtual spaces are made
semicanonical first and frozen orbitals are then the lowest semicanonical ones of each spin.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from pyscf import dft, gto, scf
from pyscf.data import elements

from .errors import InputError
from .options import Frozen, parse_frozen


@dataclass
class SpinOrbitals:
    """The orbitals of one spin channel, the one description the energy and the gradient share.

    ``c`` (nao, nmo) every MO of the channel and ``e`` (nmo,) their energies (Hartree); index arrays into
    those columns say where each kind sits: ``occ`` every occupied orbital, ``core`` the frozen occupied
    ones, ``act`` the correlated occupied ones, ``vir`` the correlated virtual ones (frozen virtuals are in
    none of them). ``weight``: the spins the channel stands for (2 for RHF's one channel, else 1).
    ``f_ov``: the channel's Fock matrix between its active occupied and virtual orbitals (nact, nvir),
    Hartree — None where it vanishes (canonical RHF/UHF orbitals); set for semicanonical ROHF orbitals."""

    label: str  # "" (RHF), "alpha" or "beta"
    weight: float
    c: np.ndarray
    e: np.ndarray
    occ: np.ndarray
    core: np.ndarray
    act: np.ndarray
    vir: np.ndarray
    f_ov: np.ndarray | None = None

    @classmethod
    def from_active(cls, label: str, c_occ: np.ndarray, c_vir: np.ndarray, e_occ: np.ndarray,
                    e_vir: np.ndarray, f_ov: np.ndarray | None = None) -> SpinOrbitals:
        """A channel of active orbitals only (no frozen ones): occupied columns first, then virtual."""
        nocc, nvir = c_occ.shape[1], c_vir.shape[1]
        act = np.arange(nocc)
        return cls(label, 2.0 if label == "" else 1.0, np.hstack([c_occ, c_vir]), np.concatenate([e_occ, e_vir]),
                   act, np.arange(0), act, np.arange(nocc, nocc + nvir), f_ov)

    @cached_property
    def c_occ(self) -> np.ndarray:
        """(nao, nact) active occupied coefficients."""
        return self.c[:, self.act]

    @cached_property
    def c_vir(self) -> np.ndarray:
        """(nao, nvir) active virtual coefficients."""
        return self.c[:, self.vir]

    @property
    def e_occ(self) -> np.ndarray:
        return self.e[self.act]

    @property
    def e_vir(self) -> np.ndarray:
        return self.e[self.vir]

    @property
    def nmo(self) -> int:
        return self.c.shape[1]

    @property
    def nocc(self) -> int:
        """Active (correlated) occupied orbitals."""
        return len(self.act)

    nact = nocc

    @property
    def nvir(self) -> int:
        return len(self.vir)


@dataclass(frozen=True)
class FrozenSelection:
    """Frozen orbital indices per spin channel and a printable description."""

    per_spin: list[list[int]]
    text: str

    @property
    def count(self) -> int:
        """Orbitals frozen in the first channel (PySCF's ``frozen=N`` for RHF/UHF alike)."""
        return len(self.per_spin[0])


#: the references mp2trn correlates, as results and JSON name them
REFERENCES = ("RHF", "UHF", "ROHF")


def reference_of(mf) -> str:
    """"RHF", "UHF" or "ROHF": the kind of the converged SCF ``mf`` (Kohn–Sham objects by their orbitals'
    spin treatment). ROHF is tested first: PySCF's ROHF is a subclass of its RHF."""
    if isinstance(mf, Semicanonical) or isinstance(mf, scf.rohf.ROHF):
        return "ROHF"
    return "UHF" if isinstance(mf, scf.uhf.UHF) else "RHF"


def is_uhf(mf) -> bool:
    """True for two spin channels (UHF, or ROHF made :func:`semicanonical`), False for RHF. A bare ROHF
    object is refused (an InputError): the stages that call this take it only made semicanonical."""
    if isinstance(mf, Semicanonical):
        return True
    if isinstance(mf, scf.rohf.ROHF):
        raise InputError("this stage takes RHF or UHF orbitals; an ROHF reference enters as its semicanonical "
                         "orbitals (mp2trn.orbitals.reference_orbitals)")
    return isinstance(mf, scf.uhf.UHF)


def _per_spin(mf, attr: str) -> list[np.ndarray]:
    value = getattr(mf, attr)
    return [np.asarray(value[0]), np.asarray(value[1])] if is_uhf(mf) else [np.asarray(value)]


@dataclass(frozen=True)
class Semicanonical:
    """An ROHF reference as two spin channels of semicanonical orbitals, shaped like PySCF's UHF arrays.

    mo_coeff (2, nao, nmo), mo_energy (2, nmo) Hartree (diagonal of F^σ in these orbitals), mo_occ (2, nmo)
    (1 or 0; each channel's occupied orbitals first, both blocks in ascending energy); fock_ov per spin
    (nocc_σ, nvir_σ) Hartree, the occupied–virtual block of F^σ. ``mf``: the ROHF object it came from."""

    mf: Any
    mo_coeff: np.ndarray
    mo_energy: np.ndarray
    mo_occ: np.ndarray
    fock_ov: tuple[np.ndarray, np.ndarray]

    @property
    def mol(self) -> gto.Mole:
        return self.mf.mol


def rohf_spin_fock(mf) -> tuple[np.ndarray, np.ndarray]:
    """F^α, F^β (nao, nao) of the ROHF object ``mf`` from the density of its orbitals: h + J − K^σ with
    the SCF's own J/K (one build; the device's when the SCF's ran there)."""
    dm = mf.make_rdm1()
    vhf = mf.get_veff(mf.mol, dm)
    h1e = mf.get_hcore()
    return h1e + vhf[0], h1e + vhf[1]


def semicanonical(mf) -> Semicanonical:
    """The semicanonical orbitals of the converged ROHF ``mf`` (see the module docstring)."""
    if not isinstance(mf, scf.rohf.ROHF) or isinstance(mf, dft.rks.KohnShamDFT):
        raise InputError("semicanonical orbitals are made from an ROHF reference (PySCF's scf.ROHF)")
    c, occ = np.asarray(mf.mo_coeff), np.asarray(mf.mo_occ)
    coeffs, energies, occs, blocks = [], [], [], []
    for fock_ao, occupied in zip(rohf_spin_fock(mf), (occ > 0, occ > 1.5)):
        fock = c.T @ fock_ao @ c
        o, v = np.flatnonzero(occupied), np.flatnonzero(~occupied)
        e_o, u_o = np.linalg.eigh(fock[np.ix_(o, o)])
        e_v, u_v = np.linalg.eigh(fock[np.ix_(v, v)])
        coeffs.append(np.hstack([c[:, o] @ u_o, c[:, v] @ u_v]))
        energies.append(np.concatenate([e_o, e_v]))
        occs.append(np.concatenate([np.ones(len(o)), np.zeros(len(v))]))
        blocks.append(u_o.T @ fock[np.ix_(o, v)] @ u_v)
    return Semicanonical(mf, np.array(coeffs), np.array(energies), np.array(occs), (blocks[0], blocks[1]))


def reference_orbitals(mf):
    """What the orbital stages work on: ``mf`` itself for RHF/UHF, its :func:`semicanonical` orbitals for ROHF."""
    return semicanonical(mf) if reference_of(mf) == "ROHF" and not isinstance(mf, Semicanonical) else mf


def spin_square(mf) -> float:
    """⟨S²⟩ of the SCF determinant (exact S(S+1) for RHF/ROHF; UHF shows its spin contamination)."""
    orbs = reference_orbitals(mf)
    if not is_uhf(orbs):
        return 0.0
    s1e = orbs.mol.intor_symmetric("int1e_ovlp")
    c_occ = [c[:, o > 0] for c, o in zip(_per_spin(orbs, "mo_coeff"), _per_spin(orbs, "mo_occ"))]
    return float(scf.uhf.spin_square((c_occ[0], c_occ[1]), s1e)[0])


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
    """The spin channels of ``mf`` with ``frozen`` orbitals left out of the active sets (with the
    occupied–virtual Fock block for semicanonical ROHF orbitals)."""
    uhf = is_uhf(mf)
    labels = ("alpha", "beta") if uhf else ("",)
    fock_ov = mf.fock_ov if isinstance(mf, Semicanonical) else (None, None)
    channels = zip(labels, _per_spin(mf, "mo_coeff"), _per_spin(mf, "mo_energy"), _per_spin(mf, "mo_occ"),
                   frozen.per_spin, fock_ov)
    out = []
    for label, c, e, occ, fz, f_ov in channels:
        skip = set(int(i) for i in fz)
        occupied = np.flatnonzero(occ > 0)
        core = np.array([p for p in occupied if p in skip], dtype=int)
        io = np.array([p for p in occupied if p not in skip], dtype=int)
        iv = np.array([p for p in range(len(occ)) if occ[p] == 0 and p not in skip], dtype=int)
        if f_ov is not None:   # semicanonical channels hold their occupied orbitals first
            f_ov = f_ov[np.ix_(io, iv - len(occupied))]
        out.append(SpinOrbitals(label, 1.0 if uhf else 2.0, c, e, occupied, core, io, iv, f_ov))
    return out
