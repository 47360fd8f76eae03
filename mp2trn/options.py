"""One options object for a whole run: :class:`RunOptions`, validated once when it is built.

Everything a run needs to know — basis sets, charge and multiplicity, units, frozen orbitals, SCF
settings, device, precision, Trainium target and the memory budget — lives here. The Python API
(``mp2trn.run``, ``interaction_energy``), the validation and benchmark drivers and every CLI command
build one and hand it to :mod:`mp2trn.pipeline`; nothing else carries these settings.

Error messages name the CLI flag (``--memory``, ``--frozen-core``, ...), which is also the keyword's
meaning in Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Integral
from dataclasses import dataclass, field, fields, replace
from typing import Any, Union

from .devices import Device
from .errors import InputError
from .methods import get_method

#: where the SCF's J/K builds run: "auto" (the run's device when it has a J/K stage, else PySCF's host
#: code, and the result says which), "device" (the run's device, an error if it has none), "pyscf"
JK_CHOICES = ("auto", "device", "pyscf")
#: the SCF references a run can ask for (``--reference``); None picks RHF or UHF by the multiplicity
REFERENCES = ("rhf", "uhf", "rohf")


#: why gradients (and optimisations, frequencies: everything built on them) refuse --lindep
LINDEP_GRADIENT = (
    "canonical orthogonalisation drops overlap eigenvectors that move with the atoms, "
    "and mp2trn's gradient leaves out the derivative of that projection, so it would not be the derivative of the "
    "energy; gradients and optimisations need a basis without near-linear dependencies (--lindep is for energies)")


@dataclass(frozen=True)
class ScfOptions:
    """How to run the SCF (the SCF's share of :class:`RunOptions`). The JK-fit basis is not a setting here:
    ``pipeline.build_molecule`` resolves it from ``RunOptions.jkbasis`` and hands it to ``scf.run_scf``."""

    density_fit: bool = True
    conv_tol: float = 1e-10
    conv_tol_grad: float | None = None   # orbital-gradient threshold; None: PySCF's √conv_tol
    max_cycle: int = 100
    jk: str = "auto"
    lindep: float | None = None  # canonical orthogonalisation threshold (None: refuse a singular overlap)
    xc: str | None = None   # a Kohn-Sham SCF with this functional (PySCF XC syntax); None: Hartree-Fock
    grid: int | None = None  # PySCF's DFT grid level (None: its default)
    reference: str | None = None  # "rhf", "uhf" or "rohf"; None: RHF for closed shells, UHF for open ones


#: Frozen orbitals as given by a user: None/"none", "auto", a count N (lowest N per spin), or orbital
#: indices (one list, or one list per spin for UHF).
Frozen = Union[None, str, int, Sequence[int], Sequence[Sequence[int]]]

#: Trainium generations whose rules the NKI devices enforce
TARGETS = ("trn1", "trn2")
UNITS = ("angstrom", "bohr")
#: devices that take a Trainium ``target``
_NKI_DEVICES = ("sim", "neuron")


def parse_frozen(value: Frozen) -> Frozen:
    """Normalise a frozen-orbital choice: None (nothing frozen), "auto", an int ≥ 0, or index lists.

    Strings are read as the CLI's ``--frozen-core`` (``auto``, ``none`` or a number); whether N orbitals
    can be frozen depends on the molecule and is checked in :mod:`mp2trn.orbitals`.
    """
    if value is None:
        return None
    if isinstance(value, str):
        key = value.strip().lower()
        if key == "none":
            return None
        if key == "auto":
            return "auto"
        try:
            value = int(key)
        except ValueError:
            raise InputError(f"--frozen-core {value!r}: use auto, none or a number of orbitals") from None
    if isinstance(value, bool):
        raise InputError(f"--frozen-core {value!r}: use auto, none or a number of orbitals")
    if isinstance(value, Integral):
        n = int(value)
        if n < 0:
            raise InputError(f"--frozen-core {str(value)!r}: must not be negative")
        return n
    items = list(value)
    if items and not isinstance(items[0], Integral):
        return tuple(tuple(int(i) for i in spin) for spin in items)
    return tuple(int(i) for i in items)


@dataclass(frozen=True)
class RunOptions:
    """All settings of one run (immutable; checked in ``__post_init__``).

    method: ``mp2``, ``scs-mp2``, ``sos-mp2`` or a double hybrid (:mod:`mp2trn.methods`); grid: the DFT grid
    level of a double hybrid (PySCF's ``grids.level``, 0–9; None: PySCF's default, 3).
    basis / auxbasis: orbital basis and MP2 fitting basis — names (PySCF library or Basis Set Exchange),
    files, or 'El:name, ...' per element (None auxbasis: the fitting rules of :mod:`mp2trn.basis`).
    ecp: None/"auto" (the basis's own ECPs), "none", or an ECP/basis name or file. cartesian: None (the
    basis's convention), True (Cartesian functions) or False (spherical).
    charge / multiplicity: None → the XYZ comment line, else neutral and lowest spin.
    reference: the SCF determinant — "rhf", "uhf" or "rohf" (ROHF-MBPT(2): semicanonical ROHF orbitals and
    the singles energy); None: RHF for closed shells, UHF for open shells.
    unit: "angstrom" or "bohr". frozen: see :data:`Frozen` (normalised by :func:`parse_frozen`).
    scf_df, conv_tol, conv_tol_grad (None: √conv_tol), max_cycle: the SCF (:class:`~mp2trn.scf.ScfOptions`);
    jkbasis: its JK-fit basis (None: the rules of :mod:`mp2trn.basis`); scf_jk: where its
    J/K builds run — "auto" (the device when it has a J/K stage, else PySCF's), "device" or "pyscf";
    lindep: canonical orthogonalisation threshold for a linearly dependent basis (None: refuse one).
    device: "cpu", "cuda", "sim", "neuron", "auto" or a Device object; precision: None → the device's
    default; target: Trainium generation for sim/neuron (None → the device default).
    max_memory: budget in MB (None → ``PYSCF_MAX_MEMORY``, else 60 % of the available RAM).
    scratch: directory for the run's temporary files (None → ``$TMPDIR``; see :mod:`mp2trn.scratch`).
    device_options: further keyword arguments of the device's constructor (e.g. ``blocks``).
    distributed: None — spread the molecule over the ranks of a torchrun launch or of an initialised
    torch.distributed process group (one rank: this process alone); False — this process alone, whatever
    the launch (``mp2trn batch`` gives each rank whole molecules); True — as None, and one rank is an error.
    gradient: also the analytic nuclear gradient of the method's energy, the relaxed MP2 density, its dipole
    and natural orbitals (:mod:`mp2trn.grad`; mp2, scs-mp2, sos-mp2 on a density-fitted SCF, one rank).
    hessian: also the Hessian by central differences of those gradients, the harmonic frequencies, IR
    intensities and thermochemistry (:mod:`mp2trn.hessian`); hessian_step: its displacement (bohr).
    """

    basis: str | dict = "cc-pvdz"
    auxbasis: str | dict | None = None
    method: str = "mp2"
    ecp: str | None = None
    cartesian: bool | None = None
    grid: int | None = None
    charge: int | None = None
    multiplicity: int | None = None
    reference: str | None = None
    unit: str = "angstrom"
    frozen: Frozen = None
    scf_df: bool = True
    jkbasis: str | None = None
    conv_tol: float = 1e-10
    conv_tol_grad: float | None = None
    max_cycle: int = 100
    scf_jk: str = "auto"
    lindep: float | None = None
    device: Any = "cpu"
    precision: str | None = None
    target: str | None = None
    max_memory: float | None = None
    scratch: str | None = None
    device_options: Mapping[str, Any] = field(default_factory=dict)
    distributed: bool | None = None
    gradient: bool = False
    hessian: bool = False
    hessian_step: float = 0.005

    def __post_init__(self) -> None:
        if not isinstance(self.device, (str, Device)):
            raise InputError(f"--device must be a device name or a Device object, got {type(self.device).__name__}")
        if self.max_memory is not None and not self.max_memory > 0:
            raise InputError(f"--memory must be a positive number of MB, got {self.max_memory}")
        if not self.conv_tol > 0:
            raise InputError(f"--conv-tol must be positive, got {self.conv_tol}")
        if self.conv_tol_grad is not None and not self.conv_tol_grad > 0:
            raise InputError(f"--conv-tol-grad must be positive, got {self.conv_tol_grad}")
        if self.max_cycle < 1:
            raise InputError(f"--scf-max-cycle must be at least 1, got {self.max_cycle}")
        if self.lindep is not None and not 0 < self.lindep < 1e-2:
            raise InputError(f"--lindep must be between 0 and 1e-2, got {self.lindep}")
        if self.scf_jk not in JK_CHOICES:
            raise InputError(f"--scf-jk {self.scf_jk!r}: use {', '.join(JK_CHOICES)}")
        object.__setattr__(self, "method", get_method(self.method).name)
        if self.grid is not None and not (isinstance(self.grid, int) and 0 <= self.grid <= 9):
            raise InputError(f"--grid must be a PySCF grid level 0-9, got {self.grid!r}")
        if self.grid is not None and not get_method(self.method).double_hybrid:
            raise InputError(f"--grid applies to double-hybrid methods only (not {self.method})")
        if get_method(self.method).double_hybrid and not self.scf_df:
            raise InputError(f"{self.method}: double hybrids run a density-fitted Kohn-Sham SCF; drop --no-scf-df")
        if self.gradient and get_method(self.method).double_hybrid:
            raise InputError(f"--gradient: analytic gradients cover mp2, scs-mp2 and sos-mp2; {self.method} "
                             "(a double hybrid) is not supported yet")
        if self.reference is not None:
            reference = str(self.reference).strip().lower()
            if reference not in REFERENCES:
                raise InputError(f"--reference {self.reference!r}: use {', '.join(REFERENCES)}")
            object.__setattr__(self, "reference", reference)
            if reference == "rohf" and get_method(self.method).double_hybrid:
                raise InputError(f"--reference rohf: {self.method} (a double hybrid) runs on RKS/UKS orbitals; "
                                 "use --reference uhf or drop --reference")
        if self.gradient and not self.scf_df:
            raise InputError("--gradient differentiates the density-fitted SCF mp2trn runs by default; drop --no-scf-df")
        if self.gradient and self.lindep is not None:
            raise InputError(f"--lindep with a gradient: {LINDEP_GRADIENT}")
        if self.hessian and get_method(self.method).double_hybrid:
            raise InputError(f"--freq/hessian: the Hessian differentiates the analytic gradient of mp2, scs-mp2 and "
                             f"sos-mp2; {self.method} (a double hybrid) has none yet")
        if not 0 < self.hessian_step <= 0.1:
            raise InputError(f"--hessian-step must be between 0 and 0.1 bohr, got {self.hessian_step}")
        if self.ecp is not None and not str(self.ecp).strip():
            raise InputError("--ecp needs a name: auto, none, or an ECP/basis name or file")
        unit = str(self.unit).lower()
        if unit not in UNITS:
            raise InputError(f"unknown unit {self.unit!r}: use angstrom or bohr")
        object.__setattr__(self, "unit", unit)
        object.__setattr__(self, "frozen", parse_frozen(self.frozen))
        object.__setattr__(self, "device_options", dict(self.device_options or {}))
        if self.target is not None:
            if self.device_name.split(":")[0] not in _NKI_DEVICES:
                raise InputError("--target applies to --device sim or neuron only")
            if str(self.target).lower() not in TARGETS:
                raise InputError(f"unknown Trainium target {self.target!r}: use trn1 or trn2")
            object.__setattr__(self, "target", str(self.target).lower())

    @classmethod
    def build(cls, options: RunOptions | None = None, **changes: Any) -> RunOptions:
        """``options`` with ``changes`` applied (or new options from ``changes``); unknown names are errors."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InputError(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        return cls(**changes) if options is None else replace(options, **changes)

    @property
    def device_name(self) -> str:
        """The device asked for, by name (a Device object's own name)."""
        return self.device if isinstance(self.device, str) else self.device.name

    @property
    def scf(self) -> ScfOptions:
        """The SCF's share of the options."""
        return ScfOptions(density_fit=self.scf_df, conv_tol=self.conv_tol, conv_tol_grad=self.conv_tol_grad,
                          max_cycle=self.max_cycle, jk=self.scf_jk, lindep=self.lindep,
                          xc=get_method(self.method).xc, grid=self.grid, reference=self.reference)

    def device_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the device constructor (the target, then ``device_options``)."""
        kwargs = dict(self.device_options)
        if self.target is not None:
            kwargs["target"] = self.target
        return kwargs


#: the defaults, for CLI help and documentation (one place for each default)
DEFAULTS = RunOptions()
