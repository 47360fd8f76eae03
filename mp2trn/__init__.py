"""mp2trn: density-fitted MP2 on AWS Trainium, with CPU/CUDA paths and an NKI emulator.

    import mp2trn
    res = mp2trn.run("molecules/water.xyz", basis="cc-pvdz")      # molecule → SCF → DF-MP2
    pt = mp2trn.DFMP2(mf, frozen="auto", device="cpu").run()       # on a PySCF mean-field object
"""

__version__ = "0.1.0"

from .api import DFMP2, run  # noqa: E402
from .errors import (  # noqa: E402
    ConvergenceError,
    DeviceUnavailableError,
    InputError,
    KernelConstraintError,
    Mp2trnError,
    ResourceError,
)
from .result import MP2Result  # noqa: E402

__all__ = [
    "DFMP2",
    "run",
    "MP2Result",
    "Mp2trnError",
    "InputError",
    "ConvergenceError",
    "ResourceError",
    "DeviceUnavailableError",
    "KernelConstraintError",
]
