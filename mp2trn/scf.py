"""SCF step: PySCF RHF (closed shell) or UHF (open shell) by default, ROHF when asked; density-fitted by default.

An SCF that does not converge raises :class:`~mp2trn.errors.ConvergenceError`; MP2 is never computed
on top of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
from pyscf import df, dft, gto, scf

from .options import ScfOptions
from .devices import Device
from .df import describe_basis, pyscf_fitting, quiet_pyscf
from .errors import ConvergenceError, InputError, Mp2trnError, NumericalError
from .jk import DeviceJK, density_fit_jk
from .parallel import Comm
from .progress import Progress
from .scratch import check_stopped
from .threads import one_blas_pool


def scf_reference(mol: gto.Mole, choice: str | None) -> str:
    """The reference a run uses: ``choice`` ("rhf", "uhf", "rohf"), else RHF for a closed shell and UHF for
    an open one; RHF for an open shell is an InputError."""
    reference = choice or ("rhf" if mol.spin == 0 else "uhf")
    if reference == "rhf" and mol.spin != 0:
        raise InputError(f"--reference rhf needs a closed shell; this molecule has multiplicity {mol.spin + 1}: "
                         "use --reference uhf or rohf")
    return reference


def new_mean_field(mol: gto.Mole, options: ScfOptions):
    """The PySCF mean-field object: RHF/UHF/ROHF (``options.reference``, :func:`scf_reference`), or RKS/UKS
    with ``options.xc`` on grid level ``options.grid``."""
    reference = scf_reference(mol, options.reference)
    if options.xc is None:
        return {"rhf": scf.RHF, "uhf": scf.UHF, "rohf": scf.ROHF}[reference](mol)
    mf = dft.RKS(mol) if reference == "rhf" else dft.UKS(mol)
    mf.xc = options.xc
    if options.grid is not None:
        mf.grids.level = options.grid
    return mf


def run_scf(mol: gto.Mole, options: ScfOptions = ScfOptions(), max_memory: float | None = None,
            device: Device | None = None, progress: Progress | None = None, comm: Comm | None = None,
            dm0: np.ndarray | None = None, jkfit: str | dict | None = None, keep_tensor: bool = False,
            meanwhile: Callable[[], None] | None = None):
    """Run RHF (spin 0) or UHF (spin > 0), or the ``options.reference`` asked for, and return the converged
    mean-field object.

    ``max_memory`` (MB) configures PySCF's own SCF (its ``max_memory``) and bounds the device copy of the
    3-index tensor; None keeps PySCF's default. With a density-fitted SCF and ``device``, the J/K builds
    run there (``options.jk``, :mod:`mp2trn.jk`); ``scf_record(mf)`` says what ran. ``progress("scf",
    cycle, max_cycle)`` after each cycle. ``dm0``: the initial density (AO; a nearby geometry's converged
    density in the same basis), else PySCF's default guess. ``comm``: the ranks of a run spread over several — every rank
    runs the same SCF driver, and the J/K builds are shared by auxiliary rows (device J/K only). ``jkfit``: the
    JK-fit basis as PySCF takes it, resolved by ``pipeline.build_molecule`` (None: PySCF's own partner of the
    orbital basis, ``make_auxbasis``).
    ``keep_tensor``: the device J/K stage keeps the host rows of its resident tensor after the SCF (the
    gradient's response reads them, ``grad.dfmp2.scf_tensor``, and frees them); its device copy is freed.
    ``meanwhile``: called once when the device's J/K builds begin (their tensor made): host work to run while
    the device builds (the MP2 step's integrals, :class:`mp2trn.transform.EarlyIntegrals`); never called
    where the builds are PySCF's.
    Raises ConvergenceError when the SCF fails to converge.
    """
    mf = new_mean_field(mol, options)
    check_overlap(mol, options.lindep)
    if max_memory is not None:
        mf.max_memory = max_memory
    if options.density_fit:
        auxbasis = jkfit if jkfit else pyscf_fitting(mol, None, "jkfit")
        try:
            with quiet_pyscf():
                mf = mf.density_fit(auxbasis=auxbasis)
                on_device = device is not None and _use_device_jk(options.jk, device)
                if on_device:  # the device J/K builds the tensor in its own layout; check the basis now
                    mf.with_df.auxmol = df.addons.make_auxmol(mol, mf.with_df.auxbasis)
                else:
                    mf.with_df.build()
        except Mp2trnError:
            raise
        except Exception as exc:  # PySCF raises several types for a missing fitting basis
            raise InputError(f"JK-fit basis {describe_basis(auxbasis)!r} is not usable: {_first_line(exc)}") from None
        if on_device:
            density_fit_jk(mf, device=device, max_memory=mf.max_memory, comm=comm)
            mf.with_df.meanwhile = meanwhile
    mf.conv_tol = options.conv_tol
    mf.conv_tol_grad = options.conv_tol_grad   # None: PySCF takes √conv_tol
    mf.max_cycle = options.max_cycle
    mf.verbose = 0
    last: dict = {}
    mf.callback = lambda envs: _after_cycle(envs, options.max_cycle, progress, last)
    mf.conv_check = False   # its extra cycle is one more J/K build; see _canonical_orbitals
    try:
        with _orthogonalisation_threshold(options.lindep), one_blas_pool():
            mf.kernel(dm0=dm0)
            check_converged(mf)
            _canonical_orbitals(mf, last)
            mf.mp2trn_convergence = last.get("convergence")   # the converged cycle's test, for scf_record
    finally:
        if isinstance(getattr(mf, "with_df", None), DeviceJK):
            # the device copy of the tensor is not needed after the SCF; its host rows are, by the gradient's
            # response, when asked
            mf.with_df.release(keep_rows=keep_tensor)
    if not np.isfinite(mf.e_tot):
        raise NumericalError(f"the SCF energy is not finite ({mf.e_tot}); the geometry or basis is degenerate")
    return mf


#: the smallest overlap eigenvalue an SCF is run with unless --lindep is given
OVERLAP_MIN_EIGENVALUE = 1e-7


@contextlib.contextmanager
def _orthogonalisation_threshold(lindep: float | None):
    """PySCF's SCF drops overlap eigenvectors below ``scf.hf.overlap_zero_eigenvalue_threshold`` (canonical
    orthogonalisation); with --lindep that threshold is the user's for this SCF."""
    saved = scf.hf.remove_overlap_zero_eigenvalue, scf.hf.overlap_zero_eigenvalue_threshold
    if lindep is not None:
        scf.hf.remove_overlap_zero_eigenvalue, scf.hf.overlap_zero_eigenvalue_threshold = True, lindep
    try:
        yield
    finally:
        scf.hf.remove_overlap_zero_eigenvalue, scf.hf.overlap_zero_eigenvalue_threshold = saved


def check_overlap(mol: gto.Mole, lindep: float | None) -> None:
    """Refuse a (nearly) singular overlap matrix — a linearly dependent basis — unless canonical
    orthogonalisation was asked for with ``lindep``."""
    w = np.linalg.eigvalsh(mol.intor_symmetric("int1e_ovlp"))
    if lindep is None and w[0] < OVERLAP_MIN_EIGENVALUE:
        dropped = int(np.count_nonzero(w < OVERLAP_MIN_EIGENVALUE))
        raise NumericalError(
            f"the overlap matrix of the {describe_basis(mol.basis)} basis is nearly singular (smallest eigenvalue "
            f"{w[0]:.2e}, condition estimate {w[-1] / max(w[0], 1e-300):.1e}; {dropped} near-dependent "
            f"combination{'s' if dropped != 1 else ''}): the basis is linearly dependent for this geometry. Rerun "
            f"with --lindep {OVERLAP_MIN_EIGENVALUE:g} (canonical orthogonalisation drops them) or use a smaller basis")


def _after_cycle(envs: dict, max_cycle: int, progress: Progress | None, last: dict) -> None:
    check_stopped()  # a signal whose exception PySCF's code swallowed still ends the run here
    last["convergence"] = {"conv_tol": float(envs["conv_tol"]), "conv_tol_grad": float(envs["conv_tol_grad"]),
                           "energy_change": abs(float(envs["e_tot"]) - float(envs["last_hf_e"])),
                           "orbital_gradient": float(envs["norm_gorb"])}
    if envs.get("scf_conv"):   # the converged cycle's Fock matrix F(D) (no DIIS, no level shift)
        last.update(fock=envs["fock"], s1e=envs["s1e"], x_orth=envs.get("x_orth"))
    if progress is not None:
        progress("scf", envs["cycle"] + 1, max_cycle)


def _canonical_orbitals(mf, last: dict) -> None:
    """The converged SCF's orbitals and energies: eigenvectors of the converged cycle's F(D).

    PySCF's default ``conv_check`` runs one more cycle after convergence: it diagonalises that same F(D)
    for the orbitals it returns, then builds J/K once more only to recompute the energy of the new
    density and confirm convergence (with looser tolerances than the loop's own test). Here the loop's
    test (|ΔE| < conv_tol and |g| < conv_tol_grad) is final: the orbitals and orbital energies are the
    ones PySCF returns, the energy is the converged cycle's (it differs from PySCF's confirming cycle's
    by less than conv_tol), and the J/K build of that extra cycle is saved."""
    if "fock" not in last:
        return
    mo_energy, mo_coeff = mf.eig(last["fock"], last["s1e"], x=last["x_orth"])
    mf.mo_energy, mf.mo_coeff = mo_energy, mo_coeff
    mf.mo_occ = mf.get_occ(mo_energy, mo_coeff)


def _use_device_jk(choice: str, device: Device) -> bool:
    if choice == "pyscf":
        return False
    if choice == "device" and not device.has_jk:
        raise InputError(f"--scf-jk device: device {device.name!r} has no J/K stage yet (use --scf-jk pyscf, "
                         "or --device cpu/cuda)")
    return device.has_jk


def scf_record(mf, seconds: float, lindep: float | None = None) -> dict:
    """What the SCF did: where its J/K builds ran, in which precision per cycle, and how long it took."""
    with_df = getattr(mf, "with_df", None)
    if isinstance(with_df, DeviceJK):
        record = with_df.jk_record()
    else:
        record = {"jk": "pyscf (host, fp64)" if with_df is not None else "pyscf (host, conventional integrals)",
                  "device": "host", "cycles": int(getattr(mf, "cycles", 0) or 0)}
    record["seconds"] = seconds
    if getattr(mf, "mp2trn_convergence", None):
        # the converged cycle's |ΔE| and orbital-gradient norm against their thresholds: the MP2 energy is
        # not stationary in the orbitals, so its error follows the orbital gradient linearly (docs/precision.md)
        record["convergence"] = mf.mp2trn_convergence
    if isinstance(mf, dft.rks.KohnShamDFT):
        grids = mf.grids
        record["xc"] = mf.xc
        record["grid"] = {"level": int(grids.level), "points": int(len(grids.weights)) if grids.weights is not None else None}
    dropped = mf.mol.nao_nr() - int(np.shape(mf.mo_coeff)[-1])
    if dropped:
        threshold = f"--lindep {lindep:g}" if lindep is not None else \
            f"PySCF's threshold {scf.hf.overlap_zero_eigenvalue_threshold:g}"
        record["orthogonalisation"] = f"canonical ({threshold}): {dropped} basis combinations dropped"
    record["seconds_per_cycle"] = seconds / record["cycles"] if record["cycles"] else None
    return record


def scf_jkbasis(mf) -> str | None:
    """The JK-fit basis a density-fitted SCF used (None for conventional integrals)."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None or not with_df.auxbasis:
        return None
    return describe_basis(with_df.auxbasis)


def check_converged(mf) -> None:
    """Raise ConvergenceError unless ``mf`` holds a converged SCF."""
    if not getattr(mf, "converged", False):
        raise ConvergenceError(
            f"SCF did not converge in {mf.max_cycle} cycles (last energy {mf.e_tot:.10f} Eh); "
            "no MP2 computed. Try a better geometry, --conv-tol, or check charge/multiplicity"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
