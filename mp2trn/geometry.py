"""Geometry sanity checks, run on every molecule before any integral is computed.

Atoms (real or ghost) closer than :data:`MIN_DISTANCE` are refused — shorter than any chemical bond (H₂,
the shortest, is 0.74 Å), so such a geometry is a unit slip, a copy-paste error or two atoms written
twice. Contacts up to :data:`SHORT_CONTACT` get a note in the result. A geometry read in bohr whose
distances look like Ångström (or the reverse) gets a hint about ``--unit``.
"""

from __future__ import annotations

import numpy as np
from pyscf import gto

from .errors import InputError

BOHR_IN_ANGSTROM = 0.52917721092
#: atoms closer than this (Å) are refused
MIN_DISTANCE = 0.5
#: contacts below this (Å) are reported in the result's notes
SHORT_CONTACT = 0.7
#: a bond to hydrogen between these "Å" values, with nothing shorter, looks like bohr read as Å
_BOHR_LIKE_XH = (1.75, 2.25)


def _label(mol: gto.Mole, i: int) -> str:
    """'3 (H)', or '2 (ghost O)' for a ghost atom (1-based, as in the XYZ file)."""
    symbol = mol.atom_symbol(i)
    if symbol.upper().startswith(("GHOST-", "X-")):
        return f"{i + 1} (ghost {symbol.split('-', 1)[1].capitalize()})"
    return f"{i + 1} ({symbol})"


def check_geometry(mol: gto.Mole) -> list[str]:
    """Refuse coinciding or impossibly close atoms (InputError); return notes about suspicious ones."""
    if mol.natm < 2:
        return []
    unit = "bohr" if str(mol.unit).lower().startswith("b") else "angstrom"
    xyz = np.asarray(mol.atom_coords(unit="Angstrom"))
    d = np.sqrt(((xyz[:, None, :] - xyz[None, :, :]) ** 2).sum(-1))
    np.fill_diagonal(d, np.inf)
    i, j = np.unravel_index(int(np.argmin(d)), d.shape)
    i, j = min(i, j), max(i, j)
    shortest = float(d[i, j])
    in_file = shortest if unit == "angstrom" else shortest / BOHR_IN_ANGSTROM
    if shortest < MIN_DISTANCE:
        what = "coincide" if shortest < 1e-6 else f"are {shortest:.4f} Å apart"
        hint = ""
        if unit == "bohr" and shortest / BOHR_IN_ANGSTROM >= SHORT_CONTACT:
            hint = "; the coordinates look like Ångström: try --unit angstrom"
        raise InputError(
            f"atoms {_label(mol, i)} and {_label(mol, j)} {what} ({in_file:.4f} {unit} as read; coordinates read in "
            f"{unit}): closer than {MIN_DISTANCE} Å, no molecule has such a contact{hint}")
    notes = []
    if shortest < SHORT_CONTACT:
        hint = ("; the coordinates were read in bohr and look like Ångström: use --unit angstrom if they are"
                if unit == "bohr" and shortest / BOHR_IN_ANGSTROM >= SHORT_CONTACT else "")
        notes.append(f"unusually short contact: atoms {_label(mol, i)} and {_label(mol, j)} are {shortest:.3f} Å "
                     f"apart{hint}")
    if unit == "angstrom":
        hydrogens = [k for k in range(mol.natm) if mol.atom_pure_symbol(k) == "H"]
        if hydrogens:
            xh = float(np.min(d[hydrogens]))
            if _BOHR_LIKE_XH[0] <= xh <= _BOHR_LIKE_XH[1] and shortest >= _BOHR_LIKE_XH[0] - 0.5:
                notes.append(f"the shortest bond to hydrogen is {xh:.2f} Å, typical of coordinates in bohr: "
                             "use --unit bohr if the file is in bohr")
    return notes
