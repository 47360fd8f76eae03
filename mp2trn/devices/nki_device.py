"""``sim`` and ``neuron``: the three DF-MP2 stages through the NKI 0.3.0 kernels in ``kernels/``.

=========  =========================================================  ==========================
stage      kernel (one launch per …)                                   host work
=========  =========================================================  ==========================
ao_to_mo   ``batched_gemm`` — both half-transforms fused (per AO        cast / split the block
           block and spin; per ≤512 occupied orbitals)
metric     ``trsm`` — B = L⁻¹V as a block-triangular GEMM (per spin,    L⁻¹ once per molecule, fp64
           or per out-of-core column block)
pairs      ``mp2_energy`` — T in PSUM, fused reductions (per occupied   per-pair sums → fp64 totals
           block pair; never per pair)
=========  =========================================================  ==========================

``sim`` runs them in the built-in emulator (or the real ``nki.simulate`` when the Neuron SDK is
installed) and reports the emulator's cost MODEL for trn1 and trn2; ``neuron`` calls the same kernel
objects through ``nki.jit`` on torch-neuronx tensors. Both plan the launches identically
(:class:`LaunchPlan`): block sizes from the SBUF/PSUM budget of the target generation.

Precisions (``supported_precisions``, first = default): ``fp32`` and the compensated ``fp32x3``
(see :mod:`mp2trn.devices.nki_precision` and docs/precision.md). Between stages the host keeps (P|ia)
and B in float32 (fp32) or as the fp64 sum of the two fp32 planes the x3 kernels return (fp32x3 — on a
NeuronCore these would stay in HBM as plane pairs); all sums over pairs are fp64 on the host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from .base import Device
from .nki_launch import Launcher, make_launcher
from .nki_precision import DESCRIPTIONS, PRECISIONS, beta_for, split

F32 = np.float32
#: SBUF bytes per partition the kernels may plan with (nl.tile_size.total_available_sbuf_size × 0.85)
SBUF_USABLE = {"trn1": 180224, "trn2": 212984}
BLOCKS_ENV = "MP2TRN_NKI_BLOCKS"
MAX_BLOCK = 512   # per-pair sums of one i row fill at most one PSUM bank (512 fp32)


@dataclass
class LaunchPlan:
    """Block sizes shared by ``sim`` and ``neuron`` (compile-time kernel constants).

    ``overrides`` (tests/debugging, or ``MP2TRN_NKI_BLOCKS="ao_group=8,i_block=2"``) force a size; the
    kernels then run with it even if it breaks a hardware rule — which surfaces as KernelConstraintError.
    """

    target: str = "trn1"
    x3: bool = False
    overrides: dict = field(default_factory=dict)

    @property
    def budget(self) -> int:
        return int(SBUF_USABLE[self.target] * 0.85)

    def ao_group(self, nao: int, no: int, nv: int) -> int:
        if "ao_group" in self.overrides:
            return int(self.overrides["ao_group"])
        from ..kernels.batched_gemm import group_size

        return group_size(nao, no, nv, self.x3, self.budget)

    def i_block(self, naux: int, ni: int, nj: int, nva: int, nvb: int) -> int:
        if "i_block" in self.overrides:
            return int(self.overrides["i_block"])
        from ..kernels.mp2_energy import i_block_size

        return i_block_size(naux, ni, nj, nva, nvb, self.x3, self.budget)

    def metric_blocks(self, naux: int, ncol: int) -> tuple[int, int]:
        """(M tiles per resident (L⁻¹)ᵀ panel, columns per streamed V chunk) for the trsm kernel."""
        from ..kernels.gemm import plan_panels

        nt = -(-naux // 128)
        mb, width = plan_panels(nt, nt, ncol, self.x3, self.overrides.get("m_block"), self.budget)
        return int(mb), int(width)

    def occ_block(self, naux: int, nvir: int) -> int:
        """Occupied orbitals per host pair block: a launch covers all pairs of two such blocks; the I
        block is sub-blocked inside the kernel to fit SBUF, and nJ ≤ 512 keeps a row of per-pair sums
        in one PSUM bank."""
        if "occ_block" in self.overrides:
            return int(self.overrides["occ_block"])
        return MAX_BLOCK


def _parse_blocks(text: str | None) -> dict:
    out = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, _, val = item.partition("=")
        if key.strip() not in ("ao_group", "i_block", "m_block", "occ_block") or not val.strip().isdigit():
            raise InputError(f"{BLOCKS_ENV}: cannot parse {item!r} (use e.g. ao_group=8,i_block=2)")
        out[key.strip()] = int(val)
    return out


class NkiDevice(Device):
    """Common base of ``sim`` and ``neuron``."""

    supported_precisions = PRECISIONS          # ("fp32", "fp32x3"): fp32 is the default
    ao_packed = False
    kind = "sim"

    def __init__(self, precision: str = "fp32", target: str | None = None, blocks: dict | None = None):
        if precision not in PRECISIONS:
            raise InputError(f"precision {precision!r} is not available on device {self.kind!r} "
                             f"(choose {', '.join(PRECISIONS)})")
        target = (target or "trn1").lower()
        if target not in SBUF_USABLE:
            raise InputError(f"unknown Trainium target {target!r}: use trn1 or trn2")
        self.precision = precision
        self.target = target
        self.x3 = precision == "fp32x3"
        overrides = _parse_blocks(os.environ.get(BLOCKS_ENV))
        overrides.update(blocks or {})
        self.plan = LaunchPlan(target, self.x3, overrides)
        self.launcher: Launcher = make_launcher(self.kind, target)
        self._linv_key = None
        self._linv = None

    # -- interface ----------------------------------------------------------------------------------
    @property
    def storage_dtype(self) -> np.dtype:
        return np.dtype(np.float64 if self.x3 else F32)

    def describe(self) -> dict[str, Any]:
        from ..kernels import _nki

        d = {"device": self.name, "precision": self.precision, "target": self.target,
             "nki": ("real NKI " + str(getattr(_nki.nki, "__version__", "")) if _nki.NKI_IMPL == "real"
                     else "emulator (mp2trn.nkiemu, NKI 0.3.0 API)"),
             "backend": f"NKI kernels batched_gemm, trsm, mp2_energy via {self.launcher.impl} "
                        f"{'nki.jit on torch-neuronx' if self.kind == 'neuron' else 'simulate'}",
             "precision_detail": DESCRIPTIONS[self.precision],
             "kernel_launches": self.launcher.total_launches}
        return d

    def preferred_occ_block(self, naux: int, nvir: int) -> int:
        return self.plan.occ_block(naux, nvir)

    def cost_report(self) -> dict[str, Any] | None:
        return self.launcher.cost_report(self.precision)

    # -- stage 1: (P|μν) -> (P|ia) ------------------------------------------------------------------
    def ao_to_mo(self, ao: np.ndarray, c_occ: np.ndarray, c_vir: np.ndarray) -> np.ndarray:
        from ..kernels.batched_gemm import batched_gemm, batched_gemm_x3

        p, nao, _ = ao.shape
        no, nv = c_occ.shape[1], c_vir.shape[1]
        out = np.empty((p, no, nv), dtype=self.storage_dtype)
        if self.x3:
            beta = beta_for(nao)
            ao_hi, ao_lo = split(ao, 1, beta)          # grid per (P, μ) along ν (the contraction)
            cv_planes = split(c_vir, 0, beta, with_full=True)
        else:
            ao32 = np.ascontiguousarray(ao, dtype=F32)
            cv32 = np.ascontiguousarray(c_vir, dtype=F32)
        for i0 in range(0, no, MAX_BLOCK):             # one launch per ≤512 occupied orbitals
            i1 = min(no, i0 + MAX_BLOCK)
            co = c_occ[:, i0:i1]
            g = self.plan.ao_group(nao, i1 - i0, nv)
            if self.x3:
                args = (ao_hi, ao_lo, *split(co, 0, beta, with_full=True), *cv_planes, beta)
                y_exact, y_rest = self.launcher.launch("ao_to_mo", batched_gemm_x3, args, {"group": g})
                y = y_exact.astype(np.float64) + y_rest
            else:
                args = (ao32, np.ascontiguousarray(co, dtype=F32), cv32)
                y = self.launcher.launch("ao_to_mo", batched_gemm, args, {"group": g})
            out[:, i0:i1, :] = y.reshape(p, i1 - i0, nv)
        return out

    # -- stage 2: B = L⁻¹ V --------------------------------------------------------------------------
    def _inverse_factor(self, l_chol: np.ndarray):
        key = (id(l_chol), l_chol.shape, float(l_chol[-1, -1]), float(l_chol[0, 0]))
        if self._linv_key != key:
            from ..kernels.trsm import inverse_factor_t

            lt = inverse_factor_t(l_chol)              # (L⁻¹)ᵀ in fp64, once per molecule
            if self.x3:
                self._linv = split(lt, 0, beta_for(lt.shape[0]))
            else:
                self._linv = (lt.astype(F32),)
            self._linv_key = key
        return self._linv

    def metric_solve(self, l_chol: np.ndarray, v: np.ndarray) -> np.ndarray:
        from ..kernels.trsm import trsm, trsm_x3

        naux, n = v.shape
        planes = self._inverse_factor(l_chol)
        mb, width = self.plan.metric_blocks(naux, n)
        kw = {"m_block": mb, "n_width": width}
        if self.x3:
            vh, vl, vf = split(v, 0, beta_for(naux), with_full=True)
            b_exact, b_rest = self.launcher.launch("metric", trsm_x3, (*planes, vh, vl, vf), kw)
            return b_exact.astype(np.float64) + b_rest
        return self.launcher.launch("metric", trsm, (planes[0], np.ascontiguousarray(v, dtype=F32)), kw)

    # -- stage 3: pair energies ----------------------------------------------------------------------
    def pair_energies(self, b_i, b_j, e_i, e_j, ev_a, ev_b, exchange):
        from ..kernels.mp2_energy import mp2_energy, mp2_energy_x3

        same = b_j is None
        naux, ni, nva = b_i.shape
        dt = self.storage_dtype                       # x3: split the fp64 B into planes below
        bi = np.ascontiguousarray(b_i, dtype=dt).reshape(naux, ni * nva)
        if same:
            bj, e_j, ev_b = bi, e_i, ev_a
        else:
            bj = np.ascontiguousarray(b_j, dtype=dt).reshape(naux, -1)
        nj, nvb = len(e_j), len(ev_b)
        consts = (np.asarray(ev_a, dtype=F32).reshape(nva, 1),
                  (-np.asarray(e_i, dtype=np.float64)).astype(F32).reshape(1, ni),
                  (np.asarray(ev_b, np.float64)[None, :] - np.asarray(e_j, np.float64)[:, None]).astype(F32))
        kw = {"exchange": bool(exchange), "same": same, "i_block": self.plan.i_block(naux, ni, nj, nva, nvb)}
        if self.x3:
            beta = beta_for(naux)
            bih, bil = split(bi, 0, beta)
            bjh, bjl, bjf = split(bj, 0, beta, with_full=True)
            out = self.launcher.launch("pairs", mp2_energy_x3, (bih, bil, bjh, bjl, bjf, *consts), kw)
        else:
            out = self.launcher.launch("pairs", mp2_energy, (bi, bj, *consts), kw)
        os_, xx = (out if exchange else (out, None))
        if self.x3:   # per-pair row sums (nva, ni·nj): the last level of each pair sum in fp64, negated
            os_ = -np.asarray(os_, dtype=np.float64).sum(axis=0).reshape(ni, nj)
            xx = None if xx is None else -np.asarray(xx, dtype=np.float64).sum(axis=0).reshape(ni, nj)
        else:
            os_ = np.asarray(os_, dtype=np.float64).reshape(ni, nj)
            xx = None if xx is None else np.asarray(xx, dtype=np.float64).reshape(ni, nj)
        if same:
            os_ = np.triu(os_)
            xx = None if xx is None else np.triu(xx)
        return os_, xx


class SimDevice(NkiDevice):
    """``--device sim``: the NKI kernels in the emulator (or the real ``nki.simulate``), with the modeled
    trn1/trn2 cost of every launch."""

    name = "sim"
    kind = "sim"


class NeuronDevice(NkiDevice):
    """``--device neuron``: the NKI kernels on a NeuronCore through ``nki.jit`` + torch-neuronx. Raises
    DeviceUnavailableError (saying what to install) when the real NKI or torch-neuronx is missing."""

    name = "neuron"
    kind = "neuron"
