"""A readable reference: closed-shell DF-MP2 and ROHF-MBPT(2) from an SCF object, as a textbook writes it.

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


def rohf_mbpt2(mf, auxbasis: str | dict | None = None, nfrozen: int = 0, exact: bool = False) -> dict[str, float]:
    """ROHF-MBPT(2) energies (Hartree) of the converged ROHF ``mf`` in spin orbitals, as a textbook writes it.

        F^σ = h + J[D^α + D^β] − K[D^σ]              each spin's Fock matrix (the SCF's own J/K)
        occupied–occupied and virtual–virtual blocks of F^σ diagonalised → semicanonical orbitals, ε
        E_singles = Σ_ia f_ia² / (ε_i − ε_a)           i, a of one spin
        E_doubles = ¼ Σ_ijab |⟨ij||ab⟩|² / (ε_i + ε_j − ε_a − ε_b),   ⟨ij||ab⟩ = (ia|jb) − (ib|ja), each
                    term present only where the spins of its orbital pairs match

    The nfrozen lowest semicanonical orbitals of each spin are frozen. Integrals: (ia|jb) ≈ Σ_Q B_Q,ia B_Q,jb
    with ``auxbasis`` (None: PySCF's RI partner), or the exact 4-index ones (PySCF's ao2mo) with ``exact``.
    Returns singles, same_spin, opposite_spin and corr (their sum).
    """
    from pyscf import ao2mo

    mol = mf.mol
    dm = mf.make_rdm1()                                      # (2, nao, nao): α and β densities
    vj, vk = mf.get_jk(mol, dm)
    h1e = mf.get_hcore()
    occ = mf.mo_occ
    orbitals = []                                            # per spin: (C_occ, ε_occ, C_vir, ε_vir, f_ov)
    for sigma in (0, 1):
        fock = mf.mo_coeff.T @ (h1e + vj[0] + vj[1] - vk[sigma]) @ mf.mo_coeff
        o = occ > 0 if sigma == 0 else occ > 1.5
        e_o, u_o = np.linalg.eigh(fock[np.ix_(o, o)])
        e_v, u_v = np.linalg.eigh(fock[np.ix_(~o, ~o)])
        f_ov = u_o.T @ fock[np.ix_(o, ~o)] @ u_v
        orbitals.append((mf.mo_coeff[:, o] @ u_o[:, nfrozen:], e_o[nfrozen:], mf.mo_coeff[:, ~o] @ u_v, e_v,
                         f_ov[nfrozen:]))

    singles = sum(float(np.sum(f ** 2 / (eo[:, None] - ev[None, :]))) for _, eo, _, ev, f in orbitals)
    # spin orbitals: α then β occupied columns, α then β virtual columns, with their spins
    c_occ = np.hstack([orbitals[0][0], orbitals[1][0]])
    c_vir = np.hstack([orbitals[0][2], orbitals[1][2]])
    e_occ = np.concatenate([orbitals[0][1], orbitals[1][1]])
    e_vir = np.concatenate([orbitals[0][3], orbitals[1][3]])
    s_occ = np.repeat([0, 1], [len(orbitals[0][1]), len(orbitals[1][1])])
    s_vir = np.repeat([0, 1], [len(orbitals[0][3]), len(orbitals[1][3])])
    nocc, nvir = len(e_occ), len(e_vir)
    if exact:
        iajb = ao2mo.general(mol, (c_occ, c_vir, c_occ, c_vir), compact=False).reshape(nocc, nvir, nocc, nvir)
    else:
        auxmol = df.addons.make_auxmol(mol, auxbasis or df.make_auxbasis(mol, mp2fit=True))
        ints = df.incore.aux_e2(mol, auxmol, intor="int3c2e")
        ov = np.einsum("mnP,mi,na->Pia", ints, c_occ, c_vir, optimize=True)
        l_chol = np.linalg.cholesky(auxmol.intor("int2c2e"))
        b = np.linalg.solve(l_chol, ov.reshape(len(l_chol), -1)).reshape(ov.shape)
        iajb = np.einsum("Qia,Qjb->iajb", b, b, optimize=True)
    same = (s_occ[:, None] == s_vir[None, :]).astype(float)          # (i, a): spin of i equals that of a
    coulomb = iajb * same[:, :, None, None] * same[None, None, :, :]   # (ia|jb), spins matched
    antisym = coulomb - coulomb.transpose(0, 3, 2, 1)                  # ⟨ij||ab⟩ laid out as [i, a, j, b]
    denom = e_occ[:, None, None, None] - e_vir[None, :, None, None] + e_occ[None, None, :, None] - e_vir[None, None, None, :]
    terms = 0.25 * antisym ** 2 / denom
    same_spin_pair = s_occ[:, None] == s_occ[None, :]                  # (i, j)
    e_ss = float(np.sum(terms * same_spin_pair[:, None, :, None]))
    e_os = float(np.sum(terms * ~same_spin_pair[:, None, :, None]))
    return {"singles": singles, "same_spin": e_ss, "opposite_spin": e_os, "corr": singles + e_ss + e_os}
