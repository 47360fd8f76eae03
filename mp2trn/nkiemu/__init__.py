"""mp2trn.nkiemu — an emulator of NKI 0.3.0 (AWS Neuron Kernel Interface) in NumPy.

Mirrors the real module tree, so a kernel written for NKI 0.3.0 runs unchanged::

    import mp2trn.nkiemu as nki
    import mp2trn.nkiemu.language as nl
    import mp2trn.nkiemu.isa as nisa

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        ...
        return out

    c = add(a_np, b_np)                             # or nki.simulate(add)(a_np, b_np)
    c = nki.simulate(add, target="trn1")(a_np, b_np)
    add.last_report.table()                         # cost MODEL of the last launch
    with nki.profile() as prof:                     # aggregate many launches
        ...
    prof.report.priced_for("trn1").to_dict()

Beyond the official CPU simulator it enforces SBUF/PSUM capacity per generation and prices every
instruction with a per-engine cost model (:mod:`.cost`). It is a library of its own: no MP2 code here.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
import warnings

import numpy as np

from . import cost as _cost
from ._blas import single_threaded as _single_threaded
from . import isa  # noqa: F401
from . import collectives  # noqa: F401
from . import language  # noqa: F401
from . import runtime as _rt
from .frontend import check_kernel as _check_language
from . import typing  # noqa: F401
from .cost import CostParams, CostReport, Profile, set_cost_params, default_params  # noqa: F401
from .errors import (NkiCapacityError, NkiError, NkiRemovedAPIError, NkiRuleError,  # noqa: F401
                     NkiSpillWarning, NkiUnsupportedError)
from .memory import spill_analysis
from .targets import TARGETS, current_target, get_target, set_default_target, target  # noqa: F401
from .tensor import NkiTensor, wrap_input, SHARED_HBM, PRIVATE_HBM

__all__ = ["jit", "simulate", "profile", "last_report", "target", "set_default_target", "current_target",
           "CostReport", "CostParams", "set_cost_params", "NkiError", "NkiRuleError", "NkiCapacityError",
           "NkiRemovedAPIError", "NkiUnsupportedError", "NkiTensor", "language", "isa", "collectives", "typing", "as_nki",
           "__nkiemu__"]

__version__ = "0.3.0"          # the NKI version emulated
__nkiemu__ = True              # marker: this is the emulator, not the real nki
EMULATOR_VERSION = "0.1.0"

_last = [None]
_profiles: list = []


#: strict capacity mode by default? (False: SBUF overflow spills, as the compiler does, and warns)
_strict_default = [False]


def set_strict(strict: bool) -> bool:
    """Make strict SBUF capacity (refuse instead of spilling) the default for launches; returns the old value."""
    old, _strict_default[0] = _strict_default[0], bool(strict)
    return old


class JitKernel:
    """A ``@nki.jit`` kernel. Call it with NumPy arrays; ``kernel[2](...)`` launches an LNC=2 grid."""

    def __init__(self, func, grid=None, parent=None, target=None, strict=None):
        self.func = func
        self.grid = grid
        self._parent = parent
        self._target = target
        self._strict = strict
        self.last_report = None
        functools.update_wrapper(self, func)

    def __getitem__(self, grid):
        if isinstance(grid, tuple):
            if len(grid) != 1:
                raise NkiRuleError("lnc.grid", "kernel[...]", f"the launch grid holds exactly one number, got {grid}")
            grid = grid[0]
        if not isinstance(grid, (int, np.integer)) or isinstance(grid, bool):
            raise NkiRuleError("lnc.grid", "kernel[...]", f"the launch grid must be an int, got {grid!r}")
        return JitKernel(self.func, int(grid), parent=self, target=self._target, strict=self._strict)

    def __call__(self, *args, **kwargs):
        return _launch(self, args, kwargs, self._target, self._strict)

    def _set_report(self, rep):
        k = self
        while k is not None:
            k.last_report = rep
            k = k._parent

    def __repr__(self):
        g = f"[{self.grid}]" if self.grid else ""
        return f"<nkiemu kernel {self.func.__name__}{g}>"


def jit(func=None, mode="auto", **kwargs):
    """``@nki.jit`` or ``@nki.jit()``. ``mode=`` is ignored (deprecated in 0.3.0); ``platform_target=``
    is rejected (select the generation with ``NEURON_PLATFORM_TARGET_OVERRIDE`` or ``nkiemu.target``)."""
    if "platform_target" in kwargs:
        raise NkiRemovedAPIError("removed_api.jit.platform_target", "nki.jit",
                                 "platform_target= was removed in NKI 0.3.0; set NEURON_PLATFORM_TARGET_OVERRIDE "
                                 "(trn1/gen2, trn2/gen3, trn3/gen4) or use mp2trn.nkiemu.target(...)")
    if func is None:
        return lambda f: jit(f, mode=mode, **kwargs)
    if isinstance(func, JitKernel):
        return func
    return JitKernel(func)


def simulate(kernel, target=None, strict=None):
    """``nki.simulate(kernel)(*numpy_arrays)`` -> NumPy results. ``target=`` ("trn1", "trn2", "trn3")
    selects the generation for this call (an emulator extension; the real API uses the env var).
    ``strict=True`` refuses SBUF overflow instead of modelling the compiler's spills (emulator extension;
    None: :func:`set_strict`'s default, False unless changed)."""
    if not isinstance(kernel, JitKernel):
        kernel = JitKernel(kernel)

    def run(*args, **kwargs):
        return _launch(kernel, args, kwargs, target, strict)

    functools.update_wrapper(run, kernel.func)
    run.kernel = kernel
    return run


def last_report():
    """Cost report of the most recent kernel launch (any kernel), or None."""
    return _last[0]


@contextlib.contextmanager
def profile(target=None, params=None):
    """Collect every launch inside the block: ``prof.report`` aggregates them (per-kernel breakdown,
    launch count); ``prof.report.priced_for("trn1")`` re-prices the same launches."""
    prof = Profile(target, params)
    _profiles.append(prof)
    try:
        yield prof
    finally:
        _profiles.remove(prof)


def _wrap_arg(a, buffer, written):
    if isinstance(a, np.ndarray):
        t = wrap_input(a, buffer)
        written.append(t._alloc)
        return t
    if isinstance(a, list):
        raise NkiRuleError("jit.list_argument", "nki.jit",
                           "kernel arguments cannot be lists (the NKI compiler rejects them); pass a tuple")
    return a


def _unwrap(out, inst):
    if isinstance(out, NkiTensor):
        if out.buffer is not SHARED_HBM:
            raise NkiRuleError("jit.output_buffer", inst,
                               f"returned tensors must be allocated with buffer=nl.shared_hbm "
                               f"(this one is {out.buffer.value})", {"output": out.shape})
        return np.array(out._data)
    if isinstance(out, (tuple, list)):
        return tuple(_unwrap(o, inst) for o in out)
    return out


def _launch(kernel: JitKernel, args, kwargs, target_name, strict=None):
    T = get_target(target_name) if target_name is not None else current_target()
    grid = kernel.grid or 1
    name = kernel.func.__name__
    if grid < 1 or grid > 2:
        raise NkiRuleError("lnc.grid", f"{name}[{grid}]", f"logical NeuronCore grids are 1 or 2, got {grid}")
    if grid == 2 and T.gen < 3:
        raise NkiRuleError("lnc.grid", f"{name}[{grid}]", f"LNC=2 needs trn2 or newer (target {T.name})")
    if _rt._current[0] is not None:
        raise NkiRuleError("jit.nested", name,
                           "a @nki.jit kernel was called inside another kernel; sub-kernels must not carry @nki.jit")
    _check_language(kernel.func)  # what the 0.3.0 front end rejects, before anything runs
    buffer = SHARED_HBM if grid > 1 else PRIVATE_HBM
    inputs = []
    wargs = [_wrap_arg(a, buffer, inputs) for a in args]
    wkw = {k: _wrap_arg(v, buffer, inputs) for k, v in kwargs.items()}
    strict = _strict_default[0] if strict is None else bool(strict)
    launch = _rt.Launch(T, name, grid, strict=strict)
    prev = _rt.set_current(launch)
    t0 = time.perf_counter()
    try:
        with _single_threaded():
            out = None
            for pid in range(grid):
                launch.set_program(pid)
                o = kernel.func(*wargs, **wkw)
                if pid == 0:
                    out = o
            result = _unwrap(out, name)
    finally:
        _rt.set_current(prev)
    wall = time.perf_counter() - t0
    for a in inputs:
        if a.written and a.orig is not None:
            a.orig[...] = a.base
    spills = [spill_analysis(m, launch.records, pid) for pid, m in enumerate(launch.mems)]
    pspills = [spill_analysis(m, launch.records, pid, psum=True) for pid, m in enumerate(launch.mems)]
    worst, pworst = max(spills, key=lambda s: s.peak), max(pspills, key=lambda s: s.peak)
    _warn_spills(name, f"SBUF peaks at {worst.peak} B/partition", worst, spills,
                 f"available on {T.name}; the compiler would spill to HBM", "DMA")
    _warn_spills(name, f"PSUM peaks at {pworst.peak} banks", pworst, pspills,
                 "banks; the compiler would spill accumulators to SBUF", "Vector Engine copies")
    trace = _cost.LaunchTrace(name, T.name, launch.records, grid, worst.peak,
                              min(pworst.peak, T.psum_banks) if pworst.peak else max(m.psum_peak_banks for m in launch.mems),
                              wall, sum(s.save_bytes for s in spills), sum(s.reload_bytes for s in spills),
                              sum(s.spill_events for s in spills),
                              psum_spill_bytes=sum(s.save_bytes + s.reload_bytes for s in pspills),
                              psum_spill_events=sum(s.spill_events for s in pspills),
                              spill_transfers=sorted((*x, pid) for pid, s in enumerate(spills) for x in s.transfers))
    rep = CostReport([trace], T)
    kernel._set_report(rep)
    _last[0] = rep
    for p in _profiles:
        p.launches.append(trace)
    return result


def _warn_spills(kernel: str, peak: str, worst, results, where: str, priced_as: str) -> None:
    """One NkiSpillWarning for a memory (SBUF or PSUM) whose live data overflowed in this launch."""
    if not worst.over:
        return
    warnings.warn(NkiSpillWarning(
        f"kernel {kernel}: live {peak}, {worst.over} over the {worst.capacity} {where}: "
        f"{sum(s.save_bytes for s in results)} B saved, {sum(s.reload_bytes for s in results)} B reloaded "
        f"(spill_save_bytes/spill_reload_bytes; priced as {priced_as} in the cost model); tiles spilled: "
        f"{', '.join(worst.spilled[:6]) or '-'}"), stacklevel=4)


@contextlib.contextmanager
def as_nki():
    """Temporarily register the emulator as ``nki``/``nki.language``/``nki.isa``/``nki.typing`` in
    ``sys.modules`` (like nki-library's simulation harness), e.g. to import unmodified kernel files
    that do ``import nki``. Modules imported inside the block keep their bindings afterwards."""
    names = {"nki": sys.modules[__name__], "nki.language": language, "nki.isa": isa, "nki.typing": typing,
             "nki.collectives": collectives}
    saved = {k: sys.modules.get(k) for k in names}
    sys.modules.update(names)
    try:
        yield sys.modules[__name__]
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
