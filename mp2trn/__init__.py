"""mp2trn: density-fitted MP2 on AWS Trainium, with CPU/CUDA paths and an NKI emulator.

    import mp2trn
    res = mp2trn.run("molecules/water.xyz", basis="cc-pvdz")      # molecule → SCF → DF-MP2
    pt = mp2trn.DFMP2(mf, frozen="auto", device="cpu").run()       # on a PySCF mean-field object
    opts = mp2trn.RunOptions(basis="cc-pvtz", device="sim")        # one options object for a run
    res = mp2trn.run("molecules/benzene.xyz", opts)
"""

import os as _os

from .version import __version__  # noqa: E402,F401

# PySCF's C kernels (OpenMP) and NumPy's BLAS (its own threads) alternate in every stage; with OpenMP's
# default spin-waiting the idle OpenMP threads starve the BLAS threads for milliseconds after each C call
# (measured: water/cc-pVTZ MP2 step 35-65 ms -> 9-13 ms, for PySCF's DFMP2 as well). Set before PySCF loads
# its OpenMP runtime; a value the user set wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .dfmp2 import DFMP2  # noqa: E402
from .errors import (  # noqa: E402
    ConvergenceError,
    DeviceUnavailableError,
    InputError,
    KernelConstraintError,
    Mp2trnError,
    ResourceError,
)
from .interaction import interaction_energy  # noqa: E402
from .jk import density_fit_jk  # noqa: E402
from .options import RunOptions  # noqa: E402
from .pipeline import run  # noqa: E402
from .result import MP2Result  # noqa: E402
from .threads import one_blas_pool  # noqa: E402



def _register_with_qcengine() -> None:
    """``qcengine.compute(..., "mp2trn")`` works once mp2trn is imported (QCEngine has no plugin hook)."""
    import importlib.util

    if importlib.util.find_spec("qcengine") is None:
        return
    from .qcschema import register

    try:
        register()
    except Exception as exc:  # a broken QCEngine install must not break mp2trn itself
        import warnings

        warnings.warn(f"mp2trn could not register with QCEngine: {exc}", stacklevel=2)


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
