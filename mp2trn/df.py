"""Density-fitting integrals: the MP2 auxiliary basis, the Coulomb metric and its Cholesky factor, and
3-index AO integrals (P|μν) generated in blocks of auxiliary shells that fit the memory budget.

The fitting bases arrive resolved (``pipeline.build_molecule`` and ``DFMP2`` resolve them by the rules of
:mod:`mp2trn.basis`, once); this module only builds with them. The MP2 aux basis is always explicit: a
caller that hands none gets PySCF's ``make_auxbasis(mol, mp2fit=True)`` (cc-pVXZ-RI, def2-XXX-RI, ...),
never silently the JK-fit basis of the SCF.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
from pyscf import df, gto, lib
from scipy.linalg import blas as scipy_blas

from .basis import BasisSet
from .errors import InputError, NumericalError
from .memory import prefaulted_empty
from .overlap import made_ahead
from .packed import nao_of_pairs
from .threads import one_blas_pool
from .parallel import Comm, balanced_counts, weighted_split


@contextlib.contextmanager
def quiet_pyscf():
    """Silence PySCF's printed hints and warnings about missing basis sets: we raise one clear line."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def pyscf_fitting(mol: gto.Mole, chosen: BasisSet | None, role: str) -> str | dict:
    """A fitting basis resolved by :mod:`mp2trn.basis` as PySCF takes it; where the rules had nothing to go on
    (``chosen`` None: the orbital basis was given as shells) PySCF's own ``make_auxbasis`` for ``role``
    ("jkfit" or "rifit")."""
    if chosen is not None:
        return chosen.pyscf_basis()
    return df.make_auxbasis(mol, mp2fit=role == "rifit")


def describe_basis(basis: str | dict) -> str:
    """A short printable name: 'cc-pvdz-ri', or 'O:cc-pvdz-ri, H:cc-pvdz-ri' when per element; basis data
    (shells) shows as 'custom'."""
    if isinstance(basis, dict):
        named = {k: (v if isinstance(v, str) else "custom") for k, v in basis.items()}
        names = sorted(set(named.values()))
        return names[0] if len(names) == 1 else ", ".join(f"{k}:{v}" for k, v in sorted(named.items()))
    return str(basis)


@dataclass
class DFIntegrals:
    """Auxiliary molecule, metric Cholesky factor L (J = L Lᵀ, fp64) and an AO-block generator."""

    mol: gto.Mole
    auxmol: gto.Mole
    auxbasis: str | dict
    l_chol: np.ndarray  # (naux, naux) lower triangular
    #: the 3-index integrals (P|μν) of every fitting function, as :meth:`ao_blocks` made them into it (packed
    #: (naux, nao(nao+1)/2) or (naux, nao, nao)), kept by the energy of a gradient run for the gradient's RI
    #: pass, which takes them instead of computing them again (:func:`mp2trn.grad.ri.ri_pass`); None: not kept
    rows: np.ndarray | None = field(default=None, repr=False)

    @property
    def naux(self) -> int:
        return self.auxmol.nao_nr()

    @property
    def max_aux_shell(self) -> int:
        """Functions in the largest auxiliary shell (the smallest possible AO block)."""
        return largest_shell(self.auxmol)

    def block_count(self, max_functions: int, shells: tuple[int, int] | None = None) -> int:
        """How many blocks ``ao_blocks(max_functions, shells=shells)`` yields."""
        return len(self.shell_ranges(max_functions, shells))

    def ao_blocks(self, max_functions: int, packed: bool = False, shells: tuple[int, int] | None = None,
                  buffers: int = 1, into: np.ndarray | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
        """Yield (p0, p1, (P|μν)) over aux shells (all, or the range ``shells``), ≤ max_functions each.

        The block is (p1−p0, nao, nao), or (p1−p0, nao(nao+1)/2) with μ ≥ ν packed when ``packed``. The
        blocks are written into ``buffers`` reused buffers in turn: a block is valid until ``buffers`` more
        are asked for (2 for blocks made ahead, :mod:`mp2trn.overlap`). ``into``: rows of every fitting
        function (:meth:`keep_rows`' array) that each block is written into instead, where it stays.
        """
        loc = self.auxmol.ao_loc_nr()
        ranges = self.shell_ranges(max_functions, shells)
        if into is not None:
            for s0, s1 in ranges:
                yield self.ao_block(s0, s1, packed, out=into[int(loc[s0]) : int(loc[s1])].reshape(-1))
            return
        bufs = [reused_buffer(ranges, loc, self.per_aux(packed)) for _ in range(max(1, buffers))]
        for k, (s0, s1) in enumerate(ranges):
            yield self.ao_block(s0, s1, packed, out=bufs[k % len(bufs)])

    def keep_rows(self, packed: bool) -> np.ndarray:
        """:attr:`rows`, made for every fitting function (in pages made ahead) for :meth:`ao_blocks` to fill."""
        nao = self.mol.nao_nr()
        self.rows = prefaulted_empty((self.naux, self.per_aux(True)) if packed else (self.naux, nao, nao))
        return self.rows

    @staticmethod
    def rows_mb(nao: int, naux: int, packed: bool) -> float:
        """MB of :meth:`keep_rows`' array."""
        return naux * (nao * (nao + 1) // 2 if packed else nao * nao) * 8 / 1e6

    @functools.cached_property
    def joined(self) -> gto.Mole:
        """The orbital molecule's shells, then the fitting basis' (what the 3-index integrals are asked of)."""
        return self.mol + self.auxmol

    def shell_ranges(self, max_functions: int, shells: tuple[int, int] | None = None) -> list[tuple[int, int]]:
        """The fitting shells of :meth:`ao_blocks`' blocks, [s0, s1) each."""
        return list(_shell_ranges(self.auxmol.ao_loc_nr(), max_functions, *(shells or ())))

    def per_aux(self, packed: bool) -> int:
        """Elements of a block per fitting function: nao(nao+1)/2 packed, nao² unpacked."""
        nao = self.mol.nao_nr()
        return nao * (nao + 1) // 2 if packed else nao * nao

    def ao_block(self, s0: int, s1: int, packed: bool, out: np.ndarray | None = None) -> tuple[int, int, np.ndarray]:
        """(p0, p1, (P|μν)) for the fitting shells [s0, s1): (p, nao, nao), or (p, nao(nao+1)/2) with μ ≥ ν
        packed; in ``out`` (a flat fp64 buffer of at least that size) when given, else a new array."""
        loc = self.auxmol.ao_loc_nr()
        pmol, nbas = self.joined, self.mol.nbas
        p0, p1 = int(loc[s0]), int(loc[s1])
        if not packed:   # μ ≥ ν computed and unpacked into the buffer (half the integrals of all pairs)
            return p0, p1, unpacked_integrals(pmol, nbas, s0, s1, out=out)
        ints = pmol.intor("int3c2e", aosym="s2ij", shls_slice=(0, nbas, 0, nbas, nbas + s0, nbas + s1), out=out)
        # PySCF returns (npair, p) in Fortran order, i.e. (p, npair) in C order
        return p0, p1, ints.T


def unpacked_integrals(pmol: gto.Mole, nbas: int, s0: int, s1: int, out: np.ndarray | None = None) -> np.ndarray:
    """(P|μν) for the fitting shells [s0, s1) of ``pmol`` (the orbital molecule's ``nbas`` shells first, then
    the fitting basis') as (p, nao, nao), C-contiguous, in ``out`` (a buffer of at least p·nao² fp64) when
    given: computed for μ ≥ ν only (``s2ij``, about half of libcint's work for all ordered pairs, ``s1``)
    and unpacked, a quarter of the block's functions (at most 64, at least one shell) per libcint call, so
    that the packed integrals beside the block stay an eighth of it (up to a quarter where one shell holds
    more than a quarter of the block's functions). A one-shell block is computed ``s1``, straight into place."""
    loc = pmol.ao_loc_nr()
    nao = int(loc[nbas])
    aux_loc = loc[nbas:] - nao
    p0, p1 = int(aux_loc[s0]), int(aux_loc[s1])
    size = (p1 - p0) * nao * nao
    block = (np.empty(size) if out is None else out.reshape(-1)[:size]).reshape(p1 - p0, nao, nao)
    if s1 - s0 == 1:
        ints = pmol.intor("int3c2e", aosym="s1", shls_slice=(0, nbas, 0, nbas, nbas + s0, nbas + s1),
                          out=block)
        return ints.T                      # (nao, nao, p) in Fortran order: (p, nao, nao) in C order, in block
    for t0, t1 in _shell_ranges(aux_loc, max(1, min(64, (p1 - p0) // 4)), s0, s1):
        packed = pmol.intor("int3c2e", aosym="s2ij", shls_slice=(0, nbas, 0, nbas, nbas + t0, nbas + t1))
        # (npair, q) in Fortran order: (q, npair) rows in C order
        lib.unpack_tril(packed.T, out=block[aux_loc[t0] - p0 : aux_loc[t1] - p0])
    return block


def tensor_rows_unpacked(rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Rows of a 3-index tensor as (p, nao, nao): packed ones ((p, nao(nao+1)/2), μ ≥ ν) unpacked (into
    ``out``, a buffer of at least p·nao² fp64, when given), unpacked ones as they are."""
    if rows.ndim != 2:
        return rows
    if out is None:
        return lib.unpack_tril(rows)
    p, nao = rows.shape[0], nao_of_pairs(rows.shape[1])
    return lib.unpack_tril(rows, out=out[: p * nao * nao].reshape(p, nao, nao))


def reused_buffer(ranges: list[tuple[int, int]], loc: np.ndarray, per_row: int) -> np.ndarray:
    """One fp64 buffer for the largest of ``ranges`` (shell ranges over ``loc``) at ``per_row`` elements a
    function, faulted in once: a fresh array per block costs its first touch every time (the MP2 step's
    five integral blocks of Vitamin C/cc-pVTZ: 1.11–1.18 s in new arrays, 0.95–1.00 s in one reused buffer
    made for them, ``python scripts/bench_scf_costs.py --only blocks``)."""
    rows = max((int(loc[b] - loc[a]) for a, b in ranges), default=0)
    return prefaulted_empty((rows * per_row,))


def largest_shell(mol: gto.Mole) -> int:
    """Functions in the largest shell of ``mol``."""
    return int(np.max(np.diff(mol.ao_loc_nr())))


def make_auxmol(mol: gto.Mole, auxbasis: str | dict | None) -> tuple[gto.Mole, str | dict]:
    """The auxiliary molecule for the MP2-fit basis as resolved (None: PySCF's RI partner of the orbital
    basis); a basis PySCF cannot build for this molecule is an InputError."""
    aux = auxbasis if auxbasis else pyscf_fitting(mol, None, "rifit")
    try:
        with quiet_pyscf():
            auxmol = df.addons.make_auxmol(mol, aux)
    except Exception as exc:  # PySCF raises KeyError/RuntimeError/BasisNotFoundError variously
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"auxiliary basis {describe_basis(aux)!r} is not usable for this molecule: {text}") from None
    if auxmol.nao_nr() == 0:
        raise InputError(f"auxiliary basis {describe_basis(aux)!r} has no functions for this molecule")
    have = {auxmol.bas_atom(i) for i in range(auxmol.nbas)}
    missing = sorted({mol.atom_symbol(i) for i in range(mol.natm) if i not in have})
    if missing:
        raise InputError(f"auxiliary basis {describe_basis(aux)!r} has no functions for {', '.join(missing)}")
    return auxmol, aux


def build_df(mol: gto.Mole, auxbasis: str | dict | None = None) -> DFIntegrals:
    """Make the aux molecule and the Cholesky factor of its Coulomb metric (P|Q)."""
    auxmol, aux = make_auxmol(mol, auxbasis)
    return DFIntegrals(mol, auxmol, aux, metric_cholesky(auxmol, aux))


def metric_cholesky(auxmol: gto.Mole, aux: str | dict) -> np.ndarray:
    """The lower Cholesky factor L of the Coulomb metric (P|Q) = L Lᵀ of the fitting basis ``aux``;
    NumericalError when the metric is not positive definite."""
    metric = auxmol.intor("int2c2e", hermi=1)
    try:
        l_chol = np.linalg.cholesky(metric)  # lower; NumPy's BLAS, whose threads the later GEMMs reuse
    except np.linalg.LinAlgError:
        w = np.linalg.eigvalsh(metric)
        raise NumericalError(
            f"the Coulomb metric of aux basis {describe_basis(aux)!r} is not positive definite (smallest "
            f"eigenvalue {w[0]:.2e}, condition estimate {abs(w[-1] / w[0]) if w[0] else float('inf'):.1e}): "
            "linearly dependent auxiliary functions (atoms very close, or a very diffuse fitting basis); "
            "choose another --auxbasis"
        ) from None
    return l_chol


def _shell_ranges(ao_loc: np.ndarray, max_functions: int, first: int = 0,
                  last: int | None = None) -> Iterator[tuple[int, int]]:
    """Consecutive shell ranges of shells ``first:last`` holding ≤ max_functions each (≥ one shell)."""
    nshell = len(ao_loc) - 1 if last is None else last
    s0 = first
    while s0 < nshell:
        s1 = s0 + 1
        while s1 < nshell and ao_loc[s1 + 1] - ao_loc[s0] <= max_functions:
            s1 += 1
        yield s0, s1
        s0 = s1


def _metric_factor(auxmol: gto.Mole) -> np.ndarray | None:
    """Lower Cholesky factor of the metric (P|Q) in Fortran order, or None when it is not positive definite."""
    try:
        return np.asfortranarray(scipy.linalg.cholesky(auxmol.intor("int2c2e", hermi=1), lower=True))
    except (np.linalg.LinAlgError, scipy.linalg.LinAlgError):
        return None


def _solved_rows(mol: gto.Mole, auxmol: gto.Mole, low: np.ndarray, shells: tuple[int, int],
                 chunk_mb: float, buffers: int = 1) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (m0, m1, X) over row chunks μ ∈ [m0, m1) of the orbital shells ``shells``: X (naux, npair) is
    L⁻¹ (Q|μν) for the pairs ν ≤ μ of those rows, in the row-major order of the lower triangle. The X are
    written into ``buffers`` reused buffers in turn: one is valid until ``buffers`` more are asked for."""
    nao, naux, nbas = mol.nao_nr(), auxmol.nao_nr(), mol.nbas
    pmol = mol + auxmol
    ao_loc = mol.ao_loc_nr()
    rows_per_chunk = max(1, int(chunk_mb * 1e6 / (8 * naux * nao)))
    ranges = list(_shell_ranges(ao_loc, rows_per_chunk, *shells))
    bufs = [reused_buffer(ranges, ao_loc, naux * nao) for _ in range(max(1, buffers))]  # a row μ: ≤ nao pairs ν ≤ μ
    for k, (s0, s1) in enumerate(ranges):
        # (npair, naux) in Fortran order: pairs μ ∈ [m0, m1), ν ≤ μ
        ints = pmol.intor("int3c2e", aosym="s2ij", shls_slice=(s0, s1, 0, s1, nbas, nbas + auxmol.nbas),
                          out=bufs[k % len(bufs)])
        # X Lᵀ = (Q|μν)ᵀ solved in place: X is the block of B, pairs by row (SciPy's trsm: its BLAS
        # pool on the cores, see mp2trn.threads)
        with one_blas_pool("scipy"):
            x = scipy_blas.dtrsm(1.0, low, ints, side=1, lower=1, trans_a=1, overwrite_b=1)
        yield int(ao_loc[s0]), int(ao_loc[s1]), x.T


def cholesky_tensor(mol: gto.Mole, auxmol: gto.Mole, chunk_mb: float = 256.0,
                    packed: bool = False) -> np.ndarray | None:
    """The SCF's density-fitted 3-index tensor: B[P, μ, ν] = Σ_Q (L⁻¹)_PQ (Q|μν), fp64.

    Dimensions: naux = auxmol.nao_nr(), nao = mol.nao_nr(). Returns (naux, nao, nao) C-contiguous, each
    B_P symmetric — or with ``packed`` (naux, nao(nao+1)/2), the lower triangle μ ≥ ν row by row (PySCF's
    ``pack_tril`` order), half the memory; None when the metric (P|Q) = L Lᵀ is not positive definite (then
    PySCF's own build, which drops linearly dependent combinations, is the right one).

    The same tensor as PySCF's ``df.incore.cholesky_eri`` (its rows, unpacked unless ``packed``), built
    straight into the layout the J/K builds read: (Q|μν) for μ ≥ ν in row blocks of μ (≈ ``chunk_mb``
    each), one triangular solve per block; unpacked, each row μ is written into B[:, μ, :μ+1] and the upper
    triangles are filled per P; packed, each block is already a contiguous run of pair columns.
    """
    low = _metric_factor(auxmol)
    if low is None:
        return None
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    out = prefaulted_empty((naux, nao * (nao + 1) // 2) if packed else (naux, nao, nao))
    for m0, m1, x in _solved_rows(mol, auxmol, low, (0, mol.nbas), chunk_mb):
        if packed:
            p0 = m0 * (m0 + 1) // 2
            out[:, p0 : p0 + x.shape[1]] = x
            continue
        off = 0
        for mu in range(m0, m1):
            out[:, mu, : mu + 1] = x[:, off : off + mu + 1]
            off += mu + 1
    if not packed:
        for b in out:
            lib.hermi_triu(b, inplace=True)
    return out


class TensorFile:
    """The packed SCF tensor (naux, nao(nao+1)/2), fp64, row-major in an unnamed file of the run's scratch
    directory, for J/K builds that stream it: rows [p0, p1) are one contiguous stretch, read with one
    ``preadv`` into a fresh array (the read releases the GIL, so a reader thread overlaps it with a build).
    Written once by :meth:`build` — column chunks of :func:`_solved_rows`, each aux row's stretch written
    at its offset — and closed (the file vanishes) by :meth:`close`."""

    def __init__(self, handle, naux: int, npair: int):
        self._handle, self.naux, self.npair = handle, naux, npair

    @classmethod
    def build(cls, mol: gto.Mole, auxmol: gto.Mole, chunk_mb: float) -> "TensorFile | None":
        """Write the tensor; None when the metric is not positive definite (PySCF's build handles that)."""
        import tempfile

        low = _metric_factor(auxmol)
        if low is None:
            return None
        nao, naux = mol.nao_nr(), auxmol.nao_nr()
        npair = nao * (nao + 1) // 2
        handle = tempfile.TemporaryFile(prefix="mp2trn-scf-tensor-")
        fd = handle.fileno()
        os.ftruncate(fd, naux * npair * 8)
        # the next chunk's integrals and solve are made while this one is written (the writes release the
        # GIL and use no core's arithmetic): two chunks alive, each half the chunk asked for
        chunks = _solved_rows(mol, auxmol, low, (0, mol.nbas), chunk_mb / 2, buffers=2)
        for m0, _m1, x in made_ahead(chunks, name="mp2trn-scf-tensor"):
            col = m0 * (m0 + 1) // 2
            for row in range(naux):
                _write_all(fd, x[row], (row * npair + col) * 8)
        return cls(handle, naux, npair)

    def rows(self, p0: int, p1: int) -> np.ndarray:
        """Rows [p0, p1) as a new (p1 - p0, npair) fp64 array."""
        out = np.empty((p1 - p0, self.npair))
        view, offset = memoryview(out).cast("B"), p0 * self.npair * 8
        done = 0
        while done < len(view):
            n = os.preadv(self._handle.fileno(), [view[done:]], offset + done)
            if n <= 0:
                raise OSError(f"short read of the SCF tensor file at byte {offset + done}")
            done += n
        return out

    def close(self) -> None:
        self._handle.close()


def _write_all(fd: int, row: np.ndarray, offset: int) -> None:
    view = memoryview(np.ascontiguousarray(row)).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def cholesky_tensor_share(mol: gto.Mole, auxmol: gto.Mole, comm: Comm, chunk_mb: float = 256.0,
                          packed: bool = False) -> np.ndarray | None:
    """This rank's auxiliary rows of :func:`cholesky_tensor` when the SCF is spread over ranks:
    (naux_r, nao, nao) — or (naux_r, nao(nao+1)/2) with ``packed`` — for rows ``balanced_counts(naux,
    size)``; None when the metric is not positive definite.

    Each rank solves the pair columns of its share of the orbital shells (shares of equal pair count), then
    an all-to-all turns pair columns into auxiliary rows: no rank ever holds the whole tensor.
    """
    low = _metric_factor(auxmol)
    if low is None:
        return None
    ao_loc = mol.ao_loc_nr()
    pairs_per_shell = [sum(mu + 1 for mu in range(ao_loc[s], ao_loc[s + 1])) for s in range(mol.nbas)]
    shells = weighted_split(pairs_per_shell, comm.size)
    cols = [int(sum(pairs_per_shell[a:b])) for a, b in shells]
    mine = np.empty((auxmol.nao_nr(), cols[comm.rank]))
    off = 0
    for _, _, x in _solved_rows(mol, auxmol, low, shells[comm.rank], chunk_mb):
        mine[:, off : off + x.shape[1]] = x
        off += x.shape[1]
    rows = comm.cols_to_rows(mine, balanced_counts(auxmol.nao_nr(), comm.size), cols, "scf_tensor")
    del mine
    return rows if packed else lib.unpack_tril(rows)
