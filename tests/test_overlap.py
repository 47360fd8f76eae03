"""Host blocks made ahead (mp2trn.overlap): the bounded queue keeps order, bounds the blocks alive, hands the
producer's errors to the consumer, and stops its thread when the consumer stops early; the stages that use
it give what they give in turn."""

from __future__ import annotations

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
