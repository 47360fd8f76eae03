"""The one exception hierarchy of mp2trn.

Every error a user can cause (bad input, an SCF that does not converge, too little memory, a device that
is not installed, a kernel that breaks a Trainium rule) is a subclass of :class:`Mp2trnError`. The CLI
prints ``str(err)`` on one line and exits with ``err.exit_code``.
"""

from __future__ import annotations


class Mp2trnError(Exception):
    """Base class of all mp2trn errors."""

    exit_code: int = 1


class InputError(Mp2trnError, ValueError):
    """Malformed XYZ, unknown element or basis, impossible charge/multiplicity, bad option."""

    exit_code = 2


class ConvergenceError(Mp2trnError):
    """The SCF did not converge; no MP2 is computed on top of it."""

    exit_code = 3


class ResourceError(Mp2trnError, MemoryError):
    """The memory budget (``--memory``) is too small for the smallest block of work."""

    exit_code = 4


class DeviceUnavailableError(Mp2trnError):
    """The requested device/backend is not installed or not present. Never silently replaced."""

    exit_code = 5


class KernelConstraintError(Mp2trnError):
    """A kernel launch broke a hardware rule (tile limits, SBUF/PSUM capacity, dtype rules)."""

    exit_code = 6


class NumericalError(Mp2trnError):
    """The input is well-formed but numerically degenerate: a (nearly) singular overlap or Coulomb metric
    (linearly dependent basis or auxiliary functions), a failed Cholesky, non-finite energies."""

    exit_code = 7


class RankFailed(Mp2trnError):
    """Another rank of a run spread over several ranks failed: its one-line message and exit code, which
    every rank then exits with (see :mod:`mp2trn.parallel`)."""

    def __init__(self, rank: int | None, message: str, exit_code: int):
        super().__init__(message if rank is None else f"rank {rank}: {message}")
        self.rank = rank
        self.exit_code = exit_code


class Terminated(BaseException):
    """The run was stopped by a signal (SIGTERM, SIGHUP; SIGINT is Python's KeyboardInterrupt): scratch is
    removed, nothing is written. A BaseException, as KeyboardInterrupt is, so that no ``except Exception``
    on the way (ours or PySCF's) swallows it."""

    def __init__(self, signum: int, name: str):
        super().__init__(f"stopped by {name}: nothing written, scratch removed")
        self.exit_code = 128 + signum
