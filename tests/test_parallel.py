"""One molecule over two ranks (torchrun, gloo on CPU): energies equal to one rank's, each rank holding
about half of B, rank 0 alone printing and writing, and a failing rank ending the whole run with its
message. The ring schedule of the pair step is checked for every rank count without processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mp2trn
from mp2trn.energy import _ring_share
from mp2trn.parallel import Comm, balanced_counts, offsets, weighted_split

from .conftest import ROOT, molecule_path

WORKER = str(ROOT / "tests" / "distributed_worker.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _launch(args: list[str], tmp_path, ranks: int = 2) -> subprocess.CompletedProcess:
    pytest.importorskip("torch.distributed")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TMPDIR"] = str(tmp_path)
    torchrun = [*TORCHRUN[:-1], str(ranks)]
    return subprocess.run([*torchrun, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_nki_collective_kernels_over_three_ranks(tmp_path):
    """all_gather, collective_permute (every ring step) and all_to_all_v (uneven, some pieces empty) in
    the emulator over the gloo fabric, against the kernels' NumPy references, for sizes 1 to 4099 words."""
    proc = _launch([WORKER, "collectives", str(tmp_path)], tmp_path, ranks=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in range(3):
        checks = json.loads((tmp_path / f"collectives.rank{r}.json").read_text())
        assert len(checks) == 5 * 4 and all(checks.values()), {k: v for k, v in checks.items() if not v}


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    """Every case of the worker run once over two ranks: {case: [rank 0 record, rank 1 record]}."""
    out = tmp_path_factory.mktemp("ranks")
    proc = _launch([WORKER, "energies", str(out)], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from .distributed_worker import CASES

    return {name: [json.loads((out / f"{name}.rank{r}.json").read_text()) for r in range(2)]
            for name in [*CASES, "interaction"]}


def _one_rank(name: str) -> mp2trn.MP2Result:
    from .distributed_worker import run_case

    return run_case(name)


@pytest.mark.parametrize("name", ["water_rhf", "hydroxyl_uhf_small_blocks", "methylene_uhf_frozen", "stannane_ecp",
                                  "hydroxyl_rohf_small_blocks"])
def test_two_ranks_give_the_one_rank_energies(two_rank_results, name):
    ref = _one_rank(name)
    for record in two_rank_results[name]:   # every rank returns the same result
        assert abs(record["e_hf"] - ref.e_hf) <= 1e-10
        assert abs(record["e_corr_os"] - ref.e_corr_os) <= 1e-10
        assert abs(record["e_corr_ss"] - ref.e_corr_ss) <= 1e-10
        assert abs(record["e_singles"] - ref.e_singles) <= 1e-10
        assert record["scf"]["ranks"] == 2 and "this rank's" in record["scf"]["tensor"]


def test_interaction_energy_over_two_ranks(two_rank_results):
    """Ghost atoms (counterpoise monomers) over ranks: every ΔE component as on one rank."""
    from .distributed_worker import interaction

    ref = interaction().delta
    for delta in two_rank_results["interaction"]:
        assert set(delta) == set(ref)
        assert all(abs(delta[k] - ref[k]) <= 1e-10 for k in ref)


@pytest.mark.parametrize("name", ["water_sim", "hydroxyl_sim_small_blocks"])
def test_sim_device_runs_per_rank_through_the_emulator(two_rank_results, name):
    """Kernels and the arrays between ranks both go through the emulator: the tensors, J/K, B blocks
    (UHF with one-orbital blocks: ring rounds where a rank only sends or only receives) and the sums
    travel in the NKI collective kernels, whose launches the cost report counts."""
    ref = _one_rank(name)
    for record in two_rank_results[name]:
        assert record["scf"]["jk"] == "device sim"
        # fp32 kernels: the ranks sum in another order and block the pairs differently than one rank does
        # the SCF ends in compensated fp32x3 builds on the device (issue 33), whose sums the ranks split
        # differently: the documented bound of a sim SCF against fp64 (1e-8 Eh) holds between the splits
        assert abs(record["e_hf"] - ref.e_hf) <= 1e-8
        assert abs(record["e_corr_os"] + record["e_corr_ss"] - ref.e_corr) <= 2e-7
        parallel = record["parallel"]
        assert parallel["backend"].startswith("nki collectives (emulator)")
        assert all(r["modeled_device_s"]["trn1"] > 0 for r in parallel["per_rank"])   # each rank priced its own
        assert all(r["bytes_sent"].get(k, 0) > 0 for r in parallel["per_rank"]
                   for k in ("scf_tensor", "scf_jk", "ao_to_mo", "reduce"))
        comm = record["cost_stages"]["comm"]
        assert set(comm["kernels"]) == {"all_to_all_words", "shift_words", "gather_words"}
        assert comm["launches"] > 0 and comm["trn1"]["modeled_time_s"] > 0


def test_neuron_device_over_ranks_with_a_stand_in_runtime(tmp_path):
    """The neuron path over two ranks: its NKI collective kernels launched on (stand-in) XLA tensors like
    the compute kernels, the stand-in runtime moving the words between the processes."""
    proc = _launch([WORKER, "neuron", str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = mp2trn.run(molecule_path("hydroxyl"), basis="cc-pvdz", device="sim")
    for r in range(2):
        got = json.loads((tmp_path / f"neuron.rank{r}.json").read_text())
        assert got["backend"].startswith("nki collectives (real)")
        assert {"all_to_all_words", "shift_words", "gather_words"} <= set(got["kernels"])
        # the SCF ends in fp32x3 device builds split over the ranks: the sim SCF's 1e-8 Eh bound
        assert abs(got["e_hf"] - ref.e_hf) <= 1e-8 and abs(got["e_corr"] - ref.e_corr) <= 2e-7


@pytest.mark.parametrize("name", ["water_rhf", "hydroxyl_uhf_small_blocks"])
def test_each_rank_holds_its_share_of_b_and_counts_its_traffic(two_rank_results, name):
    parallel = two_rank_results[name][0]["parallel"]
    assert parallel["ranks"] == 2 and parallel["backend"] == "gloo"
    ranks = parallel["per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["b_share_fraction"] <= 0.6 for r in ranks)
    assert sum(r["b_share_fraction"] for r in ranks) == pytest.approx(1.0)
    for r in ranks:
        assert r["peak_memory_mb"] > 0
        assert set(r["bytes_sent"]) <= {"scf_tensor", "scf_jk", "ao_to_mo", "pairs", "reduce"}
        assert all(r["bytes_sent"][k] > 0 for k in ("scf_tensor", "scf_jk", "ao_to_mo", "reduce"))
    # B blocks travel only to the rank that pairs them (water: one block per rank, rank 0 takes the pair)
    assert sum(r["bytes_sent"].get("pairs", 0) for r in ranks) > 0


def test_cli_over_two_ranks_prints_and_writes_once(tmp_path):
    out = tmp_path / "water.json"
    proc = _launch(["-m", "mp2trn", "run", str(molecule_path("water")), "--json", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("DF-MP2 energies") == 1 and proc.stdout.count("JSON written") == 1
    doc = json.loads(out.read_text())
    assert doc["extras"]["mp2trn"]["parallel"]["ranks"] == 2
    assert abs(doc["return_result"] - mp2trn.run(molecule_path("water")).e_tot) <= 1e-10


@pytest.mark.parametrize("name, flags", [("water", []), ("hydroxyl", ["--frozen-core", "auto"])])
def test_gradient_over_two_ranks_equals_one_rank(tmp_path, name, flags):
    """Each rank runs its share of the pair strips, the fitting-basis pass and the JK-fit derivative
    blocks; the all-reduced gradient is the one-rank gradient."""
    out = tmp_path / f"{name}.json"
    proc = _launch(["-m", "mp2trn", "run", str(molecule_path(name)), "--gradient", "--json", str(out), *flags],
                   tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["driver"] == "gradient" and "2 ranks" in doc["extras"]["mp2trn"]["gradient"]
    one = mp2trn.run(molecule_path(name), gradient=True, frozen="auto" if flags else None)
    assert np.max(np.abs(np.asarray(doc["return_result"]) - one.gradient.ravel())) <= 1e-9


@pytest.mark.parametrize("failing", [1, 0])
def test_a_failing_rank_ends_every_rank_with_its_message(tmp_path, failing):
    out = tmp_path / "never.json"
    proc = _launch([WORKER, "fail", str(failing), str(molecule_path("water")), "--json", str(out)], tmp_path)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    prefix = f"rank {failing}: " if failing else ""
    assert ours == [f"error: {prefix}the scratch disk of this rank is full (injected by the test)"]
    assert "exitcode  : 4" in proc.stderr            # each rank exits with the error's code, none hangs
    ranks_output = proc.stderr.split("elastic/multiprocessing")[0]   # before torchrun's own failure report
    assert "Traceback" not in ranks_output
    assert not out.exists()


def test_python_api_uses_a_group_the_caller_started_without_torchrun(tmp_path):
    """torch.multiprocessing + a file:// rendezvous: no RANK/WORLD_SIZE in the environment."""
    pytest.importorskip("torch.distributed")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, WORKER, "spawn", str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = _one_rank("water_rhf").e_tot
    for r in range(2):
        record = json.loads((tmp_path / f"spawned.rank{r}.json").read_text())
        assert record["ranks"] == 2 and abs(record["e_tot"] - ref) <= 1e-10


def test_a_run_asking_for_ranks_without_any_is_an_error():
    try:
        import torch.distributed  # noqa: F401
    except ImportError:   # the README's test command installs no torch: the error says to install it
        with pytest.raises(mp2trn.DeviceUnavailableError, match="needs PyTorch"):
            mp2trn.run(molecule_path("water"), distributed=True)
        return
    with pytest.raises(mp2trn.InputError, match="torchrun"):
        mp2trn.run(molecule_path("water"), distributed=True)


# -- the schedule, without processes ------------------------------------------------------------------------

# Hypothesis draws the same examples every run (derandomize): CI must not fail by chance
@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 7), st.lists(st.integers(0, 5), min_size=7, max_size=7), st.booleans())
def test_ring_covers_every_block_pair_once(size, nblocks, same):
    """Over all ranks and ring steps, every (i-block, j-block) pair is formed exactly once (same spin:
    every unordered pair once, diagonal blocks on their own rank)."""
    blocks = [[(r, k) for k in range(nblocks[r])] for r in range(size)]
    formed = []
    for r in range(size):
        for step in range(size):
            q = (r + step) % size
            if same and step == 0:
                mine = blocks[r]
                formed += [frozenset((x, y)) for k, x in enumerate(mine) for y in mine[k:]]
                continue
            for y, rows in _ring_share(r, q, step, size, blocks[r], blocks[q], same):
                formed += [frozenset((x, y)) if same else (x, y) for x in rows]
    everything = [b for bl in blocks for b in bl]
    if same:
        want = [frozenset((x, y)) for k, x in enumerate(everything) for y in everything[k:]]
    else:
        want = [(x, y) for x in everything for y in everything]
    if same:
        assert sorted(map(sorted, formed)) == sorted(map(sorted, want))
    else:
        assert sorted(formed) == sorted(want)


def test_ring_shares_the_pair_work_evenly():
    """Two ranks with three blocks each: 6 diagonal-triangle pairs each, and the 3 × 3 rectangle split
    5 / 4 (not 6 / 3)."""
    blocks = [[(0, k) for k in range(3)], [(1, k) for k in range(3)]]
    work = [sum(len(rows) for _, rows in _ring_share(r, 1 - r, 1, 2, blocks[r], blocks[1 - r], True)) for r in (0, 1)]
    assert work == [5, 4]


@settings(deadline=None, derandomize=True)
@given(st.lists(st.floats(0, 100), min_size=1, max_size=40), st.integers(1, 8))
def test_weighted_split_is_contiguous_and_complete(weights, size):
    ranges = weighted_split(weights, size)
    assert len(ranges) == size
    assert ranges[0][0] == 0 and ranges[-1][1] == len(weights)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_counts_and_a_single_rank_comm():
    assert balanced_counts(5, 2) == [3, 2] and offsets([3, 2]) == [0, 3, 5]
    comm = Comm()
    x = np.arange(6.0).reshape(2, 3)
    assert comm.allreduce(x, "s") is x and comm.rows_to_cols(x, [2], [3], "s") is x
    assert comm.gather("a") == ["a"]
