"""The SCF's J/K kernels against their NumPy references, in the emulator: syrk (Zᵀ Z, lower triangle,
fp32 and fp32x3), coulomb (ρ = B·D, J = Bᵀρ), and the exchange build as the sim device runs it
(batched_gemm with the identity forming Z = C_occᵀ B_P, then syrk)."""

from __future__ import annotations

import numpy as np
import pytest

from mp2trn.kernels.batched_gemm import batched_gemm
from mp2trn.kernels.coulomb import coulomb, coulomb_reference
from mp2trn.kernels.syrk import lower_to_full, syrk, syrk_reference, syrk_x3
from mp2trn.precision import get_precision

from .kernel_helpers import EPS32, run

# (naux, nao, nocc): nao and naux not multiples of 128, nocc = 1, more than one PSUM bank of columns,
# several row groups
SHAPES = [(84, 24, 5), (130, 19, 1), (7, 129, 3), (300, 70, 9), (150, 140, 12), (40, 513, 2)]


def _count(rep, instruction):
    """How many times ``instruction`` ran in a launch (the report counts per engine)."""
    return sum(per.get(instruction, 0) for per in rep.instruction_counts.values())


def _tensor(rng, naux, nao):
    b = rng.standard_normal((naux, nao, nao))
    return (b + b.transpose(0, 2, 1)) / 2           # B_P symmetric, as PySCF's unpacked tensor


@pytest.mark.parametrize("naux,nao,nocc", SHAPES)
def test_syrk_fp32_and_x3(naux, nao, nocc):
    rng = np.random.default_rng(naux * nao + nocc)
    z = rng.standard_normal((naux * nocc, nao))
    ref = syrk_reference(z)
    scale = np.abs(z).T @ np.abs(z)                  # Σ|z||z|: the rounding-error scale of each element
    k, rep = run(syrk, z.astype(np.float32))
    err = np.abs(lower_to_full(k) - ref)
    assert np.all(err <= 4 * np.sqrt(z.shape[0]) * EPS32 * scale + 1e-30)
    assert _count(rep, "nc_matmul") > 0
    planes = get_precision("fp32x3").split_operand(z, axis=0, moving=True)
    (k3, k3_rest), _ = run(syrk_x3, *planes)
    err3 = np.abs(lower_to_full(k3.astype(np.float64) + k3_rest) - ref)
    assert err3.max() < err.max() or err.max() == 0  # compensated is closer than fp32
    assert np.all(err3 <= 64 * np.sqrt(z.shape[0]) * EPS32 * 2.0 ** -3 * scale + 1e-30)


def test_syrk_computes_only_the_lower_triangle():
    """Output chunks stop at the diagonal: for 300 columns the M tiles stream 128, 256 and 300 moving
    columns instead of 300 each, 76 % of a full Zᵀ Z's TensorE work."""
    rows, n = 200, 300
    z = np.random.default_rng(1).standard_normal((rows, n)).astype(np.float32)
    k, rep = run(syrk, z)
    assert np.allclose(np.tril(k), np.tril(syrk_reference(z)), rtol=1e-5, atol=1e-3)
    assert rep.flops == 2 * rows * 128 * (128 + 256) + 2 * rows * 44 * 300
    assert rep.flops < 0.8 * 2 * rows * n * n


@pytest.mark.parametrize("naux,nao,nocc", SHAPES)
def test_coulomb_rho_and_j(naux, nao, nocc):
    rng = np.random.default_rng(naux + nao)
    b = _tensor(rng, naux, nao).reshape(naux, nao * nao)
    d = rng.standard_normal((nao, nao))
    d = (d + d.T).reshape(1, -1)
    (rho, j), rep = run(coulomb, b.astype(np.float32), d.astype(np.float32))
    rho0, j0 = coulomb_reference(b, d)
    assert np.abs(rho - rho0).max() <= 4 * np.sqrt(nao * nao) * EPS32 * float(np.max(np.abs(b) @ np.abs(d.T)))
    assert np.abs(j - j0).max() <= 1e-5 * np.abs(j0).max() + 1e-6
    assert _count(rep, "nc_matmul") > 0 and _count(rep, "tensor_reduce") > 0


@pytest.mark.parametrize("naux,nao,nocc", SHAPES[:5] + [(20, 260, 1)])
def test_exchange_build_as_the_sim_device_runs_it(naux, nao, nocc):
    rng = np.random.default_rng(3 * naux + nao)
    b = _tensor(rng, naux, nao)
    c = rng.standard_normal((nao, nocc))
    z, _ = run(batched_gemm, b.astype(np.float32), c.astype(np.float32), np.eye(nao, dtype=np.float32))
    x_ref = np.einsum("mi,pmn->pin", c, b).reshape(naux * nocc, nao)   # Z[(P, i), ν] = (Cᵀ B_P)[i, ν]
    assert np.abs(z - x_ref).max() <= 1e-5 * np.abs(x_ref).max()
    k, _ = run(syrk, z)
    k_ref = np.einsum("pmn,ni,pki->mk", b, c, np.einsum("pkl,li->pki", b, c))  # Σ_P B_P C Cᵀ B_P
    assert np.abs(lower_to_full(k) - k_ref).max() <= 1e-5 * np.abs(k_ref).max()
