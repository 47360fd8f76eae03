"""kernels/batched_gemm.py (both AO->MO half-transforms fused) against its NumPy reference, in the emulator."""

from __future__ import annotations

import numpy as np
import pytest

from mp2trn.precision import beta_for, split
from mp2trn.kernels.batched_gemm import batched_gemm, batched_gemm_reference, batched_gemm_x3, group_size

from .conftest import scf_for
from .kernel_helpers import EPS32, run

# (p, nao, no, nv, group): nao/nv not multiples of 128, nocc = 1, nvir < 128, nvir > 512, nocc > 128,
# a forced group of one aux function
SHAPES = [
    (7, 24, 5, 19, 0),
    (30, 130, 3, 140, 0),
    (5, 200, 1, 40, 0),
    (9, 300, 40, 600, 0),
    (4, 129, 130, 70, 0),
    (6, 64, 8, 1, 1),
    (3, 260, 2, 257, 2),
]


def _data(rng, p, nao, no, nv):
    a = rng.standard_normal((p, nao, nao))
    return a + a.transpose(0, 2, 1), rng.standard_normal((nao, no)), rng.standard_normal((nao, nv))


def _bound(ao, co, cv):
    return float(np.max(np.einsum("pmn,mi,na->pia", np.abs(ao), np.abs(co), np.abs(cv), optimize=True)))


@pytest.mark.parametrize("p,nao,no,nv,group", SHAPES)
def test_batched_gemm_fp32(p, nao, no, nv, group):
    rng = np.random.default_rng(p * nao + nv)
    ao, co, cv = _data(rng, p, nao, no, nv)
    y, rep = run(batched_gemm, ao.astype(np.float32), co.astype(np.float32), cv.astype(np.float32), group=group)
    assert y.shape == (p * no, nv)
    assert np.max(np.abs(y - batched_gemm_reference(ao, co, cv))) <= 8 * nao * EPS32 * _bound(ao, co, cv)
    # X never goes back to HBM: the only SBUF->HBM traffic is the result
    assert rep.bytes_sbuf_to_hbm == p * no * nv * 4


@pytest.mark.parametrize("p,nao,no,nv,group", SHAPES)
def test_batched_gemm_x3(p, nao, no, nv, group):
    rng = np.random.default_rng(p + nao * no)
    ao, co, cv = _data(rng, p, nao, no, nv)
    beta = beta_for(nao)
    (y, y_rest), rep = run(batched_gemm_x3, *split(ao, 1, beta), *split(co, 0, beta, True),
                           *split(cv, 0, beta, True), beta, group=group)
    ref = batched_gemm_reference(ao, co, cv)
    y = y.astype(np.float64) + y_rest
    tol = 16 * nao * EPS32 * 2.0 ** -beta * _bound(ao, co, cv)
    assert rep.bytes_sbuf_to_hbm == 2 * p * no * nv * 4         # the exact part and the corrections
    assert np.max(np.abs(y - ref)) <= tol


def test_group_size_respects_psum_bank_and_sbuf():
    assert group_size(114, 21, 93) * 21 <= 512
    assert group_size(512, 64, 448) * 64 <= 512
    g = group_size(1000, 100, 900, x3=True, budget=150000)
    assert g >= 1 and g * 100 <= 512


def test_x3_transform_of_real_integrals_is_much_closer_to_fp64():
    """Water/cc-pVDZ (P|μν) and MO coefficients: fp32x3 removes most of the fp32 cancellation error."""
    from pyscf import df

    mf = scf_for("water", "cc-pvdz")
    mol = mf.mol
    aux = df.addons.make_auxmol(mol, df.make_auxbasis(mol, mp2fit=True))
    pmol = mol + aux
    ao = pmol.intor("int3c2e", aosym="s1", shls_slice=(0, mol.nbas, 0, mol.nbas, mol.nbas, pmol.nbas)).T[:40]
    nocc = mol.nelectron // 2
    co, cv = mf.mo_coeff[:, :nocc], mf.mo_coeff[:, nocc:]
    ref = batched_gemm_reference(ao, co, cv)
    y32, _ = run(batched_gemm, ao.astype(np.float32), co.astype(np.float32), cv.astype(np.float32))
    beta = beta_for(mol.nao_nr())
    (y3, y3_rest), _ = run(batched_gemm_x3, *split(ao, 1, beta), *split(co, 0, beta, True), *split(cv, 0, beta, True),
                           beta)
    y3 = y3.astype(np.float64) + y3_rest
    e32, e3 = np.max(np.abs(y32 - ref)), np.max(np.abs(y3 - ref))
    assert e3 < e32 / 20
