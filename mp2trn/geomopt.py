"""Geometry optimisation: geomeTRIC (the ``geometric`` package) drives mp2trn's analytic gradient.

    opt = optimize("molecules/water.xyz", RunOptions(basis="cc-pvdz", gradient=True), convergence="gau")
    opt.converged, opt.steps[-1].energy, opt.final_xyz()

geomeTRIC (L.-P. Wang, C. Song, J. Chem. Phys. 144, 214108 (2016)) optimises in translation-rotation
internal coordinates with its convergence sets and constraints files; mp2trn supplies energies and
gradients through geomeTRIC's engine interface. Each step's SCF starts from the previous step's converged
AO density (the basis moves with the atoms, so the matrix is a close guess), which cuts SCF cycles per
step. Every finished step is appended to the trajectory (multi-frame XYZ, written atomically, the energy
and gradient in each comment line), so a killed optimisation resumes from its last finished step
(``resume=True``) without recomputing it; geomeTRIC's internal state (its Hessian model, trust radius)
restarts there, which it does not allow to be saved.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pyscf.data import nist

from .constraints import Constraint, Constraints, read_constraints
from .devices import Device
from .errors import ConvergenceError, InputError, Mp2trnError
from .files import write_text_atomic
from .options import RunOptions
from .parallel import Comm
from .result import MP2Result

BOHR = nist.BOHR   # Å per bohr (PySCF's value, which geomeTRIC is given too)

#: geomeTRIC's convergence sets, by the names its ``--converge`` option takes (lower case here)
CONVERGENCE_SETS = ("gau", "gau_loose", "gau_tight", "gau_verytight", "nwchem_loose", "turbomole",
                    "interfrag_tight")


@dataclass
class OptStep:
    """One evaluated geometry: energy (Eh), gradient (natm, 3) Eh/bohr, coordinates (natm, 3) bohr, the
    SCF cycles and wall time (s) it took (None for a step read back from a trajectory)."""

    step: int
    energy: float
    gradient: np.ndarray
    coords: np.ndarray
    scf_cycles: int | None = None
    seconds: float | None = None
    result: MP2Result | None = None

    @property
    def max_gradient(self) -> float:
        return float(np.max(np.abs(self.gradient)))

    @property
    def rms_gradient(self) -> float:
        return float(np.sqrt(np.mean(self.gradient ** 2)))


@dataclass
class Optimization:
    """The outcome: every step, whether geomeTRIC converged, the atom labels (ghosts as ``ghost-X``) and the
    constraints applied (from the constraints file, in its order)."""

    labels: list[str]
    steps: list[OptStep] = field(default_factory=list)
    converged: bool = False
    message: str = ""
    constraints: tuple[Constraint, ...] = ()

    def stated_constraints(self) -> list[str]:
        """The constraints applied, in words ('set angle H2-O1-H3 to 95°')."""
        return [c.describe(self.labels) for c in self.constraints]

    @property
    def final(self) -> OptStep:
        return self.steps[-1]

    def final_xyz(self) -> str:
        return xyz_frame(self.labels, self.final.coords, f"energy={self.final.energy:.10f} Eh (mp2trn optimize, "
                         f"{'converged' if self.converged else 'not converged'}, step {self.final.step})")


def xyz_frame(labels: list[str], coords_bohr: np.ndarray, comment: str) -> str:
    """One XYZ frame (Å); ghost atoms are written ``Gh(X)`` so mp2trn reads them back as ghosts."""
    rows = [f"{_xyz_label(l):<8s} {x:16.10f} {y:16.10f} {z:16.10f}" for l, (x, y, z) in
            zip(labels, np.asarray(coords_bohr) * BOHR)]
    return "\n".join([str(len(labels)), comment, *rows]) + "\n"


def _xyz_label(label: str) -> str:
    return f"Gh({label.split('-', 1)[1].capitalize()})" if label.lower().startswith("ghost-") else label


class Trajectory:
    """The multi-frame XYZ of every finished step; the comment line carries step, energy and gradient so
    that ``read`` can resume without recomputing."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None
        self.frames: list[str] = []
        self.labels: list[str] = []   # the atoms of the frames read

    def append(self, labels: list[str], step: OptStep) -> None:
        grad = ",".join(f"{v:.12e}" for v in np.asarray(step.gradient).ravel())
        self.frames.append(xyz_frame(labels, step.coords, f"step={step.step} energy={step.energy:.12f} "
                                                          f"gradient_eh_bohr={grad}"))
        if self.path is not None:
            write_text_atomic(self.path, "".join(self.frames))

    def read(self) -> list[OptStep]:
        """The finished steps stored in the file (empty when there is none)."""
        if self.path is None or not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        steps, k = [], 0
        while k < len(lines) and lines[k].strip():
            n = int(lines[k])
            comment = dict(part.split("=", 1) for part in lines[k + 1].split() if "=" in part)
            rows = [r.split() for r in lines[k + 2 : k + 2 + n]]
            self.labels = [r[0] for r in rows if r]
            try:
                coords = np.array([[float(v) for v in r[1:4]] for r in rows]) / BOHR
                grad = np.array([float(v) for v in comment["gradient_eh_bohr"].split(",")]).reshape(n, 3)
                steps.append(OptStep(int(comment["step"]), float(comment["energy"]), grad, coords))
            except (KeyError, ValueError, IndexError):
                raise InputError(f"{self.path} is not an mp2trn optimisation trajectory (frame {len(steps) + 1}); "
                                 "resume needs the file an earlier `mp2trn optimize --trajectory` wrote") from None
            self.frames.append("\n".join(lines[k : k + 2 + n]) + "\n")
            k += 2 + n
        return steps


class PointCalculator:
    """Energy and gradient of one molecule at any geometry on one open device; each SCF starts from the
    previous geometry's converged density (``reuse_density``)."""

    def __init__(self, source, options: RunOptions, device: Device, reuse_density: bool = True,
                 comm: Comm | None = None):
        from .pipeline import build_molecule

        self.options = RunOptions.build(options, gradient=True)
        self.molecule = build_molecule(source, self.options)
        self.device = device
        self.reuse_density = reuse_density
        self.comm = comm or Comm()
        self._dm: np.ndarray | None = None

    @property
    def labels(self) -> list[str]:
        mol = self.molecule.mol
        return [mol.atom_pure_symbol(i) for i in range(mol.natm)]   # "O", not a label such as "O1"

    @property
    def ghosts(self) -> list[int]:
        mol = self.molecule.mol
        return [i for i in range(mol.natm) if mol.atom_charge(i) == 0 and mol.atom_symbol(i).lower().startswith(("ghost", "x-"))]

    @property
    def real(self) -> list[int]:
        """The atoms geomeTRIC moves: every atom but the ghosts, which stay where they are."""
        ghosts = set(self.ghosts)
        return [i for i in range(self.molecule.mol.natm) if i not in ghosts]

    def full_coords(self, real_coords: np.ndarray) -> np.ndarray:
        """All atoms' coordinates (bohr) from those of the real atoms; ghosts keep theirs."""
        full = self.molecule.mol.atom_coords(unit="Bohr").copy()
        full[self.real] = np.asarray(real_coords).reshape(-1, 3)
        return full

    def __call__(self, coords_bohr: np.ndarray, step: int) -> OptStep:
        """The step at ``coords_bohr`` (rank 0 of several: the other ranks are told the geometry first)."""
        if self.comm.size > 1:
            self._tell(np.concatenate([[1.0], np.asarray(coords_bohr, dtype=float).ravel()]))
        return self.evaluate(coords_bohr, step)

    def _tell(self, message: np.ndarray) -> np.ndarray:
        """Rank 0's message on every rank (an all-reduce in which the other ranks add zeros)."""
        return self.comm.allreduce(message if self.comm.rank == 0 else np.zeros_like(message), "optimize")

    def stop_followers(self) -> None:
        """Rank 0: tell the other ranks that the optimisation is over."""
        if self.comm.size > 1:
            self._tell(np.zeros(1 + 3 * self.molecule.mol.natm))

    def follow(self) -> None:
        """Ranks other than 0: compute a share of every gradient rank 0 asks for, until it says stop."""
        while True:
            message = self._tell(np.zeros(1 + 3 * self.molecule.mol.natm))
            if message[0] == 0.0:
                return
            self.evaluate(message[1:].reshape(-1, 3), -1)

    def evaluate(self, coords_bohr: np.ndarray, step: int, dm0: np.ndarray | None = None) -> OptStep:
        """The point at ``coords_bohr``; its SCF starts from ``dm0`` when given (a frequency run's reference
        density), else from the previous point's density (``reuse_density``)."""
        from dataclasses import replace

        from .pipeline import compute

        t0 = time.perf_counter()
        mol = self.molecule.mol.set_geom_(np.asarray(coords_bohr).reshape(-1, 3), unit="Bohr", inplace=False)
        guess = dm0 if dm0 is not None else (self._dm if self.reuse_density else None)
        result, mf = compute(replace(self.molecule, mol=mol), self.options, self.device, dm0=guess, comm=self.comm)
        self._dm = mf.make_rdm1()
        return OptStep(step, result.e_tot, np.asarray(result.gradient), mol.atom_coords(unit="Bohr"),
                       result.scf["cycles"], time.perf_counter() - t0, result)

    @property
    def density(self) -> np.ndarray | None:
        """The converged AO density of the last point evaluated (None before the first)."""
        return self._dm

    @property
    def start_coords(self) -> np.ndarray:
        return self.molecule.mol.atom_coords(unit="Bohr")


def _engine(calc: PointCalculator, opt: Optimization, cache: list[OptStep], trajectory: Trajectory,
            report: Callable[[OptStep, OptStep | None], None] | None):
    """geomeTRIC's engine around ``calc`` over the real atoms (ghosts are held fixed outside geomeTRIC; made
    here: geomeTRIC is an optional extra)."""
    from geometric.engine import Engine
    from geometric.molecule import Molecule
    from geometric.nifty import bohr2ang

    real = calc.real
    molecule = Molecule()
    molecule.elem = [calc.labels[i] for i in real]
    molecule.xyzs = [calc.start_coords[real] * bohr2ang]   # geomeTRIC's own constant: its bohr come back exact
    molecule.build_topology()   # bonds and fragments, as a Molecule read from a file has (its IRC asks for them)

    class Mp2trnEngine(Engine):
        def calc_new(self, coords, dirname):
            full = calc.full_coords(coords)
            cached = [s for s in cache if np.allclose(s.coords, full, rtol=0.0, atol=1e-8)]
            if cached:              # a resumed step: computed before the kill
                step = cached[0]
            else:
                step = calc(full, (opt.steps[-1].step + 1) if opt.steps else 0)
                previous = opt.steps[-1] if opt.steps else None
                opt.steps.append(step)
                trajectory.append(calc.labels, step)
                if report:
                    report(step, previous)
            return {"energy": step.energy, "gradient": np.asarray(step.gradient)[real].ravel()}

    return Mp2trnEngine(molecule)


_QUIET_LOG = """[loggers]
keys=root
[handlers]
keys=file_handler
[formatters]
keys=formatter
[logger_root]
level=INFO
handlers=file_handler
[handler_file_handler]
class=geometric.nifty.RawFileHandler
level=INFO
formatter=formatter
args=(r'%(logfilename)s',)
[formatter_formatter]
format=%(message)s
"""


def require_geometric():
    try:
        import geometric  # noqa: F401
    except ImportError:
        raise InputError("geometry optimisation needs geomeTRIC: pip install 'mp2trn[optimize]' (or pip install "
                         "geometric)") from None


def optimize(source, options: RunOptions, device: Device, convergence: str = "gau", max_steps: int = 100,
             constraints: str | Path | None = None, trajectory: str | Path | None = None, resume: bool = False,
             reuse_density: bool = True,
             report: Callable[[OptStep, OptStep | None], None] | None = None,
             comm: Comm | None = None,
             announce: Callable[[list[str]], None] | None = None, transition_state: bool = False,
             irc: bool = False, initial_hessian: np.ndarray | None = None) -> Optimization | None:
    """Optimise the geometry of ``source`` with geomeTRIC on mp2trn's gradient (``options``' method, basis,
    device...). Ghost atoms stay where they are. Returns the Optimization; a run that reaches ``max_steps``
    raises ConvergenceError (the trajectory keeps every finished step).

    ``comm`` over several ranks (torchrun): rank 0 drives geomeTRIC, writes the trajectory and returns the
    Optimization; every rank computes its share of each gradient; the other ranks return None.

    ``transition_state``: a saddle-point search (geomeTRIC's ``transition``), ``irc``: the intrinsic reaction
    coordinate from a transition state (geomeTRIC's ``irc``; the steps are the path), both starting from
    ``initial_hessian`` ((3·natm)² Eh/bohr², mp2trn's, :mod:`mp2trn.hessian`).

    ``constraints``: a geomeTRIC constraints file, read strictly (:mod:`mp2trn.constraints`); ``announce``
    is given the constraints applied, in words, before the first gradient (they are also in
    ``Optimization.constraints``)."""
    require_geometric()
    comm = comm or Comm()
    convergence = convergence.lower()
    if convergence not in CONVERGENCE_SETS:
        raise InputError(f"--convergence {convergence!r}: use one of {', '.join(CONVERGENCE_SETS)}")
    if max_steps < 1:
        raise InputError(f"--max-steps must be at least 1, got {max_steps}")
    calc = PointCalculator(source, options, device, reuse_density, comm)
    _check_movable(calc, source)
    applied = _applied_constraints(calc, constraints)
    if comm.rank != 0:
        calc.follow()
        return None
    traj = Trajectory(trajectory)
    done = traj.read() if resume else []
    if resume and trajectory is None:
        raise InputError("--resume continues from the --trajectory file of the killed run: give --trajectory")
    opt = Optimization(calc.labels, constraints=applied)
    if announce is not None and applied:
        announce(opt.stated_constraints())
    cache: list[OptStep] = []
    start = calc.start_coords
    if done:
        if traj.labels != [_xyz_label(l) for l in calc.labels]:
            raise InputError(f"{trajectory} holds the atoms {' '.join(traj.labels)}, not this molecule's "
                             f"({' '.join(_xyz_label(l) for l in calc.labels)}): resume needs that run's trajectory")
        if max_steps - (len(done) - 1) < 1:
            raise InputError(f"the trajectory already holds {len(done) - 1} steps, --max-steps {max_steps}: raise "
                             "--max-steps to continue")
        opt.steps.extend(done)
        start = done[-1].coords
        cache.append(done[-1])
        calc.molecule.mol = calc.molecule.mol.set_geom_(start, unit="Bohr", inplace=False)
    elif trajectory is not None:
        traj.frames = []
    engine = _engine(calc, opt, cache, traj, report)
    from geometric.errors import GeomOptNotConvergedError
    from geometric.optimize import run_optimizer

    with tempfile.TemporaryDirectory(prefix="mp2trn-opt-") as tmp:
        log_ini = Path(tmp) / "log.ini"
        log_ini.write_text(_QUIET_LOG)
        cons = _constraints_file(Path(tmp), applied)
        kwargs: dict[str, Any] = {"customengine": engine, "input": os.path.join(tmp, "mp2trn_opt"),
                                  "prefix": os.path.join(tmp, "mp2trn_opt"), "logIni": str(log_ini),
                                  "maxiter": max_steps - max(0, len(done) - 1), "convergence_set": convergence.upper()}
        if cons is not None:
            kwargs["constraints"] = str(cons)
        kwargs.update(_saddle_point_settings(Path(tmp), transition_state, irc, initial_hessian, calc.real))
        try:
            try:
                run_optimizer(**kwargs)
            finally:
                calc.stop_followers()
        except GeomOptNotConvergedError:
            opt.message = f"not converged in {max_steps} steps"
            raise ConvergenceError(f"the geometry optimisation did not converge in {max_steps} steps ({convergence} "
                                   "criteria); every finished step is in the trajectory" +
                                   (f" ({trajectory}): continue with --resume" if trajectory else "")) from None
        except Mp2trnError:
            raise
        except Exception as exc:   # geomeTRIC's own errors (a bad constraints file, a failed step)
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            hint = f"; check the constraints file {constraints} (geomeTRIC's syntax)" if constraints else ""
            raise InputError(f"geomeTRIC stopped ({type(exc).__name__}: {text}){hint}") from None
    opt.converged = True
    opt.message = f"converged ({convergence} criteria) in {len(opt.steps)} gradient evaluations"
    return opt


def _saddle_point_settings(tmp: Path, transition_state: bool, irc: bool, hessian: np.ndarray | None,
                           real: list[int]) -> dict[str, Any]:
    """geomeTRIC's settings for a transition-state search (``transition``: its partitioned-RFO step that
    climbs along the lowest Hessian mode) or an IRC from a transition state (``irc``), both starting from
    mp2trn's Cartesian Hessian (Eh/bohr², the real atoms' block) handed over as a ``file:`` Hessian."""
    settings: dict[str, Any] = {}
    if transition_state:
        settings["transition"] = True
    if irc:
        settings["irc"] = True
    if hessian is not None:
        rows = np.array([3 * a + k for a in real for k in range(3)], dtype=int)
        path = tmp / "hessian.txt"
        np.savetxt(path, np.asarray(hessian)[np.ix_(rows, rows)])
        settings["hessian"] = f"file:{path}"
    return settings


def _check_movable(calc: PointCalculator, source) -> None:
    """Refuse a molecule with nothing to optimise: one real atom (its energy does not depend on where it is)."""
    if len(calc.real) < 2:
        what = "one atom" if not calc.ghosts else "one real atom (ghosts stay where they are)"
        raise InputError(f"{source}: {what} has no geometry to optimise; `mp2trn run` gives its energy")


def _applied_constraints(calc: PointCalculator, path: str | Path | None) -> tuple[Constraint, ...]:
    """The constraints file read strictly against the atoms geomeTRIC moves (none without a file)."""
    if path is None:
        return ()
    if calc.ghosts:
        raise InputError("--constraints with ghost atoms: geomeTRIC sees the real atoms only (ghosts stay fixed), "
                         "so atom numbers would not match the file; remove the ghosts or the constraints")
    return read_constraints(path, [calc.labels[i] for i in calc.real]).items


def _constraints_file(tmp: Path, applied: tuple[Constraint, ...]) -> Path | None:
    """geomeTRIC's constraints file, written from the constraints read (so it applies what was stated), or None."""
    if not applied:
        return None
    path = tmp / "constraints.txt"
    path.write_text(Constraints(applied).geometric_text())
    return path


__all__ = ["CONVERGENCE_SETS", "OptStep", "Optimization", "PointCalculator", "Trajectory", "optimize", "xyz_frame"]
