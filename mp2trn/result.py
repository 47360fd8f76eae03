"""The result of a DF-MP2 run and its QCSchema-shaped JSON document."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .methods import METHODS, SCS_OS, SCS_SS, Method
from .version import __version__

HARTREE_TO_KCAL = 627.509474  # kcal/mol per Hartree (CODATA 2018, as in PySCF/Psi4)


@dataclass
class MP2Result:
    """Energies (Hartree), what ran, and timings (s) of one DF-MP2 calculation."""

    e_hf: float
    e_corr_os: float
    e_corr_ss: float
    reference: str  # "RHF", "UHF" or "ROHF" ("RKS"/"UKS" under a double hybrid)
    what_ran: dict[str, Any]  # device, precision, basis, auxbasis, jkbasis, frozen, ...
    sizes: dict[str, Any]  # nao, naux, nocc, nvir per spin, natm
    timings: dict[str, float] = field(default_factory=dict)
    cost: dict[str, Any] | None = None
    molecule: dict[str, Any] | None = None  # QCSchema molecule
    pair_energies: list[np.ndarray] | None = None  # per channel (i ≤ j), Hartree
    notes: list[str] = field(default_factory=list)
    scf: dict[str, Any] | None = None  # the SCF stage: where J/K ran, precision per cycle, cycles, seconds
    e_nuc: float | None = None  # nuclear repulsion energy (Hartree)
    parallel: dict[str, Any] | None = None  # a run over ranks: backend, and per rank memory and bytes sent
    method: Method = field(default_factory=lambda: METHODS["mp2"])  # what e_tot is
    e_disp: float = 0.0  # the method's dispersion energy (Hartree; double hybrids with -D3BJ)
    gradient: np.ndarray | None = None  # (natm, 3) Eh/bohr of e_tot, when the gradient was asked for
    dipoles: dict[str, list[float]] | None = None  # a.u.: "scf", "mp2_unrelaxed", "mp2_relaxed" (with nuclei)
    natural_occupations: list[float] | None = None  # of the relaxed MP2 density, descending
    densities: Any = None  # the gradient stage's GradientResult (AO densities, terms); not written to JSON
    frequencies: Any = None  # the frequency stage's FrequencyResult (mp2trn.hessian), when the Hessian was asked for

    @property
    def hessian(self) -> np.ndarray | None:
        """(3·natm, 3·natm) Eh/bohr², when the Hessian was asked for (``hessian=True``)."""
        return None if self.frequencies is None else self.frequencies.hessian.hessian
    e_singles: float = 0.0  # ROHF-MBPT(2) singles Σ|f_ia|²/(ε_i − ε_a) (Hartree); 0 for RHF/UHF
    spin_square: float | None = None  # ⟨S²⟩ of the reference determinant (open-shell references)

    @property
    def e_doubles(self) -> float:
        """The doubles part of the correlation energy, E_os + E_ss."""
        return self.e_corr_os + self.e_corr_ss

    @property
    def e_corr(self) -> float:
        """The unscaled correlation energy of the reference orbitals, E_singles + E_os + E_ss (singles
        only for ROHF)."""
        return self.e_singles + self.e_doubles

    @property
    def e_method_corr(self) -> float:
        """The method's correlation: E_singles + c_os·E_os + c_ss·E_ss (the MP2 correlation for ``mp2``;
        the singles are not scaled, as in Psi4's SCS-MP2 on ROHF)."""
        return self.e_singles + self.method.c_os * self.e_corr_os + self.method.c_ss * self.e_corr_ss

    @property
    def e_tot(self) -> float:
        """The method's total energy: reference + scaled correlation + dispersion (MP2 total for ``mp2``)."""
        return self.e_hf + self.e_method_corr + self.e_disp

    @property
    def e_mp2_tot(self) -> float:
        """Reference + unscaled MP2 correlation (the MP2 total energy on a Hartree–Fock reference)."""
        return self.e_hf + self.e_corr

    @property
    def e_scs_corr(self) -> float:
        """SCS-MP2 correlation energy: E_singles + 6/5·E_os + 1/3·E_ss."""
        return self.e_singles + SCS_OS * self.e_corr_os + SCS_SS * self.e_corr_ss

    @property
    def e_scs(self) -> float:
        """SCS-MP2 total energy (PySCF's SCSMP2.e_tot convention: HF + SCS correlation)."""
        return self.e_hf + self.e_scs_corr

    def energies(self) -> dict[str, float]:
        out = {
            "scf_total_energy": self.e_hf,
            "mp2_opposite_spin_correlation_energy": self.e_corr_os,
            "mp2_same_spin_correlation_energy": self.e_corr_ss,
            "mp2_correlation_energy": self.e_corr,
            "mp2_total_energy": self.e_mp2_tot,
            "scs_mp2_correlation_energy": self.e_scs_corr,
            "scs_mp2_total_energy": self.e_scs,
        }
        if self.reference == "ROHF":
            out["mp2_singles_energy"] = self.e_singles
        if self.method.name != "mp2":
            out[f"{self.method.name}_total_energy"] = self.e_tot
        if self.e_disp:
            out["dispersion_correction_energy"] = self.e_disp
        return out

    def to_qcschema(self) -> dict[str, Any]:
        """A QCSchema ``AtomicResult``-shaped document (schema_name qcschema_output); with frequencies a
        hessian-driver document (:meth:`mp2trn.hessian.FrequencyResult.to_qcschema`)."""
        if self.frequencies is not None:
            return self.frequencies.to_qcschema()
        props = {
            "calcinfo_nbasis": self.sizes.get("nao"),
            "calcinfo_nmo": self.sizes.get("nmo"),
            "calcinfo_nalpha": self.sizes.get("nalpha"),
            "calcinfo_nbeta": self.sizes.get("nbeta"),
            "calcinfo_natom": self.sizes.get("natm"),
            "scf_total_energy": self.e_hf,
            "mp2_same_spin_correlation_energy": self.e_corr_ss,
            "mp2_opposite_spin_correlation_energy": self.e_corr_os,
            "mp2_singles_energy": self.e_singles,
            "mp2_doubles_energy": self.e_doubles,
            "mp2_correlation_energy": self.e_corr,
            "mp2_total_energy": self.e_mp2_tot,
            "return_energy": self.e_tot,
        }
        if self.method.double_hybrid:   # the PT2 pieces are on Kohn–Sham orbitals: not MP2 energies
            for key in [k for k in props if k.startswith("mp2_")]:
                del props[key]
        if self.e_nuc is not None:
            props["nuclear_repulsion_energy"] = self.e_nuc
        if self.scf and self.scf.get("cycles") is not None:
            props["scf_iterations"] = self.scf["cycles"]
        if self.gradient is not None:
            props["return_gradient"] = np.asarray(self.gradient).ravel().tolist()
        if self.dipoles:
            props["scf_dipole_moment"] = list(self.dipoles["scf"])
            props["mp2_dipole_moment"] = list(self.dipoles["mp2_relaxed"])
        extras = dict(self.what_ran)
        extras.update(
            {
                "reference": self.reference,
                **({"reference_spin_square": self.spin_square} if self.spin_square is not None else {}),
                "sizes": self.sizes,
                "method": self.method.record(),
                **({"pt2_opposite_spin_correlation_energy": self.e_corr_os,
                    "pt2_same_spin_correlation_energy": self.e_corr_ss,
                    "dispersion_correction_energy": self.e_disp} if self.method.double_hybrid else
                   {"scs_mp2_correlation_energy": self.e_scs_corr, "scs_mp2_total_energy": self.e_scs}),
                "timings": self.timings,
                "cost": self.cost,
                "notes": self.notes,
                **({"scf": self.scf} if self.scf is not None else {}),
                **({"parallel": self.parallel} if self.parallel is not None else {}),
                **({"dipoles_au": self.dipoles, "natural_occupations": self.natural_occupations}
                   if self.dipoles else {}),
            }
        )
        return {
            "schema_name": "qcschema_output",
            "schema_version": 1,
            "molecule": self.molecule,
            "driver": "energy" if self.gradient is None else "gradient",
            "model": {"method": self.method.name, "basis": self.what_ran.get("basis")},
            "keywords": {
                "df_basis_mp2": self.what_ran.get("auxbasis"),
                "df_basis_scf": self.what_ran.get("jkbasis"),
                "frozen": self.what_ran.get("frozen"),
            },
            "provenance": {"creator": "mp2trn", "version": __version__, "routine": "mp2trn.DFMP2"},
            "properties": props,
            "return_result": self.e_tot if self.gradient is None else np.asarray(self.gradient).ravel().tolist(),
            "success": True,
            "extras": {"mp2trn": extras},
        }


def qcschema_molecule(mol) -> dict[str, Any]:
    """QCSchema molecule (geometry in Bohr) for a PySCF Mole; ghost atoms have ``real: false``."""
    symbols, real = [], []
    for ia in range(mol.natm):
        label = mol.atom_pure_symbol(ia)
        ghost = label.upper().startswith(("GHOST-", "X-"))
        symbols.append(label.split("-", 1)[1].capitalize() if ghost else label)
        real.append(not ghost)
    return {
        "schema_name": "qcschema_molecule",
        "schema_version": 2,
        "symbols": symbols,
        "geometry": np.asarray(mol.atom_coords(unit="Bohr")).ravel().tolist(),
        "real": real,
        "molecular_charge": int(mol.charge),
        "molecular_multiplicity": int(mol.spin + 1),
    }
