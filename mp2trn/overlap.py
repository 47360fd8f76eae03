"""Host work made ahead of the work that consumes it: a bounded queue of blocks filled by one producer thread.

Where the host makes a stream of blocks (3-index integrals, rows of a tensor read from a file) and something
else consumes them — a device computing on its own cores, a disk being written — :func:`made_ahead` makes
the next block in a producer thread while the caller works on the current one. PySCF's integral code,
NumPy's copies and file reads release the GIL, so the two run at once.

Bounded: at most ``ahead`` blocks are made beyond the one the caller holds, so ``ahead + 1`` blocks are
alive at any time, and a producer writing each block into one of ``ahead + 1`` reused buffers (for instance
:meth:`mp2trn.df.DFIntegrals.ao_blocks` with ``buffers=2``) never overwrites a block in use. An exception in
the producer is raised in the caller, in order, where its block would have come; a caller that stops early
(``break``, an exception of its own, ``close()``) stops the producer before its next block and waits for the
block it is making, so no thread outlives the loop and no buffer is written after it.

The cores (:mod:`mp2trn.threads`): the producer's integrals run PySCF's OpenMP threads. They are made ahead
only where the consumer does not compute on the same cores (:func:`overlaps`): on a device whose arithmetic
runs elsewhere (a GPU, a NeuronCore; the consumer then waits on the device), or where it writes a file.
On the ``cpu`` device and in the emulator the device's GEMMs use every core, so a second pool beside them
would only share the cores (integrals and GEMMs each scale to all of them here): the blocks are then made in
turn, as before. ``omp_threads`` sets the producer thread's own OpenMP count (OpenMP keeps it per thread;
the caller's is unchanged).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from .devices.base import Device

T = TypeVar("T")

#: seconds between the producer's looks at the stop flag while it waits for a free slot
_POLL_S = 0.05


def overlaps(device: Device) -> bool:
    """Whether host blocks are made ahead of ``device``'s work on them: only when its arithmetic runs off the
    host's cores (:meth:`Device.computes_on_host_cores`). ``MP2TRN_OVERLAP=0`` in the environment turns
    off what this decides (the 3-index blocks of :func:`mp2trn.transform.build_b` made ahead of a GPU), so a
    benchmark can time the same run with and without (scripts/bench_gpu4pyscf.py --compare overlap); the
    streamed SCF tensor's reads and writes are made ahead on every device either way."""
    if os.environ.get("MP2TRN_OVERLAP", "1") == "0":
        return False
    return not device.computes_on_host_cores()


def made_ahead(blocks: Iterable[T], ahead: int = 1, omp_threads: int | None = None,
               name: str = "mp2trn-ahead") -> Iterator[T]:
    """Yield the items of ``blocks`` in order, each made by a producer thread while the caller works on the
    ones before it, at most ``ahead`` beyond the one the caller holds. The producer's errors are raised here;
    stopping early stops it (module docstring). ``omp_threads``: OpenMP threads of PySCF's code in the
    producer (None: as they are)."""
    ahead = max(1, int(ahead))
    slots = threading.Semaphore(ahead + 1)      # blocks alive: the caller's and those made ahead
    made: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()
    producer = threading.Thread(target=_produce, args=(blocks, slots, made, stop, omp_threads), name=name,
                                daemon=True)
    producer.start()
    try:
        while True:
            kind, item = made.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
            slots.release()        # the caller asks for the next block: it is done with this one
    finally:
        stop.set()
        slots.release()            # wakes a producer waiting for a slot
        producer.join()


def _produce(blocks: Iterable[T], slots: threading.Semaphore, made: queue.SimpleQueue, stop: threading.Event,
             omp_threads: int | None) -> None:
    """The producer thread: one slot per block it makes; ("item", block), then ("end", None) or
    ("error", exception) into ``made``; returns at once when ``stop`` is set."""
    it = iter(blocks)
    try:
        if omp_threads is not None:
            from pyscf import lib

            lib.num_threads(omp_threads)     # this thread's OpenMP count only
        while True:
            while not slots.acquire(timeout=_POLL_S):
                if stop.is_set():
                    return
            if stop.is_set():
                return
            try:
                item = next(it)
            except StopIteration:
                made.put(("end", None))
                return
            made.put(("item", item))
    except BaseException as exc:   # handed to the caller, raised where its block would have come
        made.put(("error", exc))
    finally:
        if isinstance(it, types.GeneratorType):
            it.close()                # the generator's own clean-up runs here, in the thread that ran it


class EarlyBlocks:
    """Blocks made by a thread before the stage that uses them starts — the MP2 step's 3-index integral
    blocks made while the SCF's builds run on a device off the host's cores (they depend on no orbitals).

    ``makers``: one callable per block, in order, as many as may be held (the caller's memory plan); the
    thread, begun by :meth:`start` (``start=True``: at once), calls them until they end or :meth:`take` stops
    it. :meth:`take` hands over the blocks made, in order (none when it never began), and raises the
    thread's error if it had one. As a context manager, leaving it (an SCF that failed, say) stops the
    thread and drops what it made."""

    def __init__(self, makers: Iterable[Callable[[], T]], name: str = "mp2trn-early", omp_threads: int | None = None,
                 start: bool = True):
        self._makers = makers
        self._made: list = []
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self.seconds = 0.0          # the thread's wall time making blocks
        self._thread = threading.Thread(target=self._run, args=(omp_threads,), name=name, daemon=True)
        self._started = False
        if start:
            self.start()

    def start(self) -> None:
        """Begin making the blocks (once; not after :meth:`take` or :meth:`close`)."""
        if not self._started and not self._stop.is_set():
            self._started = True
            self._thread.start()

    def _join(self) -> None:
        self._stop.set()
        if self._started:
            self._thread.join()

    def _run(self, omp_threads: int | None) -> None:
        t0 = time.perf_counter()
        try:
            if omp_threads is not None:
                from pyscf import lib

                lib.num_threads(omp_threads)     # this thread's OpenMP count only
            for make in self._makers:
                if self._stop.is_set():
                    return
                self._made.append(make())
        except BaseException as exc:   # raised in the user's thread by take()
            self._error = exc
        finally:
            self.seconds = time.perf_counter() - t0

    def wait(self) -> None:
        """Until every block is made (or the thread failed), when it began."""
        if self._started:
            self._thread.join()

    def take(self) -> list[T]:
        """Stop the thread after the block it is making; the blocks made, in order (handed over once)."""
        self._join()
        made, self._made = self._made, []
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return made

    def close(self) -> None:
        """Stop the thread and drop its blocks."""
        self._join()
        self._made = []

    def __enter__(self) -> "EarlyBlocks":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def host_blocks(blocks: Iterable[T], device: Device, omp_threads: int | None = None) -> Iterator[T]:
    """``blocks`` made ahead of ``device``'s work when :func:`overlaps` says so, else in turn."""
    return made_ahead(blocks, omp_threads=omp_threads) if overlaps(device) else iter(blocks)


__all__ = ["EarlyBlocks", "host_blocks", "made_ahead", "overlaps"]
