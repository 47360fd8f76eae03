"""Run under torchrun by tests/test_parallel.py (not a test module itself).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/distributed_worker.py energies OUT
        the Python API with a process group the caller initialised: molecules of ``CASES``, each rank's
        result written to OUT/<case>.rank<r>.json
    python tests/distributed_worker.py spawn OUT
        two processes from torch.multiprocessing with a file:// process group and no torchrun environment;
        each writes its water result to OUT/spawned.rank<r>.json
    python -m torch.distributed.run --standalone --nproc-per-node 3 tests/distributed_worker.py collectives OUT
        the NKI collective kernels in the emulator, over the gloo fabric, against their NumPy references
        on several sizes; each rank writes OUT/collectives.rank<r>.json
    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/distributed_worker.py neuron OUT
        the ``neuron`` device's path over ranks with a stand-in torch-xla (the "XLA device" is the CPU and a
        kernel call runs in the emulator, collectives over the gloo group standing in for the Neuron
        runtime); each rank writes OUT/neuron.rank<r>.json
    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/distributed_worker.py fail RANK [ARGS]
        `mp2trn run ARGS` through the CLI, with rank RANK raising a ResourceError in its transform step
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mp2trn
from mp2trn.devices.cpu import CpuDevice
from mp2trn.devices.nki_device import SimDevice

ROOT = Path(__file__).resolve().parent.parent


class OneOrbitalBlocks(CpuDevice):
    """The CPU device with pair blocks of one occupied orbital: many blocks per rank, passed in a ring."""

    def occ_block_limit(self, naux: int, nvir: int) -> int:
        return 1


class SimOneOrbitalBlocks(SimDevice):
    """The emulated NeuronCore with one-orbital pair blocks: uneven ring rounds through NKI collectives."""

    def occ_block_limit(self, naux: int, nvir: int) -> int:
        return 1


#: name → (molecule, run options)
CASES = {
    "water_rhf": ("water", {"basis": "cc-pvdz"}),
    "hydroxyl_uhf_small_blocks": ("hydroxyl", {"basis": "cc-pvdz", "device": "one-orbital-blocks"}),
    "methylene_uhf_frozen": ("methylene_triplet", {"basis": "cc-pvdz", "frozen": "auto"}),
    "hydroxyl_rohf_small_blocks": ("hydroxyl", {"basis": "cc-pvdz", "device": "one-orbital-blocks", "reference": "rohf",
                                                "frozen": "auto"}),
    "water_sim": ("water", {"basis": "cc-pvdz", "device": "sim"}),
    "hydroxyl_sim_small_blocks": ("hydroxyl", {"basis": "cc-pvdz", "device": "sim-one-orbital-blocks"}),
    "stannane_ecp": ("heavy/stannane", {"basis": "def2-svp"}),   # the tin ECP over ranks
}


def run_case(name: str) -> mp2trn.MP2Result:
    molecule, options = CASES[name]
    options = dict(options)
    if options.get("device") == "one-orbital-blocks":
        options["device"] = OneOrbitalBlocks()
    elif options.get("device") == "sim-one-orbital-blocks":
        options["device"] = SimOneOrbitalBlocks()
    return mp2trn.run(str(ROOT / "molecules" / f"{molecule}.xyz"), **options)


def energies(out: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")   # the caller's group: mp2trn.run spreads each molecule over it
    for name in CASES:
        result = run_case(name)
        record = {"e_hf": result.e_hf, "e_corr_os": result.e_corr_os, "e_corr_ss": result.e_corr_ss,
                  "e_singles": result.e_singles,
                  "parallel": result.parallel, "scf": result.scf, "notes": result.notes,
                  "cost_stages": (result.cost or {}).get("stages")}
        (out / f"{name}.rank{dist.get_rank()}.json").write_text(json.dumps(record))
    ie = interaction()
    (out / f"interaction.rank{dist.get_rank()}.json").write_text(json.dumps(ie.delta))
    dist.destroy_process_group()


def interaction():
    """The counterpoise-corrected water dimer (S22 #2; ghost atoms in the monomer calculations)."""
    return mp2trn.interaction_energy(str(ROOT / "molecules" / "s22" / "02_water_dimer.xyz"), split=3,
                                     basis="cc-pvdz")


def _spawned(rank: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    result = run_case("water_rhf")
    (Path(out) / f"spawned.rank{rank}.json").write_text(json.dumps(
        {"e_tot": result.e_tot, "ranks": (result.parallel or {}).get("ranks")}))
    dist.destroy_process_group()


def spawn(out: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_spawned, args=(str(out),), nprocs=2)


def collectives(out: Path) -> None:
    import numpy as np
    import torch.distributed as dist

    import mp2trn.nkiemu as nki
    from mp2trn.kernels import collectives as kc
    from mp2trn.nkiemu.collectives import use_fabric
    from mp2trn.parallel import TorchComm, TorchFabric, offsets

    dist.init_process_group("gloo")
    comm = TorchComm()
    r, n = comm.rank, comm.size
    group = tuple(range(n))
    checks = {}

    def words(rank: int, size: int, case: int) -> np.ndarray:
        return np.random.default_rng([rank, size, case]).integers(-2**31, 2**31, (size, 1)).astype(np.int32)

    with use_fabric(TorchFabric(comm)):
        for case, size in enumerate((1, 7, 128, 1000, 4099)):
            sends = [words(p, size, case) for p in range(n)]
            got = nki.simulate(kc.gather_words)(sends[r], group)
            checks[f"gather_{size}"] = bool(np.array_equal(got, kc.gather_words_reference(sends)[r]))
            for step in range(1, n):
                pairs = tuple((p, (p - step) % n) for p in range(n))
                got = nki.simulate(kc.shift_words)(sends[r], pairs)
                checks[f"shift_{size}_{step}"] = bool(np.array_equal(got, kc.shift_words_reference(sends, pairs)[r]))
            # uneven pieces, some empty: rank p sends (p + q + case) % 3 · size // 2 words to rank q
            counts = [[(p + q + case) % 3 * size // 2 for q in range(n)] for p in range(n)]
            metas = [np.array([counts[p], offsets(counts[p])[:-1], [counts[q][p] for q in range(n)]], np.int32)
                     for p in range(n)]
            srcs = [words(p, max(1, sum(counts[p])), case + 10) for p in range(n)]
            recv = max(1, sum(counts[q][r] for q in range(n)))
            got = nki.simulate(kc.all_to_all_words)(srcs[r], metas[r], recv, group)
            want = kc.all_to_all_words_reference(srcs, [m.astype(np.int64) for m in metas], recv)[r]
            used = sum(counts[q][r] for q in range(n))
            checks[f"all_to_all_{size}"] = bool(np.array_equal(got[:used], want[:used]))
    (out / f"collectives.rank{r}.json").write_text(json.dumps(checks))
    dist.destroy_process_group()


def neuron(out: Path) -> None:
    import types

    import numpy as np
    import torch
    import torch.distributed as dist

    import mp2trn.nkiemu as emu
    from mp2trn.devices import get_device, nki_launch
    from mp2trn.nkiemu.collectives import use_fabric
    from mp2trn.parallel import TorchComm, TorchFabric

    dist.init_process_group("gloo")
    xm = types.ModuleType("torch_xla.core.xla_model")
    xm.xla_device = lambda: torch.device("cpu")
    xm.mark_step = lambda: None
    pkg, core = types.ModuleType("torch_xla"), types.ModuleType("torch_xla.core")
    pkg.core, core.xla_model = core, xm
    sys.modules.update({"torch_xla": pkg, "torch_xla.core": core, "torch_xla.core.xla_model": xm})
    nki_launch.neuron_missing = lambda: None
    runtime = TorchFabric(TorchComm())   # the stand-in for the Neuron runtime's collectives
    kernels = set()

    def call(kernel, args, kwargs):
        assert all(not isinstance(a, np.ndarray) for a in args)           # inputs are device tensors
        with use_fabric(runtime):
            # bf16 planes (the SCF's compensated fp32x3 builds) cross as int16 views: NumPy has no bf16
            host = [a.view(torch.int16).numpy().view(np.dtype("bfloat16")) if getattr(a, "dtype", None) == torch.bfloat16
                    else (a.numpy() if isinstance(a, torch.Tensor) else a) for a in args]
            got = emu.simulate(kernel, target="trn1")(*host, **kwargs)
        kernels.add(kernel.__name__)
        def conv(o):   # a bf16 output (resplit_x3's hi plane) travels as its int16 bits, as the inputs do
            o = np.ascontiguousarray(o)
            if o.dtype == np.dtype("bfloat16"):
                return torch.from_numpy(o.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(o)
        return tuple(conv(o) for o in got) if isinstance(got, tuple) else conv(got)

    device = get_device("neuron", "fp32")
    device.launcher.call = call
    result = mp2trn.run(str(ROOT / "molecules" / "hydroxyl.xyz"), basis="cc-pvdz", device=device)
    (out / f"neuron.rank{dist.get_rank()}.json").write_text(json.dumps(
        {"e_hf": result.e_hf, "e_corr": result.e_corr, "backend": result.parallel["backend"],
         "kernels": sorted(kernels)}))
    dist.destroy_process_group()


def fail(rank: int, args: list[str]) -> None:
    import os

    from mp2trn import dfmp2
    from mp2trn.cli import app
    from mp2trn.errors import ResourceError

    real = dfmp2.build_shared_b

    def failing(*a, **k):
        if int(os.environ["RANK"]) == rank:
            raise ResourceError("the scratch disk of this rank is full (injected by the test)")
        return real(*a, **k)

    dfmp2.build_shared_b = failing
    app(["run", *args], prog_name="mp2trn")


if __name__ == "__main__":
    if sys.argv[1] == "energies":
        energies(Path(sys.argv[2]))
    elif sys.argv[1] == "neuron":
        neuron(Path(sys.argv[2]))
    elif sys.argv[1] == "collectives":
        collectives(Path(sys.argv[2]))
    elif sys.argv[1] == "spawn":
        spawn(Path(sys.argv[2]))
    else:
        fail(int(sys.argv[2]), sys.argv[3:])
