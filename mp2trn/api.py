"""Python API in PySCF's style: ``mp2trn.DFMP2(mf, ...).run()`` and ``mp2trn.run(xyz, ...)``.

    from pyscf import gto, scf
    import mp2trn
    mf = scf.RHF(gto.M(atom="water.xyz", basis="cc-pvdz")).run()
    pt = mp2trn.DFMP2(mf, frozen="auto").run()
    pt.e_corr, pt.e_corr_os, pt.e_corr_ss, pt.e_scs, pt.e_tot, pt.timings
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from pyscf import gto, scf
from pyscf.data import elements

from .devices import Device, get_device
from .df import build_df, describe_basis, make_auxmol
from .energy import pair_energies
from .errors import InputError
from .memory import SpinShape, default_memory_mb, plan_blocks
from .molecule import build_mole
from .result import MP2Result, qcschema_molecule
from .scf import ScfOptions, check_converged, run_scf
from .transform import BStore, Progress, SpinOrbitals, build_b

Frozen = None | str | int | Sequence[int] | Sequence[Sequence[int]]


def _is_uhf(mf) -> bool:
    if isinstance(mf, scf.rohf.ROHF):
        raise InputError("ROHF references are not supported; use UHF for open shells")
    return isinstance(mf, scf.uhf.UHF)


def auto_frozen_count(mol: gto.Mole, nocc_min: int) -> int:
    """Noble-gas cores (PySCF's chemcore: ECP-aware, ghosts excluded), never all occupied orbitals.

    Charge-aware: for highly charged species whose core count would leave no active occupied orbital
    in some spin channel, nothing is frozen.
    """
    ncore = int(elements.chemcore(mol))
    return ncore if ncore < nocc_min else 0


def frozen_lists(mf, frozen: Frozen) -> tuple[list[list[int]], str]:
    """Frozen orbital indices per spin channel (1 for RHF, 2 for UHF) and a printable description."""
    uhf = _is_uhf(mf)
    nspin = 2 if uhf else 1
    occ = [np.asarray(mf.mo_occ[s] if uhf else mf.mo_occ) for s in range(nspin)]
    nocc = [int(np.count_nonzero(o > 0)) for o in occ]
    nmo = len(occ[0])
    if frozen is None or (isinstance(frozen, str) and frozen.lower() == "none"):
        return [[] for _ in range(nspin)], "none"
    if isinstance(frozen, str):
        key = frozen.strip().lower()
        if key == "auto":
            n = auto_frozen_count(mf.mol, min(nocc))
            return [list(range(n)) for _ in range(nspin)], f"auto ({n} core orbital{'s' if n != 1 else ''} per spin)"
        if key.lstrip("-").isdigit():
            frozen = int(key)
        else:
            raise InputError(f"frozen core {frozen!r} not understood: use auto, none or a number of orbitals")
    if isinstance(frozen, (int, np.integer)):
        n = int(frozen)
        if n < 0 or n >= min(nocc):
            raise InputError(f"cannot freeze {n} orbitals: there are {min(nocc)} occupied orbitals per spin")
        return [list(range(n)) for _ in range(nspin)], f"{n} lowest orbital{'s' if n != 1 else ''} per spin"
    items = list(frozen)
    per_spin = [list(map(int, x)) for x in items] if items and not np.isscalar(items[0]) else [list(map(int, items))] * nspin
    if len(per_spin) != nspin:
        raise InputError(f"frozen lists: expected {nspin} (one per spin), got {len(per_spin)}")
    for s, idx in enumerate(per_spin):
        bad = [i for i in idx if not 0 <= i < nmo]
        if bad:
            raise InputError(f"frozen orbital indices out of range 0..{nmo - 1}: {bad}")
        if sum(1 for i in set(idx) if occ[s][i] > 0) >= nocc[s]:
            raise InputError("frozen list freezes every occupied orbital")
    return per_spin, "orbitals " + "; ".join(",".join(map(str, sorted(set(idx)))) for idx in per_spin)


def spin_orbitals(mf, frozen: list[list[int]]) -> list[SpinOrbitals]:
    """Active occupied/virtual coefficients and energies per spin channel."""
    uhf = _is_uhf(mf)
    out = []
    labels = ("alpha", "beta") if uhf else ("",)
    for s, label in enumerate(labels):
        c = np.asarray(mf.mo_coeff[s] if uhf else mf.mo_coeff)
        e = np.asarray(mf.mo_energy[s] if uhf else mf.mo_energy)
        occ = np.asarray(mf.mo_occ[s] if uhf else mf.mo_occ)
        fz = set(frozen[s])
        io = [p for p in range(len(occ)) if occ[p] > 0 and p not in fz]
        iv = [p for p in range(len(occ)) if occ[p] == 0 and p not in fz]
        out.append(SpinOrbitals(label, c[:, io], c[:, iv], e[io], e[iv]))
    return out


class DFMP2:
    """Density-fitted MP2 on top of a converged PySCF RHF or UHF object.

    mf: converged ``scf.RHF``/``scf.UHF`` (density-fitted or not).
    auxbasis: MP2 fitting basis; None → ``make_auxbasis(mol, mp2fit=True)`` (never the JK basis).
    frozen: None/"none", "auto", an int N (lowest N per spin), or orbital indices (a list, or two for UHF).
    device: "cpu", "cuda", "sim", "neuron", "auto" or a Device; precision: "fp64"/"fp32"/... or None.
    max_memory: MB (None: mf.max_memory if set by the user, else PYSCF_MAX_MEMORY or 60 % of free RAM).
    After ``run()``: e_corr, e_corr_os, e_corr_ss, e_scs (SCS-MP2 total), e_scs_corr, e_tot, e_hf,
    timings (s), cost (modeled accelerator cost or None), result (MP2Result).
    """

    def __init__(
        self,
        mf,
        auxbasis: str | dict | None = None,
        frozen: Frozen = None,
        device: str | Device = "cpu",
        precision: str | None = None,
        max_memory: float | None = None,
        progress: Progress | None = None,
        device_options: dict[str, Any] | None = None,
        keep_pair_energies: bool = False,
    ):
        self._scf = mf
        self.mol = mf.mol
        self.auxbasis = auxbasis
        self.frozen = frozen
        self.device = device
        self.precision = precision
        self.max_memory = max_memory
        self.progress = progress
        self.device_options = device_options or {}
        self.keep_pair_energies = keep_pair_energies
        self.result: MP2Result | None = None
        self.extra_timings: dict[str, float] = {}

    # PySCF-style attribute access
    def _need(self) -> MP2Result:
        if self.result is None:
            raise RuntimeError("call .run() first")
        return self.result

    e_corr = property(lambda self: self._need().e_corr)
    e_corr_os = property(lambda self: self._need().e_corr_os)
    e_corr_ss = property(lambda self: self._need().e_corr_ss)
    e_scs = property(lambda self: self._need().e_scs)
    e_scs_corr = property(lambda self: self._need().e_scs_corr)
    e_tot = property(lambda self: self._need().e_tot)
    e_hf = property(lambda self: self._need().e_hf)
    timings = property(lambda self: self._need().timings)
    cost = property(lambda self: self._need().cost)

    def run(self) -> DFMP2:
        """Compute the DF-MP2 energy; returns self (PySCF style)."""
        t_start = time.perf_counter()
        mf = self._scf
        check_converged(mf)
        uhf = _is_uhf(mf)
        frozen, frozen_text = frozen_lists(mf, self.frozen)
        spins = spin_orbitals(mf, frozen)
        device = get_device(self.device, self.precision, **self.device_options)
        try:
            t0 = time.perf_counter()
            dfi = build_df(self.mol, self.auxbasis)
            t_df = time.perf_counter() - t0
            budget = self._budget_mb()
            plan = plan_blocks(
                self.mol.nao_nr(),
                dfi.naux,
                [SpinShape(s.nocc, s.nvir) for s in spins],
                dfi.max_aux_shell,
                budget,
                itemsize=device.storage_dtype.itemsize,
            )
            occ_block = plan.occ_block
            preferred = getattr(device, "preferred_occ_block", None)
            if preferred is not None:
                occ_block = max(1, min(occ_block, preferred(dfi.naux, max(s.nvir for s in spins))))
            if min(s.nocc for s in spins) == 0 or min(s.nvir for s in spins) == 0:
                raise InputError("no active occupied or virtual orbitals: nothing to correlate")
            with BStore(dfi.naux, spins, device.storage_dtype, plan.incore) as store:
                stage = build_b(dfi, spins, device, plan, store, self.progress)
                t0 = time.perf_counter()
                pairs = pair_energies(store, spins, device, occ_block, self.progress)
                t_pairs = time.perf_counter() - t0
            cost = device.cost_report()
            what_ran = device.describe()
            if getattr(device, "auto_reason", None):
                what_ran["device_selection"] = device.auto_reason
        finally:
            device.close()
        timings = {"df_setup": t_df, **stage, "pairs": t_pairs, **self.extra_timings}
        timings["mp2"] = time.perf_counter() - t_start
        what_ran.update(
            {
                "basis": describe_basis(self.mol.basis),
                "auxbasis": describe_basis(dfi.auxbasis),
                "jkbasis": _scf_jkbasis(mf),
                "frozen": frozen_text,
                "frozen_orbitals": frozen if uhf else frozen[0],
                "memory_mb": budget,
                "out_of_core": not plan.incore,
                "occ_block": occ_block,
                "aux_block": plan.aux_block,
                "pair_blocks": pairs.block_pairs,
            }
        )
        nelec = self.mol.nelec
        self.result = MP2Result(
            e_hf=float(mf.e_tot),
            e_corr_os=pairs.e_os,
            e_corr_ss=pairs.e_ss,
            reference="UHF" if uhf else "RHF",
            what_ran=what_ran,
            sizes={
                "natm": self.mol.natm,
                "nao": self.mol.nao_nr(),
                "nmo": int(np.asarray(mf.mo_energy).shape[-1]),
                "naux": dfi.naux,
                "nalpha": int(nelec[0]),
                "nbeta": int(nelec[1]),
                "nocc": [s.nocc for s in spins] if uhf else spins[0].nocc,
                "nvir": [s.nvir for s in spins] if uhf else spins[0].nvir,
            },
            timings=timings,
            cost=cost,
            molecule=qcschema_molecule(self.mol),
            pair_energies=[o + s for o, s in zip(pairs.pair_os, pairs.pair_ss)] if self.keep_pair_energies else None,
        )
        return self

    kernel = run

    def _budget_mb(self) -> float:
        if self.max_memory is not None:
            return float(self.max_memory)
        return default_memory_mb()


def _check_budget_before_scf(mol: gto.Mole, auxmol: gto.Mole, memory: float | None, device: Device) -> None:
    """Raise ResourceError before any heavy work when no block of the MP2 step can fit the budget.

    Uses the all-electron orbital counts (an upper bound: frozen orbitals only shrink the work).
    """
    nao = mol.nao_nr()
    spins = [SpinShape(max(1, n), max(1, nao - n)) for n in sorted(set(mol.nelec))]
    loc = auxmol.ao_loc_nr()
    plan_blocks(nao, auxmol.nao_nr(), spins, int(np.max(np.diff(loc))),
                memory if memory is not None else default_memory_mb(), itemsize=device.storage_dtype.itemsize)


def _scf_jkbasis(mf) -> str | None:
    with_df = getattr(mf, "with_df", None)
    if with_df is None:
        return None  # conventional integrals
    return describe_basis(with_df.auxbasis) if with_df.auxbasis else None


def run(
    source: str | os.PathLike | gto.Mole,
    basis: str = "cc-pvdz",
    auxbasis: str | None = None,
    charge: int | None = None,
    multiplicity: int | None = None,
    unit: str = "angstrom",
    frozen: Frozen = None,
    scf_df: bool = True,
    jkbasis: str | None = None,
    conv_tol: float = 1e-10,
    max_cycle: int = 100,
    device: str | Device = "cpu",
    precision: str | None = None,
    memory: float | None = None,
    progress: Progress | None = None,
    device_options: dict[str, Any] | None = None,
    keep_pair_energies: bool = False,
) -> MP2Result:
    """Molecule → SCF → DF-MP2 in one call; returns the MP2Result (``.e_tot``, ``.to_qcschema()``).

    ``source``: XYZ path, XYZ text, PySCF atom string or ``gto.Mole``. Units Angstrom unless ``unit``.
    """
    # validate cheap options before any heavy work
    device_obj = get_device(device, precision, **(device_options or {}))
    mol = build_mole(source, basis=basis, charge=charge, multiplicity=multiplicity, unit=unit)
    if memory is not None:
        mol.max_memory = memory
    auxmol, _ = make_auxmol(mol, auxbasis)  # an unusable aux basis is an error before the SCF, not after
    _check_budget_before_scf(mol, auxmol, memory, device_obj)
    t0 = time.perf_counter()
    if progress:
        progress("scf", 0, 1)
    mf = run_scf(mol, ScfOptions(density_fit=scf_df, jkbasis=jkbasis, conv_tol=conv_tol, max_cycle=max_cycle))
    t_scf = time.perf_counter() - t0
    if progress:
        progress("scf", 1, 1)
    pt = DFMP2(mf, auxbasis=auxbasis, frozen=frozen, device=device_obj, max_memory=memory,
               progress=progress, keep_pair_energies=keep_pair_energies)
    pt.extra_timings = {"scf": t_scf}
    pt.run()
    result = pt.result
    result.timings = {"scf": t_scf, **{k: v for k, v in result.timings.items() if k != "scf"}}
    result.timings["total"] = result.timings["mp2"] + t_scf
    return result
