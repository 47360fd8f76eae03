"""Host blocks made ahead (mp2trn.overlap): the bounded queue keeps order, bounds the blocks alive, hands the
producer's errors to the consumer, and stops its thread when the consumer stops early; the stages that use
it give what they give in turn."""

from __future__ import annotations

import re
import threading
from dataclasses import replace

import numpy as np
import pytest

from mp2trn.overlap import made_ahead, overlaps


def _producers_alive(name: str = "mp2trn-ahead") -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_order_and_the_bound_on_blocks_alive():
    """Every item in order; the producer is never more than ``ahead`` items past the one the consumer holds."""
    made, used, worst = [], [], [0]

    def blocks():
        for i in range(40):
            made.append(i)
            worst[0] = max(worst[0], len(made) - len(used))   # blocks alive when this one is made
            yield i

    for ahead in (1, 3):
        made.clear(), used.clear()
        worst[0] = 0
        for item in made_ahead(blocks(), ahead=ahead):
            used.append(item)
        assert used == list(range(40))
        assert 1 <= worst[0] <= ahead + 1
    assert not _producers_alive()


def test_a_producer_error_reaches_the_consumer_in_order():
    def broken():
        yield 1
        yield 2
        raise ValueError("integrals failed")

    got = []
    with pytest.raises(ValueError, match="integrals failed"):
        for item in made_ahead(broken()):
            got.append(item)
    assert got == [1, 2]
    assert not _producers_alive()


@pytest.mark.parametrize("how", ["break", "raise", "close"])
def test_early_stop_ends_the_producer_and_its_generator(how):
    """The consumer stops after two items (a break, its own exception, close()): the producer makes at most
    the blocks it was allowed ahead, its generator is closed (its clean-up ran) and its thread has ended."""
    made, cleaned = [], []

    def blocks():
        try:
            for i in range(1000):
                made.append(i)
                yield i
        finally:
            cleaned.append(True)

    gen = made_ahead(blocks(), ahead=1)
    if how == "close":
        assert [next(gen), next(gen)] == [0, 1]
        gen.close()
    else:
        with pytest.raises(RuntimeError) if how == "raise" else _nothing():
            for item in gen:
                if item == 1:
                    if how == "raise":
                        raise RuntimeError("the device failed")
                    break
        gen.close()
    assert len(made) <= 4 and cleaned == [True]
    assert not _producers_alive()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_overlap_follows_the_device_and_the_benchmark_switch(monkeypatch):
    """Blocks are made ahead only for a device computing off the host's cores; MP2TRN_OVERLAP=0 turns it off
    (the GPU benchmark's with/without comparison)."""
    class OffHost:
        def computes_on_host_cores(self) -> bool:
            return False

    class OnHost(OffHost):
        def computes_on_host_cores(self) -> bool:
            return True

    monkeypatch.delenv("MP2TRN_OVERLAP", raising=False)
    assert overlaps(OffHost()) and not overlaps(OnHost())
    monkeypatch.setenv("MP2TRN_OVERLAP", "0")
    assert not overlaps(OffHost())


def test_producer_threads_are_its_own():
    """omp_threads sets PySCF's OpenMP count in the producer thread only."""
    from pyscf import lib

    before = lib.num_threads()
    seen = list(made_ahead((lib.num_threads() for _ in range(3)), omp_threads=1))
    assert seen == [1, 1, 1] and lib.num_threads() == before


def test_b_made_ahead_equals_b_made_in_turn():
    """The MP2 3-index integrals made ahead of a device that computes off the host's cores (two reused
    buffers, half blocks) give the B made in turn, to rounding."""
    from pyscf import gto, scf

    from mp2trn.devices.cpu import CpuDevice
    from mp2trn.df import build_df
    from mp2trn.memory import SpinShape, plan_blocks
    from mp2trn.orbitals import select_frozen, spin_orbitals
    from mp2trn.transform import BStore, build_b

    class OffHost(CpuDevice):
        def computes_on_host_cores(self) -> bool:
            return False

    mol = gto.M(atom="O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45", basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit().run()
    spins = spin_orbitals(mf, select_frozen(mf, None))
    dfi = build_df(mol, "cc-pvdz-ri")
    plan = plan_blocks(mol.nao_nr(), dfi.naux, [SpinShape(s.nocc, s.nvir) for s in spins], dfi.max_aux_shell, 100.0)
    plan = replace(plan, aux_block=24)      # several blocks, so that both buffers are used in turn
    assert dfi.block_count(plan.aux_block // 2) >= 4
    out = []
    for device in (CpuDevice(), OffHost()):
        assert overlaps(device) == isinstance(device, OffHost)
        with BStore(dfi.naux, spins, np.float64, True) as store:
            build_b(dfi, spins, device, plan, store)
            out.append(store.arrays[0].copy())
    assert np.max(np.abs(out[0] - out[1])) < 1e-12
    assert not _producers_alive()


def test_scf_tensor_file_written_while_the_next_chunk_is_made():
    """The streamed SCF tensor's file (its chunks made ahead of their writes) holds the packed tensor."""
    from pyscf import df, gto

    from mp2trn.df import TensorFile, cholesky_tensor

    mol = gto.M(atom="O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45", basis="cc-pvdz", verbose=0)
    auxmol = df.addons.make_auxmol(mol, "cc-pvdz-jkfit")
    expected = cholesky_tensor(mol, auxmol, packed=True)
    file = TensorFile.build(mol, auxmol, chunk_mb=0.2)      # small chunks: many made ahead
    try:
        assert np.max(np.abs(file.rows(0, file.naux) - expected)) < 1e-13
    finally:
        file.close()
    assert not _producers_alive("mp2trn-scf-tensor")


# -- blocks made before their stage starts (the MP2 step's integrals during the SCF) -----------------------

def test_early_blocks_keep_order_and_are_handed_over_once():
    """Every block made in order by the thread; take() hands them over once."""
    from mp2trn.overlap import EarlyBlocks

    with EarlyBlocks((lambda i=i: i for i in range(8)), name="mp2trn-test-early") as early:
        early.wait()
        assert early.take() == list(range(8))
        assert early.take() == []
    assert not _producers_alive("mp2trn-test-early")


def test_early_blocks_not_begun_give_none_and_leave_no_thread():
    """Blocks whose thread never began (an SCF whose builds were not the device's): take() gives none."""
    from mp2trn.overlap import EarlyBlocks

    made = []
    early = EarlyBlocks((lambda i=i: made.append(i) for i in range(3)), name="mp2trn-test-early", start=False)
    assert early.take() == [] and made == []
    early.start()                       # not after take()
    assert made == [] and not _producers_alive("mp2trn-test-early")


def test_the_mp2_integrals_wait_for_the_devices_builds():
    """With PySCF's own J/K builds (--scf-jk pyscf) the device never builds, so nothing is made during the
    SCF and the transform makes every block; the energy is the same."""
    from mp2trn.devices.cpu import CpuDevice
    from mp2trn.options import RunOptions
    from mp2trn.pipeline import compute

    water = "O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45"
    options = RunOptions(scf_jk="pyscf")
    ref, _ = compute(water, options, CpuDevice())
    got, _ = compute(water, options, _OffHostCpu.make())
    assert got.what_ran["mp2_integrals_during_scf"].startswith("0 of 2 3-index blocks")
    assert abs(got.e_tot - ref.e_tot) < 1e-10


def test_early_blocks_stop_when_taken_and_raise_the_thread_error():
    """take() stops the thread after the block it is making (a prefix of the blocks); an error in the thread
    is raised by take(); leaving the context stops the thread and drops its blocks."""
    import time

    from mp2trn.overlap import EarlyBlocks

    def slow(i):
        time.sleep(0.02)
        return i

    early = EarlyBlocks((lambda i=i: slow(i) for i in range(1000)), name="mp2trn-test-early")
    time.sleep(0.05)
    got = early.take()
    assert got == list(range(len(got))) and len(got) < 1000
    assert not _producers_alive("mp2trn-test-early")
    with pytest.raises(ZeroDivisionError):
        EarlyBlocks([lambda: 0, lambda: 1 / 0], name="mp2trn-test-early").take()
    with pytest.raises(RuntimeError, match="SCF failed"):
        with EarlyBlocks((lambda i=i: slow(i) for i in range(1000)), name="mp2trn-test-early"):
            raise RuntimeError("SCF failed")
    assert not _producers_alive("mp2trn-test-early")


class _OffHostCpu:
    """A cpu device that says it computes off the host's cores (as a NeuronCore or a GPU does)."""

    @staticmethod
    def make():
        from mp2trn.devices.cpu import CpuDevice

        class OffHost(CpuDevice):
            def computes_on_host_cores(self) -> bool:
                return False

        return OffHost()


@pytest.mark.parametrize("room_blocks", [0, 2, 100])
def test_b_from_blocks_made_early_equals_b_made_in_turn(room_blocks):
    """B from the blocks made during the SCF (none, some, all), the rest made by the transform, equals B made
    in turn."""
    from pyscf import gto, scf

    from mp2trn.devices.cpu import CpuDevice
    from mp2trn.df import build_df
    from mp2trn.memory import SpinShape, plan_blocks
    from mp2trn.orbitals import select_frozen, spin_orbitals
    from mp2trn.transform import BStore, EarlyIntegrals, build_b

    mol = gto.M(atom="O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45", basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit().run()
    spins = spin_orbitals(mf, select_frozen(mf, None))
    dfi = build_df(mol, "cc-pvdz-ri")
    plan = plan_blocks(mol.nao_nr(), dfi.naux, [SpinShape(s.nocc, s.nvir) for s in spins], dfi.max_aux_shell, 100.0)
    plan = replace(plan, aux_block=24)
    device = _OffHostCpu.make()
    with BStore(dfi.naux, spins, np.float64, True) as store:
        build_b(dfi, spins, CpuDevice(), plan, store)
        expected = store.arrays[0].copy()
    for early_block in (12, 30):       # as build_b's blocks (24 // 2), and of other bounds (its own then)
        with EarlyIntegrals(mol, dfi.auxmol, dfi.auxbasis, early_block, device.ao_packed, room_blocks) as early:
            early.start()
            early.blocks.wait()
            early.take()
            assert np.array_equal(early.dfi.l_chol, dfi.l_chol)
            with BStore(dfi.naux, spins, np.float64, True) as store:
                build_b(early.dfi, spins, device, plan, store, early=early)
                got = store.arrays[0]
                assert np.max(np.abs(got - expected)) < 1e-12
        assert early.record["blocks"] == min(room_blocks, early.record["of"])
    assert not _producers_alive("mp2trn-early-integrals")


@pytest.mark.parametrize("gradient", [False, True])
def test_a_run_on_a_device_off_the_host_makes_the_mp2_integrals_during_the_scf(gradient):
    """The pipeline on a device computing off the host's cores begins the MP2 step's integrals before the
    SCF, says so in what ran, and gives the cpu device's energy (and gradient)."""
    from mp2trn.devices.cpu import CpuDevice
    from mp2trn.options import RunOptions
    from mp2trn.pipeline import compute

    water = "O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45"
    ref, _ = compute(water, RunOptions(gradient=gradient), CpuDevice())
    got, _ = compute(water, RunOptions(gradient=gradient), _OffHostCpu.make())
    assert "mp2_integrals_during_scf" not in ref.what_ran
    # begun when the device's builds begin: how many are made by the energy's start is the thread's race
    assert re.match(r"[0-2] of 2 3-index blocks", got.what_ran["mp2_integrals_during_scf"])
    assert got.timings["integrals_during_scf"] > 0
    assert abs(got.e_tot - ref.e_tot) < 1e-10
    if gradient:
        assert np.max(np.abs(np.asarray(got.gradient) - np.asarray(ref.gradient))) < 1e-10
    assert not _producers_alive("mp2trn-early-integrals")


def test_early_blocks_leave_the_energy_plan_as_it_is():
    """The room for blocks made during the SCF is at most its share of the budget, keeps the energy's plan
    (B in memory or not, its AO block) where a held SCF tensor leaves the least budget, and is 0 when the
    budget has none."""
    from mp2trn.memory import EARLY_BLOCKS_SHARE, SCF_TENSOR_SHARE, SpinShape, early_blocks_mb, plan_blocks

    nao, naux, shell, spins = 326, 1232, 15, [SpinShape(70, 256)]
    for budget in (12000.0, 2000.0, 800.0, 400.0):
        room = early_blocks_mb(nao, naux, spins, shell, budget, 4)
        assert 0 <= room <= EARLY_BLOCKS_SHARE * budget
        base = budget * (1 - SCF_TENSOR_SHARE)
        if room:
            a, b = (plan_blocks(nao, naux, spins, shell, x, 4) for x in (base, base - room))
            assert (a.incore, a.aux_block) == (b.incore, b.aux_block)
    assert early_blocks_mb(nao, naux, spins, shell, 12000.0, 4) == EARLY_BLOCKS_SHARE * 12000.0
    assert early_blocks_mb(nao, naux, spins, shell, 60.0, 4) == 0.0


def test_early_integral_blocks_are_the_first_that_fit_the_room():
    """plan_early_integrals: the first blocks whose bytes fit early_blocks_mb's room; all of them at a large
    budget, none at one with no room."""
    from pyscf import gto

    from mp2trn.df import build_df
    from mp2trn.memory import SpinShape, early_blocks_mb
    from mp2trn.transform import plan_early_integrals

    mol = gto.M(atom="O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45", basis="cc-pvdz", verbose=0)
    dfi = build_df(mol, "cc-pvdz-ri")
    loc, nao, aux = dfi.auxmol.ao_loc_nr(), mol.nao_nr(), dfi.auxmol
    for budget in (5.0, 8.0, 12.0, 1000.0):
        aux_block, count = plan_early_integrals(mol, aux, 8, True, budget)
        room = early_blocks_mb(nao, dfi.naux, [SpinShape(5, nao - 5)], dfi.max_aux_shell, budget, 8) * 1e6 \
            - dfi.l_chol.nbytes          # beside the metric's factor
        sizes = [(loc[b] - loc[a]) * dfi.per_aux(True) * 8 for a, b in dfi.shell_ranges(max(1, aux_block))]
        assert sum(sizes[:count]) <= room and (count == len(sizes) or sum(sizes[:count + 1]) > room)
    assert plan_early_integrals(mol, aux, 8, True, 1000.0)[1] == len(dfi.shell_ranges(aux_block))
    assert plan_early_integrals(mol, aux, 8, True, 0.5)[1] == 0
