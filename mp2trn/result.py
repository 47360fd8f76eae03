"""The result of a DF-MP2 run and its QCSchema-shaped JSON document."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .version import __version__

HARTREE_TO_KCAL = 627.509474  # kcal/mol per Hartree (CODATA 2018, as in PySCF/Psi4)
SCS_OS, SCS_SS = 6.0 / 5.0, 1.0 / 3.0  # Grimme's SCS-MP2 scalings, as PySCF's SCSMP2


@dataclass
class MP2Result:
    """Energies (Hartree), what ran, and timings (s) of one DF-MP2 calculation."""

    e_hf: float
    e_corr_os: float
    e_corr_ss: float
    reference: str  # "RHF" or "UHF"
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

    @property
    def e_corr(self) -> float:
        return self.e_corr_os + self.e_corr_ss

    @property
    def e_tot(self) -> float:
        return self.e_hf + self.e_corr

    @property
    def e_scs_corr(self) -> float:
        """SCS-MP2 correlation energy: 6/5·E_os + 1/3·E_ss."""
        return SCS_OS * self.e_corr_os + SCS_SS * self.e_corr_ss

    @property
    def e_scs(self) -> float:
        """SCS-MP2 total energy (PySCF's SCSMP2.e_tot convention: HF + SCS correlation)."""
        return self.e_hf + self.e_scs_corr

    def energies(self) -> dict[str, float]:
        return {
            "scf_total_energy": self.e_hf,
            "mp2_opposite_spin_correlation_energy": self.e_corr_os,
            "mp2_same_spin_correlation_energy": self.e_corr_ss,
            "mp2_correlation_energy": self.e_corr,
            "mp2_total_energy": self.e_tot,
            "scs_mp2_correlation_energy": self.e_scs_corr,
            "scs_mp2_total_energy": self.e_scs,
        }

    def to_qcschema(self) -> dict[str, Any]:
        """A QCSchema ``AtomicResult``-shaped document (schema_name qcschema_output)."""
        props = {
            "calcinfo_nbasis": self.sizes.get("nao"),
            "calcinfo_nmo": self.sizes.get("nmo"),
            "calcinfo_nalpha": self.sizes.get("nalpha"),
            "calcinfo_nbeta": self.sizes.get("nbeta"),
            "calcinfo_natom": self.sizes.get("natm"),
            "scf_total_energy": self.e_hf,
            "mp2_same_spin_correlation_energy": self.e_corr_ss,
            "mp2_opposite_spin_correlation_energy": self.e_corr_os,
            "mp2_singles_energy": 0.0,
            "mp2_doubles_energy": self.e_corr,
            "mp2_correlation_energy": self.e_corr,
            "mp2_total_energy": self.e_tot,
            "return_energy": self.e_tot,
        }
        if self.e_nuc is not None:
            props["nuclear_repulsion_energy"] = self.e_nuc
        if self.scf and self.scf.get("cycles") is not None:
            props["scf_iterations"] = self.scf["cycles"]
        extras = dict(self.what_ran)
        extras.update(
            {
                "reference": self.reference,
                "sizes": self.sizes,
                "scs_mp2_correlation_energy": self.e_scs_corr,
                "scs_mp2_total_energy": self.e_scs,
                "timings": self.timings,
                "cost": self.cost,
                "notes": self.notes,
                **({"scf": self.scf} if self.scf is not None else {}),
                **({"parallel": self.parallel} if self.parallel is not None else {}),
            }
        )
        return {
            "schema_name": "qcschema_output",
            "schema_version": 1,
            "molecule": self.molecule,
            "driver": "energy",
            "model": {"method": "mp2", "basis": self.what_ran.get("basis")},
            "keywords": {
                "df_basis_mp2": self.what_ran.get("auxbasis"),
                "df_basis_scf": self.what_ran.get("jkbasis"),
                "frozen": self.what_ran.get("frozen"),
            },
            "provenance": {"creator": "mp2trn", "version": __version__, "routine": "mp2trn.DFMP2"},
            "properties": props,
            "return_result": self.e_tot,
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
