"""Nothing built twice: the gradient of a run takes the energy's B and the SCF's JK-fit tensor instead of
building them again, and gives the gradient of the path that rebuilds them."""

from __future__ import annotations

import numpy as np
import pytest

from mp2trn.grad import kernel as gradient_kernel
from mp2trn.options import RunOptions
from mp2trn.pipeline import compute, open_device
from mp2trn.transform import BStore, KeptB

WATER = "O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45"
HYDROXYL = "O 0 0 0; H 0.1 0 1.05"


@pytest.mark.parametrize("atom, multiplicity", [(WATER, 1), (HYDROXYL, 2)], ids=["rhf", "uhf"])
def test_gradient_reusing_b_and_scf_tensor_equals_rebuilding(atom, multiplicity):
    """cpu fp64: the run's gradient (the energy's B, the SCF's tensor for the response's MO blocks) equals the
    gradient kernel building both again, to 1e-10; what-ran says which was reused."""
    options = RunOptions.build(None, basis="cc-pvdz", multiplicity=multiplicity, gradient=True, conv_tol=1e-10,
                               frozen="auto")
    with open_device(options) as device:
        result, mf = compute(atom, options, device)
        assert mf.with_df.tensor.full is None      # the kept tensor is freed after the response
        rebuilt = gradient_kernel(mf, device, 2000.0, None, "auto", kept_b=None, reuse_scf_tensor=False)
    reused = result.what_ran["gradient_reused"]
    assert reused["B"] == "the energy's" and reused["jkfit_tensor"].startswith("the SCF's")
    assert reused["jkfit_integrals"].startswith("the SCF's tensor")
    # the RI pass read the energy's 3-index integrals, kept beside the budget's arrays
    assert reused["ri_integrals"].startswith("the energy's") and result.what_ran["ri_integrals_kept_mb"] > 0
    assert result.what_ran["scf_tensor_kept_mb"] > 0
    assert rebuilt.what_ran["gradient_reused"] == {"B": "built", "jkfit_tensor": "built again",
                                                   "jkfit_integrals": "computed (3-index integrals)",
                                                   "ri_integrals": "computed (3-index integrals)",
                                                   "B_on_device": "host memory (the device computes there)"}
    assert np.max(np.abs(result.gradient - rebuilt.gradient)) < 1e-10
    assert np.max(np.abs(result.densities.dm_relaxed - rebuilt.dm_relaxed)) < 1e-10


def test_kept_b_moves_between_memory_and_file_and_refuses_other_orbitals():
    """A kept B is handed over only for the same orbitals, fitting basis and dtype; it moves to an HDF5 file
    (or back) when the gradient's plan wants it there, unchanged."""
    from mp2trn.df import DFIntegrals
    from mp2trn.orbitals import SpinOrbitals

    rng = np.random.default_rng(7)
    spin = SpinOrbitals.from_active("", rng.normal(size=(6, 3)), rng.normal(size=(6, 4)), np.zeros(3), np.zeros(4))
    dfi = DFIntegrals(None, None, "cc-pvdz-ri", np.eye(5))
    store = BStore(5, [spin], np.float64, incore=True)
    store.arrays[0][...] = rng.normal(size=(5, 12))
    expected = store.arrays[0].copy()
    with KeptB() as kept:
        kept.keep(dfi, [spin], store)
        other = SpinOrbitals.from_active("", spin.c_occ + 1e-15, spin.c_vir, spin.e_occ, spin.e_vir)
        assert not kept.matches("cc-pvdz-ri", [other], np.float64)
        assert not kept.matches("def2-svp-ri", [spin], np.float64)
        assert not kept.matches("cc-pvdz-ri", [spin], np.float32)
        assert kept.matches("cc-pvdz-ri", [spin], np.float64)
        got_dfi, on_file = kept.take(incore=False)
        assert got_dfi is dfi and kept.store is None and not on_file.incore
        assert np.array_equal(on_file.arrays[0][...], expected)
        kept.keep(dfi, [spin], on_file)
        _, back = kept.take(incore=True)
        with back:
            assert back.incore and np.array_equal(back.arrays[0], expected)
    assert not store.arrays      # the in-memory original was closed when it moved


def test_response_products_from_an_unpacked_scf_tensor_equal_the_packed():
    """The accelerators' SCF tensor is unpacked (naux, nao, nao): the response's products made from it equal
    those of the packed tensor the CPU keeps."""
    from pyscf import gto, lib, scf

    from mp2trn.df import cholesky_tensor
    from mp2trn.grad.cpks import ResponseJK
    from mp2trn.grad.orbitals import channels
    from mp2trn.orbitals import select_frozen

    mol = gto.M(atom=HYDROXYL, basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).density_fit(auxbasis="cc-pvdz-jkfit").run()
    chans = channels(mf, select_frozen(mf, None))
    packed = cholesky_tensor(mol, mf.with_df.auxmol, packed=True)
    products = [ResponseJK(mf, chans, t) for t in (packed, lib.unpack_tril(packed))]
    rng = np.random.default_rng(5)
    mats = [(lambda m: m + m.T)(rng.normal(size=(c.nmo, c.nmo))) for c in chans]
    zs = [rng.normal(size=(c.nvir, len(c.occ))) for c in chans]
    for a, b in zip(*(p.occupied_columns(mats) for p in products)):
        assert np.max(np.abs(a - b)) < 1e-12
    for a, b in zip(*(p.zvector(zs) for p in products)):
        assert np.max(np.abs(a - b)) < 1e-12


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_jkfit_pass_from_the_scf_tensor_equals_the_integrals(packed):
    """The JK-fit derivative pass reading the SCF's L⁻¹(Q|μν) (packed as the CPU keeps it, unpacked as the
    accelerators do) for its first half gives the two-electron gradient of the pass that computes the
    3-index integrals, to 1e-11 (UHF hydroxyl, a made-up relaxed correction), and releases the tensor."""
    from pyscf import gto, lib, scf

    from mp2trn.df import cholesky_tensor
    from mp2trn.grad.jk_terms import two_electron_gradient
    from mp2trn.grad.orbitals import channels
    from mp2trn.orbitals import select_frozen

    mol = gto.M(atom=HYDROXYL, basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).density_fit(auxbasis="cc-pvdz-jkfit").run()
    chans = channels(mf, select_frozen(mf, None))
    rng = np.random.default_rng(3)
    p_spin = [(lambda m: 0.01 * (m + m.T))(rng.normal(size=(mol.nao, mol.nao))) for _ in chans]
    tensor = cholesky_tensor(mol, mf.with_df.auxmol, packed=True)

    class Held:
        full = tensor if packed else lib.unpack_tril(tensor)
        released = False

        def release(self):
            self.full, self.released = None, True

    held = Held()
    from_tensor = two_electron_gradient(mf, chans, p_spin, 40, scf_tensor=held)
    from_integrals = two_electron_gradient(mf, chans, p_spin, 40)
    assert held.released and held.full is None
    assert np.max(np.abs(from_tensor - from_integrals)) < 1e-11
    assert np.max(np.abs(from_integrals)) > 1e-3


def test_only_mp2trns_own_cholesky_tensor_is_read_by_the_jkfit_pass():
    """The JK-fit pass reads the SCF's tensor only where it is L⁻¹(Q|μν) with the metric's Cholesky factor,
    every row: mp2trn's own build, not PySCF's ``_cderi`` (which may be eigen-decomposed); a full release
    (and not ``keep_rows``) forgets it."""
    from pyscf import gto, scf

    from mp2trn.grad.dfmp2 import cholesky_scf_tensor
    from mp2trn.jk import density_fit_jk

    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    own = density_fit_jk(scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit"), "cpu")
    own.kernel()
    assert own.with_df.tensor.how.startswith("built by mp2trn") and cholesky_scf_tensor(own) is own.with_df.tensor
    own.with_df.release(keep_rows=True)
    assert cholesky_scf_tensor(own) is own.with_df.tensor and own.with_df.tensor.kept is None
    own.with_df.release()
    assert cholesky_scf_tensor(own) is None and not own.with_df.tensor.by_cholesky
    theirs = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit")
    theirs.with_df.build()
    theirs = density_fit_jk(theirs, "cpu")
    theirs.kernel()
    assert theirs.with_df.tensor.full is not None and cholesky_scf_tensor(theirs) is None


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_ri_pass_from_the_kept_integrals_equals_computing_them(packed):
    """The RI pass over blocks of a few fitting functions reads the energy's kept 3-index integrals
    (DFIntegrals.rows, packed or not) and gives the Lagrangian and derivative terms of the pass that computes
    them, to 1e-12; it frees them."""
    from pyscf import gto, scf

    from mp2trn.df import build_df
    from mp2trn.grad.orbitals import channels
    from mp2trn.grad.ri import ri_pass
    from mp2trn.orbitals import select_frozen

    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit").run(conv_tol=1e-10)
    chans = channels(mf, select_frozen(mf, None))
    dfi = build_df(mol, "cc-pvdz-ri")
    rng = np.random.default_rng(5)
    with BStore(dfi.naux, chans, np.float64, True) as gamma:
        gamma.arrays[0][...] = rng.normal(size=gamma.arrays[0].shape)
        computed = ri_pass(dfi, chans, gamma, 12)
        rows = dfi.keep_rows(packed)
        for _ in dfi.ao_blocks(40, packed=packed, into=rows):
            pass
        kept = ri_pass(dfi, chans, gamma, 12)
    assert dfi.rows is None
    assert np.max(np.abs(kept[0][0] - computed[0][0])) < 1e-12 and np.max(np.abs(kept[1] - computed[1])) < 1e-12


def test_kept_integrals_of_a_b_the_gradient_does_not_take_are_freed_and_said_so():
    """The energy kept its B and 3-index integrals for the gradient; a gradient in another fitting basis takes
    neither: it frees the integrals before its own B and what-ran says they went unused."""
    from pyscf import gto, scf

    from mp2trn import dfmp2
    from mp2trn.devices import get_device

    mf = scf.RHF(gto.M(atom=WATER, basis="cc-pvdz", verbose=0)).density_fit()
    mf.conv_tol = 1e-10
    mf.kernel()
    device = get_device("cpu", "fp64")
    with KeptB() as kept:
        kept.keep_rows = True
        dfmp2.kernel(mf, device, 2000.0, "cc-pvdz-ri", keep_b=kept)
        rows = kept.dfi.rows
        assert rows is not None and rows.size > 0
        other = gradient_kernel(mf, device, 2000.0, "def2-svp-ri", None, kept_b=kept)
        assert kept.dfi.rows is None
    reused = other.what_ran["gradient_reused"]
    assert reused["B"].startswith("built") and reused["ri_integrals"] == (
        "computed (3-index integrals); the energy's, kept for a B this gradient does not take, were freed unused")
