"""The PySCF reference for a molecule and a set of options: the one oracle of validate, bench and tests.

PySCF's ``DFMP2``/``DFUMP2`` run on the same converged SCF as mp2trn, with the MP2 fitting basis set
explicitly (PySCF would otherwise reuse the JK-fit basis of a density-fitted SCF) and the same frozen
orbitals. Conventional MP2 (exact 4-index integrals) shows the size of the DF error itself.

The oracle makes its own choices and never asks mp2trn's (a wrong fitting basis or frozen core must not be
wrong on both sides): the fitting basis is PySCF's ``df.make_auxbasis(mp2fit=True)`` and the frozen core
PySCF's ``chemcore``, except where docs/bases.md says mp2trn deliberately differs from PySCF's defaults —
those outcomes are written out here (:data:`DEF2_RIFIT_BY_BASIS`), not derived from mp2trn's code.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from ..memory import budget_mb
from ..options import Frozen, RunOptions, parse_frozen

# mp2trn's rule 3 (docs/bases.md, "The fitting bases: rules"): an orbital basis with neither a partner in
# PySCF's table nor a declared RI partner in the Basis Set Exchange is fitted with Weigend's def2 RIFIT
# set of its zeta level, where PySCF itself would generate even-tempered functions. The zeta level of each
# family is written out from its authors' naming (Jensen's pcseg-n / pc-n are (n+1)-zeta), so this table is
# the expected answer, independent of how mp2trn reads a name.
_DOUBLE, _TRIPLE, _QUADRUPLE = "def2-svp-rifit", "def2-tzvpp-rifit", "def2-qzvpp-rifit"
DEF2_RIFIT_BY_BASIS: dict[str, str] = {
    **dict.fromkeys(["ano-rcc-vdz", "ano-rcc-vdzp", "ano-pvdz", "sapporo-dzp-2012", "pcseg-0", "pcseg-1",
                     "aug-pcseg-1", "pc-0", "pc-1", "aug-pc-1", "x2c-svpall", "jorge-dzp", "dzp", "dz",
                     "lanl2dz", "mini", "midi", "dzvp"], _DOUBLE),
    **dict.fromkeys(["ano-rcc-vtzp", "ano-pvtz", "sapporo-tzp-2012", "pcseg-2", "aug-pcseg-2", "pc-2",
                     "aug-pc-2", "x2c-tzvpall", "jorge-tzp", "tzp"], _TRIPLE),
    **dict.fromkeys(["ano-rcc-vqzp", "ano-pvqz", "sapporo-qzp-2012", "pcseg-3", "pcseg-4", "aug-pcseg-3",
                     "pc-3", "pc-4", "x2c-qzvpall", "jorge-qzp"], _QUADRUPLE),
}


@dataclass(frozen=True)
class PyscfReference:
    """PySCF's DF-MP2 correlation energy and its parts (Hartree), and the wall time it took (s)."""

    e_hf: float
    e_corr: float
    e_corr_os: float
    e_corr_ss: float
    seconds: float

    @property
    def e_tot(self) -> float:
        return self.e_hf + self.e_corr


def _is_unrestricted(mf) -> bool:
    """True for UHF, False for RHF; an ROHF object is refused: PySCF's MP2 on it is UMP2 on the ROHF orbitals,
    not ROHF-MBPT(2) (its rows have their own oracle, :mod:`mp2trn.validation.rohf_oracle`)."""
    from pyscf import scf

    if isinstance(mf, scf.rohf.ROHF):
        raise InputError("the PySCF DF-MP2 reference takes RHF or UHF; compare ROHF with mp2trn.validation.rohf_oracle")
    return isinstance(mf, scf.uhf.UHF)


def _element_symbols(mol) -> list[str]:
    """The elements of ``mol`` (ghost atoms as their element), first seen first."""
    from pyscf.data.elements import _std_symbol_without_ghost

    return list(dict.fromkeys(_std_symbol_without_ghost(mol.atom_symbol(i)) for i in range(mol.natm)))


def _name_key(name: str) -> str:
    return re.sub(r"[-_ ]", "", name.strip().lower())


def _covers(name: str, symbol: str) -> bool:
    """Whether PySCF loads basis ``name`` (its library, else the Basis Set Exchange) for ``symbol``."""
    from pyscf import gto
    from pyscf.lib.exceptions import BasisNotFoundError

    try:
        return bool(gto.basis.load(name, symbol))
    except (BasisNotFoundError, KeyError, RuntimeError):
        return False


def _given_auxbasis(given: str | dict, symbols: list[str]) -> dict[str, Any]:
    """The user's fitting basis per element, looked up by PySCF (its library, then the BSE)."""
    if isinstance(given, str) and re.fullmatch(r"\s*[A-Za-z]{1,2}\s*:[^,]+(,\s*[A-Za-z]{1,2}\s*:[^,]+)*", given):
        given = {k.strip().capitalize(): v.strip() for k, v in (item.split(":", 1) for item in given.split(","))}
    per_element = given if isinstance(given, dict) else dict.fromkeys(symbols, given)
    missing = [s for s in symbols if s not in per_element
               or (isinstance(per_element[s], str) and not _covers(per_element[s], s))]
    if missing:
        raise InputError(f"the PySCF reference cannot load auxiliary basis {given!r} for {', '.join(missing)} "
                         "(PySCF's library and the Basis Set Exchange lack it); name a basis they hold")
    return {s: per_element[s] for s in symbols}


def _orbital_basis_names(mol, symbols: list[str]) -> dict[str, str] | None:
    """The orbital basis name per element, or None when ``mol`` was given basis data rather than names."""
    basis = mol.basis
    per_element = dict.fromkeys(symbols, basis) if isinstance(basis, str) else dict(basis)
    if any(not isinstance(per_element.get(s), str) for s in symbols):
        return None
    return {s: per_element[s] for s in symbols}


def oracle_auxbasis(mol, given: str | dict | None = None) -> dict[str, Any]:
    """The MP2 fitting basis the oracle uses for ``mol``: {element: basis name, or shells}.

    ``given``: the user's choice, loaded by PySCF. Otherwise PySCF's ``df.make_auxbasis(mp2fit=True)``
    on a probe molecule of one atom per element (PySCF's function stumbles over ghost atoms when it must
    generate functions), then for each element PySCF could only generate even-tempered functions for,
    mp2trn's documented order (docs/bases.md): the Basis Set Exchange's declared RI partner (PySCF's
    ``bse_predefined_auxbasis``), else the written-out def2 RIFIT set of :data:`DEF2_RIFIT_BY_BASIS`,
    else PySCF's generated functions.
    """
    from pyscf import df, gto
    from pyscf.df.addons import bse_predefined_auxbasis

    symbols = _element_symbols(mol)
    if given:
        return _given_auxbasis(given, symbols)
    names = _orbital_basis_names(mol, symbols)
    if names is None:   # basis data: PySCF's own choice, as docs/bases.md says mp2trn makes then
        return df.make_auxbasis(mol, mp2fit=True)
    probe = gto.M(atom=[(s, (0.0, 0.0, 3.0 * i)) for i, s in enumerate(symbols)], basis=names,
                  spin=sum(gto.charge(s) for s in symbols) % 2, cart=mol.cart, verbose=0)
    chosen = df.make_auxbasis(probe, mp2fit=True)
    for symbol in symbols:
        if isinstance(chosen.get(symbol), str):
            continue
        orbital = names[symbol]
        for candidate in (lambda: bse_predefined_auxbasis(probe, orbital, mp2fit=True),
                          lambda: _def2_rifit_for(orbital)):   # asked in turn: the table only when needed
            name = candidate()
            if name and _covers(name, symbol):
                chosen[symbol] = name
                break
    return {s: chosen[s] for s in symbols}


def _def2_rifit_for(orbital: str) -> str:
    """The written-out rule-3 set of an orbital basis; an error for a family this table does not list."""
    for name, rifit in DEF2_RIFIT_BY_BASIS.items():
        if _name_key(name) == _name_key(orbital):
            return rifit
    raise InputError(f"the PySCF reference has no independent fitting-basis choice for orbital basis {orbital!r} "
                     "(mp2trn's rule 3 in docs/bases.md; not in DEF2_RIFIT_BY_BASIS); give --auxbasis to compare")


def oracle_frozen(mf, frozen: Frozen):
    """PySCF's ``frozen=`` for the user's choice: "auto" is PySCF's ``chemcore`` (noble-gas cores less the
    electrons an ECP removes, ghosts none) — nothing when that would freeze every occupied orbital of a
    spin channel (docs/bases.md, mp2trn's charge-aware rule); counts and index lists go to PySCF as given
    (its ``get_frozen_mask`` reads them)."""
    from pyscf.data.elements import chemcore

    choice = parse_frozen(frozen)
    if choice is None:
        return None
    if choice == "auto":
        occupations = mf.mo_occ if _is_unrestricted(mf) else [mf.mo_occ]
        fewest_occupied = min(int(np.count_nonzero(np.asarray(occ) > 0)) for occ in occupations)
        ncore = int(chemcore(mf.mol))
        return ncore if ncore < fewest_occupied else None
    if isinstance(choice, int):
        return choice
    if choice and isinstance(choice[0], tuple):   # one list per spin
        lists = [list(spin) for spin in choice]
        return lists if _is_unrestricted(mf) else lists[0]
    return list(choice)


def pyscf_reference(mf, options: RunOptions = RunOptions()) -> PyscfReference:
    """PySCF's DF-MP2 on the converged SCF ``mf`` with the MP2 fitting basis and frozen orbitals of
    ``options`` (energy only, as mp2trn computes: no amplitudes are stored)."""
    from pyscf import df
    from pyscf.mp import dfmp2, dfump2

    cls = dfump2.DFUMP2 if _is_unrestricted(mf) else dfmp2.DFMP2
    ref = cls(mf, frozen=oracle_frozen(mf, options.frozen))
    ref.with_df = df.DF(mf.mol, auxbasis=oracle_auxbasis(mf.mol, options.auxbasis))
    ref.verbose = 0
    ref.max_memory = budget_mb(options.max_memory)
    t0 = time.perf_counter()
    ref.kernel(with_t2=False)
    return PyscfReference(float(mf.e_tot), float(ref.e_corr), float(ref.e_corr_os), float(ref.e_corr_ss), time.perf_counter() - t0)


def conventional_mp2(mf, options: RunOptions = RunOptions()) -> float:
    """Conventional (exact-integral) MP2 correlation energy on the orbitals of ``mf``.

    ``mf.undo_df()`` first: PySCF's RMP2/UMP2 on a density-fitted mean-field object use its JK-fit
    3-index integrals, which would make this a third DF-MP2 rather than the exact reference.
    """
    from pyscf.mp import mp2, ump2

    exact = mf.undo_df() if getattr(mf, "with_df", None) is not None else mf
    cls = ump2.UMP2 if _is_unrestricted(exact) else mp2.RMP2
    pt = cls(exact, frozen=oracle_frozen(mf, options.frozen))
    pt.verbose = 0
    return float(pt.kernel()[0])


def pyscf_scf_energy(mol, jkbasis, conv_tol: float = 1e-10, xc: str | None = None, grid: int | None = None) -> float:
    """PySCF's own density-fitted SCF energy of ``mol`` (its bases and ECPs as built) with JK-fit basis
    ``jkbasis``: RHF/UHF, or RKS/UKS with ``xc`` on grid level ``grid`` — no mp2trn code in the loop."""
    from pyscf import dft, scf

    if xc is None:
        mf = scf.RHF(mol) if mol.spin == 0 else scf.UHF(mol)
    else:
        mf = dft.RKS(mol) if mol.spin == 0 else dft.UKS(mol)
        mf.xc = xc
        if grid is not None:
            mf.grids.level = grid
    mf = mf.density_fit(auxbasis=jkbasis)
    mf.conv_tol = conv_tol
    mf.verbose = 0
    mf.kernel()
    return mf


def pyscf_double_hybrid(mol, method, jkbasis, rifit, grid: int | None = None, conv_tol: float = 1e-10) -> dict:
    """A double hybrid by PySCF's own route: its DF Kohn–Sham SCF with the functional's DFT part (libxc),
    its DF-MP2 (``DFMP2``/``DFUMP2``) on the Kohn–Sham orbitals with the RI basis ``rifit``, scaled by the
    method's c_os/c_ss, plus PySCF's dftd3 dispersion for the functional. Energies in Hartree."""
    from pyscf import df
    from pyscf.mp import dfmp2, dfump2

    mf = pyscf_scf_energy(mol, jkbasis, conv_tol, method.xc, grid)
    pt = (dfump2.DFUMP2 if mol.spin else dfmp2.DFMP2)(mf)
    pt.with_df = df.DF(mol, auxbasis=rifit)
    pt.verbose = 0
    pt.kernel(with_t2=False)
    e_disp = 0.0
    if method.dispersion:
        from pyscf.dispersion import dftd3

        version, name = method.dispersion
        e_disp = float(dftd3.DFTD3Dispersion(mol, xc=name, version=version).get_dispersion()["energy"])
    e_tot = float(mf.e_tot) + method.c_os * float(pt.e_corr_os) + method.c_ss * float(pt.e_corr_ss) + e_disp
    return {"e_ks": float(mf.e_tot), "e_os": float(pt.e_corr_os), "e_ss": float(pt.e_corr_ss), "e_disp": e_disp,
            "e_tot": e_tot}
