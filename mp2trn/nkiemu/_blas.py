"""Run kernel launches with single-threaded BLAS.

A launch does thousands of small (128 x 128 @ 128 x 512) matmuls; multi-threaded OpenBLAS is ~3x slower
on them than one thread and degrades badly on a loaded machine. Uses threadpoolctl when installed, else
the OpenBLAS ``*_set_num_threads`` symbols NumPy's bundled library exports; otherwise does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os

_api = None  # (get, set) or False


def _find():
    global _api
    if _api is not None:
        return _api
    _api = False
    try:
        import numpy
        d = os.path.join(os.path.dirname(numpy.__file__), "..", "numpy.libs")
        for path in glob.glob(os.path.join(d, "*openblas*")):
            lib = ctypes.CDLL(path)
            for pre in ("scipy_openblas_", "openblas_"):
                for suf in ("64_", ""):
                    g, s = f"{pre}get_num_threads{suf}", f"{pre}set_num_threads{suf}"
                    if hasattr(lib, g) and hasattr(lib, s):
                        get, set_ = getattr(lib, g), getattr(lib, s)
                        get.restype = ctypes.c_int
                        set_.argtypes = [ctypes.c_int]
                        _api = (get, set_)
                        return _api
    except Exception:  # pragma: no cover - best effort only
        _api = False
    return _api


@contextlib.contextmanager
def single_threaded():
    try:
        from threadpoolctl import threadpool_limits  # type: ignore
    except ImportError:
        threadpool_limits = None
    if threadpool_limits is not None:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
        return
    api = _find()
    if not api:
        yield
        return
    get, set_ = api
    n = get()
    if n == 1:
        yield
        return
    set_(1)
    try:
        yield
    finally:
        set_(n)
