"""mp2trn: density-fitted MP2 on AWS Trainium, with CPU/CUDA paths and an NKI emulator.

    import mp2trn
    res = mp2trn.run("molecules/water.xyz", basis="cc-pvdz")      # molecule → SCF → DF-MP2
    pt = mp2trn.DFMP2(mf, frozen="auto", device="cpu").run()       # on a PySCF mean-field object
    opts = mp2trn.RunOptions(basis="cc-pvtz", device="sim")        # one options object for a run
    res = mp2trn.run("molecules/benzene.xyz", opts)

The names below load their modules on first use (PEP 562), so that ``import mp2trn`` and ``mp2trn
--help`` do not pay for PySCF, SciPy or QCEngine; ``qcengine.compute(..., "mp2trn")`` works once both are
imported, in either order (:func:`mp2trn.qcengine_hook.register_when_imported`).
"""

import os as _os

from .version import __version__  # noqa: F401

# PySCF's C kernels (OpenMP) and NumPy's BLAS (its own threads) alternate in every stage; with OpenMP's
# default spin-waiting the idle OpenMP threads starve the BLAS threads for milliseconds after each C call
# (measured: water/cc-pVTZ MP2 step 35-65 ms -> 9-13 ms, for PySCF's DFMP2 as well). Set before PySCF loads
# its OpenMP runtime; a value the user set wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The same for OpenBLAS's workers (NumPy's and SciPy's pools): each spins ~2^28 cycles after a call before
# it sleeps, and shares the cores with the cpu device's J/K and pair-step threads that start right after
# PySCF's driver or a multi-threaded GEMM. 2^4 cycles makes them sleep at once (measured on Inosine/cc-pVDZ,
# docs/benchmarks.md "OpenBLAS's idle threads": whole runs 3-7 % faster in fp64, 10-12 % in fp32). OpenBLAS
# reads it when it loads, so it holds where mp2trn is imported before NumPy (the CLI, ``python -m mp2trn``);
# a value the user set wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from .errors import (  # noqa: E402
    ConvergenceError,
    DeviceUnavailableError,
    InputError,
    KernelConstraintError,
    Mp2trnError,
    ResourceError,
)

#: public name → the module that defines it (imported when the name is first used)
_LAZY = {
    "DFMP2": "dfmp2",
    "RunOptions": "options",
    "run": "pipeline",
    "interaction_energy": "interaction",
    "density_fit_jk": "jk",
    "one_blas_pool": "threads",
    "MP2Result": "result",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _register_with_qcengine() -> None:
    """``qcengine.compute(..., "mp2trn")`` works once mp2trn is imported (QCEngine has no plugin hook):
    registered now when QCEngine is already loaded, else as soon as it is."""
    from .qcengine_hook import register_when_imported

    register_when_imported()


_register_with_qcengine()

__all__ = [
    "DFMP2",
    "RunOptions",
    "run",
    "interaction_energy",
    "density_fit_jk",
    "one_blas_pool",
    "MP2Result",
    "Mp2trnError",
    "InputError",
    "ConvergenceError",
    "ResourceError",
    "DeviceUnavailableError",
    "KernelConstraintError",
]
