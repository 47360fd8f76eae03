"""Shared helpers of the NKI kernel tests (tests/test_kernel_*.py): emulator launch, error measures."""

from __future__ import annotations

import numpy as np

import mp2trn.nkiemu as nki

EPS32 = 2.0 ** -24


def run(kernel, *args, target="trn1", **kwargs):
    """Launch ``kernel`` in the emulator for ``target`` in strict capacity mode (our kernels must never
    spill); returns (outputs, cost report)."""
    out = nki.simulate(kernel, target=target, strict=True)(*args, **kwargs)
    return out, nki.last_report()


def bound(a_t, b):
    """max over the output of Σ_k |a_t[k, m]| |b[k, n]| (scale of the fp32 rounding error of a_tᵀ b)."""
    return float(np.max(np.abs(np.asarray(a_t, np.float64)).T @ np.abs(np.asarray(b, np.float64))))


def cancelling(rng, k, m, n, kappa=1e4):
    """(a_t (k, m), b (k, n)) with a_tᵀ b ≈ 1/kappa of Σ|a||b|: b is nearly orthogonal to a's columns."""
    a_t = rng.standard_normal((k, m))
    q, _ = np.linalg.qr(a_t)
    r = rng.standard_normal((k, n))
    b = r - q @ (q.T @ r) + rng.standard_normal((k, n)) / kappa
    return a_t, b
