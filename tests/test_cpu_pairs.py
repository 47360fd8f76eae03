"""The cpu device's pair step against the textbook formula on random blocks: every pair's opposite-spin
and exchange sums, on the diagonal block (i ≤ j) and off it, same spin and opposite spins (nva ≠ nvb)."""

from __future__ import annotations

import numpy as np
import pytest

from mp2trn.devices import get_device


def _textbook(b_i, b_j, e_i, e_j, ev_a, ev_b):
    """os[i, j] = Σ_ab T²/D, x[i, j] = Σ_ab T_ab T_ba / D in fp64 with einsum, T_ab = Σ_Q B_Q,ia B_Q,jb."""
    t = np.einsum("Qia,Qjb->ijab", b_i.astype(np.float64), b_j.astype(np.float64))
    d = e_i[:, None, None, None] + e_j[None, :, None, None] - ev_a[None, None, :, None] - ev_b[None, None, None, :]
    os_ = np.einsum("ijab,ijab->ij", t, t / d)
    x = np.einsum("ijab,ijba->ij", t / d, t) if b_i.shape[2] == b_j.shape[2] else None
    return os_, x


def _block(rng, naux, n, nv):
    return 0.1 * rng.standard_normal((naux, n, nv))


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("precision,rel", [("fp64", 1e-13), ("fp32", 1e-5)])
def test_pair_sums_match_the_textbook(precision, rel, parts, monkeypatch):
    """Rows handed one at a time to 3 threads of one BLAS thread each, or all in the calling thread, as on
    a machine with that many BLAS threads."""
    import mp2trn.devices.cpu

    monkeypatch.setattr(mp2trn.devices.cpu, "blas_threads", lambda: parts)
    rng = np.random.default_rng(7)
    dev = get_device("cpu", precision)
    naux, ni, nj, nva, nvb = 40, 5, 3, 11, 7
    b_i, b_j, b_k = _block(rng, naux, ni, nva), _block(rng, naux, nj, nva), _block(rng, naux, nj, nvb)
    e_i, e_j = -1.0 - rng.random(ni), -0.8 - rng.random(nj)
    ev_a, ev_b = 0.2 + rng.random(nva), 0.3 + rng.random(nvb)
    dtype = dev.storage_dtype
    cases = [(b_i, None, e_i, e_i, ev_a, ev_a, True),     # the diagonal block: i ≤ j
             (b_i, b_j, e_i, e_j, ev_a, ev_a, True),      # same spin, two blocks
             (b_i, b_k, e_i, e_j, ev_a, ev_b, False)]     # opposite spins: nva ≠ nvb, no exchange
    for bi, bj, ei, ej, eva, evb, exchange in cases:
        b_j = None if bj is None else bj.astype(dtype)
        os_, x = dev.pair_energies(bi.astype(dtype), b_j, ei, ej, eva, evb, exchange)
        ref_os, ref_x = _textbook(bi, bi if bj is None else bj, ei, ej, eva, evb)
        if bj is None:   # only i ≤ j is formed; the rest is 0
            ref_os, ref_x = np.triu(ref_os), np.triu(ref_x)
        assert os_.dtype == np.float64 and np.abs(os_ - ref_os).max() <= rel * np.abs(ref_os).max()
        if exchange:
            assert np.abs(x - ref_x).max() <= rel * np.abs(ref_x).max() and np.abs(ref_x).max() > 0
        else:
            assert x is None


def test_work_is_split_over_the_cores_one_blas_thread_each(monkeypatch):
    """The cpu device's split: contiguous ranges covering every row once, balanced by work (a triangle's
    first rows hold more pairs), all running at once on threads other than the caller's while every BLAS
    library runs one thread, the thread counts back afterwards; one range in the calling thread when the
    split is off."""
    import threading

    from threadpoolctl import threadpool_info, threadpool_limits

    import mp2trn.devices.cpu

    monkeypatch.setattr(mp2trn.devices.cpu, "blas_threads", lambda: 3)
    dev = get_device("cpu")
    calls = []
    together = threading.Barrier(3, timeout=30)   # passes only when the three parts run at the same time

    def blas_counts():
        return sorted(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    def run(k, i0, i1):
        calls.append((k, i0, i1, threading.get_ident(), max(blas_counts())))
        together.wait()

    work = np.arange(30, 0, -1, dtype=float)
    with threadpool_limits(2):
        before = blas_counts()
        dev._over_cores(work, run)
        assert blas_counts() == before
    ranges = sorted((i0, i1) for _, i0, i1, _, _ in calls)
    assert [r[0] for r in ranges] == [0] + [r[1] for r in ranges[:-1]] and ranges[-1][1] == 30
    assert sorted(k for k, *_ in calls) == [0, 1, 2] and threading.get_ident() not in {c[3] for c in calls}
    assert all(c[4] == 1 for c in calls)
    shares = [work[i0:i1].sum() / work.sum() for i0, i1 in ranges]
    assert max(shares) < 0.4 and ranges[0][1] - ranges[0][0] < ranges[-1][1] - ranges[-1][0]
    calls.clear()
    dev.split_over_cores = False
    dev._over_cores(work, lambda k, i0, i1: calls.append((k, i0, i1, threading.get_ident())))
    assert calls == [(0, 0, 30, threading.get_ident())]


def test_more_parts_than_rows():
    """Two rows over eight parts: two ranges of one row; a J/K block of two rows likewise gives the
    one-part J and K."""
    import mp2trn.devices.cpu

    dev = get_device("cpu")
    seen = []
    original = mp2trn.devices.cpu.blas_threads
    try:
        mp2trn.devices.cpu.blas_threads = lambda: 8
        dev._over_cores(np.ones(2), lambda k, i0, i1: seen.append((i0, i1)))
        rng = np.random.default_rng(3)
        nao, nocc = 6, 2
        rows = rng.standard_normal((2, nao * (nao + 1) // 2))
        c = rng.standard_normal((nao, nocc))
        dm = c @ c.T
        split = dev.jk_block(dev.jk_tensor(rows, np.dtype(np.float64)), [(c, 1.0)], dm, True, True)
        mp2trn.devices.cpu.blas_threads = lambda: 1
        whole = dev.jk_block(dev.jk_tensor(rows, np.dtype(np.float64)), [(c, 1.0)], dm, True, True)
    finally:
        mp2trn.devices.cpu.blas_threads = original
    assert sorted(seen) == [(0, 1), (1, 2)]
    for a, b in zip(split, whole):
        assert np.abs(a - b).max() < 1e-13 and np.abs(b).max() > 0.1


def test_one_device_builds_a_larger_then_a_smaller_molecule():
    """The J/K work buffers are kept between builds and only grow: a build for a smaller nao after a larger
    one reads the front of them (the selftest runs several molecules on one device)."""
    rng = np.random.default_rng(5)
    dev = get_device("cpu")
    for nao, nocc in ((9, 3), (6, 2)):
        rows = rng.standard_normal((4, nao * (nao + 1) // 2))
        c = rng.standard_normal((nao, nocc))
        vj, vk = dev.jk_block(dev.jk_tensor(rows, np.dtype(np.float64)), [(c, 1.0)], c @ c.T, True, True)
        b = np.zeros((4, nao, nao))   # the rows unpacked by hand
        il = np.tril_indices(nao)
        for p in range(4):
            b[p][il] = rows[p]
            b[p] = b[p] + np.tril(b[p], -1).T
        z = np.einsum("mi,pmn->pin", c, b)
        assert np.abs(vk - np.einsum("pim,pin->mn", z, z)).max() < 1e-12
        assert np.abs(vj - np.einsum("p,pmn->mn", np.einsum("pmn,mn->p", b, c @ c.T), b)).max() < 1e-12


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("precision", ["fp64", "fp32"])
def test_packed_transform_matches_the_textbook(precision, parts, monkeypatch):
    """The cpu device's AO→MO transform of packed (P|μν) rows (split over ``parts``, two rows unpacked at a
    time, so that each part runs several chunks, the last a short one) equals Σ_μν C_μi (P|μν) C_νa of the unpacked rows (fp64 to 1e-12; fp32: its storage's rounding)."""
    import mp2trn.devices.cpu

    monkeypatch.setattr(mp2trn.devices.cpu, "blas_threads", lambda: parts)
    monkeypatch.setattr(mp2trn.devices.cpu, "_UNPACK_CHUNK_BYTES", 2 * 11 * 11 * 8)   # 2 rows a chunk
    rng = np.random.default_rng(7)
    nao, naux, no, nv = 11, 9, 3, 6
    full = rng.standard_normal((naux, nao, nao))
    full = full + full.transpose(0, 2, 1)
    packed = np.stack([m[np.tril_indices(nao)] for m in full])
    c = rng.standard_normal((nao, no + nv))
    want = np.einsum("pmn,mi,na->pia", full, c[:, :no], c[:, no:])
    dev = mp2trn.devices.cpu.CpuDevice(precision)
    got = dev.ao_to_mo(packed, c[:, :no], c[:, no:])
    assert got.dtype == np.dtype(precision.replace("fp", "float"))
    assert got.shape == (naux, no, nv)
    np.testing.assert_allclose(got, want, rtol=0, atol=(1e-12 if precision == "fp64" else 1e-5) * np.abs(want).max())


@pytest.mark.parametrize("parts", [1, 2, 3])
@pytest.mark.parametrize("precision,rel", [("fp64", 1e-12), ("fp32", 2e-5)])
@pytest.mark.parametrize("coeffs,nva,nvb,vir_k", [((2.0, 1.0), 9, 9, False), ((1 / 3, 1 / 3), 8, 8, False),
                                                  ((1.3, 0.0), 7, 11, True), ((2.0, 1.0), 6, 6, True)])
def test_gradient_pair_step_matches_the_contract(precision, rel, coeffs, nva, nvb, vir_k, parts, monkeypatch):
    """The cpu device's sweep strip (nk = 5: in one part k in columns of two, the last one alone; over 2
    cores one k at a time, ranges of 3 + 2; with 3 BLAS threads one part again, its memory held to two
    parts' worth) against the contract written with whole 4-index tensors: Γ̄ rows, P_ij, P_ab of all i and
    of the k block."""
    import mp2trn.devices.cpu

    from .test_kernel_mp2_density import _contract, _strip

    monkeypatch.setattr(mp2trn.devices.cpu, "blas_threads", lambda: parts)
    strip = _strip(np.random.default_rng(nva + nvb), 17, 4, 5, nva, nvb)
    dev = get_device("cpu", precision)
    out = dev.pair_densities(*strip, *coeffs, vir_k)
    want = _contract(*strip, *coeffs)
    got = [out.gamma_k, out.p_occ, out.p_vir_all] + ([out.p_vir_k] if vir_k else [])
    for g, w in zip(got, want):
        assert np.max(np.abs(np.asarray(g, np.float64) - w)) <= rel * np.max(np.abs(w))
    assert (out.p_vir_k is None) == (not vir_k)


def test_rows_one_at_a_time_to_whichever_core_is_free(monkeypatch):
    """_over_cores(by_row=True): every row exactly once, as a range of one row, on the worker threads (not
    the caller's), k naming the thread; while row 0 is held back, the other thread takes every other row
    (a split into ranges would leave rows 1.. to row 0's thread); one part: one range in the caller."""
    import threading

    import mp2trn.devices.cpu

    monkeypatch.setattr(mp2trn.devices.cpu, "blas_threads", lambda: 2)
    dev = get_device("cpu")
    calls = []
    last_done = threading.Event()

    def run(k, i0, i1):
        if i0 == 0:
            assert last_done.wait(timeout=30)      # held until the other thread has run the last row
        calls.append((k, i0, i1, threading.get_ident()))
        if i0 == 12:
            last_done.set()

    dev._over_cores(np.arange(13, 0, -1, dtype=float), run, by_row=True)
    assert sorted((i0, i1) for _, i0, i1, _ in calls) == [(i, i + 1) for i in range(13)]
    first = next(c[3] for c in calls if c[1] == 0)
    assert [c[1] for c in calls if c[3] == first] == [0]           # row 0's thread ran no other row
    assert {k for k, *_ in calls} <= {0, 1} and threading.get_ident() not in {c[3] for c in calls}
    by_thread = {}
    for k, _, _, ident in calls:
        by_thread.setdefault(ident, set()).add(k)
    assert all(len(ks) == 1 for ks in by_thread.values())          # one k per thread
    calls.clear()
    dev.split_over_cores = False
    dev._over_cores(np.ones(5), lambda k, i0, i1: calls.append((k, i0, i1)), by_row=True)
    assert calls == [(0, 0, 5)]


def test_rows_one_at_a_time_stop_at_an_error(monkeypatch):
    """A row that raises: the error reaches the caller and the other thread takes no more rows."""
    import threading

    import mp2trn.devices.cpu

    monkeypatch.setattr(mp2trn.devices.cpu, "blas_threads", lambda: 2)
    dev = get_device("cpu")
    taken, raised = [], threading.Event()

    def run(k, i0, i1):
        if i0 == 0:
            raised.set()
            raise ValueError("row 0")
        raised.wait(timeout=30)
        taken.append(i0)

    with pytest.raises(ValueError, match="row 0"):
        dev._over_cores(np.ones(200), run, by_row=True)
    assert len(taken) <= 2


def test_fp32_pair_sums_of_full_size_tiles_stay_near_fp64():
    """nva = 256, Inosine/cc-pVDZ's virtual space: the fp32 step sums each tile row's 256 products in fp32 and
    the row sums in fp64. Its os, x and same-spin os − x stay within 1e-6 of the fp64 textbook sums, relative to
    the largest of each (the fp32 GEMMs' and row sums' rounding is far below that; row sums kept in fp16
    instead fail it)."""
    rng = np.random.default_rng(5)
    naux, n, nv = 96, 4, 256
    b = _block(rng, naux, n, nv)
    e_occ, e_vir = -1.0 - rng.random(n), 0.2 + 2.0 * rng.random(nv)
    ref_os, ref_x = _textbook(b, b, e_occ, e_occ, e_vir, e_vir)
    os_, x = get_device("cpu", "fp32").pair_energies(b.astype(np.float32), None, e_occ, e_occ, e_vir, e_vir, True)
    upper = np.triu(np.ones((n, n), dtype=bool))
    for got, want in ((os_, ref_os), (x, ref_x), (os_ - x, ref_os - ref_x)):
        assert np.abs(got - want)[upper].max() <= 1e-6 * np.abs(want[upper]).max()
