"""The PySCF oracle (mp2trn.validation.pyscf_reference) chooses its fitting basis and frozen core on its own.

A wrong choice in mp2trn must not be wrong on both sides of a comparison: the oracle imports none of mp2trn's
choosers, its choices are held here to names and counts written out from docs/bases.md, and mp2trn's own
choices are held to the same written-out answers.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import numpy as np
import pytest
from pyscf import scf

import mp2trn
from mp2trn.basis import default_fitting
from mp2trn.errors import InputError
from mp2trn.molecule import build_mole
from mp2trn.options import RunOptions
from mp2trn.orbitals import select_frozen
from mp2trn.validation import pyscf_reference
from mp2trn.validation.pyscf_reference import DEF2_RIFIT_BY_BASIS, oracle_auxbasis, oracle_frozen

from .conftest import MOLECULES

ORACLE_SOURCE = Path(mp2trn.__file__).parent / "validation" / "pyscf_reference.py"
# what the oracle may take from mp2trn: an error type, the memory budget and the options' syntax
ALLOWED_IMPORTS = {"errors": {"InputError"}, "memory": {"budget_mb"}, "options": {"Frozen", "RunOptions", "parse_frozen"}}


def test_oracle_imports_none_of_mp2trns_choosers():
    tree = ast.parse(ORACLE_SOURCE.read_text())
    taken: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("mp2trn")):
            module = (node.module or "").removeprefix("mp2trn.")
            taken.setdefault(module, set()).update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            assert not any(alias.name.startswith("mp2trn") for alias in node.names)
    assert taken and all(names <= ALLOWED_IMPORTS.get(module, set()) for module, names in taken.items()), taken


def test_oracle_runs_with_mp2trns_choosers_broken(monkeypatch, water_rhf):
    """The oracle's energy does not move when mp2trn's fitting-basis and frozen-core rules are unusable."""
    options = RunOptions(frozen="auto")
    before = pyscf_reference(water_rhf, options).e_corr

    def broken(*args, **kwargs):
        raise AssertionError("the oracle asked mp2trn's chooser")

    for target in ("mp2trn.basis.default_fitting", "mp2trn.basis.fitting_basis", "mp2trn.orbitals.select_frozen",
                   "mp2trn.orbitals.auto_frozen_count"):
        monkeypatch.setattr(target, broken)
    assert abs(pyscf_reference(water_rhf, options).e_corr - before) <= 1e-12   # BLAS sums may differ in the last bit


def _mol(path: str, basis: str):
    return build_mole(MOLECULES / path, basis=basis)


def _names(chosen: dict) -> dict[str, str]:
    return {symbol: value.lower() for symbol, value in chosen.items()}


# Expected RI sets written out from docs/bases.md: rule 1 (PySCF's partner table, Pople bases by family),
# rule 2 (the BSE's declared RI partner where the table's set lacks the element: def2-SVP-RI has no I, Sn, Pt),
# rule 3 (def2 RIFIT by zeta level for bases with no partner at all).
WRITTEN_OUT_RI = [
    ("water.xyz", "cc-pvdz", {"O": "cc-pvdz-ri", "H": "cc-pvdz-ri"}),
    ("water.xyz", "6-31g*", {"O": "cc-pvdz-ri", "H": "cc-pvdz-ri"}),
    ("water.xyz", "6-31G(d,p)", {"O": "cc-pvdz-ri", "H": "cc-pvdz-ri"}),
    ("water.xyz", "sto-3g", {"O": "def2-svp-ri", "H": "def2-svp-ri"}),
    ("water.xyz", "ano-rcc-vdz", {"O": "def2-svp-rifit", "H": "def2-svp-rifit"}),
    ("water.xyz", "sapporo-tzp-2012", {"O": "def2-tzvpp-rifit", "H": "def2-tzvpp-rifit"}),
    ("heavy/diiodomethane.xyz", "def2-svp", {"C": "def2-svp-ri", "H": "def2-svp-ri", "I": "def2-svp-rifit"}),
    ("heavy/diiodomethane.xyz", "I:def2-svp, H:cc-pvdz, C:cc-pvdz",
     {"C": "cc-pvdz-ri", "H": "cc-pvdz-ri", "I": "def2-svp-rifit"}),
    ("heavy/cisplatin.xyz", "def2-svp", {"Pt": "def2-svp-rifit", "Cl": "def2-svp-ri", "N": "def2-svp-ri",
                                         "H": "def2-svp-ri"}),
    ("heavy/iodine_in_complex_basis.xyz", "def2-svp", {"N": "def2-svp-ri", "H": "def2-svp-ri", "I": "def2-svp-rifit"}),
]


@pytest.mark.parametrize("path,basis,expected", WRITTEN_OUT_RI, ids=[f"{p}-{b}" for p, b, _ in WRITTEN_OUT_RI])
def test_oracle_and_mp2trn_pick_the_written_out_ri_basis(path, basis, expected):
    mol = _mol(path, basis)
    assert _names(oracle_auxbasis(mol)) == expected
    chosen = default_fitting(mol, "rifit")
    assert {symbol: eb.name.lower() for symbol, eb in chosen.per_element.items()} == expected


RULE_3_CASES = list(DEF2_RIFIT_BY_BASIS)


@pytest.mark.parametrize("basis", RULE_3_CASES)
def test_rule_3_sets_agree_with_the_oracles_table(basis):
    mol = _mol("water.xyz", basis)
    expected = DEF2_RIFIT_BY_BASIS[basis]
    assert _names(oracle_auxbasis(mol)) == {"O": expected, "H": expected}
    assert {eb.name.lower() for eb in default_fitting(mol, "rifit").per_element.values()} == {expected}


def test_a_basis_the_oracle_cannot_choose_for_is_an_error():
    mol = _mol("water.xyz", "cc-pvdz")
    with pytest.raises(InputError, match="no-such-fit"):
        oracle_auxbasis(mol, "no-such-fit")
    assert _names(oracle_auxbasis(mol, "O:def2-svp-ri, H:cc-pvdz-ri")) == {"O": "def2-svp-ri", "H": "cc-pvdz-ri"}


def _closed_shell_stand_in(mol):
    """What oracle_frozen reads of an RHF: the molecule and its occupations (no SCF needed)."""
    return types.SimpleNamespace(mol=mol, mo_occ=np.array([2.0] * mol.nelec[0] + [0.0] * 4))


# Frozen-core counts written out (docs/bases.md: noble-gas cores less the orbitals an ECP removes, ghosts
# none): C, N 1 ([He]); Cl 5 ([Ne]); Br 9 ([Ar], no def2 ECP below Rb); I 18 ([Kr]) - 14 (28-electron ECP) = 4;
# Sn 18 - 14 = 4; Pt: the 60-electron ECP removes more than PySCF's noble-gas core, so 0.
WRITTEN_OUT_CORES = [("water.xyz", 1), ("heavy/hydrogen_bromide.xyz", 9), ("heavy/diiodomethane.xyz", 1 + 4 + 4),
                     ("heavy/stannane.xyz", 4), ("heavy/cisplatin.xyz", 0 + 2 * 5 + 2 * 1),
                     ("heavy/ammonia_in_complex_basis.xyz", 1), ("heavy/iodine_in_complex_basis.xyz", 4 + 4)]


@pytest.mark.parametrize("path,count", WRITTEN_OUT_CORES)
def test_oracle_and_mp2trn_freeze_the_written_out_core(path, count):
    stand_in = _closed_shell_stand_in(_mol(path, "def2-svp"))
    assert oracle_frozen(stand_in, "auto") == count
    assert select_frozen(scf.RHF(stand_in.mol).set(mo_occ=stand_in.mo_occ), "auto").count == count


def test_oracle_frozen_passes_counts_and_lists_through_and_never_freezes_everything():
    mol = _mol("water.xyz", "cc-pvdz")
    rhf = _closed_shell_stand_in(mol)
    assert oracle_frozen(rhf, None) is None and oracle_frozen(rhf, "2") == 2
    assert oracle_frozen(rhf, [0, 2]) == [0, 2] and oracle_frozen(rhf, [(0,)]) == [0]
    bare = _closed_shell_stand_in(build_mole(MOLECULES / "water.xyz", basis="cc-pvdz", charge=8))   # 1 occupied
    assert oracle_frozen(bare, "auto") is None


def test_the_comparison_tells_a_wrong_fitting_basis(water_rhf):
    """mp2trn run with another MP2 fitting basis lands well outside the comparison's 1e-8 Eh."""
    oracle = pyscf_reference(water_rhf).e_corr
    assert abs(mp2trn.DFMP2(water_rhf).run().e_corr - oracle) < 1e-10
    assert abs(mp2trn.DFMP2(water_rhf, auxbasis="cc-pvdz-jkfit").run().e_corr - oracle) > 1e-5
