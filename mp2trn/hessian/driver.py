"""The Hessian by central differences of analytic gradients, its displaced points spread over ranks and
kept on disk for ``--resume``.

    H[3a+k, :] = (g(x + h e_ak) − g(x − h e_ak)) / 2h           (Eh/bohr², then symmetrised)
    ∂μ/∂x_ak  = (μ(x + h e_ak) − μ(x − h e_ak)) / 2h             (e, the relaxed MP2 dipole's derivative)

Each real atom is displaced by ±h along x, y and z (6 per atom; ghost atoms stay where they are and their
rows and columns of H are zero). The stencil is the two-point central difference, whose error is
h²/6 · ∂⁴E — about 4e-6 Eh/bohr² for h = 0.005 bohr — while the noise of the gradients (SCF converged to
``conv_tol``) enters as δg/2h; 0.005 bohr (:data:`DEFAULT_STEP`, Psi4's displacement size too) balances the
two for mp2trn's default SCF convergence. ``asymmetry`` (max |H − Hᵀ| before symmetrising) measures that
noise for every run.

Every displaced SCF starts from the reference geometry's converged density. The points are independent:
over ``N`` ranks rank r computes displacements r, r + N, ... (each on its own, one rank per gradient) and
the points are gathered at the end. With a ``store`` directory every finished point is written there
atomically as it completes, so a killed run continues (``resume``) from the points already done and never
recomputes one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..files import atomic_write, write_text_atomic
from ..parallel import Comm

#: the default displacement h (bohr) of the central differences
DEFAULT_STEP = 0.005
#: the file in a store directory that says which run its points belong to
_HEADER = "hessian_run.json"
_AXES = "xyz"


@dataclass(frozen=True)
class Displacement:
    """Atom ``atom`` moved by ``sign`` · h along Cartesian axis ``axis`` (0, 1, 2)."""

    atom: int
    axis: int
    sign: int

    @property
    def name(self) -> str:
        """The point's file name stem, e.g. ``d002y-`` (atom 2, −y)."""
        return f"d{self.atom:03d}{_AXES[self.axis]}{'+' if self.sign > 0 else '-'}"

    def coords(self, reference: np.ndarray, step: float) -> np.ndarray:
        """The displaced coordinates (natm, 3) bohr."""
        out = np.array(reference, dtype=float, copy=True)
        out[self.atom, self.axis] += self.sign * step
        return out


def displacements(atoms: Sequence[int]) -> list[Displacement]:
    """The 6·len(atoms) displacements of the central differences, atom by atom, x y z, + before −."""
    return [Displacement(a, k, s) for a in atoms for k in range(3) for s in (1, -1)]


@dataclass
class Point:
    """One evaluated geometry: energy (Eh), gradient (natm, 3) Eh/bohr, dipole (3,) e·bohr (None when the
    evaluator gives none), SCF cycles and wall time (s). ``document``: the QCSchema document of the
    reference point's result (kept in the store, so a resumed run can write its JSON); ``result``: the
    MP2Result of a point computed in this process (not stored)."""

    energy: float
    gradient: np.ndarray
    dipole: np.ndarray | None = None
    scf_cycles: int | None = None
    seconds: float | None = None
    document: dict[str, Any] | None = None
    result: Any = None

    def to_json(self) -> dict[str, Any]:
        return {"energy": self.energy, "gradient": np.asarray(self.gradient).tolist(),
                "dipole": None if self.dipole is None else np.asarray(self.dipole).tolist(),
                "scf_cycles": self.scf_cycles, "seconds": self.seconds, "document": self.document}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Point:
        dipole = data.get("dipole")
        return cls(float(data["energy"]), np.asarray(data["gradient"], dtype=float),
                   None if dipole is None else np.asarray(dipole, dtype=float), data.get("scf_cycles"),
                   data.get("seconds"), data.get("document"))


#: ``evaluate(coords (natm, 3) bohr, dm0) -> (Point, converged density)``: one gradient evaluation whose SCF
#: starts from ``dm0`` (None: the evaluator's own guess)
Evaluator = Callable[[np.ndarray, Any], tuple[Point, Any]]


class DisplacementStore:
    """A directory of finished points (``<name>.json``, each written atomically) and the reference density
    (``reference_dm.npy``), tied to one run by a header (atoms, coordinates, step, settings): a store of
    another run is refused on resume, and a fresh run refuses a directory that already holds points."""

    def __init__(self, directory: str | Path, header: dict[str, Any], resume: bool):
        self.directory = Path(directory)
        self.header = json.loads(json.dumps(header, default=str))   # as it reads back
        header_path = self.directory / _HEADER
        if resume:
            if not header_path.exists():
                raise InputError(f"--resume: {self.directory} holds no frequency run (no {_HEADER}); give the "
                                 "--displacements directory of the killed run")
            changed = header_differences(json.loads(header_path.read_text()), self.header)
            if changed:
                raise InputError(f"--resume: {self.directory} belongs to another frequency run (differs in "
                                 f"{', '.join(changed)}); resume with the same molecule and settings")
            return
        if header_path.exists():
            raise InputError(f"{self.directory} already holds a frequency run: continue it with --resume, or "
                             "give another --displacements directory")
        self.directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(header_path, json.dumps(self.header, indent=1) + "\n")

    def load(self, name: str) -> Point | None:
        path = self.directory / f"{name}.json"
        if not path.exists():
            return None
        try:
            return Point.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError) as exc:   # written atomically, so only a file edited by hand
            raise InputError(f"{path} is not a displacement record ({exc}); remove it to recompute it") from None

    def save(self, name: str, point: Point) -> None:
        write_text_atomic(self.directory / f"{name}.json", json.dumps(point.to_json()) + "\n")

    def load_density(self) -> np.ndarray | None:
        path = self.directory / "reference_dm.npy"
        return np.load(path) if path.exists() else None

    def save_density(self, dm) -> None:
        atomic_write(self.directory / "reference_dm.npy", lambda tmp: np.save(open(tmp, "wb"), np.asarray(dm)))


@dataclass
class HessianResult:
    """The finite-difference Hessian and what it took.

    hessian: (3·natm, 3·natm) Eh/bohr², symmetrised; rows and columns of ghost atoms are zero.
    dipole_derivatives: (3·natm, 3) e (∂μ_β/∂x_i, e·bohr per bohr), or None without dipoles.
    reference: the point at the reference geometry; coords: (natm, 3) bohr; moved: the displaced atoms.
    step: h (bohr); asymmetry: max |H − Hᵀ| over the moved atoms before symmetrising (Eh/bohr²).
    computed / reused: displaced points evaluated in this run / read back from the store (``resume``).
    seconds: wall time of the whole Hessian; point_seconds: the wall time of each point computed in this
    run (any rank); ranks: how many ranks shared the points.
    """

    hessian: np.ndarray
    dipole_derivatives: np.ndarray | None
    reference: Point
    coords: np.ndarray
    moved: list[int]
    step: float
    asymmetry: float
    computed: int
    reused: int
    seconds: float
    point_seconds: list[float] = field(default_factory=list)
    ranks: int = 1
    scf_cycles: list[int] = field(default_factory=list)

    @property
    def seconds_per_displacement(self) -> float | None:
        """Mean wall time (s) of one displaced gradient computed in this run."""
        return float(np.mean(self.point_seconds)) if self.point_seconds else None

    def record(self) -> dict[str, Any]:
        """What the JSON's extras say about the finite differences."""
        return {"step_bohr": self.step, "stencil": "central (2-point), Cartesian", "displaced_atoms": self.moved,
                "displacements": 6 * len(self.moved), "computed": self.computed, "reused": self.reused,
                "asymmetry_eh_bohr2": self.asymmetry, "seconds": self.seconds,
                "seconds_per_displacement": self.seconds_per_displacement, "ranks": self.ranks,
                "scf_cycles_per_displacement": self.scf_cycles}


def finite_difference_hessian(evaluate: Evaluator, coords: np.ndarray, moved: Sequence[int],
                              step: float = DEFAULT_STEP, store: DisplacementStore | None = None,
                              comm: Comm | None = None,
                              report: Callable[[Displacement, Point, int, int], None] | None = None,
                              reference: tuple[Point, Any] | None = None) -> HessianResult:
    """The Hessian at ``coords`` (natm, 3) bohr by central differences of ``evaluate``'s gradients, moving
    the atoms ``moved`` by ±``step`` bohr. Over the ranks of ``comm`` each rank evaluates its share of the
    displacements and every rank returns the same result. ``report(displacement, point, done, total)``
    after each point this rank finishes. ``reference``: the reference point and density when the caller
    has them already (else they are computed here, or read back from ``store``)."""
    comm = comm or Comm()
    if not step > 0:
        raise InputError(f"--hessian-step must be a positive number of bohr, got {step}")
    t0 = time.perf_counter()
    coords = np.asarray(coords, dtype=float).reshape(-1, 3)
    ref_point, dm_ref = reference if reference is not None else _reference(evaluate, coords, store, comm)
    todo = [d for k, d in enumerate(displacements(moved)) if k % comm.size == comm.rank]
    points: dict[str, Point] = {}
    computed: list[str] = []
    for k, disp in enumerate(todo):
        point = store.load(disp.name) if store is not None else None
        if point is None:
            point, _ = evaluate(disp.coords(coords, step), dm_ref)
            point = replace(point, result=None)    # the numbers are kept, not the densities
            computed.append(disp.name)
            if store is not None:
                store.save(disp.name, point)
        points[disp.name] = point
        if report:
            report(disp, point, k + 1, len(todo))
    everything: dict[str, Point] = {}
    counts = [0, 0]
    seconds: list[float] = []
    cycles: list[int] = []
    for rank_points, rank_computed in comm.gather((points, computed)):
        everything.update(rank_points)
        counts[0] += len(rank_computed)
        seconds += [rank_points[n].seconds for n in rank_computed if rank_points[n].seconds is not None]
        cycles += [rank_points[n].scf_cycles for n in rank_computed if rank_points[n].scf_cycles is not None]
    counts[1] = len(everything) - counts[0]
    hessian, dipole_derivatives, asymmetry = assemble(everything, coords.shape[0], moved, step)
    return HessianResult(hessian, dipole_derivatives, ref_point, coords, list(moved), step, asymmetry, counts[0],
                         counts[1], time.perf_counter() - t0, seconds, comm.size, cycles)


def _reference(evaluate: Evaluator, coords: np.ndarray, store: DisplacementStore | None,
               comm: Comm) -> tuple[Point, Any]:
    """The reference point and its density: read back from the store, else computed on rank 0 and
    handed to every rank."""
    found = None
    if comm.rank == 0:
        point = store.load("reference") if store is not None else None
        dm = store.load_density() if store is not None else None
        if point is None or dm is None:
            point, dm = evaluate(coords, None)
            if store is not None:
                store.save_density(dm)
                store.save("reference", point)
        light = None if point.result is None else replace(point.result, densities=None)   # no AO densities
        found = (replace(point, result=light), np.asarray(dm))
    shared = comm.gather(found)[0]
    return (point, shared[1]) if comm.rank == 0 else shared


def assemble(points: dict[str, Point], natm: int, moved: Sequence[int], step: float
             ) -> tuple[np.ndarray, np.ndarray | None, float]:
    """Hessian (3·natm, 3·natm) Eh/bohr² (symmetrised), dipole derivatives (3·natm, 3) or None, and the
    asymmetry max |H − Hᵀ| over the moved atoms, from the displaced points."""
    n = 3 * natm
    hessian = np.zeros((n, n))
    with_dipoles = all(p.dipole is not None for p in points.values())
    dipole_derivatives = np.zeros((n, 3)) if with_dipoles else None
    for atom in moved:
        for axis in range(3):
            plus = points[Displacement(atom, axis, 1).name]
            minus = points[Displacement(atom, axis, -1).name]
            row = 3 * atom + axis
            hessian[row] = (np.asarray(plus.gradient) - np.asarray(minus.gradient)).ravel() / (2 * step)
            if dipole_derivatives is not None:
                dipole_derivatives[row] = (plus.dipole - minus.dipole) / (2 * step)
    rows = np.array([3 * a + k for a in moved for k in range(3)], dtype=int)
    block = hessian[np.ix_(rows, rows)]
    asymmetry = float(np.max(np.abs(block - block.T))) if rows.size else 0.0
    symmetric = np.zeros_like(hessian)
    symmetric[np.ix_(rows, rows)] = (block + block.T) / 2   # ghost rows and columns stay zero
    return symmetric, dipole_derivatives, asymmetry


def mp2_evaluator(calc) -> Evaluator:
    """The evaluator of a :class:`mp2trn.geomopt.PointCalculator`: mp2trn's energy, analytic gradient and
    relaxed MP2 dipole at a geometry, the SCF started from the given density."""

    def evaluate(coords: np.ndarray, dm0) -> tuple[Point, Any]:
        step = calc.evaluate(coords, -1, dm0=dm0)
        dipole = np.asarray(step.result.dipoles["mp2_relaxed"])
        # the reference evaluation (no density handed in) keeps its whole document for the JSON
        document = _plain(step.result.to_qcschema()) if dm0 is None else None
        return Point(step.energy, np.asarray(step.gradient), dipole, step.scf_cycles, step.seconds, document,
                     step.result), calc.density

    return evaluate


def _plain(document: dict[str, Any]) -> dict[str, Any]:
    """The document as JSON types (as it reads back from a store)."""
    from ..files import _json_default

    return json.loads(json.dumps(document, default=_json_default))


def header_differences(stored: dict[str, Any], header: dict[str, Any]) -> list[str]:
    """The names in which two store headers differ (empty: the same run). A setting one header lacks counts
    as "None", the value of a setting left unset: a store written before a setting existed still resumes a
    run that leaves it unset, and one that sets it is refused."""
    changed = sorted(k for k in set(stored) | set(header) if k != "settings" and stored.get(k) != header.get(k))
    mine, theirs = stored.get("settings", {}), header.get("settings", {})
    changed += sorted(f"settings.{k}" for k in set(mine) | set(theirs)
                      if mine.get(k, "None") != theirs.get(k, "None"))
    return changed


def store_header(labels: Sequence[str], coords: np.ndarray, step: float, settings: dict[str, Any]) -> dict[str, Any]:
    """The header that ties a store directory to one run: atoms, coordinates (bohr, to 1e-10), step and
    the run settings that change a gradient."""
    return {"atoms": list(labels), "coords_bohr": np.round(np.asarray(coords, dtype=float), 10).ravel().tolist(),
            "step_bohr": step, "settings": settings}


__all__ = ["DEFAULT_STEP", "Displacement", "DisplacementStore", "HessianResult", "Point", "assemble",
           "displacements", "finite_difference_hessian", "header_differences", "mp2_evaluator", "store_header"]
