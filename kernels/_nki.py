"""The one place kernels get ``nki``, ``nl`` and ``nisa`` from.

    from ._nki import nki, nl, nisa, ncc

(``ncc`` is ``nki.collectives``) binds the real NKI (Neuron SDK >= 2.29, NKI 0.3.0) when one is installed — it must import *and* expose
``nki.jit`` and ``nki.simulate`` (PyPI's placeholder ``nki`` raises on import) — and the built-in emulator
``mp2trn.nkiemu`` otherwise. Kernel source is identical either way.

``MP2TRN_NKI=emulator`` forces the emulator; ``MP2TRN_NKI=real`` requires the real NKI and raises
:class:`RealNkiUnavailableError` (an ImportError) if it is absent. ``NKI_IMPL`` is ``"real"`` or
``"emulator"``; :func:`describe` returns one line for ``mp2trn info``.
"""

from __future__ import annotations

import importlib
import os

__all__ = ["nki", "nl", "nisa", "ncc", "NKI_IMPL", "describe", "RealNkiUnavailableError"]

ENV = "MP2TRN_NKI"


class RealNkiUnavailableError(ImportError):
    """MP2TRN_NKI=real but no working NKI 0.3.0 is importable."""


def _try_real():
    """(nki, nl, nisa, ncc, None) from a genuine NKI, or (None, None, None, None, reason)."""
    try:
        mod = importlib.import_module("nki")
    except Exception as e:  # the PyPI placeholder raises on import; anything else also means "no"
        return None, None, None, None, f"import nki failed: {type(e).__name__}: {e}"
    if getattr(mod, "__nkiemu__", False):
        return None, None, None, None, "'nki' in sys.modules is the mp2trn emulator"
    if not (callable(getattr(mod, "jit", None)) and callable(getattr(mod, "simulate", None))):
        return None, None, None, None, "the installed 'nki' has no jit/simulate (placeholder or too old, need >= 0.3.0)"
    try:
        lang = importlib.import_module("nki.language")
        isa = importlib.import_module("nki.isa")
        coll = importlib.import_module("nki.collectives")
    except Exception as e:
        return None, None, None, None, f"import nki.language/isa/collectives failed: {type(e).__name__}: {e}"
    return mod, lang, isa, coll, None


def _bind():
    want = os.environ.get(ENV, "").strip().lower()
    if want not in ("", "auto", "real", "emulator", "emu", "sim"):
        raise ValueError(f"{ENV}={want!r}: use 'real', 'emulator' or leave it unset")
    reason = None
    if want not in ("emulator", "emu", "sim"):
        real, lang, isa, coll, reason = _try_real()
        if real is not None:
            return real, lang, isa, coll, "real", None
        if want == "real":
            raise RealNkiUnavailableError(
                f"{ENV}=real but no real NKI 0.3.0 is available ({reason}); install the Neuron SDK >= 2.29 "
                "(pip install nki from the AWS Neuron package index) or unset MP2TRN_NKI")
    else:
        reason = f"forced by {ENV}={want}"
    import mp2trn.nkiemu as emu
    import mp2trn.nkiemu.collectives as emu_coll
    import mp2trn.nkiemu.isa as emu_isa
    import mp2trn.nkiemu.language as emu_lang
    return emu, emu_lang, emu_isa, emu_coll, "emulator", reason


nki, nl, nisa, ncc, NKI_IMPL, _REASON = _bind()


def describe() -> str:
    """One line saying which NKI is active (used by ``mp2trn info``)."""
    if NKI_IMPL == "real":
        ver = getattr(nki, "__version__", "unknown version")
        return f"NKI: real ({ver}) from {getattr(nki, '__file__', '?')}"
    from mp2trn.nkiemu.targets import current_target
    t = current_target()
    return (f"NKI: emulator mp2trn.nkiemu (NKI {nki.__version__} API, cost model; target {t.name}/{t.core})"
            + (f" - {_REASON}" if _REASON else ""))
