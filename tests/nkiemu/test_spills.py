"""SBUF spills: liveness from creation to last use; over capacity the compiler spills and refills
(memory-hierarchy-overview.rst), so the emulator runs the kernel, warns, counts spill_save_bytes /
spill_reload_bytes and prices them; strict mode refuses; one tile larger than a partition is an error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mp2trn.nkiemu as nki
import mp2trn.nkiemu.isa as nisa
import mp2trn.nkiemu.language as nl
from mp2trn.nkiemu import NkiCapacityError, NkiSpillWarning

from .conftest import BF16, load_conformance

F = 65_000 // 4        # fp32 elements per partition: three such tiles (195 kB) overflow trn1 (180,224 B)


@nki.jit
def three_live_tiles(x, doubled=False):
    """Three tiles written, then all read again: 195 kB live per partition (``doubled``: each tile is
    modified on chip after its load, so it no longer equals the HBM data)."""
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    tiles = []
    for k in range(3):
        t = nl.ndarray((128, F), nl.float32, buffer=nl.sbuf, name=f"t{k}")
        nisa.dma_copy(dst=t, src=x)
        if doubled:
            nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)
        tiles.append(t)
    acc = tiles[0]
    for t in tiles[1:]:
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_over_capacity_runs_warns_and_costs_more():
    x = np.random.default_rng(1).standard_normal((128, F)).astype(np.float32)
    with pytest.warns(NkiSpillWarning, match=r"three_live_tiles: live SBUF peaks at 195000 B/partition, 14776 over"):
        out = nki.simulate(three_live_tiles, target="trn1")(x)
    np.testing.assert_allclose(out, 3 * x, rtol=1e-6)
    spilled = three_live_tiles.last_report
    assert spilled.peak_sbuf_bytes == 195_000
    # the evicted tile is a copy of x: nothing to save, its refill reads x again
    assert spilled.spill_save_bytes == 0
    assert spilled.spill_reload_bytes > 0 and spilled.spill_reload_bytes % (128 * F * 4) == 0
    assert spilled.to_dict()["spill_save_bytes"] == spilled.spill_save_bytes
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # fits on trn2: no spill, no warning
        nki.simulate(three_live_tiles, target="trn2")(x)
    fits = three_live_tiles.last_report.priced_for("trn1")    # the same instructions, no spill traffic
    assert fits.spill_save_bytes == 0
    assert spilled.modeled_time_s > fits.modeled_time_s
    assert spilled.engine_busy_s["dma"] > fits.engine_busy_s["dma"]


def test_a_tile_modified_on_chip_is_saved_before_its_refill():
    x = np.random.default_rng(1).standard_normal((128, F)).astype(np.float32)
    with pytest.warns(NkiSpillWarning):
        out = nki.simulate(three_live_tiles, target="trn1")(x, doubled=True)
    np.testing.assert_allclose(out, 6 * x, rtol=1e-6)
    rep = three_live_tiles.last_report
    # every evicted tile holds on-chip results: saved, then reloaded (whole tiles: each is read whole)
    assert rep.spill_save_bytes == rep.spill_reload_bytes > 0 and rep.spill_save_bytes % (128 * F * 4) == 0
    (trace,) = rep.launches
    kinds = [tr[1] for tr in trace.spill_transfers]
    assert kinds[0] == "save" and kinds.count("save") == kinds.count("reload")
    # the spill DMAs run on the queues beside the kernel's own: the save starts after the tile's last write,
    # and the instruction that reads the refilled tile starts after the refill
    timeline = rep.timeline()
    save = next(e for e in timeline if e[2] == "spill save")
    reload = next(e for e in timeline if e[2] == "spill reload")
    assert save[4] <= reload[3]
    assert any(e[2] == "tensor_tensor" and e[3] >= reload[4] for e in timeline)


@nki.jit
def column_blocks(x):
    """A (128, 8 x 2048) fp32 accumulator (64 KiB/partition) updated one 2048-column block at a time while
    two 64 KiB tiles stay live: 192 KiB/partition over trn1's 176 KiB. Only accumulator blocks spill."""
    out = nl.ndarray((128, 8 * 2048), nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((128, 8, 2048), nl.float32, buffer=nl.sbuf, name="acc")
    nisa.memset(dst=acc, value=0.0)
    a = nl.ndarray((128, 8 * 2048), nl.float32, buffer=nl.sbuf, name="a")
    b = nl.ndarray((128, 8 * 2048), nl.float32, buffer=nl.sbuf, name="b")
    nisa.dma_copy(dst=a, src=x)
    nisa.dma_copy(dst=b, src=x)
    for j in range(8):
        blk = acc[:, j, :]
        nisa.tensor_tensor(dst=blk, data1=blk, data2=a[:, j * 2048:(j + 1) * 2048], op=nl.add)
        nisa.tensor_tensor(dst=blk, data1=blk, data2=b[:, j * 2048:(j + 1) * 2048], op=nl.add)
    nisa.dma_copy(dst=out, src=acc.reshape((128, 8 * 2048)))
    return out


def test_spills_move_the_addressed_blocks_not_whole_tiles():
    x = np.random.default_rng(2).standard_normal((128, 8 * 2048)).astype(np.float32)
    with pytest.warns(NkiSpillWarning):
        out = nki.simulate(column_blocks, target="trn1")(x)
    np.testing.assert_allclose(out, 2 * x, rtol=1e-6)
    rep = column_blocks.last_report
    over = 3 * 64 * 1024 - 180_224           # bytes/partition over the capacity
    block = 2048 * 4                         # one accumulator (or operand) block per partition
    # whole-tile spills would move at least one 64 KiB tile per partition; the pieces move a few 8 KiB blocks
    assert 0 < rep.spill_reload_bytes <= 128 * 2 * block + 128 * over
    assert rep.spill_reload_bytes < 128 * 64 * 1024


def test_strict_mode_refuses():
    x = np.zeros((128, F), np.float32)
    with pytest.raises(NkiCapacityError) as err:
        nki.simulate(three_live_tiles, target="trn1", strict=True)(x)
    assert err.value.rule == "capacity.sbuf" and "strict mode" in str(err.value)


def test_one_tile_larger_than_a_partition_is_an_error():
    @nki.jit
    def huge(x):
        t = nl.ndarray((128, 190_000 // 4), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0.0)
        return None

    with pytest.raises(NkiCapacityError) as err:
        nki.simulate(huge, target="trn1")(np.zeros(1, np.float32))
    assert err.value.rule == "capacity.sbuf_tile"


def test_liveness_ends_at_the_last_use():
    """A per-iteration tile is dead after its last instruction, not when its variable is rebound."""
    @nki.jit
    def loop(x):
        out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
        for _ in nl.affine_range(10):
            t = nl.ndarray((128, 100_000 // 4), nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=t, value=1.0)
            nisa.dma_copy(dst=out, src=t[:, 0:4])
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nki.simulate(loop, target="trn1")(np.zeros(1, np.float32))
    assert loop.last_report.peak_sbuf_bytes == 100_000


@pytest.mark.parametrize("dtype,peak,spills", [(np.float32, 229_376, True), (BF16, 114_688, False)])
def test_tutorial_allocation_pattern_at_4096x1024x2048(rng, dtype, peak, spills):
    """The optimization guide's fully blocked matmul (tiles allocated inside loops) at M=4096, K=1024,
    N=2048: fp32 needs 229,376 B/partition and now runs with spills on trn1 (the emulator refused it
    before); bf16 peaks at the guide's own 114,688 B."""
    m = load_conformance("matmul")
    lhsT = rng.standard_normal((1024, 4096)).astype(dtype)
    rhs = rng.standard_normal((1024, 2048)).astype(dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = nki.simulate(m.mm_tiles_in_loops, target="trn1")(lhsT, rhs)
    assert any(issubclass(w.category, NkiSpillWarning) for w in caught) == spills
    rep = m.mm_tiles_in_loops.last_report
    assert rep.peak_sbuf_bytes == peak
    assert (rep.spill_save_bytes > 0) == spills
    ref = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    if dtype is np.float32:
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=2e-3)
    else:
        np.testing.assert_allclose(out.astype(np.float32), ref, rtol=3e-2, atol=1.0)


@nki.jit
def nine_accumulators(x):
    """Nine PSUM accumulators written, then all read: 9 banks live, one over the 8 of a NeuronCore."""
    out = nl.ndarray((128, 9 * 512), nl.float32, buffer=nl.shared_hbm)
    a = nl.ndarray((128, 128), nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x[:, 0:128])
    nisa.dma_copy(dst=b, src=x)
    accs = []
    for _ in range(9):
        acc = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=a, moving=b)
        accs.append(acc)
    for k, acc in enumerate(accs):
        res = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        nisa.dma_copy(dst=out[:, k * 512:(k + 1) * 512], src=res)
    return out


def test_psum_over_capacity_spills_to_sbuf_and_costs_more():
    x = np.random.default_rng(2).standard_normal((128, 512)).astype(np.float32)
    with pytest.warns(NkiSpillWarning, match="live PSUM peaks at 9 banks, 1 over the 8"):
        out = nki.simulate(nine_accumulators, target="trn1")(x)
    ref = x[:, 0:128].astype(np.float64).T @ x
    np.testing.assert_allclose(out, np.tile(ref, 9), rtol=1e-4, atol=1e-3)
    rep = nine_accumulators.last_report
    trace = rep.launches[0]
    assert trace.psum_spill_bytes > 0 and trace.psum_spill_events > 0
    from mp2trn.nkiemu.cost import CostReport, LaunchTrace

    no_spill = LaunchTrace(trace.kernel, trace.target, trace.records, trace.grid, trace.peak_sbuf_bytes, 8)
    plain = CostReport([no_spill], "trn1")
    assert rep.engine_busy_s["vector"] > plain.engine_busy_s["vector"]      # the copies are priced
    assert rep.scheduled_time_s > plain.scheduled_time_s
    with pytest.raises(NkiCapacityError) as err:
        nki.simulate(nine_accumulators, target="trn1", strict=True)(x)
    assert err.value.rule == "capacity.psum"
