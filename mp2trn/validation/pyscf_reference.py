"""The PySCF reference for a molecule and a set of options: the one oracle of validate, bench and tests.

PySCF's ``DFMP2``/``DFUMP2`` run on the same converged SCF as mp2trn, with the MP2 fitting basis set
explicitly (PySCF would otherwise reuse the JK-fit basis of a density-fitted SCF) and the same frozen
orbitals. Conventional MP2 (exact 4-index integrals) shows the size of the DF error itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..df import resolve_auxbasis
from ..memory import budget_mb
from ..options import RunOptions
from ..orbitals import FrozenSelection, is_uhf, select_frozen


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


def pyscf_frozen(selection: FrozenSelection, uhf: bool):
    """PySCF's ``frozen=`` for a selection: a count when it is the lowest N orbitals, else the lists."""
    n = selection.count
    if all(sorted(set(idx)) == list(range(n)) for idx in selection.per_spin):
        return n or None
    return selection.per_spin if uhf else selection.per_spin[0]


def pyscf_reference(mf, options: RunOptions = RunOptions()) -> PyscfReference:
    """PySCF's DF-MP2 on the converged SCF ``mf`` with the MP2 fitting basis and frozen orbitals of
    ``options`` (energy only, as mp2trn computes: no amplitudes are stored)."""
    from pyscf import df
    from pyscf.mp import dfmp2, dfump2

    uhf = is_uhf(mf)
    cls = dfump2.DFUMP2 if uhf else dfmp2.DFMP2
    ref = cls(mf, frozen=pyscf_frozen(select_frozen(mf, options.frozen), uhf))
    ref.with_df = df.DF(mf.mol, auxbasis=resolve_auxbasis(mf.mol, options.auxbasis))
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
    uhf = is_uhf(exact)
    cls = ump2.UMP2 if uhf else mp2.RMP2
    pt = cls(exact, frozen=pyscf_frozen(select_frozen(mf, options.frozen), uhf))
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
