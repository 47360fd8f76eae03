"""One molecule over many ranks: the few collectives mp2trn needs, on torch.distributed.

A run is spread over ranks when it is launched by ``torchrun`` (``WORLD_SIZE`` > 1) or when the caller
has initialised a process group; :func:`open_comm` gives the run its :class:`Comm`. With one rank every
collective is the identity, so the single-process path is the same code. What travels between ranks:

    SCF tensor      all-to-all, pair columns → auxiliary rows          (once per SCF)
    SCF J/K         all-reduce of the partial J and K (fp64)            (once per cycle)
    ao_to_mo        all-to-all, auxiliary rows → occupied columns      (once per spin)
    pairs           B blocks, one ring round at a time (each rank to rank − step)
    reduce          all-reduce of the per-pair sums (fp64)             (once)

On ``cpu`` and ``cuda`` the arrays travel through the process group itself (gloo, nccl). On the NKI
devices they travel in NKI collective kernels (:class:`NkiComm`, ``mp2trn/kernels/collectives.py``:
``all_to_all_v``, ``collective_permute``, ``all_gather`` of ``nki.collectives``): on ``neuron`` the
Neuron runtime moves them (process group 'xla' of torch-neuronx, NeuronLink/EFA), on ``sim`` the
emulator does, over the gloo group. Bytes are counted per stage as this rank sends them (an
all-reduce through the process group as a ring does: 2(N−1)/N of the array). A rank that fails tells
the others through the process group's store and tears the group down, so no rank waits for it; rank 0
reports the failing rank's one-line message.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import DeviceUnavailableError, InputError, Mp2trnError, RankFailed, Terminated
from .memory import eighth_step_size

#: process-group backend per device kind
BACKENDS = {"cpu": "gloo", "sim": "gloo", "auto": "gloo", "cuda": "nccl", "neuron": "xla"}
_ERROR_KEY = "mp2trn/error"
_SEEN_KEY = "mp2trn/error-seen"
#: how long a failing rank other than 0 waits for rank 0 to take its message before it exits
_REPORT_WAIT_S = 10.0


def balanced_counts(n: int, size: int) -> list[int]:
    """``n`` items over ``size`` ranks, as equal as possible, the larger shares first."""
    return [n // size + (1 if r < n % size else 0) for r in range(size)]


def offsets(counts: Sequence[int]) -> list[int]:
    """Start of each share: [0, c0, c0+c1, ...] (one longer than ``counts``)."""
    return [0, *np.cumsum(counts).tolist()]


def weighted_split(weights: Sequence[float], size: int) -> list[tuple[int, int]]:
    """Contiguous ranges of items (e.g. shells weighted by their work) with about equal weight each."""
    total = float(np.sum(weights))
    cuts, acc, k = [0], 0.0, 1
    for i, w in enumerate(weights):
        acc += w
        while k < size and acc >= total * k / size:
            cuts.append(i + 1)
            k += 1
    cuts += [len(weights)] * (size + 1 - len(cuts))
    return [(cuts[r], cuts[r + 1]) for r in range(size)]


@dataclass
class Comm:
    """This process alone (rank 0 of 1): every collective returns its input. :class:`TorchComm` is the
    many-rank version; the compute path is written once against this interface."""

    rank: int = 0
    size: int = 1
    backend: str | None = None
    bytes_sent: dict[str, float] = field(default_factory=dict)

    def count(self, stage: str, nbytes: float) -> None:
        self.bytes_sent[stage] = self.bytes_sent.get(stage, 0.0) + float(nbytes)

    def allreduce(self, x: np.ndarray, stage: str) -> np.ndarray:
        """Σ over ranks of the fp64 array ``x``, the same on every rank."""
        return x

    def rows_to_cols(self, x: np.ndarray, rows: Sequence[int], cols: Sequence[int], stage: str) -> np.ndarray:
        """A matrix held by row blocks (this rank: ``(rows[rank], Σcols)``) → by column blocks
        (this rank: ``(Σrows, cols[rank])``)."""
        if self.size == 1:
            return x
        x = np.ascontiguousarray(x)
        c0 = offsets(cols)
        send = np.concatenate([x[:, c0[q] : c0[q + 1]].reshape(-1) for q in range(self.size)])
        item = x.itemsize
        send_bytes = [rows[self.rank] * cols[q] * item for q in range(self.size)]
        recv_bytes = [rows[p] * cols[self.rank] * item for p in range(self.size)]
        self.count(stage, sum(send_bytes) - send_bytes[self.rank])
        out = self._all_to_all(send, send_bytes, recv_bytes)
        return out.view(x.dtype).reshape(sum(rows), cols[self.rank])

    def cols_to_rows(self, x: np.ndarray, rows: Sequence[int], cols: Sequence[int], stage: str) -> np.ndarray:
        """The reverse of :meth:`rows_to_cols`: ``(Σrows, cols[rank])`` → ``(rows[rank], Σcols)``."""
        if self.size == 1:
            return x
        x = np.ascontiguousarray(x)   # rows of a C array: the send buffer needs no copy
        item = x.itemsize
        send_bytes = [rows[q] * cols[self.rank] * item for q in range(self.size)]
        recv_bytes = [rows[self.rank] * cols[p] * item for p in range(self.size)]
        self.count(stage, sum(send_bytes) - send_bytes[self.rank])
        out = self._all_to_all(x, send_bytes, recv_bytes).view(x.dtype)
        r0 = offsets([rows[self.rank] * c for c in cols])
        return np.hstack([out[r0[p] : r0[p + 1]].reshape(rows[self.rank], cols[p]) for p in range(self.size)])

    def _all_to_all(self, send: np.ndarray, send_bytes: list[int], recv_bytes: list[int]) -> np.ndarray:
        """``send`` (its bytes in rank order, ``send_bytes[q]`` for rank q) → the bytes from every rank,
        in rank order (uint8)."""
        raise RuntimeError("a single rank exchanges nothing")

    def shift(self, send: np.ndarray | None, step: int, recv_shape: tuple[int, ...] | None, dtype: np.dtype,
              capacity: int, stage: str) -> np.ndarray | None:
        """One round of a ring: send ``send`` to rank (rank − step) while receiving an array of
        ``recv_shape`` from rank (rank + step); None where this rank has nothing to send or receive.
        Every rank calls it the same number of times; ``capacity``: the elements of the largest array
        any rank passes in this round (the same on every rank)."""
        raise RuntimeError("a single rank exchanges nothing")

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        return [obj]

    def record(self) -> dict[str, Any]:
        return {"ranks": self.size, "backend": self.backend}


class TorchComm(Comm):
    """The ranks of a torch.distributed process group (arrays travel as bytes; sums in fp64)."""

    def __init__(self):
        import torch
        import torch.distributed as dist

        super().__init__(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))
        self.torch, self.dist = torch, dist
        self.store = dist.distributed_c10d._get_default_store()
        # host arrays travel over gloo or nccl; under torch-neuronx's 'xla' group, over a gloo group beside it
        # (all ranks in order, so its ranks are the global ones)
        self.group = dist.new_group(backend="gloo") if self.backend not in ("gloo", "nccl") else None
        self.tensor_device = _collective_device(self.backend)

    # -- numpy ↔ torch, and a peer's failure turned into RankFailed --------------------------------------
    def _tensor(self, x: np.ndarray):
        return self.torch.from_numpy(np.ascontiguousarray(x)).to(self.tensor_device)

    def _numpy(self, t) -> np.ndarray:
        return t.cpu().numpy()

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except RuntimeError as exc:  # gloo: "Connection closed by peer"; nccl: a failed or aborted communicator
            raise self.peer_failure(exc) from None

    def peer_failure(self, exc: BaseException) -> RankFailed:
        """The error another rank published before leaving (or a generic one when it published none)."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            try:
                if self.store.check([_ERROR_KEY]):
                    info = json.loads(self.store.get(_ERROR_KEY))
                    return RankFailed(info["rank"], info["message"], info["exit_code"])
            except Exception:  # the store went away with the launcher
                break
            time.sleep(0.05)
        return RankFailed(None, f"lost contact with another rank ({str(exc).splitlines()[0][:200]})", 1)

    # -- collectives ------------------------------------------------------------------------------------------
    def allreduce(self, x: np.ndarray, stage: str) -> np.ndarray:
        t = self._tensor(np.asarray(x, dtype=np.float64))
        with self._guard():
            self.dist.all_reduce(t, group=self.group)
        self.count(stage, 2 * (self.size - 1) / self.size * t.numel() * 8)
        return self._numpy(t).reshape(np.shape(x))

    def _all_to_all(self, send: np.ndarray, send_bytes: list[int], recv_bytes: list[int]) -> np.ndarray:
        out = self.torch.empty(sum(recv_bytes), dtype=self.torch.uint8, device=self.tensor_device)
        src = self._tensor(send.reshape(-1).view(np.uint8))
        with self._guard():
            self.dist.all_to_all_single(out, src, recv_bytes, send_bytes, group=self.group)
        return self._numpy(out)

    def shift(self, send, step, recv_shape, dtype, capacity, stage):
        dest, src = (self.rank - step) % self.size, (self.rank + step) % self.size
        request = None
        with self._guard():
            if send is not None:
                buffer = self._tensor(np.ascontiguousarray(send).reshape(-1).view(np.uint8))
                request = self.dist.isend(buffer, dest, group=self.group)
                self.count(stage, send.nbytes)
            received = None
            if recv_shape is not None:
                nbytes = int(np.prod(recv_shape)) * np.dtype(dtype).itemsize
                received = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.tensor_device)
                self.dist.recv(received, src, group=self.group)
            if request is not None:
                request.wait()
        return None if received is None else self._numpy(received).view(dtype).reshape(recv_shape)

    def gather(self, obj):
        out: list[Any] = [None] * self.size
        with self._guard():
            self.dist.all_gather_object(out, obj, group=self.group)
        return out

    # -- failure --------------------------------------------------------------------------------------------
    def publish_failure(self, exc: BaseException) -> None:
        """Tell the other ranks why this one stops (first failure wins), then leave the group so none of
        them waits for this rank in a collective."""
        if isinstance(exc, (Mp2trnError, Terminated)):
            message, code = str(exc), exc.exit_code
        elif isinstance(exc, KeyboardInterrupt):
            message, code = "interrupted", 130
        else:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            message, code = f"internal error: {type(exc).__name__}: {text}", 70
        with contextlib.suppress(Exception):
            if not self.store.check([_ERROR_KEY]):
                self.store.set(_ERROR_KEY, json.dumps({"rank": self.rank, "message": message, "exit_code": code}))
        self.leave()

    def wait_until_reported(self) -> bool:
        """On a failing rank other than 0: wait (bounded) until rank 0 has taken the message to print."""
        with contextlib.suppress(Exception):
            self.store.wait([_SEEN_KEY], datetime.timedelta(seconds=_REPORT_WAIT_S))
            return True
        return False

    def acknowledge(self) -> None:
        with contextlib.suppress(Exception):
            self.store.set(_SEEN_KEY, "1")

    def leave(self) -> None:
        with contextlib.suppress(Exception):
            if self.dist.is_initialized():
                self.dist.destroy_process_group()


class TorchFabric:
    """The NKI emulator's fabric (:mod:`mp2trn.nkiemu.collectives`) over a :class:`TorchComm`: each
    collective instruction of an emulated kernel is one all-to-all of bytes between the ranks."""

    def __init__(self, comm: TorchComm):
        self.comm, self.rank, self.size = comm, comm.rank, comm.size

    def exchange(self, sends: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        comm, torch = self.comm, self.comm.torch
        send_bytes = [int(sends[p].size) if p in sends else 0 for p in range(self.size)]
        counts = torch.tensor(send_bytes, dtype=torch.int64)
        recv_counts = torch.empty_like(counts)
        with comm._guard():
            comm.dist.all_to_all_single(recv_counts, counts, group=comm.group)
        recv_bytes = recv_counts.tolist()
        data = [sends[p].view(np.uint8) for p in range(self.size) if p in sends]
        flat = np.concatenate(data) if data else np.zeros(0, np.uint8)
        got = comm._all_to_all(flat, send_bytes, recv_bytes)
        starts = offsets(recv_bytes)
        return {p: got[starts[p] : starts[p + 1]] for p in range(self.size)}


class NkiComm(Comm):
    """Ranks whose arrays travel in NKI collective kernels (``mp2trn.kernels.collectives``) launched on
    the run's NKI device: on ``neuron`` the Neuron runtime's collectives (NeuronLink inside an instance,
    EFA between instances); on ``sim`` the emulator's, whose fabric is this process group. Arrays go as
    32-bit words, so fp64 arrives bit for bit; fp64 sums are an all-gather of every rank's words summed
    on the host in rank order. Python objects (the per-rank record) and failure reports stay on the
    process group (:class:`TorchComm`)."""

    def __init__(self, base: TorchComm, launcher):
        super().__init__(base.rank, base.size, f"nki collectives ({launcher.impl}); process group {base.backend}",
                         base.bytes_sent)
        from .kernels import collectives

        self.base, self.launcher, self.kernels = base, launcher, collectives
        self.ranks = tuple(range(base.size))
        from .devices.nki_launch import NeuronLauncher

        if launcher.impl == "emulator":
            from .nkiemu.collectives import use_fabric

            fabric = TorchFabric(base)
            self._fabric = lambda: use_fabric(fabric)
        elif isinstance(launcher, NeuronLauncher):
            self._fabric = contextlib.nullcontext
        else:
            raise DeviceUnavailableError(f"the {launcher.impl} NKI launcher has no collectives (the official "
                                         "simulator does not implement nki.collectives): set MP2TRN_NKI=emulator")

    def _launch(self, kernel, *args) -> np.ndarray:
        with self._fabric():
            return self.launcher.launch("comm", kernel, args)

    def allreduce(self, x: np.ndarray, stage: str) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float64)
        words = _words(x.reshape(-1), _bucket(x.size * 2))
        every = self._launch(self.kernels.gather_words, words, self.ranks).reshape(self.size, -1)
        self.count(stage, (self.size - 1) * words.nbytes)
        parts = every[:, : x.size * 2].copy().view(np.float64)
        total = parts[0].copy()
        for part in parts[1:]:   # rank order, the same sum on every rank
            total += part
        return total.reshape(x.shape)

    def _all_to_all(self, send, send_bytes, recv_bytes):
        send_words = [b // 4 for b in send_bytes]
        recv_words = [b // 4 for b in recv_bytes]
        meta = np.array([send_words, offsets(send_words)[:-1], recv_words], dtype=np.int32)
        buf = _words(send.reshape(-1), _bucket(sum(send_words)))
        got = self._launch(self.kernels.all_to_all_words, buf, meta, _bucket(sum(recv_words)), self.ranks)
        return got.reshape(-1)[: sum(recv_words)].view(np.uint8)

    def shift(self, send, step, recv_shape, dtype, capacity, stage):
        words = _bucket(capacity * np.dtype(dtype).itemsize // 4)
        buf = _words(np.zeros(0, np.int32) if send is None else send.reshape(-1), words)
        pairs = tuple((r, (r - step) % self.size) for r in range(self.size))
        got = self._launch(self.kernels.shift_words, buf, pairs)
        if send is not None:
            self.count(stage, send.nbytes)
        if recv_shape is None:
            return None
        n = int(np.prod(recv_shape))
        return got.reshape(-1).view(np.uint8)[: n * np.dtype(dtype).itemsize].view(dtype).reshape(recv_shape)

    def gather(self, obj):
        return self.base.gather(obj)


def _bucket(words: int) -> int:
    """Buffer sizes in steps of an eighth of a power of two (≤ 12.5 % padding): collective kernels of a
    run then compile a few sizes, not one per array."""
    return eighth_step_size(words)


def _words(a: np.ndarray, n: int) -> np.ndarray:
    """The bytes of ``a`` as ``n`` int32 words (zero padded), shaped (n, 1) for the kernels."""
    raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    out = np.zeros(n * 4, np.uint8)
    out[: raw.size] = raw
    return out.view(np.int32).reshape(n, 1)


def device_comm(comm: Comm, device) -> Comm:
    """The ranks of a run on ``device``: on an NKI device (sim, neuron) the arrays travel in NKI collective
    kernels (:class:`NkiComm`); elsewhere through the process group as they are."""
    launcher = device.collective_launcher()
    if isinstance(comm, TorchComm) and comm.size > 1 and launcher is not None:
        return NkiComm(comm, launcher)
    return comm


def _collective_device(backend: str) -> str:
    """Where tensors must be for ``backend``'s collectives."""
    if backend == "nccl":
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def rank_and_size() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) of a torchrun launch from its environment, else (0, 1)."""
    try:
        return int(os.environ.get("RANK", 0)), max(1, int(os.environ.get("WORLD_SIZE", 1)))
    except ValueError:
        raise InputError("RANK/WORLD_SIZE must be integers (set by torchrun)") from None


def _torch_dist():
    try:
        import torch.distributed as dist
    except ImportError:
        raise DeviceUnavailableError("a run over several ranks needs PyTorch: pip install 'mp2trn[cuda]' (or "
                                     "the CPU build of torch)") from None
    return dist


def _init_group(device_kind: str) -> None:
    """Start the process group of a torchrun launch with the backend of ``device_kind``."""
    dist = _torch_dist()
    backend = BACKENDS.get(device_kind, "gloo")
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise DeviceUnavailableError("--device cuda over several ranks needs NVIDIA GPUs (nccl); none is visible")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if backend == "xla":   # torch-neuronx's process group (its PyTorch programming guide, torchrun section)
        os.environ.setdefault("NEURON_RT_VISIBLE_CORES", os.environ.get("LOCAL_RANK", "0"))
        try:
            import torch_xla.distributed.xla_backend  # noqa: F401  (registers the 'xla' backend)
        except ImportError:
            from .devices.nki_launch import NEURON_INSTALL

            raise DeviceUnavailableError(f"--device neuron over several ranks needs torch-neuronx: {NEURON_INSTALL}") from None
    dist.init_process_group(backend)
    # kept for the process's later runs (a second start on the same rendezvous would wait for ever)
    atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())


@contextlib.contextmanager
def open_comm(distributed: bool | None, device_kind: str) -> Iterator[Comm]:
    """The ranks of this run.

    ``distributed``: None — all ranks of an initialised process group, or of a torchrun launch (whose
    group is started here, with the backend of ``device_kind``); False — this process alone (how
    ``mp2trn batch`` runs each molecule); True — as None, but one rank is an error.
    On an exception the rank publishes it and leaves the group (see :class:`TorchComm`).
    """
    if distributed is False:
        yield Comm()
        return
    # a group the caller started (any init method, WORLD_SIZE set or not) is used as it is
    dist = sys.modules.get("torch.distributed")
    launched = rank_and_size()[1]
    if launched > 1 or distributed:
        dist = _torch_dist()
        if not dist.is_initialized() and launched > 1:
            _init_group(device_kind)
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        if distributed:
            raise InputError("a distributed run needs several ranks: launch with torchrun --nproc-per-node N, "
                             "or initialise a torch.distributed process group first")
        yield Comm()
        return
    comm = TorchComm()
    try:
        yield comm
    except BaseException as exc:
        report(comm, exc)
        raise


def report(comm: TorchComm, exc: BaseException) -> None:
    """A failing run, on one rank: publish this rank's own failure; decide who prints the one line.

    Rank 0 prints (a peer's message arrives as RankFailed); another rank stays silent unless rank 0
    never took its message (then it prints its own)."""
    if isinstance(exc, RankFailed):
        if comm.rank == 0:
            comm.acknowledge()
        else:
            exc.silent = True
        comm.leave()
        return
    comm.publish_failure(exc)
    if comm.rank != 0 and comm.wait_until_reported():
        exc.silent = True  # type: ignore[attr-defined]


__all__ = ["BACKENDS", "Comm", "TorchComm", "NkiComm", "TorchFabric", "device_comm", "open_comm", "balanced_counts", "offsets", "weighted_split",
           "rank_and_size"]
