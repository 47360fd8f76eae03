"""nki.collectives in the emulator, in one process: the documented rules (one broken rule each), the
semantics against a mirror fabric (a second rank that sends what this one sends), and the cost record.
Several real processes: tests/test_parallel.py::test_nki_collective_kernels_over_three_ranks."""

from __future__ import annotations

import numpy as np
import pytest

import mp2trn.nkiemu as nki
import mp2trn.nkiemu.collectives as ncc
import mp2trn.nkiemu.isa as nisa
import mp2trn.nkiemu.language as nl
from mp2trn.nkiemu import NkiRuleError
from mp2trn.nkiemu.targets import TRN1

X = np.arange(24, dtype=np.float32).reshape(4, 6)


class Mirror:
    """Rank 0 of two; rank 1 sends to rank 0 exactly what rank 0 sends to rank 1."""

    rank, size = 0, 2

    def exchange(self, sends):
        return {0: sends.get(0, np.zeros(0, np.uint8)), 1: sends.get(1, np.zeros(0, np.uint8))}


def _in_hbm(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=t, src=x)
    return t


@nki.jit
def reduce_kernel(x, op_name):
    src = _in_hbm(x)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ops = {"add": nl.add, "max": nl.maximum, "multiply": nl.multiply}
    ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=ncc.ReplicaGroup([[0, 1]]), op=ops[op_name])
    return dst


@nki.jit
def gather_kernel(x, dim):
    src = _in_hbm(x)
    shape = (x.shape[0] * 2, x.shape[1]) if dim == 0 else (x.shape[0], x.shape[1] * 2)
    dst = nl.ndarray(shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.all_gather(srcs=[src], dsts=[dst], replica_group=ncc.ReplicaGroup([[0, 1]]), collective_dim=dim)
    return dst


@nki.jit
def scatter_kernel(x):
    src = _in_hbm(x)
    dst = nl.ndarray((x.shape[0] // 2, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.reduce_scatter(srcs=[src], dsts=[dst], replica_group=ncc.ReplicaGroup([[0, 1]]), collective_dim=0, op=nl.add)
    return dst


@nki.jit
def sbuf_kernel(x, which):
    """The collectives on SBUF tiles: legal for all_reduce/all_gather (2-D), not for all_to_all/permute."""
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    h = _in_hbm(x)
    d = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    g = ncc.ReplicaGroup([[0, 1]])
    if which == "all_to_all":
        ncc.all_to_all(srcs=[t], dsts=[d], replica_group=g, collective_dim=0)
    elif which == "permute":
        ncc.collective_permute(srcs=[t], dsts=[d], source_target_pairs=[(0, 1), (1, 0)])
    elif which == "mixed":
        ncc.all_reduce(srcs=[t], dsts=[_in_hbm(x)], replica_group=g, op=nl.add)
    elif which == "coalesced":
        ncc.all_reduce(srcs=[t, t], dsts=[d, d], replica_group=g, op=nl.add)
    elif which == "gather_dim1":
        wide = nl.ndarray((x.shape[0], 2 * x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        ncc.all_gather(srcs=[t], dsts=[wide], replica_group=g, collective_dim=1)
        out = nl.ndarray(wide.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=wide)
        return out
    elif which == "hbm_gather_dim1":
        wide = nl.ndarray((x.shape[0], 2 * x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
        ncc.all_gather(srcs=[h], dsts=[wide], replica_group=g, collective_dim=1)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=h)
    return out


@nki.jit
def permute_kernel(x, pairs):
    src = _in_hbm(x)
    dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.collective_permute(srcs=[src], dsts=[dst], source_target_pairs=list(pairs))
    return dst


@nki.jit
def a2av_kernel(x, meta, out_words):
    src = _in_hbm(x)
    m = _in_hbm(meta)
    dst = nl.ndarray((out_words, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    ncc.all_to_all_v(srcs=[src], dsts=[dst], replica_group=ncc.ReplicaGroup([[0, 1]]), metadata_tensor=m,
                     recv_counts_known=True)
    return dst


def _mirror(kernel, *args):
    with ncc.use_fabric(Mirror()):
        return nki.simulate(kernel, target="trn1")(*args)


def test_reductions_and_gathers_over_a_mirror_rank():
    assert np.array_equal(_mirror(reduce_kernel, X, "add"), 2 * X)
    assert np.array_equal(_mirror(reduce_kernel, X, "max"), X)
    assert np.array_equal(_mirror(gather_kernel, X, 0), np.concatenate([X, X]))
    # rank 0 keeps slice 0: its own plus what the mirror sends it (its slice 1, see Mirror)
    assert np.array_equal(_mirror(scatter_kernel, X), X[:2] + X[2:])
    assert np.array_equal(_mirror(sbuf_kernel, X, "gather_dim1"), np.concatenate([X, X], axis=1))
    assert np.array_equal(_mirror(permute_kernel, X, ((0, 1), (1, 0))), X)


def test_all_to_all_v_places_pieces_by_counts():
    x = np.arange(10, dtype=np.int32).reshape(-1, 1)
    # rank 0 keeps 3 words from offset 0 and sends 5 from offset 4; the mirror rank sends the same 5
    meta = np.array([[3, 5], [0, 4], [3, 5]], dtype=np.uint32)
    got = _mirror(a2av_kernel, x, meta, 8).ravel()
    assert got.tolist() == [0, 1, 2, 4, 5, 6, 7, 8]
    bad = np.array([[3, 5], [0, 4], [3, 4]], dtype=np.uint32)        # says 4 words arrive from rank 1
    with pytest.raises(NkiRuleError, match="recv_counts"):
        _mirror(a2av_kernel, x, bad, 8)
    with pytest.raises(NkiRuleError, match="metadata must be a uint32"):
        _mirror(a2av_kernel, x, meta.astype(np.float32), 8)
    with pytest.raises(NkiRuleError, match=r"metadata must have shape \(3..4, 2\)"):
        _mirror(a2av_kernel, x, meta[:2], 8)


@pytest.mark.parametrize("which, rule", [("all_to_all", "collectives.hbm_only"), ("permute", "collectives.hbm_only"),
                                         ("mixed", "collectives.memory"), ("coalesced", "collectives.coalesced"),
                                         ("hbm_gather_dim1", "collectives.collective_dim")])
def test_memory_and_dimension_rules(which, rule):
    with pytest.raises(NkiRuleError) as info:
        _mirror(sbuf_kernel, X, which)
    assert info.value.rule == rule


def test_operator_ring_and_group_rules():
    with pytest.raises(NkiRuleError) as info:
        _mirror(reduce_kernel, X, "multiply")
    assert info.value.rule == "collectives.op"
    with pytest.raises(NkiRuleError) as info:                         # 0 → 1 with no way back
        _mirror(permute_kernel, X, ((0, 1),))
    assert info.value.rule == "collectives.permute_ring"
    with pytest.raises(NkiRuleError, match="must not overlap"):
        ncc.ReplicaGroup([[0, 1], [1, 2]])
    with pytest.raises(NkiRuleError, match="in no sub-group"):
        ncc.ReplicaGroup([[1, 2]]).members(0, "all_reduce")


def test_a_collective_costs_latency_plus_bytes_over_the_links():
    _mirror(gather_kernel, X, 0)
    rep = nki.last_report()
    cc = [r for r in rep.launches[0].records if r[0] == "cc"]
    assert len(cc) == 1 and cc[0][2] == ("cc", X.nbytes)             # the bytes sent to the other rank
    expected = nki.default_params().collective_latency_s + X.nbytes / TRN1.link_bw
    assert rep.priced_for("trn1").engine_busy_s["cc"] == pytest.approx(expected)


def test_one_rank_world_without_a_fabric():
    @nki.jit
    def alone(x):
        src = _in_hbm(x)
        dst = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        ncc.all_reduce(srcs=[src], dsts=[dst], replica_group=ncc.ReplicaGroup([[0]]), op=nl.add)
        return dst

    assert np.array_equal(nki.simulate(alone)(X), X) and ncc.rank_id() == 0
