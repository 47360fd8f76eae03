"""The SCF's Coulomb (J) and exchange (K) builds on an mp2trn device, inside PySCF's own SCF driver.

PySCF keeps the molecule, the density-fitted 3-index tensor (its Cholesky-decomposed ``_cderi``, in
memory or in its HDF5 file) and the SCF driver (DIIS, level shift, convergence tests); this module
replaces the density-fitting object's ``get_jk`` so that every J/K build runs on a device:

    K_μν = Σ_P Σ_i (B_P C)_μi (B_P C)_νi        C: occupied orbitals scaled by √occ (from the dm's tag),
    J_μν = Σ_P ρ_P B_P,μν,  ρ_P = Σ_μν B_P,μν D_μν     or the eigen-factors of a bare density matrix

The tensor goes to the device once per SCF (blocked over the auxiliary index, kept in device memory when
the memory plan has room, :func:`mp2trn.memory.plan_scf_tensor`, else streamed at every build from
mp2trn's own tensor file or PySCF's). Mixed precision (:class:`PrecisionSchedule`, :func:`device_schedule`):
builds start in the reduced precision and switch to the final one — fp64, or fp32x3 on the NKI devices,
whose builds then never leave the device — when the orbital gradient falls below a threshold or stops
falling; the SCF is never declared converged before the switch, so the converged energy is that of
final-precision builds. On the NKI devices the builds are difference-density ones. Every build's
precision, kind and time are recorded.

    mf = scf.RHF(mol).density_fit()
    mp2trn.density_fit_jk(mf, device="cpu", precision="fp32").run()
    mf.with_df.jk_record()      # cycles, precision per build, seconds per build

Three parts: :class:`DeviceJK` dispatches the builds, :class:`JKTensor` holds the tensor as they read it,
:class:`CycleLog` records the cycles and builds under the :class:`PrecisionSchedule`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pyscf import df, lib

from .devices import Device, get_device
from .df import TensorFile, cholesky_tensor, cholesky_tensor_share
from .errors import InputError
from .memory import JK_WORK_SHARE, budget_mb, plan_scf_tensor
from .overlap import EarlyBlocks, made_ahead, overlaps
from .parallel import Comm, balanced_counts, offsets
from .precision import Precision, get_precision

#: eigenvalues of a bare density matrix below this (relative to the largest) are dropped
_EIG_CUTOFF = 1e-12


@dataclass
class PrecisionSchedule:
    """The precision of each J/K build: ``start`` until the orbital gradient says the reduced precision
    has done what it can, then ``final`` — fp64 where the device (or the host CPU) builds in fp64, the
    compensated fp32x3 on an NKI device, so that no build leaves the device (:func:`density_fit_jk`).

    Incremental builds (``incremental``): while the precision is reduced, a build after the first takes the
    difference density ΔD = D_n − D_(n−1) (factored by eigendecomposition, rank ≤ 2·nocc for idempotent
    densities) and adds J[ΔD], K[ΔD] to the previous cycle's fp64 J, K, so the reduced precision's error
    scales with |ΔD|, which falls as the SCF converges, not with |D|; every ``rebuild_every``-th reduced
    build is a full one, which drops the accumulated rounding (Luehr, Ufimtsev & Martínez, JCTC 7, 949
    (2011), for mixed-precision ERIs on GPUs; Laqua, Kussmann & Ochsenfeld, JCP 154, 214116 (2021), for
    incremental builds whose precision follows the density change). The first build in the final precision
    is a full one; after it fp64 builds are full ones, compensated (fp32x3) ones incremental again: a full
    fp32x3 build's rounding (~1e-9 of tr(D·K) on benzene) differs from build to build and would keep the
    energy from settling below it (water: 28 fp32x3 cycles to |ΔE| < 1e-10), while the incremental ones
    change by a rounding error of ΔD only, so the energy settles as in fp64, offset by that one build's error.

    Raising the precision as the SCF converges follows the adaptive-precision scheme of Huang, Shao and
    Hammond (arXiv 2601.08077), who switch on |ΔE/E|. Here the switch watches the orbital gradient (the
    norm PySCF reports, ``norm_gorb``) instead: the reduced builds take J in fp64 (the CPU device's ρ_P and
    Σ_P ρ_P B_P read the fp64 tensor; only K is fp32), and so an fp32 SCF follows the fp64 one's gradient
    cycle for cycle down to ~1e-4 and keeps it falling to ~1.5e-5, while its energy sits ~2e-5 Eh off
    (`python scripts/bench_scf_jk.py --trace`). Switching at 1e-4 leaves 4 fp64 cycles where 3e-4 left 6
    (Inosine/cc-pVDZ: 13 + 4 against 11 + 6, `--grad-sweep 3e-4 1e-4 3e-5 1.5e-5`; below 1e-4 the fp32
    cycles grow and the fp64 ones stay at 4); Cetirizine/cc-pVDZ: fp32 ×11 → fp64 ×4 in 53.7 s against
    ×10 → ×6 in 76.6 s (the fp64 SCF: 15 cycles, 66.5 s; ``--xyz
    molecules/gpu4pyscf/organic/052_Cetirizine.xyz --grad-sweep 3e-4 1e-4``).

    The switch comes when the gradient norm falls below ``switch_grad``, when it stops falling (above
    ``stall_ratio`` of the previous cycle's after ``min_reduced`` reduced cycles: the noise floor), or after
    ``max_reduced`` reduced cycles. ``switch_rel`` > 0 adds the energy rule |ΔE| < switch_rel·|E|.
    """

    start: Precision
    final: Precision = field(default_factory=lambda: get_precision("fp64"))
    switch_grad: float = 1e-4
    stall_ratio: float = 0.7
    switch_rel: float = 0.0
    max_reduced: int = 15
    min_reduced: int = 4
    incremental: bool = False
    rebuild_every: int = 8
    current: Precision | None = None
    last_grad: float | None = None

    def __post_init__(self) -> None:
        self.current = self.start

    @property
    def reduced(self) -> bool:
        return self.current.name != self.final.name

    def update(self, e_tot: float, e_last: float, reduced_cycles: int, grad: float) -> None:
        """After a reduced-precision cycle with energy ``e_tot`` (previous ``e_last``) and orbital-gradient
        norm ``grad``: switch to the final precision when one of the rules above says so."""
        if not self.reduced:
            return
        small = grad < self.switch_grad
        stalled = (reduced_cycles >= self.min_reduced and self.last_grad is not None
                   and grad > self.stall_ratio * self.last_grad)
        small_energy = abs(e_tot - e_last) < self.switch_rel * abs(e_tot)
        self.last_grad = grad
        if small or stalled or small_energy or reduced_cycles >= self.max_reduced:
            self.current = self.final

    def build_from_difference(self, builds_since_full: int) -> bool:
        """Whether the next build may add J[ΔD], K[ΔD] to the last one's (it is the ``builds_since_full``-th
        build after the last full one, in the same precision): reduced builds until the ``rebuild_every``-th,
        compensated final builds always after their first (full) one."""
        if not self.incremental or builds_since_full < 1:
            return False
        if not self.reduced:   # compensated final builds: their rounding is tiny times |ΔD|, no rebuilds
            return self.final.compensated
        return builds_since_full < self.rebuild_every


@dataclass
class CycleLog:
    """What the J/K stage did, cycle by cycle, under its :class:`PrecisionSchedule`: the precision of every SCF
    cycle and of every build with its wall time; PySCF's convergence test held back while builds run in the
    reduced precision."""

    schedule: PrecisionSchedule
    cycles: list[str] = field(default_factory=list)              # precision label per SCF cycle
    builds: list[dict[str, Any]] = field(default_factory=list)   # {"precision", "seconds"} per J/K build
    converged: bool = False

    def add_build(self, label: str, seconds: float, incremental: bool = False) -> None:
        self.builds.append({"precision": label, "seconds": seconds, "incremental": incremental})

    def check_convergence(self, envs: dict[str, Any], label: str) -> bool:
        """PySCF's ``check_convergence`` hook for a cycle whose builds ran as ``label``: record the cycle,
        switch precision, and never report convergence while builds are in reduced precision.

        After convergence PySCF runs one extra cycle (``conv_check``) and calls the hook again; that call
        gets PySCF's own criterion for it (energy OR gradient, with the tolerances PySCF loosened) and is
        not counted as a cycle."""
        de, grad = abs(envs["e_tot"] - envs["last_hf_e"]), envs["norm_gorb"]
        if self.converged:
            return de < envs["conv_tol"] or grad < envs["conv_tol_grad"]
        self.cycles.append(label)
        reduced_cycles = sum(1 for c in self.cycles if not c.startswith(self.schedule.final.name))
        if self.schedule.incremental and reduced_cycles and len(self.cycles) == reduced_cycles + 1:
            _forget_diis(envs.get("mf_diis"))
        if self.schedule.reduced:
            self.schedule.update(envs["e_tot"], envs["last_hf_e"], reduced_cycles, grad)
            return False
        self.converged = de < envs["conv_tol"] and grad < envs["conv_tol_grad"]
        return self.converged

    def record(self) -> dict[str, Any]:
        """Cycles and the precision of each, builds with their precisions and seconds (total, per build)."""
        builds = self.builds
        return {
            "cycles": len(self.cycles),
            "precision_per_cycle": list(self.cycles),
            "jk_builds": len(builds),
            "build_precisions": [b["precision"] for b in builds],
            "incremental_builds": sum(1 for b in builds if b["incremental"]),
            "builds_on_host": sum(1 for b in builds if "(host" in b["precision"]),
            "jk_seconds": sum(b["seconds"] for b in builds),
            "jk_seconds_per_build": (sum(b["seconds"] for b in builds) / len(builds)) if builds else 0.0,
        }


class JKTensor:
    """The SCF's fitted 3-index tensor as the device builds read it, for one SCF: resident (this rank's fp64
    rows made once, and the device's blocks of them kept per precision) when it fits the budget, else
    streamed block by block at every build. ``source`` is the PySCF density-fitting object: the molecule,
    the auxiliary molecule, and PySCF's own tensor and ``loop`` where it has built one."""

    def __init__(self, source: df.DF, budget_mb: float, comm: Comm, packed: bool):
        self.source = source
        self.budget = budget_mb
        self.comm = comm
        self.layout = "packed" if packed else "unpacked"   # of the last build's device
        self.streamed = False
        self.full: np.ndarray | None = None     # this rank's fp64 rows (resident)
        self.kept: list | None = None           # the device blocks made from ``full``, for ``kept_for``
        self.kept_for = None                    # (dtype, device name)
        self.kept_step = 0                      # rows per kept block
        self.file = None   # the streamed tensor's file (TensorFile), False when it could not be built
        self.how = "PySCF's tensor, streamed"   # how the rows were made (what-ran)
        self.seconds = 0.0   # building the tensor (integrals and Cholesky), in the first build
        self.copy_left_out = False   # the last blocks made without the device's optional copy (no room)
        #: every precision whose blocks were made so (what-ran), for this tensor's life: one SCF and the
        #: gradient's response builds after it (each SCF makes its own DeviceJK)
        self.copy_left_out_for: list[str] = []
        self.why = ""   # the memory plan's reason for resident or streamed (memory.plan_scf_tensor)
        #: ``full`` is L⁻¹(Q|μν) with L the Cholesky factor of the metric, all rows (mp2trn's own build, one
        #: rank): what the gradient's JK-fit pass can read instead of the integrals (mp2trn.grad.jk_terms)
        self.by_cholesky = False
        #: the compensated blocks' second halves, made by a thread during the reduced builds on a device off
        #: the host's cores (:meth:`Device.jk_second_half`), and what that thread did
        self.second_halves: EarlyBlocks | None = None
        self.second_record: dict[str, Any] = {}
        self.pair_seconds = 0.0   # making the compensated blocks (their pairs) when the builds asked for them
        #: making the resident device blocks from the host rows, every precision: the cpu device's fp32 copy (in
        #: fresh memory, once per SCF), an accelerator's copies
        self.blocks_seconds = 0.0

    def _plan(self, mode: Precision, device: Device, naux: int, per_row: int, packed: bool):
        """:func:`mp2trn.memory.plan_scf_tensor` for builds in ``mode`` on ``device``."""
        planes = {"planes": mode.planes} if mode.compensated else {}
        nao = self.source.mol.nao_nr()
        return plan_scf_tensor(naux, per_row, device.jk_copy_itemsize(mode.compute, **planes), device.jk_copy_optional,
                               0 if packed and not device.jk_streamed_unpacked else nao * nao, self.budget,
                               device.memory_mb(), device.jk_host_copy_itemsize(mode.compute, **planes))

    def blocks(self, mode: Precision, device: Device, then: Precision | None = None):
        """Device blocks of the tensor for builds in ``mode``: kept when the tensor fits the budget, else
        streamed. A compensated mode asks the device for its planes (``planes``, :meth:`Device.jk_tensor`).

        The layout is the device's (:attr:`Device.jk_packed`): packed rows (μ ≥ ν, half the memory; the
        CPU unpacks a few rows at a time as a build reads them) or unpacked (p, nao, nao) rows. Resident:
        the fp64 host tensor is made once per SCF — built straight into that layout
        (:func:`mp2trn.df.cholesky_tensor`) when PySCF has not built its own, else taken from PySCF's
        (packed: as it is; unpacked: unpacked once) — and the device blocks are made from it. The plan
        counts the host tensor and the copy the device keeps (:meth:`Device.jk_copy_itemsize`; on the CPU
        the fp32 builds' unpacked fp32 copy) against the budget, or against the device's own memory where it
        has some (:meth:`Device.memory_mb`); a device whose copy is optional (:attr:`Device.jk_copy_optional`)
        keeps the tensor resident without it when only the copy does not fit, and converts as it reads. The
        decision is :func:`mp2trn.memory.plan_scf_tensor`'s, and its reason is in the record (``tensor_plan``).
        Streamed: PySCF builds its tensor (in its HDF5 file when it is large) and every build reads it
        block by block.

        ``then``: the precision the builds switch to later. When it is compensated, the device computes off
        the host's cores and its plan keeps the same resident blocks, what the switch would make on the host
        for them (:meth:`Device.jk_second_half`) is made by a thread during these builds, while the host waits
        for the device; the switch takes what it made (the plan of the compensated builds counts it).
        """
        dtype = mode.compute
        planes = {"planes": mode.planes} if mode.compensated else {}   # asked only of devices that build so
        if self.kept is not None and self.kept_for == (mode.name, device.name):
            return self.kept
        # a precision switch frees the old device copy first — unless the new blocks are compensated ones of
        # the same device, which may reuse the old blocks' rows (Device.jk_tensor's ``previous``)
        previous = self.kept if mode.compensated and self.kept_for and self.kept_for[1] == device.name else None
        previous_step, self.kept = self.kept_step, None
        src = self.source
        nao = src.mol.nao_nr()
        if src._cderi is None and src.auxmol is None:
            src.auxmol = df.addons.make_auxmol(src.mol, src.auxbasis)
        naux = src.auxmol.nao_nr() if src._cderi is None else src.get_naoaux()
        naux = balanced_counts(naux, self.comm.size)[self.comm.rank]   # this rank's rows
        packed = device.jk_packed
        per_row = nao * (nao + 1) // 2 if packed else nao * nao
        plan = self._plan(mode, device, naux, per_row, packed)
        resident, self.copy_left_out, blksize, self.why = plan.resident, plan.copy_left_out, plan.block_rows, plan.why
        if self.copy_left_out and mode.name not in self.copy_left_out_for:   # kept past a switch to fp64 builds
            self.copy_left_out_for.append(mode.name)
        self.streamed = not resident
        self.layout = "packed" if packed else "unpacked"
        if not resident:   # the next block is read (and unpacked) by a thread while this one is used
            mine = self._streamed_rows(naux, blksize)
            # an optional copy of a block read once per build would be made again at every build: none
            keep = not device.jk_copy_optional
            unpack = not packed or device.jk_streamed_unpacked
            return made_ahead(device.jk_tensor(lib.unpack_tril(b) if unpack else b, dtype, keep_copy=keep, **planes)
                              for b in mine)
        if self.full is None:
            t0 = time.perf_counter()
            self.full = self._resident_rows(nao, packed)
            self.seconds += time.perf_counter() - t0
        step = max(1, self.full.shape[0]) if device.jk_resident_one_block else blksize
        if previous is not None and previous_step:
            # resident compensated blocks take the fp32 blocks' rows, whatever the plan's rows for a streamed
            # block: the fp32 rows are then the first half of every pair, and the blocks' memory is the
            # whole tensor's either way
            step = previous_step
        starts = range(0, self.full.shape[0], step)
        if previous is None or previous_step != step:   # the old blocks' rows must be the new blocks' rows
            previous = [None] * len(starts)
        halves = self._take_second_halves() if mode.compensated else []
        halves += [None] * (len(starts) - len(halves))
        t0 = time.perf_counter()
        self.kept = [device.jk_tensor(self.full[p0 : p0 + step], dtype, keep_copy=not self.copy_left_out, **planes,
                                      **({"previous": old} if old is not None else {}),
                                      **({"second": second} if second is not None else {}))
                     for p0, old, second in zip(starts, previous, halves)]
        made = time.perf_counter() - t0
        self.blocks_seconds += made
        if mode.compensated:
            self.pair_seconds += made
        self.kept_for, self.kept_step = (mode.name, device.name), step
        if then is not None and then.compensated and not mode.compensated and overlaps(device) and \
                _same_blocks(self._plan(then, device, naux, per_row, packed), plan):
            full, kept, self.second_record = self.full, self.kept, {"of": len(starts)}
            self.second_halves = EarlyBlocks(
                (lambda p0=p0, k=k: device.jk_second_half(full[p0 : p0 + step], k) for p0, k in zip(starts, kept)),
                name="mp2trn-second-halves")
        return self.kept

    def _take_second_halves(self) -> list:
        """The second halves made during the reduced builds (in block order; fewer when the thread had not
        finished), with the record of what the thread did."""
        if self.second_halves is None:
            return []
        made, self.second_halves = self.second_halves.take(), None
        self.second_record["blocks"] = sum(1 for m in made if m is not None)
        return made

    def _streamed_rows(self, naux: int, blksize: int):
        """Packed row blocks of this rank's tensor for a streamed build: from mp2trn's own tensor file
        (:class:`~mp2trn.df.TensorFile`, written once per SCF, one contiguous read per block) when PySCF
        has not built its tensor and the run is one rank, else through PySCF's ``loop``."""
        src = self.source
        if src._cderi is None and self.comm.size == 1 and self.file is not False:
            if self.file is None:
                t0 = time.perf_counter()
                self.file = TensorFile.build(src.mol, src.auxmol, chunk_mb=max(1.0, min(256.0, 0.1 * self.budget)))
                self.seconds += time.perf_counter() - t0
                if self.file is None:
                    self.file = False   # not positive definite: PySCF's build handles that
            if self.file:
                self.how = "built by mp2trn into its scratch file"
                return (self.file.rows(p0, min(naux, p0 + blksize)) for p0 in range(0, naux, blksize))
        self.how = "PySCF's tensor"
        return (b for k, b in enumerate(src.loop(blksize)) if k % self.comm.size == self.comm.rank)

    def _resident_rows(self, nao: int, packed: bool) -> np.ndarray:
        """This rank's rows of the tensor, fp64, packed (naux_r, nao(nao+1)/2) or unpacked (naux_r, nao,
        nao); ``self.how`` says how they were made."""
        src, comm = self.source, self.comm
        if src._cderi is None:
            chunk_mb = max(1.0, min(256.0, 0.1 * self.budget))   # the solve's row chunk, beside the tensor
            full = cholesky_tensor(src.mol, src.auxmol, chunk_mb, packed=packed) if comm.size == 1 else \
                cholesky_tensor_share(src.mol, src.auxmol, comm, chunk_mb, packed=packed)
            if full is not None:
                self.by_cholesky = comm.size == 1
                self.how = "built by mp2trn in the device layout" + \
                    (f", this rank's {full.shape[0]} of {src.auxmol.nao_nr()} rows" if comm.size > 1 else "")
                return full
            src.build()  # a metric that is not positive definite: PySCF's build handles that
        starts = offsets(balanced_counts(src.get_naoaux(), comm.size))
        lo, hi = starts[comm.rank], starts[comm.rank + 1]
        if packed and isinstance(src._cderi, np.ndarray) and comm.size == 1:
            self.how = "PySCF's tensor, as it is"
            return src._cderi
        self.how = "PySCF's tensor" + (", unpacked" if not packed else ", copied")
        npair = nao * (nao + 1) // 2
        full = np.empty((hi - lo, npair) if packed else (hi - lo, nao, nao))
        p0 = 0
        for b in src.loop():   # keep this rank's rows [lo, hi)
            a, z = max(p0, lo), min(p0 + len(b), hi)
            if a < z:
                if packed:
                    full[a - lo : z - lo] = b[a - p0 : z - p0]
                else:
                    lib.unpack_tril(b[a - p0 : z - p0], out=full[a - lo : z - lo])
            p0 += len(b)
        return full

    def release(self, keep_rows: bool = False) -> None:
        """Drop the rows (unless ``keep_rows``: the host rows stay, for the gradient's response), the device
        blocks and the streamed tensor's file."""
        self.kept = None
        if self.second_halves is not None:
            self.second_halves.close()
            self.second_halves = None
        if not keep_rows:
            self.full = None
            self.by_cholesky = False
        if self.file:
            self.file.close()
        self.file = None

    def record(self) -> dict[str, Any]:
        """Seconds spent making the tensor, and whether it was resident or streamed, in which layout, how made."""
        where = "streamed at every build" if self.streamed else "resident on the device"
        modes = " and ".join(self.copy_left_out_for)
        left_out = f"; no room for the device's reduced-precision copy: the {modes} builds converted at every build" \
            if modes else ""
        out = {"tensor_seconds": self.seconds, "tensor": f"{where} ({self.layout}, {self.how}{left_out})",
               "tensor_plan": self.why, "device_blocks_seconds": self.blocks_seconds,
               "compensated_blocks_seconds": self.pair_seconds}
        if "blocks" in self.second_record:
            out["second_halves_ahead"] = (f"{self.second_record['blocks']} of {self.second_record['of']} compensated "
                                          "blocks' second halves made on the host during the reduced builds")
        return out


def _same_blocks(a, b) -> bool:
    """Whether two SCF tensor plans keep the tensor resident alike (the compensated blocks then take the
    reduced ones' rows, :meth:`JKTensor.blocks`)."""
    return a.resident and b.resident and a.copy_left_out == b.copy_left_out


class DeviceJK(df.DF):
    """PySCF's density-fitting object with ``get_jk`` running on an mp2trn device.

    Made from an existing (built) ``df.DF`` by :func:`density_fit_jk`; everything else — the 3-index
    tensor, ``loop``, the auxiliary basis — is PySCF's. This class dispatches the builds (which device runs
    a precision, the blocks, the all-reduce over ranks); the tensor as the builds read it is its
    :class:`JKTensor` (``tensor``), the cycles, builds and precision switch its :class:`CycleLog` (``log``).
    """

    def setup(self, device: Device, schedule: PrecisionSchedule, max_memory: float, owned: bool,
              comm: Comm | None = None) -> None:
        self.device = device
        self.comm = comm or Comm()  # several ranks: each builds J/K from its auxiliary rows, then an all-reduce
        self.host = None  # a CPU device for builds in a precision the device has no J/K kernels for
        self.owns_device = owned
        self.tensor = JKTensor(self, max_memory, self.comm, device.jk_packed)
        device.limit_jk_work(JK_WORK_SHARE * self.tensor.budget)
        self.log = CycleLog(schedule)
        #: called once when the builds begin (the tensor made): host work run while the device builds
        self.meanwhile = None
        #: the last SCF build's (precision, densities, fp64 J, K, builds since its last full one): what an
        #: incremental build adds to (:meth:`PrecisionSchedule.build_from_difference`)
        self.last: tuple | None = None

    def _runs_on(self, mode: Precision) -> Device:
        """The device of a build in ``mode``: ours when its J/K kernels run that precision, else the host CPU."""
        if mode.name in (self.device.jk_precisions or self.device.supported_precisions):
            return self.device
        if self.host is None:
            self.host = get_device("cpu", mode.name)
            self.host.limit_jk_work(JK_WORK_SHARE * self.tensor.budget)
        return self.host

    def _label(self, mode: Precision) -> str:
        return mode.name if self._runs_on(mode) is self.device else f"{mode.name} (host cpu)"

    def release_builds(self, keep_rows: bool = False) -> None:
        """Free the device copy of the tensor (its host rows too unless ``keep_rows``) and the builds' work
        buffers; a later build makes them anew."""
        self.tensor.release(keep_rows)
        self.device.release_jk()
        if self.host is not None:
            self.host.release_jk()

    def release(self, keep_rows: bool = False) -> None:
        """:meth:`release_builds` (after the SCF), then close the device when it is ours."""
        self.release_builds(keep_rows)
        if self.owns_device:
            self.device.close()
        if self.host is not None:
            self.host.close()

    # -- PySCF's interface -----------------------------------------------------------------------------
    def get_jk(self, dm, hermi=1, with_j=True, with_k=True, direct_scf_tol=None, omega=None):
        if omega is not None or hermi != 1:
            raise InputError("mp2trn's device J/K builds handle Hermitian densities without range separation; "
                             "use the PySCF J/K (--scf-jk pyscf) for this calculation")
        t0 = time.perf_counter()
        mode = self.log.schedule.current
        device = self._runs_on(mode)
        dms = np.asarray(dm).reshape(-1, *np.shape(dm)[-2:])
        base = self._difference_base(mode, dms, with_j, with_k)
        built = dms if base is None else dms - base[1]   # the density this build contracts: D, or ΔD
        factors = density_factors(dm) if base is None else density_factors(built)
        nset, nao = dms.shape[0], dms.shape[-1]
        vj = np.zeros((nset, nao, nao)) if with_j else None
        vk = np.zeros((nset, nao, nao)) if with_k else None
        then = self.log.schedule.final if self.log.schedule.reduced else None
        blocks = self.tensor.blocks(mode, device, then if then is not None and self._runs_on(then) is device else None)
        if self.meanwhile is not None:
            begin, self.meanwhile = self.meanwhile, None
            begin()
        for block in blocks:
            for k in range(nset):
                j_part, k_part = device.jk_block(block, factors[k], built[k], with_j, with_k)
                if with_j:
                    vj[k] += j_part
                if with_k:
                    vk[k] += k_part
        if self.comm.size > 1:   # each rank summed its auxiliary rows
            vj = None if vj is None else self.comm.allreduce(vj, "scf_jk")
            vk = None if vk is None else self.comm.allreduce(vk, "scf_jk")
        if base is not None:   # J[D_n] = J[D_(n-1)] + J[ΔD], the same for K, summed in fp64
            vj = None if vj is None else vj + base[2]
            vk = None if vk is None else vk + base[3]
        if not self.log.converged:   # an SCF cycle's build: what the next one may add to
            self.last = (mode.name, dms.copy(), vj, vk, 0 if base is None else base[4] + 1)
        shape = np.shape(dm)
        self.log.add_build(self._label(mode), time.perf_counter() - t0, incremental=base is not None)
        return (None if vj is None else vj.reshape(shape)), (None if vk is None else vk.reshape(shape))

    def _difference_base(self, mode: Precision, dms: np.ndarray, with_j: bool, with_k: bool) -> tuple | None:
        """The last build to add this one's J[ΔD], K[ΔD] to, when the schedule allows an incremental build
        (same precision, same density sets, the parts asked for built last time), else None."""
        last = self.last
        if last is None or self.log.converged or last[0] != mode.name or last[1].shape != dms.shape:
            return None
        if (with_j and last[2] is None) or (with_k and last[3] is None):
            return None
        return last if self.log.schedule.build_from_difference(last[4] + 1) else None

    def check_convergence(self, envs: dict[str, Any]) -> bool:
        """PySCF's ``check_convergence`` hook (:meth:`CycleLog.check_convergence`)."""
        return self.log.check_convergence(envs, self._label(self.log.schedule.current))

    def jk_record(self) -> dict[str, Any]:
        """What the J/K stage did: device, cycles and the precision of each, seconds per build, the tensor."""
        return {"jk": f"device {self.device.name}", "device": self.device.name, **self.log.record(),
                **self.tensor.record(), **({"ranks": self.comm.size} if self.comm.size > 1 else {})}


def _forget_diis(diis) -> None:
    """Clear PySCF's DIIS history after the first final-precision cycle. The incremental fp32 Fock matrices
    carry the rounding the fp32 builds accumulated (~1e-6 in the energy); kept, DIIS extrapolates with them
    and the orbital gradient sat near 1e-4 for seven fp32x3 cycles on benzene/cc-pVDZ."""
    if diis is not None:   # PySCF's DIIS has no public reset
        diis._buffer, diis._bookkeep, diis._head, diis._H, diis._xprev = {}, [], 0, None, None


def precision_runs(cycles: list[str]) -> str:
    """'fp32 ×6 → fp64 ×12': the precision of consecutive cycles, run-length encoded."""
    runs: list[list] = []
    for name in cycles:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return " → ".join(f"{name} ×{count}" for name, count in runs)


def density_factors(dm) -> list[list[tuple[np.ndarray, float]]]:
    """Per density-matrix set, [(C, sign)] with dm = Σ sign·C Cᵀ.

    With PySCF's tag (``mo_coeff``, ``mo_occ`` on the array ``make_rdm1`` returns) C is the occupied
    orbitals scaled by √occ; a bare density is factored by eigendecomposition (positive and negative
    parts), which also covers difference densities.
    """
    mo_coeff = getattr(dm, "mo_coeff", None)
    mo_occ = getattr(dm, "mo_occ", None)
    dms = np.asarray(dm).reshape(-1, *np.shape(dm)[-2:])
    if mo_coeff is not None and mo_occ is not None:
        coeffs = np.asarray(mo_coeff).reshape(-1, *np.shape(mo_coeff)[-2:])
        occs = np.asarray(mo_occ).reshape(-1, np.shape(mo_occ)[-1])
        if len(coeffs) == len(dms):
            return [[(c[:, o > 0] * np.sqrt(o[o > 0]), 1.0)] for c, o in zip(coeffs, occs)]
    out = []
    for d in dms:
        w, v = np.linalg.eigh((d + d.T) / 2)
        cut = _EIG_CUTOFF * max(1.0, float(np.max(np.abs(w))) if w.size else 1.0)
        pos, neg = w > cut, w < -cut
        out.append([(v[:, pos] * np.sqrt(w[pos]), 1.0), (v[:, neg] * np.sqrt(-w[neg]), -1.0)])
    return out


def device_schedule(device: Device, incremental: bool | None = None) -> PrecisionSchedule:
    """The J/K precision schedule on ``device``: its own precision (else its first J/K precision) to start,
    and to finish the compensated precision its J/K kernels run (fp32x3 on sim/neuron: no build leaves the
    device) or else fp64 (on the CPU, or on the host for a device without fp64 kernels). ``incremental``
    (None: the device's :attr:`~mp2trn.devices.Device.jk_incremental`) makes the reduced builds
    difference-density ones."""
    names = device.jk_precisions or device.supported_precisions
    start = device.mode if device.mode.name in names else get_precision(names[0])
    compensated = [get_precision(n) for n in names if get_precision(n).compensated]
    final = compensated[0] if compensated else get_precision("fp64")
    return PrecisionSchedule(start, final, incremental=device.jk_incremental if incremental is None else incremental)


def density_fit_jk(mf, device: str | Device = "cpu", precision: str | None = None,
                   max_memory: float | None = None, auxbasis: str | dict | None = None,
                   comm: Comm | None = None, incremental: bool | None = None, **device_options: Any):
    """Make ``mf``'s J/K builds run on an mp2trn device (PySCF style: returns ``mf``, ready to ``run()``).

    mf: a PySCF RHF/UHF, density-fitted or not (then ``mf.density_fit(auxbasis)`` first).
    precision: the device's default when None; a reduced precision (fp32) starts the SCF with fp32 builds
    and switches near convergence to fp64, or on an NKI device to the compensated fp32x3
    (:func:`device_schedule`). incremental: difference-density builds while in fp32 (None: the device's
    default, :attr:`Device.jk_incremental`). max_memory: MB (None: ``mf.max_memory``), per rank.
    comm: the ranks of a run spread over several (:mod:`mp2trn.parallel`): each builds J and K from its
    share of the auxiliary rows and the partial matrices are all-reduced.
    After the SCF: ``mf.with_df.jk_record()``; ``mf.with_df.release()`` frees the device copy.
    """
    if getattr(mf, "with_df", None) is None:
        mf = mf.density_fit(auxbasis=auxbasis)
    owned = not isinstance(device, Device)
    dev = get_device(device, precision, **device_options)
    if not dev.has_jk:
        if owned:
            dev.close()
        raise InputError(f"device {dev.name!r} has no J/K stage yet; run the SCF's J/K with PySCF "
                         "(--scf-jk pyscf) or on --device cpu/cuda")
    old = mf.with_df
    jk = DeviceJK.__new__(DeviceJK)
    jk.__dict__.update(old.__dict__)
    jk.setup(dev, device_schedule(dev, incremental), float(max_memory if max_memory is not None else budget_mb(
        getattr(mf, "max_memory", None))), owned, comm)
    mf.with_df = jk
    mf.check_convergence = jk.check_convergence
    return mf


__all__ = ["CycleLog", "DeviceJK", "JKTensor", "PrecisionSchedule", "density_factors", "density_fit_jk", "device_schedule",
           "precision_runs"]

