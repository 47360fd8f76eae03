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
gradient   ``mp2_density`` — amplitudes on chip; Γ̄ rows and the P_ij,  fp64 sums over strips
           P_ab sums out (per strip of the gradient's pair sweep; fp32)
=========  =========================================================  ==========================

``sim`` runs them in the built-in emulator (or the real ``nki.simulate`` when the Neuron SDK is
installed) and reports the emulator's cost MODEL for trn1 and trn2; ``neuron`` calls the same kernel
objects through ``nki.jit`` on torch-neuronx tensors. Both plan the launches identically
(:class:`LaunchPlan`): block sizes from the SBUF/PSUM budget of the target generation.

Precisions (``supported_precisions``, first = default): ``fp32`` and the compensated ``fp32x3``
(see :mod:`mp2trn.precision` and docs/precision.md). Between stages the host keeps (P|ia)
and B in float32 (fp32) or as the fp64 sum of the two fp32 planes the x3 kernels return (fp32x3 — on a
NeuronCore these would stay in HBM as plane pairs); all sums over pairs are fp64 on the host. The gradient's
pair step runs in fp32 in every mode (no compensated planes for ``mp2_density``; recorded in what-ran).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError, ResourceError
from ..memory import eighth_step_size
from ..nkiemu.targets import DEFAULT_TARGET
from ..packed import coulomb_weights, nao_of_pairs
from ..precision import combine_planes
from .base import Device, PairDensities, root_array
from .nki_launch import Launcher, make_launcher

F32 = np.float32
#: SBUF bytes per partition the kernels may plan with (nl.tile_size.total_available_sbuf_size × 0.85)
SBUF_USABLE = {"trn1": 180224, "trn2": 212984}
BLOCKS_ENV = "MP2TRN_NKI_BLOCKS"
#: device memory (HBM) per NeuronCore, GiB: a Trainium chip has 32 GiB for its two NeuronCore-v2, a
#: Trainium2 chip 96 GiB for its eight NeuronCore-v3 (aws-neuron-sdk
#: about-neuron/arch/neuron-hardware/trainium.rst and trainium2.rst)
HBM_PER_CORE_GIB = {"trn1": 32 / 2, "trn2": 96 / 8}
#: most distinct kernel signatures (NEFF compiles on Trainium) one run may use per stage, with the host's
#: padding (NkiDevice._bucket): J/K — coulomb once, batched_gemm and syrk per factor width (the run's
#: current width, NkiDevice._factor_width: the initial guess's and the occupied orbitals'), and in fp32x3
#: resplit_x3 three times (Z's 1024-row launches, the tensor's
#: two plane sets); ao_to_mo — per spin, the first block size and one larger one; metric —
#: one column chunk per spin; pairs — diagonal and off-diagonal blocks per spin channel (αα, ββ, αβ);
#: grad_pairs — one strip size per spin case of the gradient (RHF one, UHF αα, ββ and αβ both ways); zvector —
#: per spin channel the Z-vector product's five GEMM shapes and five more of the G[X] columns, the shorter last
#: launch of its two contractions over device-resident operands (fp32x3: and their resplit_x3 for a full and a
#: last row count), 16 in all (UHF: α and β), and the MO blocks' resplit_x3 and per spin channel two transforms
#: (C_occ against C for B_oo and B_ov, C_vir against C_vir for B_vv): 16·2 + 1 + 2·2;
#: grad_gamma — per spin channel the fitting-basis pass's full block and its shorter last one.
#: tests/test_compile_signatures.py holds runs of several sizes to it (tests/test_zvector_device.py a gradient).
SIGNATURE_BOUND = {"scf_jk": 12, "ao_to_mo": 4, "metric": 2, "pairs": 6, "grad_pairs": 6, "zvector": 37,
                   "grad_gamma": 4}
#: rows of Z per compensated exchange launch: β = 7 grid bits (mp2trn.precision.beta_for). One launch over a
#: whole block (benzene/cc-pVDZ: 17 000 rows, β = 4) left tr(D ΔK) at 9e-7 (the exact Z); 2048 rows (β = 6)
#: 1.2e-8, 512 rows 6.4e-9, 256 rows (β = 8) 5.3e-9; stannane/def2-SVP (the device's Z): 1024 rows 1.3e-8,
#: 256 rows 5.9e-9. Every launch returns an (nao, nao) pair: 1024 rows keep those transfers 4x below 256's
SYRK_X3_ROWS = 1024
#: auxiliary rows per compensated Coulomb launch (J = Σ_P ρ_P B_P): one launch over stannane/def2-SVP's
#: whole tensor (~300 rows, β = 7) left tr(D ΔJ) at 4.6e-8, 128-row launches (β = 8, a narrower range of
#: ρ_P per grid) 4.8e-9, 32-row ones 1.2e-8 (the exact ρ; fp64 sums of the launches on the host)
J_X3_ROWS = 128
MAX_BLOCK = 512   # per-pair sums of one i row fill at most one PSUM bank (512 fp32)


@dataclass
class LaunchPlan:
    """Block sizes shared by ``sim`` and ``neuron`` (compile-time kernel constants).

    ``overrides`` (tests/debugging, or ``MP2TRN_NKI_BLOCKS="ao_group=8,i_block=2"``) force a size; the
    kernels then run with it even if it breaks a hardware rule — which surfaces as KernelConstraintError.
    """

    target: str = DEFAULT_TARGET
    x3: bool = False                       # a compensated (multi-plane) precision
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
        from ..kernels.tiles import plan_panels

        nt = -(-naux // 128)
        mb, width = plan_panels(nt, nt, ncol, self.x3, self.overrides.get("m_block"), self.budget)
        return int(mb), int(width)

    def gemm_k_rows(self, m: int, n: int) -> int:
        """Contraction rows per ``gemm``/``gemm_x3`` launch for a (K, m)ᵀ·(K, n) product
        (:func:`kernels.tiles.k_tiles_that_fit`): the Z-vector's products contract over naux·nvir rows, more
        than one M tile's panel holds in SBUF on Vitamin C/cc-pVDZ already."""
        from ..kernels.tiles import k_tiles_that_fit

        return 128 * int(k_tiles_that_fit(-(-m // 128), n, self.x3, self.budget))

    def occ_block(self, naux: int, nvir: int) -> int:
        """Occupied orbitals per host pair block: a launch covers all pairs of two such blocks; the I
        block is sub-blocked inside the kernel to fit SBUF, and nJ ≤ 512 keeps a row of per-pair sums
        in one PSUM bank."""
        if "occ_block" in self.overrides:
            return int(self.overrides["occ_block"])
        return MAX_BLOCK

    def density(self, naux: int, ni: int, nk: int, nva: int, nvb: int, exchange: bool,
                vir_k: bool) -> tuple[bool, int, int, int]:
        """(resident, i_block, i_group, b_buffers) of the gradient's pair kernel
        (:func:`kernels.mp2_density.density_plan`)."""
        from ..kernels.mp2_density import density_plan

        return density_plan(naux, ni, nk, nva, nvb, exchange, vir_k, self.budget)


#: what each precision means on the NKI kernels, for the what-ran record
NKI_DETAILS = {
    "fp32": "fp32 operands, fp32 PSUM accumulation; per-pair sums fp32 on chip, pair totals fp64 on the host",
}


@dataclass(frozen=True)
class KernelSet:
    """The kernel of each stage for one operand-plane count, and how the pair kernel's output becomes
    (ni, nj) fp64 per-pair sums; ``densities``: the gradient's pair kernel (None: not for these planes)."""

    ao_to_mo: Any
    metric: Any
    pairs: Any
    pair_sums: Callable[[np.ndarray, int, int], np.ndarray]
    densities: Any = None


def _direct_sums(out: np.ndarray, ni: int, nj: int) -> np.ndarray:
    return np.asarray(out, dtype=np.float64).reshape(ni, nj)


def _row_sums(out: np.ndarray, ni: int, nj: int) -> np.ndarray:
    """Compensated kernels return per-pair row sums (nva, ni·nj), negated: the last level in fp64."""
    return -np.asarray(out, dtype=np.float64).sum(axis=0).reshape(ni, nj)


def kernel_set(planes: int) -> KernelSet:
    """The kernels taking operands of ``planes`` planes (1: fp32; 3: the compensated x3 variants)."""
    from ..kernels.batched_gemm import batched_gemm, batched_gemm_x3
    from ..kernels.mp2_density import mp2_density
    from ..kernels.mp2_energy import mp2_energy, mp2_energy_x3
    from ..kernels.trsm import trsm, trsm_x3

    if planes == 1:
        return KernelSet(batched_gemm, trsm, mp2_energy, _direct_sums, mp2_density)
    return KernelSet(batched_gemm_x3, trsm_x3, mp2_energy_x3, _row_sums)


def _parse_blocks(text: str | None) -> dict:
    out = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, _, val = item.partition("=")
        if key.strip() not in ("ao_group", "i_block", "m_block", "occ_block", "broadcast_dma") or not val.strip().isdigit():
            raise InputError(f"{BLOCKS_ENV}: cannot parse {item!r} (use e.g. ao_group=8,i_block=2)")
        out[key.strip()] = int(val)
    return out


class NkiDevice(Device):
    """Common base of ``sim`` and ``neuron``.

    The precision's registry entry decides everything that differs between modes: how operands are
    split into planes, which kernel variant takes that many planes (:data:`KERNELS`), and how output
    planes are combined.
    """

    supported_precisions = ("fp32", "fp32x3")   # fp32 is the default
    ao_packed = False
    kind = "sim"

    def __init__(self, precision: str = "fp32", target: str | None = None, blocks: dict | None = None):
        if precision not in self.supported_precisions:
            raise InputError(f"precision {precision!r} is not available on device {self.kind!r} "
                             f"(choose {', '.join(self.supported_precisions)})")
        target = (target or DEFAULT_TARGET).lower()
        if target not in SBUF_USABLE:
            raise InputError(f"unknown Trainium target {target!r}: use trn1 or trn2")
        self.precision = precision
        self.target = target
        overrides = _parse_blocks(os.environ.get(BLOCKS_ENV))
        overrides.update(blocks or {})
        self.plan = LaunchPlan(target, self.mode.compensated, overrides)
        self.plan_x3 = LaunchPlan(target, True, overrides)   # the SCF's compensated J/K builds, in any mode
        self.kernels = kernel_set(self.mode.planes)
        self.launcher: Launcher = make_launcher(self.kind, target)
        self._linv_key = None
        self._linv = None
        self._rows: dict[tuple, int] = {}   # the padded size of each bucketed dimension (see _bucket)
        #: B arrays held in device memory (:meth:`hold`): id -> weakref
        self._held: dict[int, weakref.ref] = {}

    # -- interface ----------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        from ..kernels import _nki

        return {"device": self.name, "precision": self.precision, "target": self.target,
                "nki": ("real NKI " + str(getattr(_nki.nki, "__version__", "")) if _nki.NKI_IMPL == "real"
                        else "emulator (mp2trn.nkiemu, NKI 0.3.0 API)"),
                "backend": f"NKI kernels batched_gemm, trsm, mp2_energy via {self.launcher.impl} "
                           f"{'nki.jit on torch-neuronx' if self.kind == 'neuron' else 'simulate'}",
                "precision_detail": NKI_DETAILS.get(self.precision, self.mode.description),
                "kernel_launches": self.launcher.total_launches}

    def occ_block_limit(self, naux: int, nvir: int) -> int | None:
        return self.plan.occ_block(naux, nvir)

    def cost_report(self, since: Any = None) -> dict[str, Any] | None:
        return self.launcher.cost_report(self.precision, since)

    def cost_checkpoint(self) -> Any:
        return self.launcher.checkpoint()

    def transfer_record(self, since: Any = None) -> dict[str, dict[str, int]] | None:
        return self.launcher.transfer_record(since)

    def collective_launcher(self) -> Launcher:
        return self.launcher

    # -- compile signatures: the host pads shapes so a run compiles few distinct kernels ----------------
    def _bucket(self, key: tuple, n: int) -> int:
        """The size to pad a dimension of ``n`` to: the largest seen so far under ``key`` in this run.

        Blocks over the auxiliary index, metric column chunks and occupied blocks come in one full size
        and a shorter last one; padding the short ones with zeros (which add nothing) keeps one kernel
        signature — one NEFF compile on Trainium — per stage and spin channel (:data:`SIGNATURE_BOUND`).
        """
        size = max(self._rows.get(key, 0), n)
        self._rows[key] = size
        return size

    def _factor_width(self, nao: int, n: int) -> int:
        """The padded width of a density factor block of ``n`` orbitals: :func:`factor_width`, padded further
        to the current width of the run (one signature for the full builds' occupied orbitals and the
        difference densities' parts, which are at most as wide), which a wider block raises and a block under
        3/4 of it resets: the initial guess's factor (PySCF's minao guess: 107 fractionally occupied
        orbitals on Inosine, against 70 occupied) or a short last part of a wide factor gets a width of its
        own instead of padding every block after it."""
        key, width = ("scf_jk_factor", nao), factor_width(n)
        current = self._rows.get(key, 0)
        if width > current or 4 * width < 3 * current:
            self._rows[key] = current = width
        return current

    # -- the SCF's J/K builds: fp32 kernels, and the compensated fp32x3 ones (see mp2trn.jk) ------------
    has_jk = True
    jk_precisions = ("fp32", "fp32x3")
    #: difference-density builds: the fp32x3 final builds settle the energy only when incremental (mp2trn.jk)
    jk_incremental = True

    #: the host keeps the tensor's rows packed (:mod:`mp2trn.packed`, half the host memory, and half the bytes
    #: J's ρ = B·D reads in a compensated build); the device's copies are unpacked as they are made
    jk_packed = True
    jk_streamed_unpacked = True

    def jk_copy_itemsize(self, dtype, planes=1) -> int:
        """Per element of the packed rows (about half an unpacked row's): fp32, the unpacked block in fp32
        (2 × 4 bytes); compensated, the planes of both splits of the unpacked block (:class:`_X3Block`, 2 + 4
        bytes split along μ and 2 + 4 + 4 along P: 2 × 16) and the fp32 pair they are made from, alive beside
        them at the precision switch (2 × 8)."""
        return 48 if planes > 1 else 8

    def _rows_of(self, block) -> tuple[int, int]:
        """(device rows, nao) of a host block: whole 128-row tiles (Z's p·n rows, n ≥ 8, are then whole
        SYRK_X3_ROWS launches, one signature each); a block of fewer rows (a tight budget's streamed blocks) is
        not padded to 128: that is its cost."""
        p = block.shape[0]
        nao = nao_of_pairs(block.shape[1]) if block.ndim == 2 else block.shape[1]
        return self._bucket(("scf_jk", block.shape[1]), -(-p // 128) * 128 if p >= 128 else p), nao

    @staticmethod
    def _reusable(previous, rows: int, nao: int) -> np.ndarray | None:
        """``previous`` when it is fp32 rows as made for the fp32 builds, of the padded rows' shape, an array
        of its own (a view of another kept array would be dropped with it once the planes are made)."""
        ok = isinstance(previous, np.ndarray) and previous.dtype == F32 and previous.shape == (rows, nao, nao) \
            and root_array(previous).nbytes == previous.nbytes
        return previous if ok else None

    def jk_second_half(self, block, previous):
        from ..precision import fp32_pair

        # the rows as the fp32 block was made (not the run's bucket: this runs in a thread of its own)
        nao = nao_of_pairs(block.shape[1]) if block.ndim == 2 else block.shape[1]
        rows = previous.shape[0] if isinstance(previous, np.ndarray) and previous.ndim == 3 else 0
        hi = self._reusable(previous, rows, nao) if rows >= block.shape[0] else None
        return None if hi is None else fp32_pair(np.asarray(block, dtype=np.float64), rows, hi)[1]

    def jk_tensor(self, block, dtype, keep_copy=True, planes=1, previous=None, second=None):   # the copy is always kept
        """The block — packed host rows (p, nao(nao+1)/2), or unpacked ones — in device memory: fp32 rows
        (rows, nao, nao), or (compensated) its :class:`_X3Block` planes. The launcher keeps the arrays
        resident (:meth:`Launcher.keep`): sent to the device once per SCF and precision. A compensated block
        made from the block's fp32 rows (``previous``) takes them as the first half of its fp32 pair: they are
        in device memory already, and only the second half is made and sent."""
        from ..precision import fp32_copy

        rows, nao = self._rows_of(block)
        if planes > 1:   # the pair now (a streamed block is made by a reader thread), the planes at first use
            hi = self._reusable(previous, rows, nao)
            lo = second if hi is not None and isinstance(second, np.ndarray) and second.shape == hi.shape \
                and second.dtype == F32 else None
            return _X3Block.pair_of(np.asarray(block, dtype=np.float64), rows, hi, lo)
        kept = fp32_copy(block, rows)   # (rows, nao, nao), unpacked
        self.launcher.keep(kept)
        return kept

    def release_jk(self) -> None:
        self.launcher.drop_kept()

    def jk_block(self, block, factors, dm, with_j, with_k):
        if isinstance(block, _X3Block):
            return self._jk_block_x3(block.made_on(self.launcher), factors, with_j, with_k)
        from ..kernels.batched_gemm import batched_gemm
        from ..kernels.coulomb import coulomb
        from ..kernels.syrk import lower_to_full, syrk

        p, nao, _ = block.shape
        vj = vk = None
        if with_k:
            low = np.zeros((nao, nao))        # Σ sign · ZᵀZ, the kernels' lower triangles in fp64, mirrored once
            eye = np.eye(nao, dtype=F32)      # C_vir = 1: batched_gemm's second half is TensorE's transpose
            for c, sign in factors:
                for part in _factor_parts(c):
                    co = _padded_factor(part, self._factor_width(nao, part.shape[1]), F32)
                    kw = {"group": self.plan.ao_group(nao, co.shape[1], nao)}
                    z = self.launcher.launch("scf_jk", batched_gemm, (block, co, eye), kw, stay=True)  # (p·n, nao)
                    k = self.launcher.launch("scf_jk", syrk, (z,), {})                        # Z stays there
                    (np.add if sign > 0 else np.subtract)(low, k, out=low)
            vk = lower_to_full(low)
        if with_j:
            flat = block.reshape(p, nao * nao)
            _, j = self.launcher.launch("scf_jk", coulomb, (flat, np.asarray(dm, dtype=F32).reshape(1, -1)), {})
            vj = np.asarray(j, dtype=np.float64).reshape(nao, nao)
        return vj, vk

    def _jk_block_x3(self, block: "_X3Block", factors, with_j: bool, with_k: bool):
        """Compensated J and K of one block (fp32x3: each product hi·hi exact, hi·lo + lo·x in fp32; the
        products that leave the chip come as two fp32 planes, added in fp64 on the host — mp2trn.precision):

            Z_P = Cᵀ B_P           batched_gemm_x3 (C_vir = 1: its second half is TensorE's transpose); Z
                                    stays in device memory
            Z planes               resplit_x3 on chip, per :data:`SYRK_X3_ROWS` rows (grid along the rows)
            K   = Σ sign · Zᵀ Z     syrk_x3 on those planes, one launch per :data:`SYRK_X3_ROWS` rows
            ρ_P = Σ_μν B_P,μν D_μν  the host's fp64 product of its own rows of the tensor with the density
            J   = Σ_P ρ_P B_P       gemm_x3 per :data:`J_X3_ROWS` rows, ρ stationary, the planes split along P
                                    moving

        ρ is exact (fp64, the host's rows) rather than the coulomb kernel's ρ = B·D, which runs on VectorE,
        whose fp32 products a split cannot make exact (a ρ traced off the device's Cᵀ B_P C, tried, was less
        accurate than this fp64 one). Until the resplit kernel, Z itself went to the host at
        every build (0.3 GB for Inosine/cc-pVDZ), was added in fp64, split and sent back."""
        from ..kernels.batched_gemm import batched_gemm_x3
        from ..kernels.gemm import gemm_x3
        from ..kernels.resplit import resplit_x3
        from ..kernels.syrk import lower_to_full, syrk_x3
        from ..precision import beta_for

        mode = self.mode if self.mode.compensated else _compensated()
        launch = self.launcher.launch
        p, nao = block.rows, block.nao
        eye = mode.split_operand(np.eye(nao), axis=0, moving=True)
        low = np.zeros((nao, nao)) if with_k else None    # Σ sign · (k_exact + k_rest), lower triangles, fp64
        density = np.zeros((nao, nao))
        for c, sign in factors:
            density += sign * (c @ c.T)
            if not with_k:
                continue
            for part in _factor_parts(c):
                co = _padded_factor(part, self._factor_width(nao, part.shape[1]), np.float64)
                n = co.shape[1]
                args = (*block.by_mu, *mode.split_operand(co, axis=0, moving=True), *eye, *mode.grid_args(nao))
                kw = {"group": self.plan_x3.ao_group(nao, n, nao)}
                exact, rest = launch("scf_jk", batched_gemm_x3, args, kw, stay=True)    # (p·n, nao), on the device
                beta = beta_for(SYRK_X3_ROWS)
                for r0 in range(0, p * n, SYRK_X3_ROWS):
                    rows = slice(r0, min(p * n, r0 + SYRK_X3_ROWS))
                    planes = launch("scf_jk", resplit_x3, (exact[rows], rest[rows], beta),
                                    {"rows_out": SYRK_X3_ROWS}, stay=True)
                    for k in launch("scf_jk", syrk_x3, planes, {}):
                        (np.add if sign > 0 else np.subtract)(low, k, out=low)
        vk = lower_to_full(low) if with_k else None          # mirrored once per build
        rho = np.zeros(p)
        if with_j:
            host = block.host.reshape(block.host.shape[0], -1)      # packed rows: half the bytes of unpacked ones
            rho[:host.shape[0]] = host @ coulomb_weights(density, block.host.ndim == 2)
        vj = None
        if with_j:
            vj = np.zeros(nao * nao)
            for c, chunk in enumerate(block.by_p):
                r0 = c * J_X3_ROWS
                rho_planes = mode.split_operand(_pad_rows(rho[r0:r0 + J_X3_ROWS].reshape(-1, 1), J_X3_ROWS), axis=0,
                                                moving=False)
                vj += mode.combine(self.launcher.launch("scf_jk", gemm_x3, (*rho_planes, *chunk), {})).ravel()
            vj = _exact_along_density(vj.reshape(nao, nao), density, float(rho @ rho))
        return vj, vk

    # -- stage 1: (P|μν) -> (P|ia) ------------------------------------------------------------------
    def ao_to_mo(self, ao: np.ndarray, c_occ: np.ndarray, c_vir: np.ndarray) -> np.ndarray:
        mode = self.mode
        p, nao, _ = ao.shape
        rows = self._bucket(("ao_to_mo", nao), p)                    # zero rows: the last, shorter block
        ao_planes = mode.split_operand(_pad_rows(ao, rows), axis=1, moving=False)   # grid per (P, μ) along ν
        return self._transform(ao_planes, p, c_occ, c_vir, "ao_to_mo", mode, self.plan, self.kernels.ao_to_mo)

    def _transform(self, ao_planes: tuple, p: int, c_occ, c_vir, stage: str, mode, plan, kernel) -> np.ndarray:
        """(p, no, nv) = C_occᵀ (P|μν) C_vir of the (padded) AO planes in device memory or from the host:
        one launch per ≤ 512 occupied orbitals, the pairs of a compensated kernel added in fp64 (``mode``'s
        storage dtype)."""
        rows, nao = ao_planes[0].shape[0], ao_planes[0].shape[1]
        no, nv = c_occ.shape[1], c_vir.shape[1]
        out = np.empty((p, no, nv), dtype=mode.storage)
        cv_planes = mode.split_operand(c_vir, axis=0, moving=True)
        for i0 in range(0, no, MAX_BLOCK):             # one launch per ≤512 occupied orbitals
            i1 = min(no, i0 + MAX_BLOCK)
            co_planes = mode.split_operand(c_occ[:, i0:i1], axis=0, moving=True)
            args = (*ao_planes, *co_planes, *cv_planes, *mode.grid_args(nao))
            kw = {"group": plan.ao_group(nao, i1 - i0, nv)}
            y = mode.combine(self.launcher.launch(stage, kernel, args, kw))
            out[:, i0:i1, :] = y.reshape(rows, i1 - i0, nv)[:p]
        return out

    # -- stage 2: B = L⁻¹ V --------------------------------------------------------------------------
    def _inverse_factor(self, l_chol: np.ndarray):
        key = (id(l_chol), l_chol.shape, float(l_chol[-1, -1]), float(l_chol[0, 0]))
        if self._linv_key != key:
            from ..kernels.trsm import inverse_factor_t

            # (L⁻¹)ᵀ in fp64, once per molecule, split for the stationary side
            self._linv = self.mode.split_operand(inverse_factor_t(l_chol), axis=0, moving=False)
            self._linv_key = key
        return self._linv

    def metric_solve(self, l_chol: np.ndarray, v: np.ndarray) -> np.ndarray:
        naux, n = v.shape
        cols = self._bucket(("metric", naux), n)                     # zero columns: the last chunk
        if cols > n:
            v = np.concatenate([v, np.zeros((naux, cols - n), dtype=v.dtype)], axis=1)
        mb, width = self.plan.metric_blocks(naux, cols)
        args = (*self._inverse_factor(l_chol), *self.mode.split_operand(v, axis=0, moving=True))
        out = self.launcher.launch("metric", self.kernels.metric, args, {"m_block": mb, "n_width": width})
        return self.mode.combine(out)[:, :n]

    #: the share of the NeuronCore's HBM (:meth:`memory_mb`) that B may take when held
    HOLD_SHARE = 0.5

    def hold(self, arrays, add=True) -> str:
        """B kept in HBM from the energy's pair step through the gradient's sweep: sent once, every block a
        pair kernel reads is then sliced (and zero-padded) from the device copy (:meth:`Launcher.derive`;
        the ``neuron`` launcher slices its XLA tensor, the emulator counts the bytes once). Only in fp32:
        the fp32x3 pair kernel takes each block as planes split on the host."""
        if os.environ.get("MP2TRN_HOLD_B", "1") == "0":    # a benchmark's switch, as on the torch device
            return "sent with each launch (MP2TRN_HOLD_B=0)"
        new = [a for a in arrays if not self._holds(a)]
        if not new:
            return f"resident in device memory ({self.held_mb():.0f} MB, held since the energy)"
        if not add:
            return "sent with each launch (not held by the energy)"
        if self.mode.compensated or any(a.dtype != F32 or a.ndim != 2 for a in new):
            return "sent with each launch (the fp32x3 pair kernel takes each block as planes split on the host)"
        need = sum(a.nbytes for a in new) + self.held_mb() * 1e6
        hbm_mb = self.hbm_mb()
        if need > self.HOLD_SHARE * hbm_mb * 1e6:
            return (f"sent with each launch: holding B would take {need / 1e6:.0f} MB, more than "
                    f"{self.HOLD_SHARE:.0%} of the NeuronCore's {hbm_mb:.0f} MB of HBM")
        held = self._held    # the callbacks close over the dict, not the device
        for a in new:
            self.launcher.keep(a)
            held[id(a)] = weakref.ref(a, lambda _r, k=id(a): held.pop(k, None))
        return f"resident in device memory ({sum(a.nbytes for a in new) / 1e6:.0f} MB, sent once)"

    def hbm_mb(self) -> float:
        """The HBM of the one NeuronCore a run uses (:data:`HBM_PER_CORE_GIB`), MB: the ``neuron`` device's
        memory, and what the ``sim`` device models."""
        return HBM_PER_CORE_GIB[self.target] * 2 ** 30 / 1e6

    def _holds(self, a: np.ndarray) -> bool:
        ref = self._held.get(id(a))
        return ref is not None and ref() is a

    def held_mb(self) -> float:
        return sum(a.nbytes for a in (r() for r in list(self._held.values())) if a is not None) / 1e6

    def release(self) -> None:
        self.launcher.drop(*(a for a in (r() for r in list(self._held.values())) if a is not None))
        self._held.clear()

    def _b_argument(self, b: np.ndarray, n: int, dtype) -> np.ndarray:
        """A pair kernel's B argument: the (naux, k, nv) block ``b`` as a C-contiguous (naux, n·nv) array in
        ``dtype``, zero-padded to n orbitals. When ``b`` is a column range of a held B, the device makes the
        argument from its copy (no host transfer)."""
        naux, k, nv = b.shape
        arg = np.empty((naux, n * nv), dtype)
        arg[:, :k * nv] = b.reshape(naux, k * nv)
        arg[:, k * nv:] = 0.0                   # the padded orbitals (none for a full block)
        root = root_array(b)
        if self._holds(root) and root.dtype == arg.dtype and k and b.strides == (root.strides[0], nv * b.itemsize,
                                                                                    b.itemsize):
            col0, rest = divmod(b.__array_interface__["data"][0] - root.__array_interface__["data"][0], b.itemsize)
            if not rest and 0 <= col0 < root.shape[1]:
                self.launcher.derive(arg, root, col0, k * nv)
        return arg

    # -- stage 3: pair energies ----------------------------------------------------------------------
    def pair_energies(self, b_i, b_j, e_i, e_j, ev_a, ev_b, exchange):
        mode = self.mode
        same = b_j is None
        naux, ni0, nva = b_i.shape
        nj0 = ni0 if same else b_j.shape[1]
        # occupied blocks padded to the largest of their kind: zero B rows give T = 0 (nothing added);
        # their orbital energy −1 Eh keeps every denominator finite
        ni = self._bucket(("pairs_i", same, naux, nva), ni0)
        bi = self._b_argument(b_i, ni, self.storage_dtype)
        e_i = _pad_energies(e_i, ni)
        if same:
            bj, e_j, ev_b = bi, e_i, ev_a
        else:
            nj = self._bucket(("pairs_j", naux, b_j.shape[2]), nj0)
            bj = self._b_argument(b_j, nj, self.storage_dtype)
            e_j = _pad_energies(e_j, nj)
        nj, nvb = len(e_j), len(ev_b)
        consts = (np.asarray(ev_a, dtype=F32).reshape(nva, 1),
                  (-np.asarray(e_i, dtype=np.float64)).astype(F32).reshape(1, ni),
                  (np.asarray(ev_b, np.float64)[None, :] - np.asarray(e_j, np.float64)[:, None]).astype(F32))
        kw = {"exchange": bool(exchange), "same": same, "i_block": self.plan.i_block(naux, ni, nj, nva, nvb)}
        if "broadcast_dma" in self.plan.overrides:   # 0: partition broadcasts by TensorE instead of stride-0 DMAs
            kw["broadcast_dma"] = bool(int(self.plan.overrides["broadcast_dma"]))
        args = (*mode.split_operand(bi, axis=0, moving=False), *mode.split_operand(bj, axis=0, moving=True), *consts)
        out = self.launcher.launch("pairs", self.kernels.pairs, args, kw)
        sums = [self.kernels.pair_sums(x, ni, nj)[:ni0, :nj0] for x in (out if exchange else (out,))]
        os_, xx = (sums[0], sums[1] if exchange else None)
        if same:
            os_ = np.triu(os_)
            xx = None if xx is None else np.triu(xx)
        return os_, xx

    # -- the orbital response's GEMMs: ``gemm`` (fp32) or ``gemm_x3`` (fp32x3), the stationary operands kept ----
    @property
    def response_precision(self) -> str:
        return self.precision

    def response_blocks(self, rows, channels, out):
        """The compensated AO→MO kernel (``batched_gemm_x3``, its pair added in fp64) per channel twice — C_occ
        against [C_occ C_vir] (oo and ov), then C_vir against C_vir (vv) — launched under stage ``zvector`` in every precision, so that the blocks come back to ~1e-9 of the
        host's fp64 ones: the host's fp64 products of these blocks are the fallback when the device's products
        stall near an unstable SCF (a near-singular Hessian amplifies even that difference in z; the gradient
        stays within 1e-6 Eh/bohr of cpu fp64, tests/test_zvector_device.py). The rows go over once for all
        channels, as an fp32 pair (8 bytes per element), and ``resplit_x3`` makes their planes on the chip, as
        for the SCF's tensor; the blocks come back to the host (fp64), which keeps them in the products'
        layouts on the device (:meth:`response_operand`)."""
        from ..kernels.batched_gemm import batched_gemm_x3
        from ..precision import fp32_pair

        p, nao, _ = rows.shape
        padded = self._bucket(("zvector", nao), p)                   # zero rows: the last, shorter chunk
        hi, lo = fp32_pair(rows, padded)
        self.launcher.keep(hi, lo)
        planes = _split_by_mu(self.launcher, "zvector", hi, lo)       # the planes ao_to_mo would send
        self.launcher.drop(hi, lo)
        for (c_occ, c_vir), (oo, ov, vv) in zip(channels, out):
            o = c_occ.shape[1]
            occ = self._transform(planes, p, c_occ, np.hstack([c_occ, c_vir]), "zvector", _compensated(),
                                  self.plan_x3, batched_gemm_x3)
            oo[...], ov[...] = occ[:, :, :o], occ[:, :, o:]
            vv[...] = self._transform(planes, p, c_vir, c_vir, "zvector", _compensated(), self.plan_x3,
                                      batched_gemm_x3)

    def response_operand(self, a_t, moving=False):
        """The operand's planes (fp32: one; fp32x3: hi, lo, and x for an operand ``moving`` in some product),
        kept in device memory: every Z-vector iteration reads them, the bytes travel once. A moving
        operand's hi and lo are its stationary planes (one split along K), so it serves both sides."""
        planes = self.mode.split_operand(np.asarray(a_t, dtype=np.float64), axis=0, moving=moving)
        self.launcher.keep(*planes)
        return planes

    #: grouped results stay in device memory: no host buffer to write them into
    response_grouped_on_host = False

    def response_grouped(self, a_t, b, width, stage="zvector", out=None):
        """One ``gemm(width=…)`` launch: ``a_t`` (K, M) from the host stationary, the kept ``b`` (a
        ``moving=True`` handle) streamed; the result — (G·M, width) fp32, or the fp32x3 pair — stays in device
        memory (``stay``), its planes the handle :meth:`response_gemm` takes as ``b``."""
        planes = self.mode.split_operand(np.asarray(a_t, dtype=np.float64), axis=0, moving=False)
        k, m = planes[0].shape
        rows = self.plan.gemm_k_rows(m, min(b[0].shape[1], 512))    # for the widest column chunk a launch streams
        if k > rows:
            raise ResourceError(f"the Z-vector's grouped product contracts over {k} orbitals, more than one launch "
                                f"holds in SBUF ({rows}); run the gradient on --device cpu")
        out = self.launcher.launch(stage, _response_kernel(self.mode.compensated), (*planes, *b), {"width": width},
                                   stay=True)
        return out if isinstance(out, tuple) else (out,)

    def response_gemm(self, a_t, b, stage="zvector", out=None):
        """One launch per :meth:`LaunchPlan.gemm_k_rows` rows of the contraction (row ranges of the kept
        planes: slices in device memory), their products added in fp64 on the host. A stationary plane split
        for the whole K has a grid no finer than one split for a part of it, so the compensated products of
        a part stay exact (mp2trn.precision). ``b`` from the host is split per launch; ``b`` in device memory
        (a :meth:`response_grouped` result) is sliced there, its fp32x3 pair split on the chip by
        ``resplit_x3`` per launch's rows (the grid the host's split of those rows would have)."""
        planes = a_t if isinstance(a_t, tuple) else self.mode.split_operand(np.asarray(a_t, dtype=np.float64),
                                                                            axis=0, moving=False)
        planes = planes[:2] if self.mode.compensated else planes     # a moving handle's x is not needed here
        resident = isinstance(b, tuple)
        b = b if resident else np.asarray(b, dtype=np.float64)
        k, m = planes[0].shape
        n = b[0].shape[1] if resident else b.shape[1]
        rows = self.plan.gemm_k_rows(m, n)
        kernel = _response_kernel(self.mode.compensated)
        if out is None:
            out = np.zeros((m, n))
        else:
            out[...] = 0.0
        for k0 in range(0, k, rows):
            moving = self._moving_rows(b, k0, min(k, k0 + rows), stage) if resident else \
                self.mode.split_operand(b[k0:k0 + rows], axis=0, moving=True)
            part = self.launcher.launch(stage, kernel, (*(p[k0:k0 + rows] for p in planes), *moving), {})
            out += self.mode.combine(part)
        return out

    def _moving_rows(self, b: tuple, r0: int, r1: int, stage: str) -> tuple:
        """Rows r0:r1 of a result in device memory as a moving operand's planes, made there."""
        if not self.mode.compensated:
            return (b[0][r0:r1],)
        from ..kernels.resplit import resplit_x3
        from ..precision import beta_for

        return self.launcher.launch(stage, resplit_x3, (b[0][r0:r1], b[1][r0:r1], beta_for(r1 - r0)), {}, stay=True)

    # -- the gradient's pair step ----------------------------------------------------------------------
    has_pair_densities = True

    @property
    def pair_densities_precision(self) -> str:
        """fp32 in every precision mode: ``mp2_density`` has no compensated (fp32x3) variant, so under fp32x3
        the gradient's pair step runs the fp32 kernel on B rounded to fp32 (what-ran says so)."""
        return "fp32"

    def pair_densities(self, b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch, vir_k, energies=False) -> PairDensities:
        """One strip through ``mp2_density`` (one launch): B and energies in fp32 as the kernel takes them,
        the k block padded to the largest of the run (zero B, energy −1 Eh: nothing added, one signature),
        the sums back in fp64."""
        if energies:
            raise ValueError(f"device {self.name!r} does not sum pair energies in its pair sweep (sweep_energies)")
        kernel = self.kernels.densities or kernel_set(1).densities    # fp32 for every mode (see above)
        naux, ni, nva = b_all.shape
        nk0, nvb = b_k.shape[1], b_k.shape[2]
        c_direct, c_exch = float(c_direct), float(c_exch)
        if c_exch and nva != nvb:
            raise InputError(f"pair densities: exchange (c_exch={c_exch}) needs one spin on both sides, got "
                             f"{nva} and {nvb} virtuals")
        if c_direct == 0.0 and c_exch == 0.0:
            return PairDensities(np.zeros((naux, nk0, nvb)), np.zeros((ni, ni)), np.zeros((nva, nva)),
                                 np.zeros((nvb, nvb)) if vir_k else None)
        if c_direct <= 0.0 or c_direct < abs(c_exch):
            raise InputError(f"pair densities on device {self.kind!r} need c_direct > 0 and c_direct >= |c_exch| "
                             f"(every MP2, SCS- and SOS-MP2 spin case); got c_direct={c_direct}, c_exch={c_exch}")
        exchange = c_exch != 0.0
        nk = self._bucket(("grad_pairs_k", naux, ni, nva, nvb, exchange), nk0)
        e_k = _pad_energies(e_k, nk)
        ba = self._b_argument(b_all, ni, F32)
        bk = self._b_argument(b_k, nk, F32)
        consts = (np.asarray(ev_all, dtype=F32).reshape(nva, 1),
                  (-np.asarray(e_all, dtype=np.float64)).astype(F32).reshape(1, ni),
                  (np.asarray(ev_k, np.float64)[None, :] - np.asarray(e_k, np.float64)[:, None]).astype(F32))
        resident, i_block, i_group, b_buffers = self.plan.density(naux, ni, nk, nva, nvb, exchange, bool(vir_k))
        kw = {"c_direct": c_direct, "c_exch": c_exch, "vir_k": bool(vir_k), "resident": resident,
              "i_block": i_block, "i_group": i_group, "b_buffers": b_buffers}
        out = self.launcher.launch("grad_pairs", kernel, (ba, bk, *consts), kw)
        gamma = np.asarray(out[0], dtype=np.float64).reshape(naux, nk, nvb)[:, :nk0]
        p_vir_k = np.asarray(out[3], dtype=np.float64) if vir_k else None
        return PairDensities(gamma, np.asarray(out[1], dtype=np.float64), np.asarray(out[2], dtype=np.float64),
                             p_vir_k)



def _response_kernel(compensated: bool):
    from ..kernels.gemm import gemm, gemm_x3

    return gemm_x3 if compensated else gemm


def _pad_rows(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` with zero rows appended along axis 0 up to ``rows``."""
    if a.shape[0] >= rows:
        return a
    return np.concatenate([a, np.zeros((rows - a.shape[0], *a.shape[1:]), dtype=a.dtype)])


def _pad_energies(e: np.ndarray, n: int) -> np.ndarray:
    """Occupied energies padded to ``n`` orbitals with −1 Eh (the padded orbitals' B is zero)."""
    e = np.asarray(e, dtype=np.float64)
    return e if len(e) >= n else np.concatenate([e, -np.ones(n - len(e))])


def _split_by_mu(launcher, stage: str, hi: np.ndarray, lo: np.ndarray) -> tuple:
    """The stationary planes (hi, lo) of (p, nao, nao) rows sent as an fp32 pair (kept by the caller), made on
    the chip by ``resplit_x3``: one grid per (P, ν) along μ (groups of nao of the (P, μ) rows), the split the
    host's ``split_operand(rows, axis=1)`` makes; they stay in device memory."""
    from ..kernels.resplit import resplit_x3
    from ..precision import beta_for

    p, nao, _ = hi.shape
    planes = launcher.launch(stage, resplit_x3, (hi.reshape(p * nao, nao), lo.reshape(p * nao, nao), beta_for(nao)),
                             {"group": nao, "planes": 2}, stay=True)
    return tuple(a.reshape(p, nao, nao) for a in planes)


def _compensated():
    from ..precision import get_precision

    return get_precision("fp32x3")


def _exact_along_density(vj: np.ndarray, density: np.ndarray, trace: float) -> np.ndarray:
    """J plus the multiple of the density that makes tr(D J) equal ``trace`` = Σ_P ρ_P², its exact value
    (tr(D J) = Σ_P ρ_P Σ_μν B_P,μν D_μν = ρ·ρ, with ρ in fp64 on the host).

    The compensated J = Σ_P ρ_P B_P is good to ~1e-10 of Σ|ρ_P B_P|, the rounding of its fp32 corrections
    (rows of B far below their column's grid keep only fp32 precision), and the SCF energy takes
    ½ tr(D J) at first order: stannane/def2-SVP was 1.6e-8 Eh off the fp64 SCF before this correction,
    5.7e-11 after (``python scripts/scf_schedule_errors.py``, docs/precision.md). The added multiple is of
    that size (~1e-10 of J), so the Fock matrix, and with it the orbitals, move only at that level; a closed
    shell's energy gets the exact fitted Coulomb term. Each density set is corrected along itself: for UHF the
    cross term tr(D_α J_β) keeps the compensated rounding (hydroxyl: 1.3e-9 Eh off the fp64 SCF). A
    difference-density build is corrected along its ΔD alike."""
    norm = float(np.vdot(density, density))
    if norm == 0.0:
        return vj
    return vj + ((trace - float(np.vdot(density, vj))) / norm) * density


def _factor_parts(c: np.ndarray):
    """Column blocks of a density factor of at most MAX_BLOCK orbitals (one PSUM bank per launch)."""
    for i0 in range(0, c.shape[1], MAX_BLOCK):
        yield c[:, i0:i0 + MAX_BLOCK]


def factor_width(n: int) -> int:
    """The width a factor block of ``n`` orbitals is padded to: a multiple of 8 (Z's p·n rows are then whole
    :data:`SYRK_X3_ROWS` launches for p a multiple of 128) in steps of an eighth of a power of two, ≤ 12.5 %
    of zero columns (Inosine's 70 occupied orbitals: 72 columns, where the next power of two gave 128: the
    exchange's Z, its DMA and its syrk scale with the width), at most :data:`MAX_BLOCK`."""
    return min(MAX_BLOCK, eighth_step_size(n, minimum_step=8))


def _padded_factor(part: np.ndarray, width: int, dtype) -> np.ndarray:
    """A factor block with zero columns up to ``width`` (:func:`factor_width`, bucketed per run so that the
    widths, and with them the distinct kernel signatures, stay few: :data:`SIGNATURE_BOUND`): zero columns
    add nothing to J or K."""
    co = np.zeros((part.shape[0], width), dtype=dtype)
    co[:, :part.shape[1]] = part
    return co


@dataclass
class _X3Block:
    """One block of the SCF tensor as the compensated J/K kernels read it, kept in device memory:
    ``by_mu`` = (hi bf16, lo fp32) of the (p, nao, nao) rows split along μ (the contraction of Z = CᵀB_P, the
    stationary operand of ``batched_gemm_x3``), ``by_p`` = per :data:`J_X3_ROWS` rows (zero-padded), (hi, lo,
    x) of the (rows, nao²) rows split along P (the contraction of J = Σ_P ρ_P B_P, the moving operand of
    ``gemm_x3``): 16 bytes per element."""

    by_mu: tuple | None
    by_p: tuple | None
    rows: int
    nao: int
    host: np.ndarray    # the host's fp64 rows the planes were made from, packed or not (not a copy): J's ρ = B·D
    pair: tuple | None = None   # the rows as an fp32 pair until the device has made the planes

    @classmethod
    def split(cls, block: np.ndarray, host: np.ndarray) -> "_X3Block":
        """The planes of ``block`` (p, nao, nao) fp64, zero-padded rows of ``host``, split on the host (the
        reference :meth:`made_on` is tested against)."""
        mode = _compensated()
        p, nao, _ = block.shape
        flat = block.reshape(p, nao * nao)
        by_p = tuple(mode.split_operand(_pad_rows(flat[r0:r0 + J_X3_ROWS], J_X3_ROWS), axis=0, moving=True)
                     for r0 in range(0, p, J_X3_ROWS))
        return cls(mode.split_operand(block, axis=1, moving=False), by_p, p, nao, host)

    @classmethod
    def pair_of(cls, host: np.ndarray, rows: int, hi: np.ndarray | None = None,
                lo: np.ndarray | None = None) -> "_X3Block":
        """A block whose planes the device will make (:meth:`made_on`): ``host`` fp64, (p, nao, nao) or packed
        (p, nao(nao+1)/2), unpacked and zero-padded to ``rows`` rows, as an fp32 pair
        (:func:`mp2trn.precision.fp32_pair`: 8 bytes per element, against the planes' 16; ``hi``: its first
        half, fp32(host), already made; ``lo``, with it, the second, made ahead: :meth:`NkiDevice.jk_second_half`).
        Host work only, so a reader thread can make the next streamed block meanwhile."""
        from ..precision import fp32_pair

        pair = (hi, lo) if hi is not None and lo is not None else fp32_pair(host, rows, hi)
        return cls(None, None, rows, pair[0].shape[1], host, pair)

    def made_on(self, launcher) -> "_X3Block":
        """This block with its planes in device memory (made at the first call, in the launching thread):
        ``resplit_x3`` splits the pair along μ per (P, ν) (groups of nao of the (P, μ) rows; hi, lo) and
        along P per :data:`J_X3_ROWS` rows (hi, lo, x). The same planes as :meth:`split` but for the last bit
        where fp32(B) + fp32(B − fp32(B)) and B round to two sides of a grid point."""
        if self.by_mu is not None:
            return self
        from ..kernels.resplit import resplit_x3
        from ..precision import beta_for

        rows, nao = self.rows, self.nao
        hi, lo = self.pair
        # sent once for both launches; hi may be the fp32 builds' rows, in device memory already
        launcher.keep(*(a for a in (hi, lo) if not launcher.is_kept(a)))
        self.by_mu = _split_by_mu(launcher, "scf_jk", hi, lo)
        padded = -(-rows // J_X3_ROWS) * J_X3_ROWS
        flat = launcher.launch("scf_jk", resplit_x3, (hi.reshape(rows, nao * nao), lo.reshape(rows, nao * nao),
                                                      beta_for(J_X3_ROWS)), {"group": J_X3_ROWS, "rows_out": padded},
                               stay=True)
        launcher.drop(hi, lo)
        self.by_p = tuple(tuple(a[r0:r0 + J_X3_ROWS] for a in flat) for r0 in range(0, rows, J_X3_ROWS))
        self.pair = None
        return self


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

    def memory_mb(self) -> float | None:
        """The device memory of the one NeuronCore a run uses: the chip's HBM shared by its cores
        (:data:`HBM_PER_CORE_GIB`), less what :meth:`hold` keeps there; the SCF tensor's copy and the
        gradient's strips are planned to fit it."""
        return self.hbm_mb() - self.held_mb()

    def jk_host_copy_itemsize(self, dtype, planes=1) -> int:
        """The host arrays behind the device copy, per packed element: the fp32 rows stay in host memory
        while their device tensor lives (the launcher keys it by them), 8 bytes; compensated, the fp32 pair
        of every block until the device has made its planes, 16."""
        return 16 if planes > 1 else 8

    def computes_on_host_cores(self) -> bool:
        return False     # the kernels run on the NeuronCore: the host makes its next integral block meanwhile
