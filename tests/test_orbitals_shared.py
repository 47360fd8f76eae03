"""One description of the orbitals (issue 38): the gradient's spin channels are the energy's
:class:`~mp2trn.orbitals.SpinOrbitals`, with the same active blocks to the bit, and the index sets the
gradient reads say what PySCF's occupations and the frozen selection say."""

from __future__ import annotations

import numpy as np
import pytest

from mp2trn.errors import InputError
from mp2trn.grad.orbitals import channels
from mp2trn.orbitals import SpinOrbitals, select_frozen, spin_orbitals

from .conftest import scf_for


@pytest.mark.parametrize("name,frozen", [("water", "auto"), ("water", None), ("hydroxyl", "auto")])
def test_the_gradient_reads_the_energys_channels(name, frozen):
    mf = scf_for(name, "cc-pvdz")
    sel = select_frozen(mf, frozen)
    energy, gradient = spin_orbitals(mf, sel), channels(mf, sel)
    occs = [mf.mo_occ] if len(energy) == 1 else list(mf.mo_occ)
    coeffs = [mf.mo_coeff] if len(energy) == 1 else list(mf.mo_coeff)
    for e, g, occ, c, fz in zip(energy, gradient, occs, coeffs, sel.per_spin):
        assert isinstance(g, SpinOrbitals) and g.weight == (2.0 if len(energy) == 1 else 1.0)
        for field in ("c_occ", "c_vir", "e_occ", "e_vir"):
            assert np.array_equal(getattr(e, field), getattr(g, field))
        assert list(g.core) == sorted(fz) and list(g.occ) == list(np.flatnonzero(occ > 0))
        assert list(g.act) == [i for i in np.flatnonzero(occ > 0) if i not in fz]
        assert list(g.vir) == list(np.flatnonzero(occ == 0))
        assert np.array_equal(g.c_occ, c[:, g.act]) and g.nocc == g.nact == len(g.act)


def test_frozen_virtuals_are_kept_from_the_gradient_but_not_from_the_energy():
    mf = scf_for("water", "cc-pvdz")
    sel = select_frozen(mf, [0, 23])   # the core and the highest virtual orbital
    (orbs,) = spin_orbitals(mf, sel)
    assert orbs.nvir == 23 - 5 and 23 not in orbs.vir
    with pytest.raises(InputError, match="frozen virtual"):
        channels(mf, sel)


def test_active_only_channels():
    rng = np.random.default_rng(1)
    c_o, c_v = rng.normal(size=(6, 2)), rng.normal(size=(6, 3))
    s = SpinOrbitals.from_active("alpha", c_o, c_v, np.array([-2.0, -1.0]), np.array([0.5, 1.0, 2.0]))
    assert np.array_equal(s.c_occ, c_o) and np.array_equal(s.c_vir, c_v) and s.weight == 1.0
    assert (s.nocc, s.nvir, s.nmo) == (2, 3, 5) and list(s.e_vir) == [0.5, 1.0, 2.0]
