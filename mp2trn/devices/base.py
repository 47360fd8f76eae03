"""The small interface every device implements: three tensor stages of DF-MP2.

The host (``mp2trn.transform`` / ``mp2trn.energy``) owns blocking, storage and the fp64 sums over
pairs; a device only does the heavy tensor work on blocks it is handed:

1. ``ao_to_mo``:  (P|μν) block → (P|ia) block            (two AO→MO half-transforms)
2. ``metric_solve``: (P|ia) → B = L⁻¹ (P|ia)             (L: lower Cholesky factor of the metric)
3. ``pair_energies``: B blocks of occupied orbitals I, J → per-pair opposite-spin and exchange sums

Arrays cross the interface as NumPy arrays on the host. Layout: the auxiliary index is leading
(``B[Q, i, a]``), which is the contraction axis of the pair step and maps onto Trainium's partition dim.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import numpy as np

from ..precision import Precision, get_precision


class PairDensities(NamedTuple):
    """What :meth:`Device.pair_densities` returns for one strip of occupied pairs (fp64 arrays)."""

    gamma_k: np.ndarray            #: (naux, nk, nvb): Σ_ia t̃_ik^ab B_Q,ia
    p_occ: np.ndarray              #: (ni, ni): Σ_kab τ_ik^ab t̃_i'k^ab
    p_vir_all: np.ndarray          #: (nva, nva): Σ_ikb τ_ik^ab t̃_ik^a'b
    p_vir_k: np.ndarray | None     #: (nvb, nvb): Σ_ika τ_ik^ab t̃_ik^ab' (when asked)
    #: (ni, nk): Σ_ab T_ik^ab τ_ik^ab, the pair's os sum of :meth:`Device.pair_energies` (with ``energies``)
    pair_os: np.ndarray | None = None
    #: (ni, nk): Σ_ab T_ik^ab τ_ik^ba, :meth:`Device.pair_energies`' x (with ``energies`` and c_exch ≠ 0)
    pair_x: np.ndarray | None = None


def root_array(a: np.ndarray) -> np.ndarray:
    """The array a view (a reshape) was made from: a view of a kept or held array is that array."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class Device(ABC):
    """A backend that runs the tensor stages. ``name`` is what the user asked for and what ran.

    Besides the three stages, the host asks a device only what is defined here: which precisions it
    runs and its storage dtype, its own memory (:meth:`memory_mb`), whether it takes packed AO blocks, the
    largest occupied block it wants per pair launch (:meth:`occ_block_limit`), the SCF tensor layout and
    copy it keeps (:attr:`jk_packed`, :meth:`jk_copy_itemsize`), the orbital response's GEMMs on operands it keeps
    (:meth:`response_operand`, :meth:`response_gemm`), what ran (:meth:`what_ran`), its modeled
    cost (:meth:`cost_report`), how arrays travel between ranks (:meth:`collective_launcher`) and
    :meth:`close`. Callers ask these; they never probe a device for attributes.
    """

    name: str = "abstract"
    precision: str = "fp64"
    #: precisions this device accepts (first = default); entries of :data:`mp2trn.precision.PRECISIONS`
    supported_precisions: tuple[str, ...] = ("fp64", "fp32")
    #: True when ``ao_to_mo`` takes AO blocks packed over μ ≥ ν, shape (p, nao(nao+1)/2), which halves
    #: the integral work; False for full square blocks (p, nao, nao)
    ao_packed: bool = False
    #: why this device was chosen when the user asked for ``auto`` (None otherwise); part of what ran
    selection_note: str | None = None

    @property
    def mode(self) -> Precision:
        """The registry entry of ``precision``."""
        return get_precision(self.precision)

    @property
    def storage_dtype(self) -> np.dtype:
        """dtype in which the host stores (P|ia) and B between stages."""
        return self.mode.storage

    def describe(self) -> dict[str, Any]:
        """Device name, precision and backend details (subclasses add their own keys)."""
        return {"device": self.name, "precision": self.precision}

    def what_ran(self) -> dict[str, Any]:
        """What actually ran, for the output and the JSON: :meth:`describe` plus the auto-selection note."""
        info = self.describe()
        if self.selection_note:
            info["device_selection"] = self.selection_note
        return info

    def computes_on_host_cores(self) -> bool:
        """Whether the device's arithmetic runs on the host's CPU cores (the CPU, the NKI emulator, torch on a
        CPU). Then the host makes its integral blocks in turn with the device's work; else (a GPU, a
        NeuronCore) it makes the next block while the device works on the current one (:mod:`mp2trn.overlap`)."""
        return True

    def memory_mb(self) -> float | None:
        """MB of its own memory the device computes in (the gradient's plan fits a strip's arrays into it), or
        None when it computes in host memory, which ``--memory`` already counts."""
        return None

    def occ_block_limit(self, naux: int, nvir: int) -> int | None:
        """Most occupied orbitals per host pair block this device wants (None: only memory decides).

        NKI devices cap it so that one launch covers all pairs of two blocks within on-chip limits.
        """
        return None

    @abstractmethod
    def ao_to_mo(self, ao: np.ndarray, c_occ: np.ndarray, c_vir: np.ndarray) -> np.ndarray:
        """Transform an AO block.

        ao: (p, nao, nao) 3-index integrals (P|μν) for p auxiliary functions, symmetric in μν
            (or (p, nao(nao+1)/2), lower triangle packed row-wise, when ``ao_packed``).
        c_occ: (nao, no), c_vir: (nao, nv) MO coefficients.
        Returns (p, no, nv) = Σ_μν C_μi (P|μν) C_νa in ``storage_dtype``.
        """

    @abstractmethod
    def metric_solve(self, l_chol: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Solve L B = V for B.

        l_chol: (naux, naux) lower-triangular Cholesky factor of the Coulomb metric (fp64).
        v: (naux, n) columns of (P|ia). Returns B (naux, n) in ``storage_dtype``; may overwrite ``v``.
        """

    @abstractmethod
    def pair_energies(
        self,
        b_i: np.ndarray,
        b_j: np.ndarray | None,
        e_i: np.ndarray,
        e_j: np.ndarray,
        ev_a: np.ndarray,
        ev_b: np.ndarray,
        exchange: bool,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-pair MP2 sums for a block of occupied pairs (Hartree).

        b_i: (naux, ni, nva), b_j: (naux, nj, nvb), or ``None`` meaning "the same block as b_i", in
        which case only pairs i ≤ j are computed (entries with i > j are returned as 0).
        e_i (ni,), e_j (nj,): occupied orbital energies; ev_a (nva,), ev_b (nvb,): virtual energies.
        With T_ab = Σ_Q B_Q,ia B_Q,jb and D_ab = e_i + e_j − ev_a − ev_b:
          os[i, j] = Σ_ab T_ab² / D_ab
          x[i, j]  = Σ_ab T_ab T_ba / D_ab   (only when ``exchange``; same-spin blocks, nva == nvb)
        Returns float64 arrays (ni, nj) (x is None without ``exchange``).
        """

    # -- B between launches: the pair steps of the energy and of the gradient read views of the same arrays --
    def hold(self, arrays: list[np.ndarray], add: bool = True) -> str:
        """Offer host arrays (B of each spin channel, (naux, nocc·nvir)) that the pair launches to come
        read views of (:meth:`pair_energies`, :meth:`pair_densities`): a device with memory of its own may
        keep them there until :meth:`release` or until the host frees them, and read every later view
        from its copy instead of sending it again; arrays it holds already are not sent again, and with
        ``add`` False nothing new is taken (a later stage whose memory plan did not count them). Returns
        what it did, for what-ran. The base class computes in host memory: nothing to hold."""
        return "host memory (the device computes there)"

    def held_mb(self) -> float:
        """MB of the device's own memory that :meth:`hold` keeps now (part of what :meth:`memory_mb` no
        longer counts as free)."""
        return 0.0

    def release(self) -> None:
        """Free what :meth:`hold` kept."""

    # -- the gradient's pair step (mp2trn.grad.densities owns the strips, the spin cases and the factors) --
    #: True when the device implements :meth:`pair_densities`
    has_pair_densities: bool = False

    @property
    def pair_densities_precision(self) -> str:
        """The arithmetic of :meth:`pair_densities` (the device's precision unless it has no kernel for it)."""
        return self.precision

    #: True when :meth:`pair_densities` also sums each pair's energy from the amplitudes it forms (its
    #: ``energies``), so that a gradient run needs no separate pair step for the MP2 energy
    sweep_energies: bool = False

    def pair_densities(self, b_all: np.ndarray, b_k: np.ndarray, e_all: np.ndarray, e_k: np.ndarray,
                       ev_all: np.ndarray, ev_k: np.ndarray, c_direct: float, c_exch: float,
                       vir_k: bool, energies: bool = False) -> PairDensities:
        """Unrelaxed MP2 densities and the 3-index two-particle density of one strip of pairs (Hartree⁻¹).

        b_all: (naux, ni, nva) B of every occupied orbital i of one spin; b_k: (naux, nk, nvb) B of a block
        of occupied orbitals k (same spin or the other one); energies e_all (ni,), e_k (nk,), ev_all (nva,),
        ev_k (nvb,). With τ_ik^ab = Σ_Q B_Q,ia B_Q,kb / (e_i + e_k − ev_a − ev_b) and
        t̃_ik^ab = c_direct·τ_ik^ab − c_exch·τ_ik^ba (c_exch ≠ 0 only when nva == nvb, same spin):
          gamma_k[Q, k, b] = Σ_ia t̃_ik^ab B_Q,ia          p_occ[i, i'] = Σ_kab τ_ik^ab t̃_i'k^ab
          p_vir_all[a, a'] = Σ_ikb τ_ik^ab t̃_ik^a'b        p_vir_k[b, b'] = Σ_ika τ_ik^ab t̃_ik^ab' (vir_k)
        With ``energies`` (only where :attr:`sweep_energies`), per pair with T_ik^ab = Σ_Q B_Q,ia B_Q,kb, fp64
        sums, :meth:`pair_energies`' os and x:
          pair_os[i, k] = Σ_ab T_ik^ab τ_ik^ab             pair_x[i, k] = Σ_ab T_ik^ab τ_ik^ba (c_exch ≠ 0)
        """
        raise NotImplementedError(f"device {self.name!r} has no gradient pair step")

    # -- the orbital response's GEMMs (mp2trn.grad.cpks owns their layouts, the solver and the fp64 sums) -----
    @property
    def response_precision(self) -> str:
        """The arithmetic of :meth:`response_gemm` (the base class: fp64 NumPy on the host)."""
        return "fp64"

    #: bytes per element of the copy of the response's MO blocks that :meth:`reduced_response` keeps beside
    #: the fp64 blocks in host memory (0: none; the memory plan counts it when it is not)
    reduced_response_itemsize: int = 0

    def reduced_response(self) -> Device | None:
        """A device whose response products run in a reduced precision, for the Z-vector's inner solves
        refined by this device's fp64 products (:meth:`mp2trn.grad.cpks.ResponseJK.reduced`); None when this
        device offers none (the base class: none)."""
        return None

    def response_blocks(self, rows: np.ndarray, channels: list[tuple[np.ndarray, np.ndarray]],
                        out: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """The response's MO blocks of a chunk ``rows`` (q, nao, nao) fp64 of the SCF's JK-fit tensor, made where
        its products run (counted under stage ``zvector``): per spin channel k with ``channels[k]`` = (C_occ
        (nao, o), C_vir (nao, v)), C_occᵀ B_Q C_occ, C_occᵀ B_Q C_vir and C_virᵀ B_Q C_vir written into the
        host fp64 arrays ``out[k]`` = (oo (q, o, o), ov (q, o, v), vv (q, v, v)). The (vir, occ) block, ovᵀ, is
        not made. The base class: the host's fp64 GEMMs, B_Q [C_occ C_vir] once per channel, then C_occᵀ of it
        and C_virᵀ of its virtual columns, each into its block (no (q, nmo, nmo) array, no copies out of one)."""
        q, nao, _ = rows.shape
        flat = rows.reshape(q * nao, nao)
        for (c_occ, c_vir), (oo, ov, vv) in zip(channels, out):
            o = c_occ.shape[1]
            half = (flat @ np.hstack([c_occ, c_vir])).reshape(q, nao, -1)          # B_Q C
            np.matmul(c_occ.T, half[:, :, :o], out=oo)
            np.matmul(c_occ.T, half[:, :, o:], out=ov)
            np.matmul(c_vir.T, half[:, :, o:], out=vv)

    def response_operand(self, a_t: np.ndarray, moving: bool = False) -> Any:
        """Take an fp64 (K, M) operand that every iteration of the Z-vector reads (an MO block of the JK-fit
        tensor in one layout) into device memory, where it stays until the host drops the handle; returns the
        handle for :meth:`response_gemm` (its ``a_t``) and, with ``moving``, for :meth:`response_grouped`
        (its ``b``) too (the base class: the array itself)."""
        return a_t

    #: whether :meth:`response_grouped` computes on the host, into a NumPy array of its
    #: :attr:`response_precision` that the caller may hand it (``out``) to reuse between products
    response_grouped_on_host: bool = True

    def response_grouped(self, a_t: np.ndarray, b: Any, width: int, stage: str = "zvector",
                         out: np.ndarray | None = None) -> Any:
        """Y (G·M, width) with Y[g·M + m, j] = Σ_k a_t[k, m] b[k, g·width + j]: the product of a small host
        operand ``a_t`` (K, M) fp64 with each of the G column groups of the kept ``b`` (a ``moving``
        :meth:`response_operand` handle, (K, G·width)), laid out as row blocks for a next product that
        contracts over (g, m). It stays where the device computed it: the handle :meth:`response_gemm` takes
        as its ``b`` (the base class: a NumPy array, G batched GEMMs). ``out``: where
        :attr:`response_grouped_on_host`, a C-contiguous (G·M, width) host array of the response's dtype to
        write Y into (returned), else a new one; a device with memory of its own ignores it."""
        k, m = a_t.shape
        g = np.shape(b)[1] // width
        res = None if out is None else out.reshape(g, m, width)
        return np.matmul(np.asarray(a_t).T, np.asarray(b).reshape(k, g, width).transpose(1, 0, 2),
                         out=res).reshape(g * m, width)

    def response_gemm(self, a_t: Any, b: Any, stage: str = "zvector", out: np.ndarray | None = None) -> np.ndarray:
        """C (M, N) = a_tᵀ · b in fp64: ``a_t`` a :meth:`response_operand` handle or an fp64 (K, M) array,
        ``b`` (K, N) fp64 from the host or a :meth:`response_grouped` result; written into ``out`` (a host
        C-contiguous (M, N) fp64 array, returned) when given, else a new array. Launch records and cost reports
        count it under ``stage`` (``zvector``: the response's products; ``grad_gamma``: Γ's
        back-transformation to the AO basis)."""
        return np.matmul(np.asarray(a_t).T, b, out=out)

    # -- the SCF's Coulomb and exchange builds (mp2trn.jk owns blocking, caching and the fp64 sums) ------
    #: True when the device implements the J/K stage below
    has_jk: bool = False
    #: precisions its J/K builds run in (None: the supported precisions); a precision outside it (fp64 on
    #: an NKI device) runs on the host CPU, and the SCF record says so per cycle
    jk_precisions: tuple[str, ...] | None = None

    #: whether :meth:`jk_tensor` takes packed rows (p, nao(nao+1)/2), μ ≥ ν (half the host memory of the
    #: tensor: :mod:`mp2trn.packed`), which the device unpacks as its builds read them or as it makes its
    #: copy of them; else it takes unpacked (p, nao, nao) rows
    jk_packed: bool = False

    def jk_copy_itemsize(self, dtype: np.dtype, planes: int = 1) -> int:
        """Bytes per tensor element the device keeps besides the host tensor for builds in ``dtype``
        (its copy of the blocks; ``planes`` > 1: a compensated precision's planes, asked only of a device
        whose :attr:`jk_precisions` list one); the memory plan of the SCF counts them."""
        return np.dtype(dtype).itemsize

    def jk_host_copy_itemsize(self, dtype: np.dtype, planes: int = 1) -> int:
        """Bytes per tensor element that a device with memory of its own (:meth:`memory_mb`) keeps in host
        memory besides the host tensor while its copy is in device memory; the memory plan counts them
        against the budget (a device computing in host memory has its whole copy counted there)."""
        return 0

    #: whether the SCF's builds are difference-density ones by default (:class:`mp2trn.jk.PrecisionSchedule`:
    #: their rounding error then follows |ΔD|, not |D|). Off where the final builds are fp64 (cpu, cuda): a
    #: ΔD factor has up to 2·nocc columns, twice D's: benzene/cc-pVDZ took 1.30x the J/K seconds and one more cycle
    #: (``python scripts/bench_scf_jk.py --incremental``, docs/precision.md); on for the NKI devices, whose
    #: fp32x3 final builds settle the energy only so (mp2trn.devices.nki_device)
    jk_incremental: bool = False

    #: whether a resident tensor is taken as one block (:meth:`jk_tensor` once, :meth:`jk_block` once per
    #: build) rather than in blocks of the plan's rows: the CPU's builds split the rows over the cores
    #: themselves, and a hand-over between blocks left them idle (``python scripts/bench_idle_cores.py jk
    #: --blocks``: cores 93-95 % busy in 7 blocks of an Inosine fp32 build, 97-99 % in one); a kernel device
    #: keeps its launch-sized blocks
    jk_resident_one_block: bool = False

    #: whether a streamed tensor's blocks reach :meth:`jk_tensor` unpacked (p, nao, nao) though the device
    #: takes packed resident rows; the SCF's plan then counts the unpacked rows per streamed row. The NKI
    #: devices: with their copies made from packed rows in the streamed reader's thread, ``/usr/bin/time -f %M
    #: mp2trn run molecules/benzene.xyz --device sim --precision fp32 --memory 300`` peaked at 529 MB (350 MB
    #: before the packed rows, 284 MB this way; 2-core VM, 2026-11-27); the CPU unpacks a few rows itself
    jk_streamed_unpacked: bool = False

    #: whether the builds can do without that copy, reading the host rows as they go (slower), when the
    #: SCF's plan has room for the resident host tensor but not for the copy beside it (the CPU's fp32
    #: copy); a device whose copy is its working tensor (GPU, NeuronCore) cannot
    jk_copy_optional: bool = False

    def jk_second_half(self, block: np.ndarray, previous: Any) -> Any:
        """What :meth:`jk_tensor` (``planes`` > 1, ``previous``) would make on the host for ``block`` beyond
        the reduced-precision handle ``previous`` it reuses, or None where there is nothing: an NKI device's
        fp32(B − fp32(B)), the second half of the compensated block's fp32 pair. The SCF makes it in a thread
        during the reduced builds on a device computing off the host's cores (:class:`mp2trn.jk.JKTensor`)
        and hands it to :meth:`jk_tensor` as ``second``."""
        return None

    def jk_tensor(self, block: np.ndarray, dtype: np.dtype, keep_copy: bool = True, planes: int = 1,
                  previous: Any = None, second: Any = None) -> Any:
        """Take one block of the SCF's Cholesky-decomposed 3-index tensor onto the device.

        block: fp64 rows B_P (each symmetric), a view into the host tensor: (p, nao(nao+1)/2) packed when
        :attr:`jk_packed`, else (p, nao, nao); dtype: the arithmetic of the builds that will use it;
        keep_copy: False only for a device with :attr:`jk_copy_optional`, when the plan has no room for its
        copy; planes > 1: the block split for a compensated precision's kernels (only devices whose
        :attr:`jk_precisions` list one are asked), with ``previous`` the handle of the same rows for the
        builds before the precision switch (resident tensor only), which the device may reuse (an NKI
        device's fp32 rows are the first half of the compensated block's fp32 pair) and ``second`` what
        :meth:`jk_second_half` made of it ahead. The handle stays in
        device memory for every build of the SCF in that precision (an NKI launcher keeps it,
        :meth:`~mp2trn.devices.nki_launch.Launcher.keep`; the cuda device holds a GPU tensor) until
        :meth:`release_jk`. Returns a device-side handle for
        :meth:`jk_block` (on the CPU, a view, an fp32 copy, or a note to convert as it reads).
        """
        raise NotImplementedError(f"device {self.name!r} has no J/K stage")

    def jk_block(self, block: Any, factors: list[tuple[np.ndarray, float]], dm: np.ndarray, with_j: bool,
                 with_k: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Coulomb and exchange contributions of one tensor block for one density matrix (Hartree).

        factors: [(C (nao, n), sign)] with dm = Σ sign·C Cᵀ (occupied orbitals scaled by √occ, or the
        eigen-factors of a bare density); dm (nao, nao) symmetric.
        J_μν = Σ_P ρ_P B_P,μν with ρ_P = Σ_μν B_P,μν dm_μν;  K_μν = Σ_P Σ_i (B_P C)_μi (B_P C)_νi · sign.
        Returns fp64 (nao, nao) arrays (None for what was not asked).
        """
        raise NotImplementedError(f"device {self.name!r} has no J/K stage")

    def release_jk(self) -> None:
        """Free whatever the J/K builds kept between builds (work buffers), after the SCF."""

    def limit_jk_work(self, mb: float) -> None:
        """Hold the J/K builds' host work buffers (all parts of a build together) to ``mb`` MB, set by the J/K
        stage from its budget (:data:`mp2trn.memory.JK_WORK_SHARE` of it). Devices whose builds keep no
        buffers of that size in host memory ignore it."""

    def cost_report(self, since: Any = None) -> dict[str, Any] | None:
        """Modeled accelerator cost of everything run so far, or since a :meth:`cost_checkpoint` (NKI
        devices); the cpu device's measured roofline (:mod:`mp2trn.roofline`); None for cuda."""
        return None

    def cost_checkpoint(self) -> Any:
        """A mark to pass to :meth:`cost_report` as ``since`` (None where there is no cost report)."""
        return None

    def transfer_record(self, since: Any = None) -> dict[str, dict[str, int]] | None:
        """Host<->device bytes per stage of the kernel launches so far (or since a checkpoint): ``to_device`` as launched (every
        array input copied per launch), ``to_host`` (outputs), ``to_device_reusing`` (an array object passed
        again counted once: what a device keeping its inputs resident would move); None for cpu/cuda."""
        return None

    def collective_launcher(self) -> Any | None:
        """The kernel launcher whose NKI collective kernels move arrays between the ranks of a run on
        this device (sim, neuron); None: arrays travel through the process group as they are."""
        return None

    def close(self) -> None:
        """Release device resources."""
