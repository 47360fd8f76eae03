"""Scratch files of a run: one directory per run, removed on every exit path, and signals handled.

All temporary files of a run — the out-of-core B tensor, PySCF's HDF5 files for a density-fitting tensor
that does not fit in memory — live in ``<base>/mp2trn-<pid>-<random>`` (base: ``--scratch``, else
``$TMPDIR``). The directory holds an ``owner`` file with the process id; a later run (or ``mp2trn clean``)
removes directories whose process is gone, such as those a SIGKILL left, and never touches a live run's.

:func:`handle_signals` turns SIGTERM and SIGHUP (what batch schedulers and ``timeout`` send) into
:class:`~mp2trn.errors.Terminated`, like SIGINT, so every ``finally`` block — scratch removal included —
runs, and the CLI prints one line and exits with 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pyscf import lib

from .errors import InputError, Terminated

PREFIX = "mp2trn-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def stale_directories(base: str | os.PathLike | None = None) -> list[Path]:
    """Run directories under ``base`` whose owning process no longer exists."""
    root = Path(base or tempfile.gettempdir())
    out = []
    for d in root.glob(PREFIX + "*"):
        owner = d / "owner"
        try:
            pid = int(owner.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # not one of ours, or still being created
        if pid != os.getpid() and not _alive(pid):
            out.append(d)
    return out


def clean_stale(base: str | os.PathLike | None = None) -> list[Path]:
    """Remove the stale run directories under ``base``; returns what was removed."""
    removed = []
    for d in stale_directories(base):
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


@contextlib.contextmanager
def run_scratch(base: str | os.PathLike | None = None) -> Iterator[Path]:
    """A fresh run directory under ``base`` (made the process's temporary directory and PySCF's TMPDIR for
    the run), removed when the block ends, however it ends."""
    root = Path(base) if base else Path(tempfile.gettempdir())
    if not root.is_dir():
        raise InputError(f"--scratch {root}: no such directory")
    if not os.access(root, os.W_OK):
        raise InputError(f"--scratch {root}: directory is not writable")
    clean_stale(root)
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root))
    (path / "owner").write_text(f"{os.getpid()}\n")
    saved = tempfile.tempdir, lib.param.TMPDIR
    tempfile.tempdir, lib.param.TMPDIR = str(path), str(path)
    try:
        yield path
    finally:
        tempfile.tempdir, lib.param.TMPDIR = saved
        _close_temporary_files(path)
        shutil.rmtree(path, ignore_errors=True)


def _close_temporary_files(path: Path) -> None:
    """Close the NamedTemporaryFile objects still open under ``path`` (PySCF's density-fitting objects
    keep one each): closing unlinks the file now, so their finalizers find nothing to remove later."""
    prefix = str(path) + os.sep
    for obj in gc.get_objects():
        if type(obj) is tempfile._TemporaryFileWrapper and str(obj.name).startswith(prefix):  # noqa: E721
            with contextlib.suppress(OSError):
                obj.close()


@contextlib.contextmanager
def handle_signals(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, the given signals raise :class:`Terminated` (the previous handlers come back)."""

    def stop(signum, _frame):
        _RECEIVED.append(signum)
        raise Terminated(signum, signal.Signals(signum).name)

    def unraisable(info):
        # the signal landed in a finalizer or weakref callback, where Python prints the exception and
        # drops it: stay quiet, check_stopped() raises it again at the next check
        if not isinstance(info.exc_value, Terminated):
            previous_hook(info)

    previous = {}
    for s in signals:
        try:
            previous[s] = signal.signal(s, stop)
        except ValueError:  # not the main thread: leave signals alone
            pass
    _RECEIVED.clear()
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        for s, h in previous.items():
            signal.signal(s, h)


#: signals received inside :func:`handle_signals` (a library on the way may swallow the exception)
_RECEIVED: list[int] = []


def check_stopped() -> None:
    """Raise :class:`Terminated` again if a signal arrived, even if its exception was swallowed on the way;
    called between stages and before any output is written."""
    if _RECEIVED:
        raise Terminated(_RECEIVED[0], signal.Signals(_RECEIVED[0]).name)
