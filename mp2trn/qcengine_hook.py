"""Register mp2trn as a QCEngine program as soon as QCEngine is imported, without importing it here.

QCEngine has no plugin entry point, so mp2trn registers its harness itself (:func:`mp2trn.qcschema.register`).
Importing QCEngine costs ~0.3–0.6 s, which ``mp2trn --help`` and every run would otherwise pay; instead a
finder on ``sys.meta_path`` waits for ``import qcengine`` (by anyone, before or after mp2trn) and registers
right after that module has loaded. If QCEngine is already loaded, registration happens at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings


def _register() -> None:
    from .qcschema import register

    try:
        register()
    except Exception as exc:  # a broken QCEngine install must not break mp2trn itself
        warnings.warn(f"mp2trn could not register with QCEngine: {exc}", stacklevel=2)


class _RegisterAfterLoad(importlib.abc.Loader):
    """QCEngine's own loader, then the registration."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _register()


class _QcengineFinder(importlib.abc.MetaPathFinder):
    """Finds ``qcengine`` through the other finders and wraps its loader; removes itself after one use."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "qcengine":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _RegisterAfterLoad(spec.loader)
        return spec


def register_when_imported() -> None:
    """Register now if QCEngine is loaded, else when it is imported."""
    if "qcengine" in sys.modules:
        _register()
    elif not any(isinstance(f, _QcengineFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _QcengineFinder())
