"""Accuracy validation against PySCF: molecule sets, the PySCF reference, the runner and its reports.

    from mp2trn.validation import load_set, run_validation, ValidationConfig
    mset = load_set("default")
    rows, summary = run_validation(mset, mset.entries, ValidationConfig())
"""

from ..precision import COMPENSATED_TOLERANCE, tolerance_for
from .pyscf_reference import PyscfReference, conventional_mp2, pyscf_reference
from .runner import ValidationConfig, run_validation, summarize
from .sets import MoleculeSet, SetEntry, available_sets, load_set, molecules_dir, resolve_set, select_entries

__all__ = [
    "COMPENSATED_TOLERANCE", "tolerance_for", "PyscfReference", "conventional_mp2", "pyscf_reference",
    "ValidationConfig", "run_validation", "summarize", "MoleculeSet", "SetEntry", "available_sets", "load_set",
    "molecules_dir", "resolve_set", "select_entries",
]
