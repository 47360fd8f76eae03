"""SCF step: PySCF RHF (closed shell) or UHF (open shell), density-fitted by default.

An SCF that does not converge raises :class:`~mp2trn.errors.ConvergenceError`; MP2 is never computed
on top of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyscf import df, gto, scf

from .df import describe_basis, quiet_pyscf
from .errors import ConvergenceError, InputError


@dataclass(frozen=True)
class ScfOptions:
    """How to run the SCF. ``jkbasis=None`` means PySCF's JK-fit default for the orbital basis."""

    density_fit: bool = True
    jkbasis: str | None = None
    conv_tol: float = 1e-10
    max_cycle: int = 100


def jk_auxbasis(mol: gto.Mole, jkbasis: str | None) -> str | dict:
    """The JK-fit auxiliary basis actually used (explicit name, or PySCF's default for the basis)."""
    return jkbasis if jkbasis else df.make_auxbasis(mol, mp2fit=False)


def run_scf(mol: gto.Mole, options: ScfOptions = ScfOptions(), max_memory: float | None = None):
    """Run RHF (spin 0) or UHF (spin > 0) and return the converged mean-field object.

    ``max_memory`` (MB) configures PySCF's own SCF (its ``max_memory``); None keeps PySCF's default.
    Raises ConvergenceError when the SCF fails to converge in ``options.max_cycle`` iterations.
    """
    mf = scf.RHF(mol) if mol.spin == 0 else scf.UHF(mol)
    if max_memory is not None:
        mf.max_memory = max_memory
    if options.density_fit:
        try:
            with quiet_pyscf():
                mf = mf.density_fit(auxbasis=jk_auxbasis(mol, options.jkbasis))
                mf.with_df.build()
        except Exception as exc:  # PySCF raises several types for a missing fitting basis
            raise InputError(f"JK-fit basis {options.jkbasis or 'default'!r} is not usable: {_first_line(exc)}") from None
    mf.conv_tol = options.conv_tol
    mf.max_cycle = options.max_cycle
    mf.verbose = 0
    mf.kernel()
    check_converged(mf)
    return mf


def scf_jkbasis(mf) -> str | None:
    """The JK-fit basis a density-fitted SCF used (None for conventional integrals)."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None or not with_df.auxbasis:
        return None
    return describe_basis(with_df.auxbasis)


def check_converged(mf) -> None:
    """Raise ConvergenceError unless ``mf`` holds a converged SCF."""
    if not getattr(mf, "converged", False):
        raise ConvergenceError(
            f"SCF did not converge in {mf.max_cycle} cycles (last energy {mf.e_tot:.10f} Eh); "
            "no MP2 computed. Try a better geometry, --conv-tol, or check charge/multiplicity"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
