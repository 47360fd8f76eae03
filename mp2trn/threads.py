"""One BLAS thread pool on the cores at a time.

A process running mp2trn loads several BLAS libraries, each with its own pool of threads: NumPy's
OpenBLAS (every GEMM of mp2trn's own) and SciPy's (the triangular solves, and the LAPACK calls of
PySCF's SCF driver); PySCF's integral code runs OpenMP threads of its own. An OpenBLAS worker keeps
spinning for about 2^28 cycles (~0.1 s) after each call before it sleeps. On a machine with few cores,
a call into one pool right after a call into another shares the cores with the first pool's spinning
workers: on the 2-core machine a 326×326 ``eigh`` in SciPy right after a NumPy GEMM took 90-120 ms
instead of 12 ms (``python scripts/bench_blas_pools.py``).

Inside :func:`one_blas_pool` only one library's pool runs on all its threads (NumPy's by default,
SciPy's around mp2trn's triangular solves) and every other BLAS library is held to one thread. The
OpenMP threads of PySCF's integral code are left as they are. A user driving PySCF with mp2trn's J/K
builds (:func:`mp2trn.density_fit_jk`) can do the same::

    with mp2trn.one_blas_pool():
        mf.kernel()

(``OPENBLAS_THREAD_TIMEOUT=4`` in the environment before NumPy is imported has a similar effect for
every OpenBLAS at once: each worker then sleeps almost at once after a call. ``import mp2trn`` sets it
unless it is set, so it holds wherever mp2trn is imported before NumPy.)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
from typing import Iterator

try:
    from threadpoolctl import ThreadpoolController
except ImportError:  # pragma: no cover - a dependency; without it nothing is changed
    ThreadpoolController = None

#: the thread count of each BLAS library (by path) before mp2trn first held it back
_ORIGINAL: dict[str, int] = {}


def _package_dirs(package: str) -> tuple[str, ...]:
    """Where ``package``'s own shared libraries live: the package and its wheel's ``<package>.libs``."""
    pkg = os.path.dirname(os.path.abspath(importlib.import_module(package).__file__))
    return pkg + os.sep, os.path.join(os.path.dirname(pkg), f"{package}.libs") + os.sep


@functools.lru_cache(maxsize=None)
def _all_blas_libraries() -> tuple:
    """Every BLAS library loaded in this process (threadpoolctl's controllers), looked up once: a scan of
    the loaded libraries costs ~2 ms, and a triangular solve or a J/K build asks at every call; mp2trn
    imports NumPy, SciPy and PySCF before the first lookup."""
    return tuple(lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas")


@functools.lru_cache(maxsize=None)
def _blas_libraries(owner: str) -> tuple[list, list]:
    """(``owner``'s BLAS libraries, the other BLAS libraries); nothing to hold back when ``owner``'s own
    cannot be told apart (e.g. NumPy and SciPy sharing one system BLAS: then there is one pool)."""
    blas = list(_all_blas_libraries())
    dirs = _package_dirs(owner)
    mine = [lib for lib in blas if os.path.abspath(lib.filepath).startswith(dirs)]
    return (mine, [lib for lib in blas if lib not in mine]) if mine else ([], [])


def _label(lib) -> str:
    """A short name for a BLAS library: the package it ships with."""
    parts = os.path.abspath(lib.filepath).split(os.sep)
    for part in reversed(parts[:-1]):
        if part.endswith(".libs"):
            return part[: -len(".libs")]
        if part not in ("lib", "lib64", "site-packages"):
            return part
    return parts[-1]


@contextlib.contextmanager
def one_blas_pool(owner: str = "numpy") -> Iterator[list[str]]:
    """Inside the block ``owner``'s BLAS ("numpy" or "scipy") runs on all the threads it had before
    mp2trn touched it, and every other BLAS library on one; yields the held-back libraries' packages.
    Nests: leaving a block restores the counts it found."""
    if ThreadpoolController is None:
        yield []
        return
    mine, others = _blas_libraries(owner)
    found = [(lib, lib.num_threads) for lib in mine + others]
    for lib, n in found:
        _ORIGINAL.setdefault(lib.filepath, n)
    for lib in mine:
        lib.set_num_threads(_ORIGINAL[lib.filepath])
    held = [lib for lib in others if lib.num_threads > 1]
    for lib in held:
        lib.set_num_threads(1)
    try:
        yield sorted({_label(lib) for lib in held})
    finally:
        for lib, n in found:
            lib.set_num_threads(n)


def blas_threads() -> int:
    """The threads of NumPy's BLAS pool as mp2trn found it (of the one BLAS when NumPy's cannot be told
    apart; 1 without threadpoolctl): the pool's size, and how many parts work split over the cores by
    :func:`one_thread_each` runs in."""
    if ThreadpoolController is None:
        return 1
    pools = _blas_libraries("numpy")[0] or list(_all_blas_libraries())
    return max(1, _ORIGINAL.get(pools[0].filepath, pools[0].num_threads)) if pools else 1


def current_blas_threads() -> int:
    """The threads NumPy's BLAS pool has now (of the one BLAS when NumPy's cannot be told apart; 1 without
    threadpoolctl or any BLAS)."""
    if ThreadpoolController is None:
        return 1
    pools = _blas_libraries("numpy")[0] or list(_all_blas_libraries())
    return int(pools[0].num_threads) if pools else 1


#: one_thread_each's holds: entered from several threads at once (a reader thread's block beside a build),
#: the first entry holds every BLAS library to one thread and the last exit restores what the first found
_EACH_LOCK = threading.Lock()
_each_entries = 0
_each_found: list = []


@contextlib.contextmanager
def one_thread_each() -> Iterator[None]:
    """Inside the block every BLAS library runs on one thread, so that the caller's own threads, one per
    core, can each run a part of the work with BLAS calls of their own (the parts take the place of
    NumPy's pool: still one set of threads on the cores). Small GEMMs and the elementwise work between
    them then run on all cores at once, where a pool would run the GEMMs on all cores and the rest on one
    (the cpu device's J/K builds and pair step). Entries from several threads share one hold, released at
    the last exit; :func:`one_blas_pool` is meant for one thread at a time and is not entered inside it."""
    global _each_entries, _each_found
    if ThreadpoolController is None:
        yield
        return
    with _EACH_LOCK:
        if _each_entries == 0:
            _each_found = [(lib, lib.num_threads) for lib in _all_blas_libraries()]
            for lib, n in _each_found:
                _ORIGINAL.setdefault(lib.filepath, n)
                if n > 1:
                    lib.set_num_threads(1)
        _each_entries += 1
    try:
        yield
    finally:
        with _EACH_LOCK:
            _each_entries -= 1
            if _each_entries == 0:
                for lib, n in _each_found:
                    if n > 1:
                        lib.set_num_threads(n)
                _each_found = []


def pool_note() -> str:
    """For the output: the BLAS pool of mp2trn's GEMMs, and the libraries a run holds to one thread."""
    if ThreadpoolController is None:
        return "threadpoolctl missing: BLAS pools left as they are"
    mine, others = _blas_libraries("numpy")
    if not mine:
        return "one BLAS library for NumPy and SciPy: its pool left as it is"
    threads = _ORIGINAL.get(mine[0].filepath, mine[0].num_threads)
    held = sorted({_label(lib) for lib in others if _ORIGINAL.get(lib.filepath, lib.num_threads) > 1})
    rest = f"; {', '.join(held)} BLAS held to 1 thread while NumPy's runs" if held else ""
    return f"NumPy's {mine[0].internal_api}, {threads} thread{'' if threads == 1 else 's'}{rest}"


__all__ = ["blas_threads", "one_blas_pool", "one_thread_each", "pool_note"]
