"""A readable reference: closed-shell DF-MP2 from an SCF object, as a textbook writes it.

Plain NumPy, everything in memory, no blocking, no devices — a second oracle beside PySCF for the tests
(``tests/test_reference.py``), and a map of what the production stages compute::

    (P|Q) = L Lᵀ                                  Coulomb metric of the fitting basis, Cholesky
    B[Q, i, a] = Σ_P L⁻¹[Q, P] Σ_μν (P|μν) C[μ, i] C[ν, a]
    (ia|jb) ≈ Σ_Q B[Q, i, a] B[Q, j, b]
    E_os = Σ_ijab (ia|jb)² / D,   E_ss = Σ_ijab (ia|jb) [(ia|jb) − (ib|ja)] / D,   D = e_i + e_j − e_a − e_b
"""

from __future__ import annotations

import numpy as np
from pyscf import df


def rhf_dfmp2(mf, auxbasis: str | None = None, nfrozen: int = 0) -> tuple[float, float, float]:
    """(E_os, E_ss, E_corr) in Hartree for the converged RHF ``mf``; ``nfrozen`` lowest orbitals frozen.

    auxbasis: MP2 fitting basis (None: PySCF's RI partner of the orbital basis).
    """
    mol = mf.mol
    auxmol = df.addons.make_auxmol(mol, auxbasis or df.make_auxbasis(mol, mp2fit=True))
    occupied = mf.mo_occ > 0
    c_occ = mf.mo_coeff[:, occupied][:, nfrozen:]          # (nao, nocc) active occupied
    c_vir = mf.mo_coeff[:, ~occupied]                       # (nao, nvir)
    e_occ = mf.mo_energy[occupied][nfrozen:]
    e_vir = mf.mo_energy[~occupied]

    ints = df.incore.aux_e2(mol, auxmol, intor="int3c2e")   # (nao, nao, naux) = (μν|P)
    ov = np.einsum("mnP,mi,na->Pia", ints, c_occ, c_vir, optimize=True)
    metric = auxmol.intor("int2c2e")                        # (naux, naux) = (P|Q)
    l_chol = np.linalg.cholesky(metric)
    b = np.linalg.solve(l_chol, ov.reshape(len(metric), -1)).reshape(ov.shape)   # B = L⁻¹ (P|ia)

    iajb = np.einsum("Qia,Qjb->iajb", b, b, optimize=True)  # (ia|jb)
    denom = (e_occ[:, None, None, None] - e_vir[None, :, None, None]
             + e_occ[None, None, :, None] - e_vir[None, None, None, :])
    e_os = float(np.sum(iajb * iajb / denom))
    e_ss = float(np.sum(iajb * (iajb - iajb.transpose(0, 3, 2, 1)) / denom))
    return e_os, e_ss, e_os + e_ss
