"""The SCF's J/K builds on the devices against PySCF's density-fitted get_jk, and whole SCFs against
PySCF's DF-SCF (fp64 builds, and the mixed-precision schedule)."""

from __future__ import annotations

import numpy as np
import pytest
from pyscf import df, scf

import mp2trn
import mp2trn.devices.cpu
from mp2trn.devices import get_device
from mp2trn.errors import InputError
from mp2trn.jk import density_factors, density_fit_jk
from mp2trn.molecule import build_mole
from mp2trn.precision import get_precision

from .conftest import molecule_path

GHOST_WATER = "3\nwater with a ghost O\nGh(O) 0 0 0.1173\nH 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692\n"
#: fp32 builds: |ΔJ|, |ΔK| relative to max |J|, |K| (measured ≤ 2e-7 on these molecules and 1e-5 absolute
#: on Inosine/cc-pVDZ, scripts/bench_jk.py); the SCF never converges on them (fp64 builds finish it)
FP32_REL = 2e-6


def _devices():
    out = ["cpu"]
    try:
        import torch  # noqa: F401

        out.append("cuda:cpu")  # the torch backend on CPU torch, as tests/test_torch_backend.py
    except ImportError:
        pass
    return out


def _device(name, precision):
    if name == "cuda:cpu":
        return get_device("cuda", precision, torch_device="cpu")
    return get_device(name, precision)


def _converged(source, basis="cc-pvdz", **kw):
    mol = build_mole(source, basis=basis, **kw)
    mf = (scf.RHF(mol) if mol.spin == 0 else scf.UHF(mol)).density_fit()
    mf.conv_tol = 1e-10
    mf.verbose = 0
    mf.kernel()
    return mf


def _fresh(ref):
    """A new, unconverged density-fitted SCF object of the same kind as ``ref``."""
    return (scf.UHF if isinstance(ref, scf.uhf.UHF) else scf.RHF)(ref.mol).density_fit()


@pytest.fixture(scope="module")
def references():
    return {"water": _converged(molecule_path("water")), "hydroxyl": _converged(molecule_path("hydroxyl")),
            "ghost": _converged(GHOST_WATER)}


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("name", ["water", "hydroxyl", "ghost"])
@pytest.mark.parametrize("tagged", [True, False], ids=["with-orbitals", "bare-dm"])
def test_j_and_k_match_pyscf(references, device, name, tagged):
    ref = references[name]
    dm = ref.make_rdm1()
    vj0, vk0 = ref.get_jk(ref.mol, dm)
    mf = density_fit_jk(_fresh(ref), device=_device(device, "fp64"))
    vj, vk = mf.get_jk(ref.mol, dm if tagged else np.asarray(dm))
    assert vj.shape == vj0.shape and vk.shape == vk0.shape
    assert np.abs(vj - vj0).max() < 1e-10 and np.abs(vk - vk0).max() < 1e-10
    assert np.abs(vk0).max() > 0.1  # a real exchange matrix
    mf32 = density_fit_jk(_fresh(ref), device=_device(device, "fp32"))
    vj, vk = mf32.get_jk(ref.mol, dm)
    assert np.abs(vj - vj0).max() < FP32_REL * np.abs(vj0).max()
    assert np.abs(vk - vk0).max() < FP32_REL * np.abs(vk0).max()
    assert np.abs(vk - vk0).max() > 0  # it really ran in fp32


def test_difference_density_and_j_or_k_alone(references):
    ref = references["water"]
    dm = np.asarray(ref.make_rdm1())
    ddm = dm - ref.get_init_guess()  # indefinite: positive and negative eigen-factors
    assert [s for _, s in density_factors(ddm)[0]] == [1.0, -1.0]
    mf = density_fit_jk(scf.RHF(ref.mol).density_fit())
    vj0, vk0 = ref.get_jk(ref.mol, ddm)
    vj, vk = mf.get_jk(ref.mol, ddm)
    assert np.abs(vj - vj0).max() < 1e-10 and np.abs(vk - vk0).max() < 1e-10
    assert np.abs(mf.get_jk(ref.mol, dm, with_k=False)[0] - ref.get_jk(ref.mol, dm)[0]).max() < 1e-10
    assert np.abs(mf.get_jk(ref.mol, dm, with_j=False)[1] - ref.get_jk(ref.mol, dm)[1]).max() < 1e-10


def test_tensor_on_disk_and_streamed(references):
    """PySCF's tensor in its HDF5 file (tiny max_memory), and a budget too small to keep the device copy."""
    ref = references["hydroxyl"]
    dm = ref.make_rdm1()
    vj0, vk0 = ref.get_jk(ref.mol, dm)
    mf = scf.UHF(ref.mol).density_fit()
    mf.with_df.max_memory = 0.01
    mf.with_df.build()
    assert not isinstance(mf.with_df._cderi, np.ndarray)  # a temporary HDF5 file, not an array
    mf = density_fit_jk(mf, max_memory=0.05)
    vj, vk = mf.get_jk(ref.mol, dm)
    assert mf.with_df.tensor.streamed
    assert np.abs(vj - vj0).max() < 1e-10 and np.abs(vk - vk0).max() < 1e-10


@pytest.mark.parametrize("chunk_mb", [256.0, 0.01], ids=["one-chunk", "row-by-row"])
def test_tensor_built_in_device_layout_equals_pyscfs(chunk_mb):
    from pyscf import df, lib

    from mp2trn.df import cholesky_tensor

    mol = build_mole(GHOST_WATER, basis="cc-pvdz")
    auxmol = df.addons.make_auxmol(mol, df.make_auxbasis(mol))
    ours = cholesky_tensor(mol, auxmol, chunk_mb=chunk_mb)
    ref = lib.unpack_tril(df.incore.cholesky_eri(mol, auxmol=auxmol))
    assert ours.shape == ref.shape == (auxmol.nao_nr(), mol.nao_nr(), mol.nao_nr())
    assert np.abs(ours - ref).max() < 1e-12 and np.abs(ours).max() > 0.1


def test_tensor_sources_are_recorded(references, monkeypatch):
    """Built by mp2trn when PySCF has none; PySCF's own (unpacked) when it has one or when the metric is
    not positive definite (PySCF's build drops the dependent combinations)."""
    import mp2trn.jk

    ref = references["water"]
    dm = ref.make_rdm1()
    vj0, vk0 = ref.get_jk(ref.mol, dm)
    cases = [(density_fit_jk(_fresh(ref)), "built by mp2trn in the device layout", False),
             (density_fit_jk(_fresh(ref)), "PySCF's tensor, as it is", True)]
    for mf, source, not_positive_definite in cases:
        if not_positive_definite:
            monkeypatch.setattr(mp2trn.jk, "cholesky_tensor", lambda *a, **k: None)
        assert mf.with_df._cderi is None
        vj, vk = mf.get_jk(ref.mol, dm)
        assert np.abs(vj - vj0).max() < 1e-10 and np.abs(vk - vk0).max() < 1e-10
        assert source in mf.with_df.jk_record()["tensor"]
    own = _fresh(ref)
    own.with_df.build()
    mf = density_fit_jk(own)
    mf.get_jk(ref.mol, dm)
    assert "packed, PySCF's tensor, as it is" in mf.with_df.jk_record()["tensor"]
    assert mf.with_df.tensor.full is own.with_df._cderi   # the packed tensor is read where it is: no copy
    unpacked = density_fit_jk(_fresh(ref), device=_UnpackedCpu())
    unpacked.with_df.build()
    unpacked.get_jk(ref.mol, dm)
    assert "unpacked, PySCF's tensor, unpacked" in unpacked.with_df.jk_record()["tensor"]


class _UnpackedCpu(mp2trn.devices.cpu.CpuDevice):
    """The CPU device reading the unpacked (naux, nao, nao) tensor, as the accelerators do."""

    jk_packed = False

    def __init__(self, precision="fp64"):
        super().__init__(precision)


@pytest.mark.parametrize("chunks", ["default", "row-by-row"])
@pytest.mark.parametrize("precision,tol", [("fp64", 1e-12), ("fp32", 2e-6)])
@pytest.mark.parametrize("name", ["water", "hydroxyl"])
@pytest.mark.parametrize("parts", [1, 3])
def test_packed_builds_equal_unpacked(references, name, precision, tol, chunks, parts, monkeypatch):
    """The packed layout (half the memory; rows unpacked a few at a time as builds read them) gives the
    unpacked layout's J and K: to 1e-12 in fp64, to fp32 rounding in fp32 (the packed fp32 builds read
    their unpacked fp32 copy). Row by row: one row unpacked at a time and exchange syrks over groups of a
    few rows (6 for water, 3 for hydroxyl's two spins, with a remainder), as a large molecule's builds run.
    Parts: the rows split over 3 threads of one BLAS thread each (uneven parts), or run in the calling
    thread, as on a machine with that many BLAS threads."""
    monkeypatch.setattr(mp2trn.devices.cpu, "blas_threads", lambda: parts)
    if chunks == "row-by-row":
        monkeypatch.setattr(mp2trn.devices.cpu, "_UNPACK_CHUNK_BYTES", 1.0)
        monkeypatch.setattr(mp2trn.devices.cpu, "_SYRK_GROUP_BYTES", 6000.0)
    ref = references[name]
    dm = ref.make_rdm1()
    packed = density_fit_jk(_fresh(ref), device=get_device("cpu", precision))
    unpacked = density_fit_jk(_fresh(ref), device=_UnpackedCpu(precision))
    (vj1, vk1), (vj0, vk0) = packed.get_jk(ref.mol, dm), unpacked.get_jk(ref.mol, dm)
    assert packed.with_df.tensor.layout == "packed" and unpacked.with_df.tensor.layout == "unpacked"
    assert packed.with_df.tensor.full.ndim == 2 and unpacked.with_df.tensor.full.ndim == 3
    scale = 1.0 if precision == "fp64" else max(np.abs(vj0).max(), np.abs(vk0).max())
    assert np.abs(vj1 - vj0).max() <= tol * scale and np.abs(vk1 - vk0).max() <= tol * scale
    bare_j, bare_k = packed.get_jk(ref.mol, np.asarray(dm))   # eigen-factors of a bare density
    assert np.abs(bare_j - vj0).max() <= tol * scale and np.abs(bare_k - vk0).max() <= tol * scale
    j_only = packed.get_jk(ref.mol, dm, with_k=False)[0], unpacked.get_jk(ref.mol, dm, with_k=False)[0]
    assert max(np.abs(j - vj0).max() for j in j_only) <= tol * scale   # ρ = B·D on the rows as stored


def test_streamed_equals_resident(references):
    """A budget too small for the resident tensor streams PySCF's tensor block by block: same J and K."""
    ref = references["water"]
    dm = ref.make_rdm1()
    resident = density_fit_jk(_fresh(ref))
    streamed = density_fit_jk(_fresh(ref), max_memory=0.2)
    (vj1, vk1), (vj0, vk0) = streamed.get_jk(ref.mol, dm), resident.get_jk(ref.mol, dm)
    assert streamed.with_df.tensor.streamed and not resident.with_df.tensor.streamed
    assert "built by mp2trn into its scratch file" in streamed.with_df.jk_record()["tensor"]
    assert np.abs(vj1 - vj0).max() < 1e-12 and np.abs(vk1 - vk0).max() < 1e-12
    streamed.with_df.release()


@pytest.mark.parametrize("precision, tol", [("fp64", 1e-12), ("fp32", 1e-5)])
def test_cpu_resident_tensor_is_one_block_with_the_blocks_j_and_k(references, precision, tol, monkeypatch):
    """The cpu device takes a resident tensor as one block (its parts then run through every row); the
    blocks of the plan's rows (a budget that makes them 83 rows, the fp32 copy kept) give the same J and K."""
    from mp2trn.devices.cpu import CpuDevice

    ref = references["water"]
    dm = ref.make_rdm1()
    one = density_fit_jk(_fresh(ref), device=get_device("cpu", precision), max_memory=2.0)
    vj1, vk1 = one.get_jk(ref.mol, dm)
    assert not one.with_df.tensor.streamed and len(one.with_df.tensor.kept) == 1
    assert not one.with_df.tensor.copy_left_out                     # fp32: the builds read the fp32 copy
    monkeypatch.setattr(CpuDevice, "jk_resident_one_block", False)
    many = density_fit_jk(_fresh(ref), device=get_device("cpu", precision), max_memory=2.0)
    vj0, vk0 = many.get_jk(ref.mol, dm)
    assert not many.with_df.tensor.streamed and len(many.with_df.tensor.kept) > 1
    scale = max(np.abs(vj0).max(), np.abs(vk0).max())
    assert np.abs(vj1 - vj0).max() <= tol * scale and np.abs(vk1 - vk0).max() <= tol * scale


@pytest.mark.parametrize("chunk_mb", [256.0, 0.01], ids=["one-chunk", "row-by-row"])
def test_tensor_file_rows_equal_the_packed_tensor(chunk_mb):
    """mp2trn's streamed tensor file: any row range reads back the packed tensor's rows — exactly when the
    file was solved in one chunk as the tensor was, to rounding when row by row (the triangular solve's
    blocking then differs: 1e-14 on an AMD EPYC's OpenBLAS, exact on the Intel VM)."""
    from mp2trn.df import TensorFile, cholesky_tensor

    mol = build_mole(GHOST_WATER, basis="cc-pvdz")
    auxmol = df.addons.make_auxmol(mol, "cc-pvdz-jkfit")
    full = cholesky_tensor(mol, auxmol, packed=True)
    tf = TensorFile.build(mol, auxmol, chunk_mb)
    try:
        assert (tf.naux, tf.npair) == full.shape
        for p0, p1 in ((0, full.shape[0]), (3, 17), (full.shape[0] - 1, full.shape[0])):
            got = tf.rows(p0, p1)
            if chunk_mb == 256.0:
                assert np.array_equal(got, full[p0:p1])
            else:
                assert np.abs(got - full[p0:p1]).max() <= 1e-13 * np.abs(full).max()
    finally:
        tf.close()


def test_packed_tensor_equals_pyscfs():
    from pyscf import df

    from mp2trn.df import cholesky_tensor

    mol = build_mole(GHOST_WATER, basis="cc-pvdz")
    auxmol = df.addons.make_auxmol(mol, df.make_auxbasis(mol))
    ours = cholesky_tensor(mol, auxmol, chunk_mb=0.01, packed=True)
    ref = df.incore.cholesky_eri(mol, auxmol=auxmol)
    assert ours.shape == ref.shape and np.abs(ours - ref).max() < 1e-12


@pytest.mark.parametrize("name,precision,tol", [
    ("water", "fp64", 1e-9), ("hydroxyl", "fp64", 1e-9), ("benzene", "fp64", 1e-9),
    ("water", "fp32", 1e-8), ("hydroxyl", "fp32", 1e-8), ("benzene", "fp32", 1e-8),
])
def test_scf_energy_matches_pyscf_df_scf(name, precision, tol):
    ref = _converged(molecule_path(name))
    res = mp2trn.run(molecule_path(name), precision=precision)
    assert abs(res.e_hf - ref.e_tot) <= tol
    record = res.scf
    assert record["jk"] == "device cpu" and record["cycles"] == len(record["precision_per_cycle"]) > 3
    if precision == "fp32":  # early cycles reduced, the last ones fp64
        assert record["precision_per_cycle"][0] == "fp32" and record["precision_per_cycle"][-1] == "fp64"
    else:
        assert set(record["precision_per_cycle"]) == {"fp64"}


def test_scf_jk_choice_is_recorded_and_checked():
    res = mp2trn.run(molecule_path("water"), scf_jk="pyscf")
    assert res.scf["jk"].startswith("pyscf") and res.to_qcschema()["extras"]["mp2trn"]["scf"]["cycles"] > 3
    with pytest.raises(InputError, match="--scf-jk"):
        mp2trn.RunOptions(scf_jk="gpu")


def test_interaction_energy_with_device_jk_matches_pyscf_jk():
    xyz = molecule_path("s22/02_water_dimer")
    dev = mp2trn.interaction_energy(xyz, conv_tol=1e-10)
    host = mp2trn.interaction_energy(xyz, conv_tol=1e-10, scf_jk="pyscf")
    assert all(c.result.scf["jk"] == "device cpu" for c in dev.calculations)  # ghosts included
    assert abs(dev.delta["scf"] - host.delta["scf"]) < 1e-9


@pytest.mark.parametrize("name", ["water", "hydroxyl", "ghost"])
def test_sim_device_j_and_k_in_fp32(references, name):
    """The NKI kernels (batched_gemm → syrk for K, coulomb for J) in the emulator, against PySCF."""
    ref = references[name]
    dm = ref.make_rdm1()
    vj0, vk0 = ref.get_jk(ref.mol, dm)
    mf = density_fit_jk(_fresh(ref), device="sim")
    vj, vk = mf.get_jk(ref.mol, dm)
    assert np.abs(vj - vj0).max() < FP32_REL * np.abs(vj0).max()
    assert np.abs(vk - vk0).max() < FP32_REL * np.abs(vk0).max()
    launches = mf.with_df.device.launcher.launches["scf_jk"]
    nset = 2 if name == "hydroxyl" else 1
    assert launches == 3 * nset  # one tensor block: batched_gemm + syrk per density set, coulomb per set
    # the host keeps the rows packed (half the memory); the device's copy of them is unpacked
    tensor = mf.with_df.tensor
    assert tensor.layout == "packed" and tensor.full.ndim == 2 and tensor.kept[0].ndim == 3


@pytest.mark.parametrize("name,basis", [
    ("water", "cc-pvdz"), ("hydroxyl", "cc-pvdz"),
    pytest.param("benzene", "cc-pvdz", marks=pytest.mark.slow),
    # Sn with its 28-electron def2 ECP: 1.6e-8 Eh off until J was made exact along the density
    # (nki_device._exact_along_density): a full fp32x3 build's rounding, ~1e-10 of E_J = 209 Eh
    pytest.param("heavy/stannane", "def2-svp", marks=pytest.mark.slow),
])
def test_sim_scf_incremental_fp32_then_compensated_no_host_build(name, basis):
    """The sim SCF's schedule (mp2trn.jk.device_schedule): difference-density fp32 builds, then fp32x3 builds
    on the device to the end: within 1e-8 Eh of PySCF's fp64 DF-SCF with no build on the host."""
    ref = _converged(molecule_path(name), basis=basis)
    res = mp2trn.run(molecule_path(name), basis=basis, device="sim")
    assert abs(res.e_hf - ref.e_tot) <= 1e-8
    record = res.scf
    cycles, builds = record["precision_per_cycle"], record["build_precisions"]
    assert cycles[0] == "fp32" and cycles[-1] == "fp32x3" and set(builds) == {"fp32", "fp32x3"}
    assert record["builds_on_host"] == 0 and record["incremental_builds"] >= len(builds) // 2
    stage = res.cost["stages"]["scf_jk"]
    assert stage["launches"] > 0 and stage["device_builds"] == len(builds)
    assert stage["modeled_time_per_build_s"]["trn1"] > 0
    whole = res.cost["whole_run"]
    assert whole["modeled_total_s"]["trn1"] > whole["modeled_device_s"]["trn1"] and "host" in whole["host_parts"]


def test_incremental_builds_add_the_difference_densitys_j_and_k(references):
    """An incremental build's J, K (the last ones plus J[ΔD], K[ΔD]) equal a full build's (cpu fp64: 1e-12),
    and every rebuild_every-th reduced build is a full one."""
    ref = references["water"]
    mf = density_fit_jk(_fresh(ref), device=get_device("cpu", "fp32"), incremental=True)
    full = density_fit_jk(_fresh(ref), device=get_device("cpu", "fp64"))
    schedule = mf.with_df.log.schedule
    schedule.start = schedule.current = get_precision("fp64")   # fp64 "reduced" builds: exact sums to check
    schedule.final = get_precision("fp32")
    dm1 = ref.make_rdm1()
    dm0 = scf.hf.init_guess_by_minao(ref.mol)
    for step in range(schedule.rebuild_every + 1):
        dm = dm0 + (dm1 - dm0) * (step + 1) / (schedule.rebuild_every + 1)
        (vj, vk), (vj0, vk0) = mf.get_jk(ref.mol, dm), full.get_jk(ref.mol, dm)
        assert np.abs(vj - vj0).max() < 1e-12 and np.abs(vk - vk0).max() < 1e-12
    kinds = [b["incremental"] for b in mf.with_df.log.builds]
    assert kinds == [False] + [True] * (schedule.rebuild_every - 1) + [False]


@pytest.mark.parametrize("name", ["water", "hydroxyl"])
def test_second_halves_made_during_the_fp32_builds_give_the_same_scf(name):
    """On a device computing off the host's cores the compensated blocks' second halves are made by a thread
    during the fp32 builds: the same SCF, bit for bit, as the sim device making them at the switch; the
    record says so and no thread is left."""
    import threading

    from mp2trn.devices.nki_device import SimDevice
    from mp2trn.options import RunOptions
    from mp2trn.pipeline import scf_stage

    taken = []

    class OffHost(SimDevice):
        def computes_on_host_cores(self) -> bool:
            return False

        def jk_tensor(self, block, dtype, keep_copy=True, planes=1, previous=None, second=None):
            made = super().jk_tensor(block, dtype, keep_copy, planes, previous, second)
            if second is not None:
                taken.append(made.pair[1] is second)
            return made

    runs = [scf_stage(molecule_path(name), RunOptions(), dev).mf for dev in (SimDevice("fp32"), OffHost("fp32"))]
    assert taken == [True]            # the switch took the half made during the fp32 builds
    assert runs[0].e_tot == runs[1].e_tot
    records = [mf.with_df.jk_record() for mf in runs]
    assert "second_halves_ahead" not in records[0]
    assert records[1]["second_halves_ahead"].startswith("1 of 1 compensated blocks' second halves")
    assert not [t for t in threading.enumerate() if t.name == "mp2trn-second-halves"]


def test_compensated_blocks_take_the_fp32_rows_where_the_plan_would_cut_them_smaller():
    """At a budget whose plan gives a streamed compensated block fewer rows than an fp32 one (15 MB for water),
    the resident compensated blocks still take the fp32 blocks' rows, each reusing its fp32 block."""
    from pyscf import scf as pyscf_scf

    from mp2trn.devices.nki_device import SimDevice
    from mp2trn.jk import density_fit_jk
    from mp2trn.memory import plan_scf_tensor
    from mp2trn.molecule import build_mole

    mol = build_mole(molecule_path("water"), basis="cc-pvdz")
    naux, per_row, nao = 116, 300, 24
    rows = [plan_scf_tensor(naux, per_row, SimDevice("fp32").jk_copy_itemsize(None, planes), False, nao * nao,
                            15.0, None).block_rows for planes in (1, 3)]
    assert rows[1] < rows[0]            # the plan alone would cut the compensated blocks smaller
    calls = []

    class Spy(SimDevice):
        def jk_tensor(self, block, dtype, keep_copy=True, planes=1, previous=None, second=None):
            calls.append((planes, block.shape[0], previous is not None))
            return super().jk_tensor(block, dtype, keep_copy, planes, previous, second)

    mf = density_fit_jk(pyscf_scf.RHF(mol).density_fit("cc-pvdz-jkfit"), device=Spy("fp32"), max_memory=15.0)
    assert mf.with_df.get_naoaux() == naux
    mf.run()
    fp32 = [c for c in calls if c[0] == 1]
    x3 = [c for c in calls if c[0] == 3]
    assert x3 and [c[1] for c in x3] == [c[1] for c in fp32] and all(c[2] for c in x3)
    mf.with_df.release()


@pytest.mark.parametrize("name", ["water", pytest.param("hydroxyl", marks=pytest.mark.slow)])   # UHF: 31 s, -m slow
def test_sim_resident_and_streamed_scf_agree(name):
    """The sim device keeps the SCF tensor in device memory (sent once per precision: the launcher counts
    its bytes once) or streams it at every build when the plan has no room: the same SCF energy to fp32
    rounding, and the streamed tensor's bytes go to the device at every build."""
    ref = references_of(name)
    runs = {}
    for label, memory in (("resident", None), ("streamed", 0.3)):
        mf = density_fit_jk(_fresh(ref), device="sim", max_memory=memory)
        mf.conv_tol, mf.verbose = 1e-10, 0
        mf.kernel()
        record, moved = mf.with_df.jk_record(), mf.with_df.device.transfer_record()["scf_jk"]
        runs[label] = mf.e_tot, record, moved
        mf.with_df.release()
    (e_res, rec_res, moved_res), (e_str, rec_str, moved_str) = runs["resident"], runs["streamed"]
    assert rec_res["tensor"].startswith("resident") and rec_str["tensor"].startswith("streamed")
    assert abs(e_res - ref.e_tot) < 1e-8 and abs(e_str - ref.e_tot) < 1e-8 and abs(e_res - e_str) < 1e-8
    builds = rec_res["jk_builds"]
    nao = ref.mol.nao_nr()
    naux = ref.with_df.get_naoaux()
    tensor_fp32 = naux * nao * nao * 4
    # resident: the kept blocks count once in to_device, as in to_device_reusing (an array passed again
    # counted once); what differs is small arrays passed twice in one build (the identity of batched_gemm)
    assert moved_res["to_device"] - moved_res["to_device_reusing"] < tensor_fp32
    # the fp32 copy (4 bytes), then the second half of the fp32 pair the device splits into the fp32x3 planes
    # (4 more: the pair's first half is the fp32 copy, there already; not the planes' 16)
    padded = -(-naux // 128) * 128 * nao * nao * 4      # resident: one block, padded to whole 128-row tiles
    assert tensor_fp32 * 2 < moved_res["to_device"] < padded * 3   # (+ each build's factors and ρ)
    assert moved_str["to_device"] > builds * tensor_fp32


@pytest.mark.parametrize("device", _devices())
def test_resident_and_streamed_scf_agree_in_fp64(device):
    """The memory plan (memory.plan_scf_tensor) keeps the tensor on the device or streams it: the same SCF
    energy to 1e-12 (cpu, and the cuda device on CPU torch, whose resident blocks are torch tensors)."""
    ref = references_of("water")
    energies = {}
    for label, memory in (("resident", None), ("streamed", 0.2)):
        mf = density_fit_jk(_fresh(ref), device=_device(device, "fp64"), max_memory=memory)
        mf.conv_tol, mf.verbose = 1e-10, 0
        mf.kernel()
        record = mf.with_df.jk_record()
        assert record["tensor"].startswith("resident" if label == "resident" else "streamed")
        assert record["tensor_plan"].startswith(label)
        if label == "resident" and device != "cpu":
            import torch

            assert all(isinstance(b, torch.Tensor) for b in mf.with_df.tensor.kept)
        energies[label] = mf.e_tot
        mf.with_df.release()
    assert abs(energies["resident"] - energies["streamed"]) < 1e-12


def test_scf_tensor_plan_counts_a_device_memory_copy_against_the_device():
    """A device with its own memory (neuron's HBM, a GPU's) holds its copy there: the copy is checked against
    that memory and not counted in the host budget; a host-memory device's copy counts in the budget."""
    from mp2trn.memory import plan_scf_tensor

    naux, per_row = 1000, 10_000           # 80 MB of fp64 rows, a 40 MB fp32 copy
    host = plan_scf_tensor(naux, per_row, 4, False, 0, budget_mb=220, device_mb=None)
    assert not host.resident and "streamed" in host.why                       # 80 + 40 MB > 110 MB
    device = plan_scf_tensor(naux, per_row, 4, False, 0, budget_mb=220, device_mb=1000)
    assert device.resident and device.why.startswith("resident")              # 80 MB host, 40 of 1000 MB
    small_device = plan_scf_tensor(naux, per_row, 4, False, 0, budget_mb=1000, device_mb=50)
    assert not small_device.resident and "device" in small_device.why          # 40 MB > half of 50 MB
    # what such a device keeps in host memory for its copy (neuron: the fp32 rows its tensors stand for)
    # counts in the budget
    behind = plan_scf_tensor(naux, per_row, 4, False, 0, budget_mb=220, device_mb=1000, host_copy_itemsize=4)
    assert not behind.resident                                                 # 80 + 40 MB > 110 MB
    from mp2trn.devices.nki_device import NeuronDevice, SimDevice
    sim = SimDevice("fp32", "trn1")          # computes in host memory: its whole copy is counted there
    assert sim.memory_mb() is None and sim.jk_host_copy_itemsize(np.float32) == 0
    # (a NeuronDevice cannot be made without the Neuron SDK: its methods read no state)
    assert NeuronDevice.jk_host_copy_itemsize(sim, np.float32) == sim.jk_copy_itemsize(np.float32)


def references_of(name):
    return _converged(molecule_path(name))


def test_cycles_are_counted_as_pyscf_counts_them():
    """PySCF's extra conv_check cycle is judged by PySCF's own criterion and not counted as a cycle."""
    mol = build_mole(molecule_path("benzene"))
    mf = density_fit_jk(scf.RHF(mol).density_fit(), precision="fp32")
    mf.conv_tol, mf.verbose = 1e-10, 0
    mf.kernel()
    assert mf.converged and len(mf.with_df.log.cycles) == mf.cycles


@pytest.mark.parametrize("name", ["water", "hydroxyl"])
def test_no_confirming_cycle_and_pyscfs_orbitals(name):
    """mp2trn's SCF ends at the loop's convergence test: one J/K build per cycle plus the initial guess's,
    none for PySCF's confirming conv_check cycle; the orbitals and orbital energies are PySCF's (both
    diagonalise the converged cycle's F(D)) and the energy is within conv_tol of PySCF's."""
    ref = _converged(molecule_path(name))
    res = mp2trn.run(molecule_path(name), conv_tol=1e-10)
    assert res.scf["jk_builds"] == res.scf["cycles"] + 1
    mf = mp2trn.scf.run_scf(build_mole(molecule_path(name)), mp2trn.scf.ScfOptions(conv_tol=1e-10))
    assert np.abs(np.asarray(mf.mo_energy) - np.asarray(ref.mo_energy)).max() < 1e-9
    assert abs(mf.e_tot - ref.e_tot) < 1e-10 and abs(res.e_hf - ref.e_tot) < 1e-10


def _schedule():
    from mp2trn.jk import PrecisionSchedule
    from mp2trn.precision import get_precision

    return PrecisionSchedule(get_precision("fp32"))


def _after_cycles(sched, grads, energies=None):
    """Feed the schedule reduced cycles with these gradient norms; return the cycle after which it switched."""
    energies = energies or [-100.0 - k for k in range(len(grads))]   # falling: no energy signal
    for k, g in enumerate(grads):
        sched.update(energies[k], energies[k - 1] if k else 0.0, k + 1, g)
        if not sched.reduced:
            return k + 1
    return None


def test_mixed_schedule_switches_below_the_gradient_threshold():
    assert _after_cycles(_schedule(), [1.0, 0.3, 0.1, 3e-2, 1e-2, 3e-3, 1e-3, 5e-4, 2e-4, 9.9e-5, 5e-5]) == 10


def test_mixed_schedule_switches_when_the_gradient_stalls_but_not_in_the_first_cycles():
    # cycle 2 barely falls (0.95x) but comes before min_reduced; cycle 7 (0.9x) is the noise floor
    assert _after_cycles(_schedule(), [1.6, 1.5, 0.3, 0.1, 2e-2, 8e-3, 7.2e-3, 1e-3]) == 7


def test_mixed_schedule_ignores_fp32_energy_jitter_and_stops_after_max_reduced():
    sched = _schedule()
    jitter = [-100.0 + (1e-5 if k % 2 else -1e-5) for k in range(20)]   # the energy rises every other cycle
    grads = [0.5 ** k for k in range(20)]                              # falling 2x a cycle, never below 1e-4 in 11
    assert _after_cycles(sched, grads[:11], jitter[:11]) is None
    assert _after_cycles(_schedule(), [1.0] + [0.69 ** k for k in range(1, 20)]) == sched.max_reduced


def test_mixed_schedule_energy_rule_when_asked():
    sched = _schedule()
    sched.switch_rel = 1e-8
    assert _after_cycles(sched, [1.0, 0.5, 0.25], [-100.0, -100.5, -100.5 - 1e-7]) == 3


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("name", ["water", "hydroxyl", "ghost"])
def test_fp32_copy_gives_the_per_build_conversions_j_and_k(references, name, parts, monkeypatch):
    """fp32 builds of the packed tensor read an fp32 copy of the rows, unpacked once per SCF: the same J
    (fp64 from the fp64 rows in both) to 1e-12 and the same K to fp32 rounding as unpacking and converting
    the fp64 rows at every build (the path without room for the copy); for tagged and bare densities, J or
    K alone, and blocks of 7 rows (a remainder)."""
    from mp2trn.devices.cpu import _Cast, _Fp32Copy
    from mp2trn.df import cholesky_tensor

    monkeypatch.setattr(mp2trn.devices.cpu, "blas_threads", lambda: parts)   # the copy's fill and the builds
    ref = references[name]
    packed = cholesky_tensor(ref.mol, df.addons.make_auxmol(ref.mol, ref.with_df.auxbasis), packed=True)
    nao = ref.mol.nao_nr()
    dev = get_device("cpu", "fp32")
    dm = ref.make_rdm1()
    dms = np.asarray(dm).reshape(-1, nao, nao)
    blocks = [packed[p0 : p0 + 7] for p0 in range(0, packed.shape[0], 7)]
    copies = [dev.jk_tensor(b, np.dtype(np.float32)) for b in blocks]
    assert all(isinstance(c, _Fp32Copy) and c.copy.dtype == np.float32 and c.copy.shape == (len(c.block), nao, nao)
               for c in copies)
    assert dev.jk_copy_itemsize(np.float32) == 8 and dev.jk_copy_itemsize(np.float64) == 0   # the plan counts it
    assert 4 * nao * nao <= 8 * packed.shape[1]   # nao² fp32 elements per row within 8 bytes per packed one
    for density in (dm, np.asarray(dm)):   # the orbitals' factor; a bare density's eigen-factors
        for factors, d in zip(density_factors(density), dms):
            for with_j, with_k in ((True, True), (True, False), (False, True)):
                new = [dev.jk_block(c, factors, d, with_j, with_k) for c in copies]
                old = [dev.jk_block(_Cast(b, np.dtype(np.float32), nao), factors, d, with_j, with_k) for b in blocks]
                if with_j:
                    vj1, vj0 = sum(j for j, _ in new), sum(j for j, _ in old)
                    assert np.abs(vj1 - vj0).max() < 1e-12 and np.abs(vj0).max() > 0.1
                else:
                    assert all(j is None for j, _ in new)
                if with_k:
                    vk1, vk0 = sum(k for _, k in new), sum(k for _, k in old)
                    assert np.array_equal(vk1, vk1.T)
                    assert np.abs(vk1 - vk0).max() < FP32_REL * np.abs(vk0).max() and np.abs(vk0).max() > 0.1
                else:
                    assert all(k is None for _, k in new)


def test_fp32_copy_is_made_once_per_scf(references):
    """The fp32 copy is made at the first fp32 build (what-ran's ``device_blocks_seconds`` counts it) and read
    by the next ones; a switch to fp64 drops it."""
    from mp2trn.devices.cpu import _Fp32Copy

    ref = references["water"]
    dm = ref.make_rdm1()
    mf = density_fit_jk(_fresh(ref), device=get_device("cpu", "fp32"))
    first = mf.get_jk(ref.mol, dm)
    blocks = mf.with_df.tensor.kept
    assert blocks and all(isinstance(b, _Fp32Copy) for b in blocks)
    made = mf.with_df.jk_record()["device_blocks_seconds"]     # what-ran: the copy's seconds, once
    second = mf.get_jk(ref.mol, dm)
    assert mf.with_df.tensor.kept is blocks and all(np.array_equal(a, b) for a, b in zip(first, second))
    assert made > 0 and mf.with_df.jk_record()["device_blocks_seconds"] == made
    mf.with_df.log.schedule.current = mf.with_df.log.schedule.final
    vj, vk = mf.get_jk(ref.mol, dm)
    assert not any(isinstance(b, _Fp32Copy) for b in mf.with_df.tensor.kept)
    vj0, vk0 = ref.get_jk(ref.mol, dm)
    assert np.abs(vj - vj0).max() < 1e-10 and np.abs(vk - vk0).max() < 1e-10


def test_the_plan_counts_the_fp32_copy(references):
    """The cpu device's fp32 copy (unpacked: 8 bytes per packed element) is counted beside the fp64 tensor (8): with
    room for both it is kept; with room for the tensor only, the tensor stays resident and fp32 builds
    convert as they read (recorded, and still after a mixed SCF's switch to fp64 builds); with room for neither, the tensor streams. J and K the same in all."""
    from mp2trn.devices.cpu import _Cast, _Fp32Copy

    ref = references["water"]
    dm = ref.make_rdm1()
    probe = density_fit_jk(_fresh(ref), device=get_device("cpu", "fp64"))
    probe.get_jk(ref.mol, dm)
    tensor_mb = probe.with_df.tensor.full.nbytes / 1e6   # fp64, packed; the plan allows half the budget
    runs = {}
    for label, bytes_per_element in (("both", 17), ("tensor only", 10), ("neither", 6)):
        mf = density_fit_jk(_fresh(ref), device=get_device("cpu", "fp32"),
                            max_memory=2 * tensor_mb * bytes_per_element / 8)
        runs[label] = mf.get_jk(ref.mol, dm), mf.with_df.tensor, mf.with_df.jk_record()["tensor"]
    (_, both, note) = runs["both"]
    assert not both.streamed and all(isinstance(b, _Fp32Copy) for b in both.kept) and "no room" not in note
    (_, tensor_only, note) = runs["tensor only"]
    assert not tensor_only.streamed and all(isinstance(b, _Cast) for b in tensor_only.kept)
    assert "no room for the device's reduced-precision copy: the fp32 builds converted at every build" in note
    mf = density_fit_jk(_fresh(ref), device=get_device("cpu", "fp32"), max_memory=2 * tensor_mb * 10 / 8)
    mf.get_jk(ref.mol, dm)
    mf.with_df.log.schedule.current = mf.with_df.log.schedule.final   # the mixed SCF's switch to fp64 builds
    mf.get_jk(ref.mol, dm)
    assert not mf.with_df.tensor.copy_left_out        # the fp64 builds need no copy; the record still says so
    assert "the fp32 builds converted at every build" in mf.with_df.jk_record()["tensor"]
    assert runs["neither"][1].streamed
    (vj0, vk0) = runs["both"][0]
    for label in ("tensor only", "neither"):
        vj, vk = runs[label][0]
        assert np.abs(vj - vj0).max() < 1e-12
        assert np.abs(vk - vk0).max() < FP32_REL * np.abs(vk0).max()


@pytest.mark.parametrize("precision,tol", [("fp64", 1e-12), ("fp32", 1e-6)])
def test_an_empty_spin_channel_has_zero_exchange(precision, tol):
    """The hydrogen atom's β channel has no occupied orbital: its K is zero, J and α's K are PySCF's."""
    from pyscf import gto

    mol = gto.M(atom="H 0 0 0", basis="cc-pvdz", spin=1)
    ref = scf.UHF(mol).density_fit()
    ref.verbose = 0
    ref.kernel()
    dm = ref.make_rdm1()
    vj0, vk0 = ref.get_jk(mol, dm)
    vj, vk = density_fit_jk(scf.UHF(mol).density_fit(), device=get_device("cpu", precision)).get_jk(mol, dm)
    assert np.abs(vj - vj0).max() < tol and np.abs(vk - vk0).max() < tol and not vk[1].any()
    assert np.abs(vk0[0]).max() > 0.1
    mf = density_fit_jk(scf.UHF(mol).density_fit(), device=get_device("cpu", precision))
    k_only = mf.get_jk(mol, dm, with_j=False)
    assert k_only[0] is None and np.abs(k_only[1] - vk0).max() < tol


def test_streamed_fp32_builds_make_no_copy_of_their_blocks(references):
    """A streamed block is read once per build, so the cpu device's optional fp32 copy of it would be made
    again at every build: streamed blocks are asked for without it (converted as read); a resident tensor's
    blocks keep theirs. J and K the same either way."""
    ref = references["water"]
    dm = ref.make_rdm1()
    asked = {}
    out = {}
    for label, memory in (("resident", None), ("streamed", 0.05)):
        dev = get_device("cpu", "fp32")
        plain = dev.jk_tensor

        def recording(block, dtype, keep_copy=True, label=label, plain=plain):
            asked.setdefault(label, set()).add(keep_copy)
            return plain(block, dtype, keep_copy=keep_copy)

        dev.jk_tensor = recording
        mf = density_fit_jk(_fresh(ref), device=dev, max_memory=memory)
        out[label] = mf.get_jk(ref.mol, dm)
        assert mf.with_df.tensor.streamed == (label == "streamed")
        mf.with_df.release()
    assert asked == {"resident": {True}, "streamed": {False}}
    (vj0, vk0), (vj1, vk1) = out["resident"], out["streamed"]
    assert np.abs(vj1 - vj0).max() < 1e-12 and np.abs(vk1 - vk0).max() < FP32_REL * np.abs(vk0).max()


@pytest.mark.parametrize("name, budget, copy_kept", [("hydroxyl", 0.5, False), ("water", 2.0, True)])
@pytest.mark.parametrize("precision, tol", [("fp64", 1e-12), ("fp32", FP32_REL)])
@pytest.mark.parametrize("parts", [1, 2])
def test_work_buffers_stay_within_the_stages_limit_with_the_same_j_and_k(references, name, budget, copy_kept,
                                                                          precision, tol, parts, monkeypatch):
    """The J/K stage holds the cpu device's work buffers (unpacked rows, their fp32 conversion, a group of Z
    rows and its ZᵀZ, per part) to a tenth of its budget (memory.JK_WORK_SHARE): at 0.5 MB (hydroxyl: no room
    for the fp32 copy, rows converted at every build) and 2 MB (water: the fp32 copy kept, made a few rows at a
    time in those buffers) they stay within it, and the builds give the J and K of unlimited buffers, tagged
    and bare densities alike; the gradient's response, which builds with its own factors after the SCF, then
    drops them (grad.dfmp2.release_scf_tensor)."""
    from mp2trn.grad.dfmp2 import release_scf_tensor
    from mp2trn.memory import JK_WORK_SHARE

    monkeypatch.setattr(mp2trn.devices.cpu, "blas_threads", lambda: parts)
    ref = references[name]
    dm = ref.make_rdm1()
    for density in (dm, np.asarray(dm) + 0.01):   # the orbitals' factors; a bare density's (more columns)
        free = density_fit_jk(_fresh(ref), device=get_device("cpu", precision))
        limited = density_fit_jk(_fresh(ref), device=get_device("cpu", precision), max_memory=budget)
        (vj0, vk0), (vj1, vk1) = free.get_jk(ref.mol, density), limited.get_jk(ref.mol, density)
        if precision == "fp32":
            assert limited.with_df.tensor.copy_left_out is not copy_kept
        bufs = limited.with_df.device._jk_bufs
        assert bufs and sum(b.nbytes for b in bufs.values()) <= JK_WORK_SHARE * budget * 1e6
        assert sum(b.nbytes for b in free.with_df.device._jk_bufs.values()) > JK_WORK_SHARE * budget * 1e6
        scale = 1.0 if precision == "fp64" else max(np.abs(vj0).max(), np.abs(vk0).max())
        assert np.abs(vj1 - vj0).max() <= tol * scale and np.abs(vk1 - vk0).max() <= tol * scale
        vj_pyscf, vk_pyscf = ref.get_jk(ref.mol, np.asarray(density))   # PySCF's DF J/K, the independent check
        assert np.abs(vj1 - vj_pyscf).max() <= max(1e-10, tol * scale)
        assert np.abs(vk1 - vk_pyscf).max() <= max(1e-10, tol * scale)
        release_scf_tensor(limited)
        assert limited.with_df.tensor.full is None and not limited.with_df.device._jk_bufs
