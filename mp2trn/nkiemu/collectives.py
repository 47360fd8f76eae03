"""``nki.collectives``: collective communication between emulated NeuronCores.

The API is that of NKI 0.3.0 (aws-neuron-sdk at Neuron 2.29, ``nki/api/nki/collectives/__init__.py``):
``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``all_to_all_v``,
``collective_permute``, ``rank_id`` and :class:`ReplicaGroup`. (The ring-implicit variants
``collective_permute_implicit*`` return runtime registers and are not emulated: they raise
:class:`NkiUnsupportedError`.)

Ranks are processes. Each runs the same kernel (SPMD) and reaches the same collective instructions in
the same order; the data travels over a *fabric* that stands in for NeuronLink/EFA. A fabric is any
object with ``rank``, ``size`` and ``exchange(sends) -> received``, where ``sends`` maps a destination
rank to a 1-D ``uint8`` array and ``received`` maps each source rank to what it sent this rank (every
rank calls ``exchange`` once per collective instruction). Attach one with :func:`use_fabric`; without
one the emulator is a world of one rank. mp2trn's torch.distributed fabric is in ``mp2trn.parallel``.

Rules enforced (each from the docs; rule names in docs/emulator.md):

* ``srcs``/``dsts`` are lists of tensors of equal length; all in HBM or all in SBUF; several tensors
  (coalesced) only in HBM (stub docstrings of all_reduce/all_gather/reduce_scatter);
* ``all_to_all``, ``all_to_all_v`` and ``collective_permute``: HBM only; ``collective_permute`` and
  ``all_to_all_v`` take exactly one tensor each;
* ``collective_dim``: 0 for HBM tensors (all_gather on 2-D SBUF tensors: 0 or 1);
* ``op``: ``nl.add``, ``nl.minimum`` or ``nl.maximum``;
* ``all_to_all_v``: a ``uint32`` metadata tensor of shape (2-4, group size), counts and displacements in
  elements; row 2 (receive counts) when ``recv_counts_known``, row 3 (receive displacements) when
  ``has_rdispls``;
* ``collective_permute``: the source-target pairs form rings ("Currently, only circular permute patterns
  are supported", neuron-runtime/about/collectives.rst, Permute Operation);
* replica groups: lists of ranks that do not overlap; the calling rank must be in one of them.

Cost MODEL: a collective is one record on the ``cc`` engine (the collective-communication cores of
collectives.rst, "System Connectivity"), priced as a fixed latency plus the bytes this rank sends over
its share of the inter-chip links (:mod:`.targets`, ``link_bw``; :class:`.cost.CostParams`,
``collective_latency_s``).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from . import runtime as _rt
from .errors import NkiRuleError, NkiUnsupportedError
from .tensor import HBM_REGIONS, SBUF, NkiTensor

__all__ = ["ReplicaGroup", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v",
           "collective_permute", "collective_permute_implicit", "collective_permute_implicit_reduce",
           "collective_permute_implicit_current_processing_rank_id", "rank_id", "use_fabric", "Fabric",
           "LocalFabric", "current_fabric"]


class Fabric(Protocol):
    """What connects the emulated NeuronCores of several processes (see the module docstring)."""

    rank: int
    size: int

    def exchange(self, sends: dict[int, np.ndarray]) -> dict[int, np.ndarray]: ...


class LocalFabric:
    """A world of one rank: every collective is local."""

    rank, size = 0, 1

    def exchange(self, sends: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        return {0: sends[0]} if 0 in sends else {}


_fabric: list[Any] = [LocalFabric()]


def current_fabric():
    return _fabric[-1]


class use_fabric:
    """``with use_fabric(f): ...`` — collectives inside the block travel over ``f``."""

    def __init__(self, fabric):
        self.fabric = fabric

    def __enter__(self):
        _fabric.append(self.fabric)
        return self.fabric

    def __exit__(self, *exc):
        _fabric.remove(self.fabric)
        return False


class ReplicaGroup:
    """Groups of ranks that take part in a collective: ``ReplicaGroup([[0, 1, 2, 3]])`` or several
    non-overlapping sub-groups ``ReplicaGroup([[0, 1], [2, 3]])``."""

    def __init__(self, groups):
        groups = [list(g) for g in groups]
        flat = [r for g in groups for r in g]
        if not groups or any(not g for g in groups):
            raise NkiRuleError("collectives.replica_group", "ReplicaGroup", "a replica group needs non-empty rank lists")
        if len(set(flat)) != len(flat):
            raise NkiRuleError("collectives.replica_group", "ReplicaGroup",
                               f"sub-groups must not overlap: {groups}")
        self.groups = groups

    def members(self, rank: int, inst: str) -> list[int]:
        for g in self.groups:
            if rank in g:
                return g
        raise NkiRuleError("collectives.replica_group", inst, f"rank {rank} is in no sub-group of {self.groups}")

    def __repr__(self):
        return f"ReplicaGroup({self.groups})"


def rank_id() -> int:
    """This rank's id in the fabric."""
    return current_fabric().rank


# -- checks ---------------------------------------------------------------------------------------------

def _tensors(inst: str, srcs, dsts, hbm_only: bool, single: bool) -> list[tuple[NkiTensor, NkiTensor]]:
    if not isinstance(srcs, (list, tuple)) or not isinstance(dsts, (list, tuple)):
        raise NkiRuleError("collectives.lists", inst, "srcs and dsts are lists of tensors")
    if len(srcs) != len(dsts) or not srcs:
        raise NkiRuleError("collectives.lists", inst, f"{len(srcs)} sources for {len(dsts)} destinations")
    for t in (*srcs, *dsts):
        if not isinstance(t, NkiTensor):
            raise NkiRuleError("collectives.lists", inst, f"expected tensors, got {type(t).__name__}")
    if single and len(srcs) != 1:
        raise NkiRuleError("collectives.coalesced", inst, "takes exactly one source and one destination tensor")
    spaces = {"hbm" if t.buffer in HBM_REGIONS else t.buffer.value for t in (*srcs, *dsts)}
    if hbm_only and spaces != {"hbm"}:
        raise NkiRuleError("collectives.hbm_only", inst, "tensors must reside on HBM (SBUF is not supported)")
    if spaces - {"hbm", "sbuf"}:
        raise NkiRuleError("collectives.memory", inst, "collective tensors live in HBM or SBUF, never PSUM")
    if len(spaces) > 1:
        raise NkiRuleError("collectives.memory", inst, "all tensors must be on HBM or all on SBUF, not mixed")
    if len(srcs) > 1 and spaces != {"hbm"}:
        raise NkiRuleError("collectives.coalesced", inst, "several tensors (coalesced) only when they are on HBM")
    for s, d in zip(srcs, dsts):
        if s.dtype != d.dtype:
            raise NkiRuleError("collectives.dtype", inst, f"source {s.dtype} and destination {d.dtype} differ")
    if _rt.current().num_programs > 1:
        raise NkiUnsupportedError(f"{inst}: the emulator does not model collectives inside an LNC=2 grid")
    return list(zip(srcs, dsts))


def _dim(inst: str, t: NkiTensor, dim: int, sbuf_dims=(0,)) -> None:
    allowed = sbuf_dims if t.buffer is SBUF else (0,)
    if dim not in allowed:
        raise NkiRuleError("collectives.collective_dim", inst,
                           f"collective_dim {dim} is not supported here (allowed: {allowed})", {"tensor": t.shape})
    if t.buffer is SBUF and t.ndim != 2:
        raise NkiRuleError("collectives.collective_dim", inst, "SBUF collectives operate on 2-D tensors")


def _reduce_fn(inst: str, op):
    from . import language as nl

    table = {nl.add: np.add, nl.minimum: np.minimum, nl.maximum: np.maximum}
    if op not in table:
        raise NkiRuleError("collectives.op", inst, f"op must be nl.add, nl.minimum or nl.maximum, got {op!r}")
    return table[op]


def _shape_rule(inst: str, ok: bool, detail: str, **shapes) -> None:
    if not ok:
        raise NkiRuleError("collectives.shape", inst, detail, shapes)


# -- data movement -----------------------------------------------------------------------------------------

def _raw(t: NkiTensor) -> np.ndarray:
    return np.ascontiguousarray(t._data).reshape(-1).view(np.uint8)


def _store(dst: NkiTensor, flat: np.ndarray, start: int = 0) -> None:
    """Write the elements ``flat`` (dst's dtype) into dst from element ``start`` (row-major)."""
    d = np.ascontiguousarray(dst._data).reshape(-1)
    d[start : start + flat.size] = flat
    dst._data[...] = d.reshape(dst.shape)
    dst._alloc.written = True


def _swap(inst: str, sends: dict[int, np.ndarray], reads, writes) -> dict[int, np.ndarray]:
    """One fabric exchange, recorded for the cost model (bytes this rank sends to other ranks)."""
    fabric = current_fabric()
    me = fabric.rank
    for p in sends:
        if not 0 <= p < fabric.size:
            raise NkiRuleError("collectives.rank", inst, f"rank {p} is outside the world of {fabric.size} ranks")
    got = fabric.exchange(sends)
    nbytes = sum(int(v.size) for p, v in sends.items() if p != me)
    _rt.current().record("cc", inst, ("cc", nbytes), tuple(reads), tuple(writes))
    return got


def _slices(g: int):
    """payload(src, j): the bytes of slice j of ``src`` split ``g`` ways along dim 0."""
    def piece(s, j):
        rows = s.shape[0] // g
        return np.ascontiguousarray(s._data[j * rows : (j + 1) * rows]).reshape(-1).view(np.uint8)
    return piece


def _reduced(parts: list[np.ndarray], fn) -> np.ndarray:
    """``fn`` over the ranks' parts in group order (the same result on every rank)."""
    acc = parts[0].copy()
    for x in parts[1:]:
        acc = fn(acc, x)
    return acc


def _group_exchange(inst, pairs, group, payload) -> list[dict[int, np.ndarray]]:
    """Every member sends ``payload(src, member index)`` of each tensor to each member; returns per tensor
    {source rank: bytes}."""
    me = current_fabric().rank
    members = group.members(me, inst)
    sends = {}
    sizes = []
    for p_idx, p in enumerate(members):
        chunks = [payload(s, p_idx) for s, _ in pairs]
        sizes.append([c.size for c in chunks])
        sends[p] = np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)
    got = _swap(inst, sends, [s for s, _ in pairs], [d for _, d in pairs])
    out: list[dict[int, np.ndarray]] = [{} for _ in pairs]
    for p in members:
        buf, off = got[p], 0
        for k, (s, _) in enumerate(pairs):
            n = payload(s, members.index(me)).size
            out[k][p] = buf[off : off + n]
            off += n
    return out


def all_reduce(srcs, dsts, replica_group, op):
    """Element-wise ``op`` of every member's source into every member's destination (rank order)."""
    inst = "all_reduce"
    pairs = _tensors(inst, srcs, dsts, hbm_only=False, single=False)
    fn = _reduce_fn(inst, op)
    for s, d in pairs:
        _shape_rule(inst, s.shape == d.shape, "source and destination shapes differ", src=s.shape, dst=d.shape)
    members = replica_group.members(current_fabric().rank, inst)
    got = _group_exchange(inst, pairs, replica_group, lambda s, _i: _raw(s))
    for k, (s, d) in enumerate(pairs):
        _store(d, _reduced([got[k][p].view(s.dtype) for p in members], fn))


def all_gather(srcs, dsts, replica_group, collective_dim):
    """Every member's source, concatenated along ``collective_dim`` in group order, into each destination."""
    inst = "all_gather"
    pairs = _tensors(inst, srcs, dsts, hbm_only=False, single=False)
    members = replica_group.members(current_fabric().rank, inst)
    for s, d in pairs:
        _dim(inst, s, collective_dim, sbuf_dims=(0, 1))
        want = list(s.shape)
        want[collective_dim] *= len(members)
        _shape_rule(inst, tuple(want) == d.shape, f"destination must be {tuple(want)}", src=s.shape, dst=d.shape)
    got = _group_exchange(inst, pairs, replica_group, lambda s, _i: _raw(s))
    for k, (s, d) in enumerate(pairs):
        parts = [got[k][p].view(s.dtype).reshape(s.shape) for p in members]
        d._data[...] = np.concatenate(parts, axis=collective_dim)
        d._alloc.written = True


def reduce_scatter(srcs, dsts, replica_group, collective_dim, op):
    """Member j's destination = ``op`` over members of their j-th slice along dim 0."""
    inst = "reduce_scatter"
    pairs = _tensors(inst, srcs, dsts, hbm_only=False, single=False)
    fn = _reduce_fn(inst, op)
    members = replica_group.members(current_fabric().rank, inst)
    g = len(members)
    for s, d in pairs:
        _dim(inst, s, collective_dim)
        _shape_rule(inst, s.shape[0] % g == 0 and (s.shape[0] // g, *s.shape[1:]) == d.shape,
                    f"destination must be the source split {g} ways along dim 0", src=s.shape, dst=d.shape)
    got = _group_exchange(inst, pairs, replica_group, _slices(g))
    for k, (s, d) in enumerate(pairs):
        _store(d, _reduced([got[k][p].view(s.dtype) for p in members], fn))


def all_to_all(srcs, dsts, replica_group, collective_dim):
    """Slice j (dim 0, equal slices) of each member's source goes to member j; received slices are
    concatenated in group order."""
    inst = "all_to_all"
    pairs = _tensors(inst, srcs, dsts, hbm_only=True, single=False)
    members = replica_group.members(current_fabric().rank, inst)
    g = len(members)
    for s, d in pairs:
        _dim(inst, s, collective_dim)
        _shape_rule(inst, s.shape[0] % g == 0 and s.shape == d.shape,
                    f"source dim 0 must split {g} ways and the destination match the source", src=s.shape, dst=d.shape)
    got = _group_exchange(inst, pairs, replica_group, _slices(g))
    for k, (s, d) in enumerate(pairs):
        d._data[...] = np.concatenate([got[k][p].view(s.dtype) for p in members]).reshape(d.shape)
        d._alloc.written = True


def all_to_all_v(srcs, dsts, replica_group, metadata_tensor, recv_counts_known=False, has_rdispls=False):
    """Variable all-to-all over flat element buffers: to member j go ``count[j]`` elements from ``displ[j]``;
    from member j arrive its elements, at receive displacement j (row 3, or packed in group order)."""
    inst = "all_to_all_v"
    ((s, d),) = _tensors(inst, srcs, dsts, hbm_only=True, single=True)
    me = current_fabric().rank
    members = replica_group.members(me, inst)
    g = len(members)
    meta = metadata_tensor
    if not isinstance(meta, NkiTensor) or meta.dtype != np.dtype(np.uint32):
        raise NkiRuleError("collectives.all_to_all_v.metadata", inst, "metadata must be a uint32 tensor")
    rows = 2 + bool(recv_counts_known) + bool(has_rdispls)
    if has_rdispls and not recv_counts_known:
        rows = 4
    if meta.ndim != 2 or meta.shape[1] != g or not 2 <= meta.shape[0] <= 4 or meta.shape[0] < rows:
        raise NkiRuleError("collectives.all_to_all_v.metadata", inst,
                           f"metadata must have shape ({rows}..4, {g}): send counts, send displacements"
                           + (", receive counts" if recv_counts_known else "")
                           + (", receive displacements" if has_rdispls else ""), {"metadata": meta.shape})
    m = np.asarray(meta._data, dtype=np.int64)
    counts, displs = m[0], m[1]
    flat = np.ascontiguousarray(s._data).reshape(-1)
    for j in range(g):
        if displs[j] + counts[j] > flat.size:
            raise NkiRuleError("collectives.all_to_all_v.bounds", inst,
                               f"send slice {j} [{displs[j]}, {displs[j] + counts[j]}) is outside the source",
                               {"src": s.shape})
    sends = {p: flat[displs[j] : displs[j] + counts[j]].view(np.uint8) for j, p in enumerate(members)}
    got = _swap(inst, sends, [s, meta], [d])
    arrived = [got[p].view(d.dtype) for p in members]
    if recv_counts_known:
        want = m[2]
        for j, a in enumerate(arrived):
            if a.size != want[j]:
                raise NkiRuleError("collectives.all_to_all_v.recv_counts", inst,
                                   f"rank {members[j]} sent {a.size} elements, metadata says {want[j]}")
    starts = m[3] if has_rdispls else np.concatenate([[0], np.cumsum([a.size for a in arrived])[:-1]])
    for j, a in enumerate(arrived):
        if starts[j] + a.size > d.size:
            raise NkiRuleError("collectives.all_to_all_v.bounds", inst,
                               f"{a.size} elements from rank {members[j]} at {starts[j]} overflow the destination",
                               {"dst": d.shape})
        _store(d, a, int(starts[j]))


def _check_rings(inst: str, pairs) -> dict[int, int]:
    """source → target, where every participating rank sends once and receives once (rings)."""
    pairs = [tuple(int(x) for x in p) for p in pairs]
    targets = dict(pairs)
    sources = {t: s for s, t in pairs}
    if len(targets) != len(pairs) or len(sources) != len(pairs) or set(targets) != set(sources):
        raise NkiRuleError("collectives.permute_ring", inst,
                           f"source-target pairs {pairs} do not form rings: only circular permute patterns "
                           "are supported (each rank sends once and receives once)")
    return targets


def collective_permute(srcs, dsts, source_target_pairs):
    """Each source rank's tensor goes to its target's destination (pairs must form rings)."""
    inst = "collective_permute"
    ((s, d),) = _tensors(inst, srcs, dsts, hbm_only=True, single=True)
    _shape_rule(inst, s.shape == d.shape, "source and destination shapes differ", src=s.shape, dst=d.shape)
    targets = _check_rings(inst, source_target_pairs)
    me = current_fabric().rank
    sends = {targets[me]: _raw(s)} if me in targets else {}
    got = _swap(inst, sends, [s], [d])
    source = {t: src for src, t in targets.items()}.get(me)
    if source is not None:
        _store(d, got[source].view(d.dtype))


def _implicit(*_a, **_k):
    raise NkiUnsupportedError("the ring-implicit collectives return runtime registers; the emulator does not "
                              "implement them (use collective_permute with explicit pairs)")


collective_permute_implicit = collective_permute_implicit_reduce = _implicit
collective_permute_implicit_current_processing_rank_id = _implicit
