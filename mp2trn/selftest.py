"""``mp2trn selftest``: the first command to run on a new machine (trn1/trn2, a GPU, a laptop).

Every device operation — and so, on ``sim``/``neuron``, every NKI kernel behind it — runs on a few
shapes (sizes that are not multiples of 128, a single occupied orbital, several tiles) against a NumPy
reference; then water/cc-pVDZ runs through the whole pipeline and is compared with PySCF's DF-MP2. One
line per check, the kernel launch and compile counts, and a final PASS or FAIL.

    ao_to_mo      batched_gemm     (P|μν) → (P|ia)            ref: einsum over C_occ, C_vir
    metric_solve  trsm             L B = V                    ref: scipy solve_triangular (fp64)
    pair_energies mp2_energy       Σ_ab T²/D, Σ_ab T·Tᵀ/D     ref: einsum on T = B_iᵀ B_j
    pair_densities mp2_density     Γ̄, P_ij, P_ab of a strip   ref: einsum on τ = B_iᵀ B_k / D (the gradient)
    jk_block      batched_gemm + syrk, coulomb   J, K          ref: einsum over B_P, C

Tolerances scale with the device's precision: the error is measured relative to the largest entry of
the reference, and must be below 64·ε of the arithmetic (fp64 ε = 2⁻⁵³, fp32 2⁻²⁴, bf16 2⁻⁸, the
compensated fp32x3 counts as 2⁻³⁰) times √(contraction length). A broken kernel (a wrong index, a
missing tile, a dropped term) is off by O(1); the bounds catch that, they are not precision benchmarks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from .devices import Device, get_device
from .errors import Mp2trnError

#: unit roundoff of each precision's arithmetic; fp32x3 (compensated products, fp32 accumulation and
#: reductions) is counted as 2⁻³⁰: measured errors are 3e-10–5e-8 relative on these shapes
_EPS = {"fp64": 2.0 ** -53, "fp32": 2.0 ** -24, "fp32x3": 2.0 ** -30, "bf16": 2.0 ** -8}
#: the molecule of the whole-pipeline check (r(OH) 0.9572 Å, HOH 104.52°, as molecules/water.xyz)
WATER = "3\nwater\nO 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n"
#: (p, nao, no, nv) for ao_to_mo
AO_SHAPES = [(5, 7, 1, 6), (17, 130, 3, 127), (33, 24, 5, 19)]
#: (naux, n) for metric_solve
METRIC_SHAPES = [(7, 3), (130, 20), (257, 9)]
#: (naux, ni, nj, nva, nvb, same) for pair_energies
PAIR_SHAPES = [(40, 1, 1, 5, 5, True), (130, 3, 3, 17, 17, True), (70, 2, 4, 9, 9, False)]
#: (naux, ni, nk, nva, nvb, c_direct, c_exch, vir_k) for pair_densities: RHF, same spin, opposite spin
DENSITY_SHAPES = [(40, 3, 1, 5, 5, 2.0, 1.0, False), (130, 5, 2, 17, 17, 1 / 3, 1 / 3, False),
                  (70, 4, 3, 9, 7, 1.3, 0.0, True)]
#: (p, nao, nocc) for jk_block
JK_SHAPES = [(12, 9, 1), (40, 129, 5), (130, 30, 7)]


@dataclass
class Check:
    """One selftest line: what was checked, whether it passed, the measured error, the wall time (s)."""

    name: str
    passed: bool
    detail: str
    seconds: float

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name:<44} {self.detail}  ({self.seconds:.2f} s)"


def _compare(name: str, got: np.ndarray, ref: np.ndarray, eps: float, length: int, t0: float) -> Check:
    got = np.asarray(got, dtype=np.float64)
    scale = float(np.max(np.abs(ref))) or 1.0
    if got.shape != ref.shape:
        return Check(name, False, f"shape {got.shape} != reference {ref.shape}", time.perf_counter() - t0)
    err = float(np.max(np.abs(got - ref))) / scale if ref.size else 0.0
    tol = 64 * eps * math.sqrt(max(length, 1))
    ok = bool(np.all(np.isfinite(got))) and err <= tol
    return Check(name, ok, f"rel. error {err:.1e} (bound {tol:.1e})", time.perf_counter() - t0)


def _symmetric(rng, p: int, n: int) -> np.ndarray:
    a = rng.standard_normal((p, n, n))
    return (a + a.transpose(0, 2, 1)) / 2


def check_ao_to_mo(device: Device, rng, eps: float) -> list[Check]:
    out = []
    for p, nao, no, nv in AO_SHAPES:
        t0 = time.perf_counter()
        ao = _symmetric(rng, p, nao)
        c_occ, c_vir = rng.standard_normal((nao, no)), rng.standard_normal((nao, nv))
        ref = np.einsum("pmn,mi,na->pia", ao, c_occ, c_vir, optimize=True)
        arg = np.stack([a[np.tril_indices(nao)] for a in ao]) if device.ao_packed else ao
        got = device.ao_to_mo(arg, c_occ, c_vir)
        out.append(_compare(f"ao_to_mo p={p} nao={nao} no={no} nv={nv}", got, ref, eps, nao * nao, t0))
    return out


def check_metric_solve(device: Device, rng, eps: float) -> list[Check]:
    out = []
    for naux, n in METRIC_SHAPES:
        t0 = time.perf_counter()
        a = rng.standard_normal((naux, naux))
        l_chol = np.linalg.cholesky(a @ a.T / naux + np.eye(naux))
        v = rng.standard_normal((naux, n))
        ref = scipy.linalg.solve_triangular(l_chol, v, lower=True)
        got = device.metric_solve(l_chol, v.copy())
        out.append(_compare(f"metric_solve naux={naux} n={n}", got, ref, eps, naux, t0))
    return out


def _pair_reference(b_i, b_j, e_i, e_j, ev_a, ev_b, exchange):
    t = np.einsum("qia,qjb->ijab", b_i, b_j)
    d = e_i[:, None, None, None] + e_j[None, :, None, None] - ev_a[None, None, :, None] - ev_b[None, None, None, :]
    os_ = np.einsum("ijab,ijab->ij", t, t / d)
    xx = np.einsum("ijab,ijba->ij", t / d, t) if exchange else None
    return os_, xx


def check_pair_energies(device: Device, rng, eps: float) -> list[Check]:
    out = []
    for naux, ni, nj, nva, nvb, same in PAIR_SHAPES:
        t0 = time.perf_counter()
        b_i = rng.standard_normal((naux, ni, nva)) / math.sqrt(naux)
        b_j = b_i if same else rng.standard_normal((naux, nj, nvb)) / math.sqrt(naux)
        e_i, e_j = -1 - rng.random(ni), -1 - rng.random(nj)
        ev_a, ev_b = 0.5 + rng.random(nva), 0.5 + rng.random(nvb)
        if same:
            e_j, ev_b = e_i, ev_a
        exchange = same or nva == nvb
        os_ref, xx_ref = _pair_reference(b_i, b_j, e_i, e_j, ev_a, ev_b, exchange)
        os_, xx = device.pair_energies(b_i.astype(device.storage_dtype), None if same else b_j.astype(device.storage_dtype),
                                       e_i, e_j, ev_a, ev_b, exchange)
        if same:  # only i ≤ j is computed
            keep = np.triu(np.ones((ni, ni), dtype=bool))
            os_, os_ref = np.where(keep, os_, 0.0), np.where(keep, os_ref, 0.0)
            if xx is not None:
                xx, xx_ref = np.where(keep, xx, 0.0), np.where(keep, xx_ref, 0.0)
        got = np.concatenate([np.ravel(os_), np.ravel(xx) if xx is not None else []])
        ref = np.concatenate([np.ravel(os_ref), np.ravel(xx_ref) if xx is not None else []])
        name = f"pair_energies naux={naux} ni={ni} nj={nj} nv={nva}{' (same block)' if same else ''}"
        out.append(_compare(name, got, ref, eps, naux * nva, t0))
    return out


def check_pair_densities(device: Device, rng, eps: float) -> list[Check]:
    """The gradient's pair step against the 4-index einsum of its contract (Device.pair_densities)."""
    if not device.has_pair_densities:
        return []
    out = []
    eps = _EPS.get(device.pair_densities_precision, eps)
    for naux, ni, nk, nva, nvb, c_d, c_x, vir_k in DENSITY_SHAPES:
        t0 = time.perf_counter()
        b_all = rng.standard_normal((naux, ni, nva)) / math.sqrt(naux)
        b_k = rng.standard_normal((naux, nk, nvb)) / math.sqrt(naux)
        e_all, e_k = -1 - rng.random(ni), -1 - rng.random(nk)
        ev_all, ev_k = 0.5 + rng.random(nva), 0.5 + rng.random(nvb)
        d = e_all[:, None, None, None] + e_k[None, :, None, None] - ev_all[None, None, :, None] - ev_k[None, None, None, :]
        tau = np.einsum("qia,qkb->ikab", b_all, b_k) / d
        tt = c_d * tau - (c_x * tau.transpose(0, 1, 3, 2) if c_x else 0.0)
        refs = [np.einsum("ikab,qia->qkb", tt, b_all), np.einsum("ikab,jkab->ij", tau, tt),
                np.einsum("ikab,ikcb->ac", tau, tt)] + ([np.einsum("ikab,ikac->bc", tau, tt)] if vir_k else [])
        got = device.pair_densities(b_all.astype(device.storage_dtype), b_k.astype(device.storage_dtype), e_all, e_k,
                                    ev_all, ev_k, c_d, c_x, vir_k)
        parts = [got.gamma_k, got.p_occ, got.p_vir_all] + ([got.p_vir_k] if vir_k else [])
        name = f"pair_densities naux={naux} ni={ni} nk={nk} nv={nva}/{nvb} c=({c_d:.2g}, {c_x:.2g})"
        # every output scaled by its own largest entry: a missing term shows in the small ones too
        scales = [float(np.max(np.abs(r))) or 1.0 for r in refs]
        if any(np.shape(g) != r.shape for g, r in zip(parts, refs)):
            out.append(Check(name, False, "output shapes differ from the reference", time.perf_counter() - t0))
            continue
        got_n = np.concatenate([np.ravel(np.asarray(g, dtype=np.float64)) / c for g, c in zip(parts, scales)])
        ref_n = np.concatenate([np.ravel(r) / c for r, c in zip(refs, scales)])
        out.append(_compare(name, got_n, ref_n, eps, naux * nva * nvb, t0))
    return out


def check_jk_block(device: Device, rng, eps: float) -> list[Check]:
    if not device.has_jk:
        return []
    out = []
    precision = (device.jk_precisions or (device.precision,))[0]
    jk_eps = _EPS.get(precision, eps)
    dtype = np.float64 if precision == "fp64" else np.float32
    for p, nao, nocc in JK_SHAPES:
        t0 = time.perf_counter()
        b = _symmetric(rng, p, nao)
        c = rng.standard_normal((nao, nocc))
        dm = c @ c.T
        j_ref = np.einsum("pmn,mn,pkl->kl", b, dm, b, optimize=True)
        k_ref = np.einsum("pmi,pni->mn", b @ c, b @ c, optimize=True)
        block = device.jk_tensor(b, np.dtype(dtype))
        vj, vk = device.jk_block(block, [(c, 1.0)], dm, True, True)
        got = np.concatenate([np.ravel(vj), np.ravel(vk)])
        ref = np.concatenate([np.ravel(j_ref), np.ravel(k_ref)])
        out.append(_compare(f"jk_block p={p} nao={nao} nocc={nocc} ({precision})", got, ref, jk_eps, p * nao, t0))
    device.release_jk()
    return out


def check_molecule(device: Device) -> list[Check]:
    """Water/cc-pVDZ through the whole pipeline on ``device`` against PySCF's DF-MP2 (same SCF)."""
    from .options import RunOptions
    from .pipeline import compute
    from .precision import tolerance_for
    from .scratch import run_scratch
    from .validation.pyscf_reference import pyscf_reference

    t0 = time.perf_counter()
    options = RunOptions(device=device, basis="cc-pvdz")
    with run_scratch(None):
        result, mf = compute(WATER, options, device)
        ref = pyscf_reference(mf, options)
    tol = tolerance_for(result.what_ran.get("precision"))
    err = abs(result.e_corr - ref.e_corr)
    name = "water/cc-pVDZ DF-MP2 vs PySCF"
    return [Check(name, err <= tol, f"|ΔE_corr| {err:.1e} Eh (bound {tol:.0e})", time.perf_counter() - t0)]


def selftest(device: str | Device = "cpu", precision: str | None = None, target: str | None = None,
             report: Callable[[str], None] | None = print, seed: int = 2026) -> tuple[bool, list[Check], dict[str, Any]]:
    """Run every check on ``device``; returns (all passed, the checks, summary: device, launches, compiles).

    A device that cannot be opened (no Neuron SDK, no GPU) is a failed check whose line says what to
    install, and the selftest fails.
    """
    say = report or (lambda _line: None)
    checks: list[Check] = []
    summary: dict[str, Any] = {"device": str(device), "precision": precision}
    t0 = time.perf_counter()
    try:
        options = {"target": target} if target else {}
        dev = get_device(device, precision, **options)
    except Mp2trnError as exc:
        checks.append(Check(f"open device {device}", False, str(exc), time.perf_counter() - t0))
        say(checks[-1].line())
        say(f"FAIL: device {device} could not be opened")
        return False, checks, summary
    try:
        info = dev.what_ran()
        summary.update({"device": dev.name, "precision": dev.precision, "what_ran": info})
        shown = ", ".join(f"{k} {info[k]}" for k in ("precision", "target", "nki", "backend") if info.get(k))
        say(f"selftest on device {dev.name} ({shown})")
        eps = _EPS.get(dev.precision, _EPS["fp32"])
        rng = np.random.default_rng(seed)
        for group in (check_ao_to_mo, check_metric_solve, check_pair_energies, check_pair_densities, check_jk_block):
            for check in _guarded(group, dev, rng, eps):
                checks.append(check)
                say(check.line())
        for check in _guarded(lambda d, *_: check_molecule(d), dev, rng, eps):
            checks.append(check)
            say(check.line())
        cost = dev.cost_report()
        if cost:
            summary.update({"launches": cost.get("launches"), "compiles": cost.get("compiles"),
                            "launches_by_stage": cost.get("launches_by_stage"),
                            "compiles_by_stage": cost.get("compiles_by_stage")})
            say(f"kernel launches {cost.get('launches')} ({_by_stage(cost.get('launches_by_stage'))}), distinct "
                f"compiles {cost.get('compiles')} ({_by_stage(cost.get('compiles_by_stage'))})")
        else:
            say(f"kernel launches: none (device {dev.name} runs {info.get('backend', 'library')} calls, not NKI kernels)")
    finally:
        dev.close()
    passed = all(c.passed for c in checks)
    summary["seconds"] = time.perf_counter() - t0
    say(f"{'PASS' if passed else 'FAIL'}: {sum(c.passed for c in checks)}/{len(checks)} checks passed on device "
        f"{summary['device']} ({summary['precision']}) in {summary['seconds']:.1f} s")
    return passed, checks, summary


def _guarded(group, dev, rng, eps) -> list[Check]:
    """A check group; an exception (a kernel that broke a rule, a crash) is a failed check, not a traceback."""
    t0 = time.perf_counter()
    try:
        return group(dev, rng, eps)
    except Exception as exc:  # noqa: BLE001 - every failure is reported as a line
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        name = getattr(group, "__name__", "check").replace("check_", "")
        return [Check(name, False, f"{type(exc).__name__}: {text}", time.perf_counter() - t0)]


def _by_stage(counts: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (counts or {}).items())


__all__ = ["Check", "selftest"]
