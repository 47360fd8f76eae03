"""The oracle of ROHF rows (issue 37): ROHF-MBPT(2) by the textbook spin-orbital formula on the same SCF.

PySCF has no ROHF-MBPT(2) (its MP2 on an ROHF object converts it to UHF and runs UMP2 on the ROHF
orbitals, without the semicanonical orbitals or the singles), so ROHF rows compare mp2trn with
:func:`mp2trn.reference.rohf_mbpt2` — every spin-orbital ⟨ij||ab⟩ formed explicitly, with the DF integrals of
the MP2 fitting basis, and with PySCF's exact integrals (ao2mo) for the DF error. The oracle makes its own
choices: PySCF's RI partner of the orbital basis (``df.make_auxbasis(mp2fit=True)``) unless the options
name one, and PySCF's ``chemcore`` for ``frozen="auto"``. The SCF energy is checked against PySCF's own
density-fitted ROHF.
"""

from __future__ import annotations

import time

from ..options import RunOptions, parse_frozen
from ..reference import rohf_mbpt2
from .pyscf_reference import PyscfReference


def _frozen_count(mf, options: RunOptions) -> int:
    from pyscf.data.elements import chemcore

    choice = parse_frozen(options.frozen)
    if choice is None:
        return 0
    if choice == "auto":
        ncore = int(chemcore(mf.mol))
        return ncore if ncore < int(mf.mol.nelec[1]) else 0
    if isinstance(choice, int):
        return choice
    raise NotImplementedError("the ROHF oracle freezes the lowest N orbitals; give --frozen-core auto, none or N")


def rohf_reference(mf, options: RunOptions = RunOptions()) -> PyscfReference:
    """ROHF-MBPT(2) correlation (singles included) and its same-/opposite-spin parts on the converged ROHF
    ``mf`` with DF integrals, and the seconds it took."""
    t0 = time.perf_counter()
    out = rohf_mbpt2(mf, options.auxbasis, _frozen_count(mf, options))
    return PyscfReference(float(mf.e_tot), out["corr"], out["opposite_spin"], out["same_spin"],
                          time.perf_counter() - t0)


def rohf_conventional(mf, options: RunOptions = RunOptions()) -> float:
    """The same with PySCF's exact 4-index integrals (the DF error of the doubles; the singles need none)."""
    return rohf_mbpt2(mf, nfrozen=_frozen_count(mf, options), exact=True)["corr"]


def pyscf_rohf_energy(mol, jkbasis, conv_tol: float = 1e-10) -> float:
    """PySCF's own density-fitted ROHF energy of ``mol`` with JK-fit basis ``jkbasis`` (no mp2trn code)."""
    from pyscf import scf

    mf = scf.ROHF(mol).density_fit(auxbasis=jkbasis)
    mf.conv_tol, mf.verbose = conv_tol, 0
    return float(mf.kernel())
