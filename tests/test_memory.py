"""The memory budget: blocks that fit, B on disk when it does not fit, a clear error when nothing fits."""

from __future__ import annotations

import platform
import re
import sys

import numpy as np
import pytest

import mp2trn
from mp2trn.errors import ResourceError
from mp2trn.memory import SpinShape, plan_blocks, prefaulted_empty

from .conftest import scf_for


def test_budget_smaller_than_b_tensor_gives_same_energy():
    mf = scf_for("benzene", "cc-pvdz")
    full = mp2trn.DFMP2(mf).run()
    sizes = full.result.sizes
    b_mb = sizes["naux"] * sizes["nocc"] * sizes["nvir"] * 8 / 1e6
    budget = 0.7 * b_mb  # smaller than the whole B tensor
    small = mp2trn.DFMP2(mf, max_memory=budget).run()
    w = small.result.what_ran
    assert w["out_of_core"] is True
    assert w["aux_block"] < sizes["naux"]  # AO integrals came in several blocks
    assert w["occ_block"] < sizes["nocc"]  # and the pair step in several blocks
    assert abs(small.e_corr - full.e_corr) <= 1e-10
    assert abs(small.e_corr_os - full.e_corr_os) <= 1e-10


def test_uhf_out_of_core_same_energy(monkeypatch):
    import mp2trn.memory

    mf = scf_for("oxygen_triplet", "cc-pvdz")
    full = mp2trn.DFMP2(mf).run()
    monkeypatch.setattr(mp2trn.memory, "_INCORE_SHARE", 0.0)  # force both spins' B onto disk
    small = mp2trn.DFMP2(mf, max_memory=50).run()
    assert small.result.what_ran["out_of_core"] is True
    assert abs(small.e_corr - full.e_corr) <= 1e-10


def test_budget_too_small_is_an_error_before_heavy_work(water_rhf, monkeypatch):
    import mp2trn.transform as transform

    def must_not_run(*args, **kwargs):  # pragma: no cover - reaching it is the failure
        raise AssertionError("heavy work started despite an impossible budget")

    monkeypatch.setattr(transform.DFIntegrals, "ao_blocks", must_not_run)
    with pytest.raises(ResourceError, match="too small.*raise --memory"):
        mp2trn.DFMP2(water_rhf, max_memory=0.05).run()


def test_plan_rejects_metric_that_does_not_fit():
    with pytest.raises(ResourceError, match="metric"):
        plan_blocks(nao=500, naux=5000, spins=[SpinShape(50, 450)], max_aux_shell=11, budget_mb=100)


def test_plan_keeps_b_in_memory_when_it_fits():
    plan = plan_blocks(nao=100, naux=400, spins=[SpinShape(10, 90)], max_aux_shell=11, budget_mb=4000)
    assert plan.incore and plan.aux_block == 400 and plan.occ_block == 10


def test_pyscf_max_memory_env_is_the_default(monkeypatch):
    from mp2trn.memory import default_memory_mb

    monkeypatch.setenv("PYSCF_MAX_MEMORY", "1234")
    assert default_memory_mb() == 1234.0


@pytest.mark.parametrize("shape, dtype", [((3, 4), np.float64), ((70, 330, 330), np.float64),
                                          ((41, 331, 331), np.float32)])
def test_prefaulted_empty_is_a_writable_zeroed_c_array(shape, dtype):
    # the two middle cases are above the size where the pages are mapped ahead by threads
    a = prefaulted_empty(shape, dtype)
    assert a.shape == shape and a.dtype == dtype
    assert a.flags.c_contiguous and a.flags.writeable
    assert not a.any()
    a[...] = 2.5
    a[-1, ...] = -1.0
    assert a.sum() == pytest.approx(2.5 * (a.size - a[-1].size) - a[-1].size)


def test_prefaulted_empty_survives_its_views():
    a = prefaulted_empty((80, 330, 330))
    view = a[40:]
    del a
    view[...] = 1.0   # the mapping belongs to the array chain, not to a local name
    assert view.sum() == view.size


_PEAK_CHILD = """
import json, sys
from mp2trn.memory import peak_rss_mb
from mp2trn.pipeline import run
res = run(sys.argv[1], basis="cc-pvtz", max_memory=float(sys.argv[2]))
print(json.dumps({"peak_mb": peak_rss_mb(), "tensor": res.scf["tensor"]}))
"""


def _peak_run(path: str, memory_mb: float) -> dict:
    import json
    import subprocess
    import sys

    from .conftest import ROOT

    done = subprocess.run([sys.executable, "-c", _PEAK_CHILD, path, str(memory_mb)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_small_budget_streams_the_scf_tensor_and_is_honoured():
    """Benzene/cc-pVTZ's packed SCF tensor (183 MB) does not fit half of a 150 MB budget: the J/K builds
    stream it, and the whole run's peak RSS stays within the budget above a water run's (the fixed cost of
    Python, NumPy and PySCF), measured in fresh processes (measured: +121 MB)."""
    budget = 150.0
    fixed = _peak_run("molecules/water.xyz", budget)["peak_mb"]
    got = _peak_run("molecules/benzene.xyz", budget)
    assert got["tensor"].startswith("streamed")
    assert got["peak_mb"] - fixed <= budget, (got, fixed)


def test_gradient_plan_streams_b_in_pairs_when_one_spin_does_not_fit():
    """Inosine/cc-pVDZ's shapes: at 300 MB one spin's B (177 MB) does not fit beside a strip, so the sweep
    reads B in pairs of occupied blocks; at 4 GB everything stays in memory; every stage's planned peak is
    within the budget, and the smallest budget named by the refusal is one that plans."""
    from mp2trn.memory import ChannelShape, GradientSizes, plan_gradient

    sizes = GradientSizes(nao=326, naux=1232, max_aux_shell=7, naux_jk=1606, max_jk_shell=9,
                          channels=(ChannelShape(70, 70, 256),), itemsize=8)
    small, large = plan_gradient(sizes, 300), plan_gradient(sizes, 4000)
    assert not small.stores_incore and 0 < small.pair_block < 35 and not small.response_factors
    assert "pairs of" in small.residency()["pair_sweep"]
    assert large.stores_incore and large.pair_block == 0 and large.response_factors and large.jk_half_incore
    for plan in (small, large):
        assert max(plan.stage_mb.values()) <= plan.budget_mb
    with pytest.raises(ResourceError, match=r"smallest budget this gradient fits is (\d+) MB") as err:
        plan_gradient(sizes, 100)
    smallest = float(re.search(r"fits is (\d+) MB", str(err.value)).group(1))
    assert plan_gradient(sizes, smallest + 1).budget_mb == smallest + 1
    with pytest.raises(ResourceError):
        plan_gradient(sizes, 0.97 * smallest)


def test_gradient_integral_blocks_are_capped_whatever_the_budget():
    """The fitting-basis and JK-fit derivative passes take blocks of at most MAX_GRADIENT_BLOCK_BYTES of
    nao² squares (a whole-budget block was slower, from page faults), fewer when the budget is small, and
    never less than one shell."""
    from mp2trn.memory import MAX_GRADIENT_BLOCK_BYTES, ChannelShape, GradientSizes, plan_gradient

    sizes = GradientSizes(nao=326, naux=1232, max_aux_shell=7, naux_jk=1606, max_jk_shell=9,
                          channels=(ChannelShape(70, 70, 256),), itemsize=8)
    cap = int(MAX_GRADIENT_BLOCK_BYTES // (326 * 326 * 8))
    large, small = plan_gradient(sizes, 64000), plan_gradient(sizes, 600)
    assert large.ri_aux_block == large.jk_aux_block == cap < 1232
    assert 7 <= small.ri_aux_block < cap and 9 <= small.jk_aux_block < cap
    huge = GradientSizes(nao=4000, naux=9000, max_aux_shell=11, naux_jk=12000, max_jk_shell=13,
                         channels=(ChannelShape(300, 300, 3700),), itemsize=8)
    assert plan_gradient(huge, 2e6).jk_aux_block == 13     # one shell beats the cap


def test_gradient_plan_fits_the_strips_into_a_device_memory():
    """A device with its own memory (Device.memory_mb) smaller than one spin's B makes the sweep read B in
    pairs of occupied blocks even when the host budget keeps everything in memory."""
    from mp2trn.memory import ChannelShape, GradientSizes, plan_gradient

    sizes = GradientSizes(nao=326, naux=1232, max_aux_shell=7, naux_jk=1606, max_jk_shell=9,
                          channels=(ChannelShape(70, 70, 256),), itemsize=4)
    assert plan_gradient(sizes, 8000).pair_block == 0
    on_device = plan_gradient(sizes, 8000, device_mb=60)
    assert on_device.stores_incore and 0 < on_device.pair_block < 35
    assert 1232 * 2 * on_device.pair_block * 256 * 4 < 60e6


def test_gradient_budget_too_small_is_refused_before_the_scf(monkeypatch):
    """A gradient whose smallest block cannot fit is refused before any SCF cycle, naming the budget that
    would fit; the same budget without --gradient runs (the energy alone fits it)."""
    import mp2trn.pipeline as pipeline

    def must_not_run(*args, **kwargs):  # pragma: no cover - reaching it is the failure
        raise AssertionError("the SCF started despite a gradient that cannot fit the budget")

    monkeypatch.setattr(pipeline, "run_scf", must_not_run)
    with pytest.raises(ResourceError, match=r"gradient's .*smallest budget this gradient fits is \d+ MB"):
        mp2trn.run("molecules/benzene.xyz", basis="cc-pvdz", max_memory=15, gradient=True)
    with pytest.raises(AssertionError, match="the SCF started"):
        mp2trn.run("molecules/benzene.xyz", basis="cc-pvdz", max_memory=15)


def test_optimize_with_a_budget_too_small_is_refused_before_the_scf(monkeypatch, tmp_path):
    """optimize runs the gradient at every step: the same refusal, before the first step's SCF."""
    import mp2trn.pipeline as pipeline
    from mp2trn.geomopt import optimize
    from mp2trn.options import RunOptions

    monkeypatch.setattr(pipeline, "run_scf", lambda *a, **k: pytest.fail("the SCF started"))
    from mp2trn.pipeline import open_device

    options = RunOptions(basis="cc-pvdz", gradient=True, max_memory=15)
    with open_device(options) as device, \
            pytest.raises(ResourceError, match=r"smallest budget this gradient fits is \d+ MB"):
        optimize("molecules/benzene.xyz", options, device, trajectory=tmp_path / "opt.xyz")


_GRADIENT_PEAK_CHILD = """
import json, sys
from mp2trn.memory import peak_rss_mb
from mp2trn.pipeline import run
res = run(sys.argv[1], basis=sys.argv[2], max_memory=float(sys.argv[3]), gradient=True)
print(json.dumps({"peak_mb": peak_rss_mb(), "tensor": res.scf["tensor"], "out_of_core": res.what_ran["out_of_core"],
                  "gradient_memory": res.what_ran["gradient_memory"], "gradient": res.gradient.tolist()}))
"""


def _gradient_peak(path: str, basis: str, memory_mb: float) -> dict:
    import json
    import subprocess
    import sys

    from .conftest import ROOT

    done = subprocess.run([sys.executable, "-c", _GRADIENT_PEAK_CHILD, path, basis, str(memory_mb)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_within_budget(path: str, basis: str, budget: float) -> dict:
    """The energy and gradient run of ``path`` at ``budget`` MB in a fresh process: its peak RSS within the
    budget plus a water/cc-pVDZ gradient run's at the same budget (the interpreter's and libraries' fixed
    cost, measured, its own arrays a few hundred kB), plus 10 %."""
    fixed = _gradient_peak("molecules/water.xyz", "cc-pvdz", budget)["peak_mb"]
    got = _gradient_peak(path, basis, budget)
    assert got["peak_mb"] <= 1.1 * (fixed + budget), (got["peak_mb"], fixed, got["gradient_memory"])
    return got


def test_energy_and_gradient_stay_within_a_small_budget():
    """Formaldehyde/cc-pVTZ at 13 MB: the SCF's JK-fit tensor (6.8 MB packed) does not fit half the budget
    and is streamed, and the response's MO blocks of it (B_vv alone 11 MB) are not made (J/K builds
    instead); the whole run stays within the budget. (B itself, 1.1 MB, fits: the slow benzene case below
    streams it too.)"""
    got = _check_within_budget("molecules/formaldehyde.xyz", "cc-pvtz", 13.0)
    assert got["tensor"].startswith("streamed")
    assert got["gradient_memory"]["response_jkfit_mo_blocks"].startswith("not made")


@pytest.mark.slow
def test_benzene_gradient_stays_within_a_small_budget():
    """Benzene/cc-pVDZ at 30 MB: the gradient's B (6.6 MB) and Γ̄ streamed from HDF5, the JK-fit tensor
    (29 MB) streamed by the SCF and not kept by the response; peak RSS within the budget above the fixed
    cost (it was not, by 4 MB, while glibc kept freed blocks of up to 32 MB: memory.return_freed_memory)."""
    got = _check_within_budget("molecules/benzene.xyz", "cc-pvdz", 30.0)
    assert got["tensor"].startswith("streamed")
    assert got["gradient_memory"]["B"].startswith("streamed") and got["gradient_memory"]["Gamma"].startswith("streamed")


@pytest.mark.slow
def test_benzene_gradient_whose_response_builds_the_scf_tensor_stays_within_the_budget():
    """Benzene/cc-pVDZ at 60 MB: the SCF's tensor (29 MB) is resident in the SCF and freed after it, and the
    response, with no room for its MO blocks, runs J/K builds that make it again. Those builds' work buffers
    (2 × 16 MB of Z rows for the response's wide density factors) were neither bounded by the budget nor
    freed after the response, and the run peaked 95 MB above water's at a 60 MB budget; now the J/K stage
    holds them to a tenth of its budget and the gradient drops them with the tensor."""
    got = _check_within_budget("molecules/benzene.xyz", "cc-pvdz", 60.0)
    assert got["tensor"].startswith("resident")
    assert got["gradient_memory"]["response_jkfit_mo_blocks"].startswith("not made")


_FREED_CHILD = """
import sys
import numpy as np
from mp2trn.memory import return_freed_memory

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6

fixed = return_freed_memory() if sys.argv[1] == "1" else False
a = np.ones(30_000_000 // 8); del a         # glibc's default: freeing this raises its mmap threshold
before = rss_mb()
b = np.ones(20_000_000 // 8)                 # then this comes from the heap,
c = np.ones(1000)                            # this lands above it,
del b                                        # and the 20 MB stay in the process
print(fixed, rss_mb() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_arrays_leave_the_process():
    """With memory.return_freed_memory a freed 20 MB array leaves the RSS; without it, after a larger block
    was freed first, glibc keeps it (the case that put a benzene gradient 4 MB over its budget)."""
    import subprocess

    def grown(fix: str) -> tuple[str, float]:
        out = subprocess.run([sys.executable, "-c", _FREED_CHILD, fix], capture_output=True, text=True, check=True)
        fixed, mb = out.stdout.split()
        return fixed, float(mb)

    assert grown("0")[1] > 15.0
    fixed, mb = grown("1")
    assert fixed == "True" and mb < 2.0


@pytest.mark.parametrize("buffers", [1, 2])
def test_ao_blocks_unpacked_from_packed_integrals_equal_all_pairs(buffers):
    """The unpacked AO blocks (computed for μ ≥ ν in sub-blocks and unpacked into the reused buffers) equal
    PySCF's integrals over all ordered pairs (``s1``) to 1e-13, for one-shell and many-shell blocks; the
    packed blocks are their lower triangles."""
    from pyscf import df, gto, lib

    from mp2trn.df import DFIntegrals

    mol = gto.M(atom="O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45", basis="cc-pvdz", verbose=0)
    auxmol = df.make_auxmol(mol, "cc-pvdz-ri")
    dfi = DFIntegrals(mol, auxmol, "cc-pvdz-ri", np.eye(auxmol.nao_nr()))
    want = (mol + auxmol).intor("int3c2e", aosym="s1", shls_slice=(0, mol.nbas, 0, mol.nbas, mol.nbas,
                                                                    mol.nbas + auxmol.nbas)).T
    for max_functions in (1, 7, 40):    # one shell a block (s1 straight into the buffer), a few, many
        got = np.concatenate([ao.copy() for _, _, ao in dfi.ao_blocks(max_functions, buffers=buffers)])
        assert got.shape == want.shape and np.max(np.abs(got - want)) < 1e-13
        packed = np.concatenate([ao.copy() for _, _, ao in dfi.ao_blocks(max_functions, packed=True)])
        assert np.max(np.abs(lib.unpack_tril(packed) - want)) < 1e-13


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_kept_rows_hold_every_blocks_integrals(packed):
    """Blocks written into :meth:`DFIntegrals.keep_rows`' array (``into``) are views of it and leave it equal to
    the blocks of the reused buffers, packed or not; the gradient's RI pass reads them from there
    (tests/test_reuse.py compares its gradient with one that computes them)."""
    from pyscf import df, gto

    from mp2trn.df import DFIntegrals, tensor_rows_unpacked

    mol = gto.M(atom="O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45", basis="cc-pvdz", verbose=0)
    auxmol = df.make_auxmol(mol, "cc-pvdz-ri")
    dfi = DFIntegrals(mol, auxmol, "cc-pvdz-ri", np.eye(auxmol.nao_nr()))
    rows = dfi.keep_rows(packed)
    assert rows.nbytes / 1e6 == pytest.approx(DFIntegrals.rows_mb(mol.nao_nr(), auxmol.nao_nr(), packed))
    for _, _, ao in dfi.ao_blocks(7, packed=packed, into=rows):
        assert np.shares_memory(ao, rows)
    want = np.concatenate([ao.copy() for _, _, ao in dfi.ao_blocks(7, packed=packed)])
    assert np.array_equal(rows.reshape(want.shape), want)
    assert tensor_rows_unpacked(rows[3:9]).shape == (6, mol.nao_nr(), mol.nao_nr())
