"""The fitting bases are resolved once, by ``pipeline.build_molecule``, and handed to the SCF, the MP2 step and
the gradient as data: none of them applies the rules of mp2trn.basis again."""

from __future__ import annotations

import mp2trn
from mp2trn import basis, pipeline

from .conftest import molecule_path


def test_fitting_bases_are_resolved_once_per_run(monkeypatch):
    resolved: list[str] = []
    real = basis.fitting_basis

    def counting(role, *args, **kwargs):
        resolved.append(role)
        return real(role, *args, **kwargs)

    monkeypatch.setattr(basis, "fitting_basis", counting)     # default_fitting's (a stage resolving again)
    monkeypatch.setattr(pipeline, "fitting_basis", counting)  # build_molecule's
    result = mp2trn.run(molecule_path("water"), basis="def2-svp", gradient=True)
    assert sorted(resolved) == ["jkfit", "rifit"]
    assert result.what_ran["auxbasis"] == "def2-svp-ri" and result.what_ran["jkbasis"] == "def2-svp-jkfit"
    assert result.gradient is not None


def test_built_molecule_hands_pyscf_input_down():
    """What build_molecule resolved is what the stages get: the resolved sets' PySCF data, or PySCF's own
    partner where the orbital basis is given as shells (the rules have no name to go on)."""
    from pyscf import df, gto

    options = mp2trn.RunOptions(basis="cc-pvdz", auxbasis="def2-svp-ri")
    named = pipeline.build_molecule(molecule_path("water"), options)
    assert named.ri_auxbasis == named.rifit.pyscf_basis() == {"O": "def2-svp-ri", "H": "def2-svp-ri"}
    assert named.jk_auxbasis == {"O": "cc-pvdz-jkfit", "H": "cc-pvdz-jkfit"}
    shells = gto.M(atom="O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587", verbose=0,
                   basis={"O": gto.basis.load("cc-pvdz", "O"), "H": gto.basis.load("cc-pvdz", "H")})
    data = pipeline.build_molecule(shells, mp2trn.RunOptions())
    assert data.rifit is None and data.ri_auxbasis == df.make_auxbasis(shells, mp2fit=True)
    assert data.jk_auxbasis == df.make_auxbasis(shells, mp2fit=False)
