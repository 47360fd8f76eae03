"""The SCF's J/K kernels against their NumPy references, in the emulator: syrk (Zᵀ Z, lower triangle,
fp32 and fp32x3), coulomb (ρ = B·D, J = Bᵀρ), and the exchange build as the sim device runs it
(batched_gemm with the identity forming Z = C_occᵀ B_P, then syrk)."""

from __future__ import annotations

import numpy as np
import pytest

from mp2trn.kernels.batched_gemm import batched_gemm
from mp2trn.kernels.coulomb import coulomb, coulomb_reference
from mp2trn.kernels.syrk import lower_to_full, syrk, syrk_reference, syrk_x3
from mp2trn.precision import get_precision

from .kernel_helpers import EPS32, run

# (naux, nao, nocc): nao and naux not multiples of 128, nocc = 1, more than one PSUM bank of columns,
# several row groups
SHAPES = [(84, 24, 5), (130, 19, 1), (7, 129, 3), (300, 70, 9), (150, 140, 12), (40, 513, 2)]


def _count(rep, instruction):
    """How many times ``instruction`` ran in a launch (the report counts per engine)."""
    return sum(per.get(instruction, 0) for per in rep.instruction_counts.values())


def _tensor(rng, naux, nao):
    b = rng.standard_normal((naux, nao, nao))
    return (b + b.transpose(0, 2, 1)) / 2           # B_P symmetric, as PySCF's unpacked tensor


@pytest.mark.parametrize("naux,nao,nocc", SHAPES)
def test_syrk_fp32_and_x3(naux, nao, nocc):
    rng = np.random.default_rng(naux * nao + nocc)
    z = rng.standard_normal((naux * nocc, nao))
    ref = syrk_reference(z)
    scale = np.abs(z).T @ np.abs(z)                  # Σ|z||z|: the rounding-error scale of each element
    k, rep = run(syrk, z.astype(np.float32))
    err = np.abs(lower_to_full(k) - ref)
    assert np.all(err <= 4 * np.sqrt(z.shape[0]) * EPS32 * scale + 1e-30)
    assert _count(rep, "nc_matmul") > 0
    planes = get_precision("fp32x3").split_operand(z, axis=0, moving=True)
    (k3, k3_rest), _ = run(syrk_x3, *planes)
    err3 = np.abs(lower_to_full(k3.astype(np.float64) + k3_rest) - ref)
    assert err3.max() < err.max() or err.max() == 0  # compensated is closer than fp32
    assert np.all(err3 <= 64 * np.sqrt(z.shape[0]) * EPS32 * 2.0 ** -3 * scale + 1e-30)


def test_syrk_computes_only_the_lower_triangle():
    """Output chunks stop at the diagonal: for 300 columns the M tiles stream 128, 256 and 300 moving
    columns instead of 300 each, 76 % of a full Zᵀ Z's TensorE work."""
    rows, n = 200, 300
    z = np.random.default_rng(1).standard_normal((rows, n)).astype(np.float32)
    k, rep = run(syrk, z)
    assert np.allclose(np.tril(k), np.tril(syrk_reference(z)), rtol=1e-5, atol=1e-3)
    assert rep.flops == 2 * rows * 128 * (128 + 256) + 2 * rows * 44 * 300
    assert rep.flops < 0.8 * 2 * rows * n * n


@pytest.mark.parametrize("naux,nao,nocc", SHAPES)
def test_coulomb_rho_and_j(naux, nao, nocc):
    rng = np.random.default_rng(naux + nao)
    b = _tensor(rng, naux, nao).reshape(naux, nao * nao)
    d = rng.standard_normal((nao, nao))
    d = (d + d.T).reshape(1, -1)
    (rho, j), rep = run(coulomb, b.astype(np.float32), d.astype(np.float32))
    rho0, j0 = coulomb_reference(b, d)
    assert np.abs(rho - rho0).max() <= 4 * np.sqrt(nao * nao) * EPS32 * float(np.max(np.abs(b) @ np.abs(d.T)))
    assert np.abs(j - j0).max() <= 1e-5 * np.abs(j0).max() + 1e-6
    assert _count(rep, "nc_matmul") > 0 and _count(rep, "tensor_reduce") > 0


@pytest.mark.parametrize("naux,nao,nocc", SHAPES[:5] + [(20, 260, 1)])
def test_exchange_build_as_the_sim_device_runs_it(naux, nao, nocc):
    rng = np.random.default_rng(3 * naux + nao)
    b = _tensor(rng, naux, nao)
    c = rng.standard_normal((nao, nocc))
    z, _ = run(batched_gemm, b.astype(np.float32), c.astype(np.float32), np.eye(nao, dtype=np.float32))
    x_ref = np.einsum("mi,pmn->pin", c, b).reshape(naux * nocc, nao)   # Z[(P, i), ν] = (Cᵀ B_P)[i, ν]
    assert np.abs(z - x_ref).max() <= 1e-5 * np.abs(x_ref).max()
    k, _ = run(syrk, z)
    k_ref = np.einsum("pmn,ni,pki->mk", b, c, np.einsum("pkl,li->pki", b, c))  # Σ_P B_P C Cᵀ B_P
    assert np.abs(lower_to_full(k) - k_ref).max() <= 1e-5 * np.abs(k_ref).max()


@pytest.mark.parametrize("rows,ncols,rows_out", [(1024, 0, 0), (300, 17, 1024), (130, 0, 0)])
def test_resplit_x3_equals_the_hosts_split_of_the_sum(rows, ncols, rows_out):
    """resplit_x3 on a compensated kernel's real output pair (batched_gemm_x3, whose corrections plane is
    2^-β of the result, not a rounding residue) gives the planes the host's fp64 split of their sum gives,
    bit for bit; rows past the input are zero."""
    from mp2trn.kernels.batched_gemm import batched_gemm_x3
    from mp2trn.kernels.resplit import resplit_reference, resplit_x3
    from mp2trn.precision import beta_for

    rng = np.random.default_rng(rows + ncols)
    nao, nocc = 40, 5
    naux = -(-rows // nocc)
    b = _tensor(rng, naux, nao) * np.exp(rng.standard_normal(naux))[:, None, None]
    mode = get_precision("fp32x3")
    args = (*mode.split_operand(b, axis=1, moving=False),
            *mode.split_operand(rng.standard_normal((nao, nocc)), axis=0, moving=True),
            *mode.split_operand(np.eye(nao), axis=0, moving=True), *mode.grid_args(nao))
    (exact, rest), _ = run(batched_gemm_x3, *args)
    exact, rest = exact[:rows], rest[:rows]
    assert np.abs(rest).max() > 1e-4 * np.abs(exact).max()          # corrections well above fp32 rounding
    beta = beta_for(max(rows, rows_out))
    planes, rep = run(resplit_x3, exact, rest, beta, ncols=ncols, rows_out=rows_out)
    want = resplit_reference(exact, rest, beta, ncols, rows_out)
    for got, ref in zip(planes, want):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert np.array_equal(got.astype(np.float64), ref.astype(np.float64))
    assert _count(rep, "tensor_partition_reduce") > 0


def test_compensated_exchange_keeps_z_on_the_device():
    """The sim device's fp32x3 J/K build: Z = Cᵀ B_P stays in device memory between batched_gemm_x3,
    resplit_x3 and syrk_x3 (no bytes of it to the host or back), and J is exact along the density."""
    from mp2trn.devices import get_device

    rng = np.random.default_rng(7)
    naux, nao, nocc = 90, 30, 4
    b = _tensor(rng, naux, nao)
    c = rng.standard_normal((nao, nocc)) / 3
    dev = get_device("sim", "fp32x3")
    block = dev.jk_tensor(b, np.float64, planes=3)
    dev.jk_block(block, [(c, 1.0)], c @ c.T, True, True)                # the tensor's planes go over once
    before = len(dev.launcher.transfers["scf_jk"])
    vj, vk = dev.jk_block(block, [(c, 1.0)], c @ c.T, True, True)
    d = c @ c.T
    rho = np.einsum("pmn,mn->p", b, d)
    z = np.einsum("mi,pmn->pin", c, b)
    k_ref = np.einsum("pim,pin->mn", z, z)
    j_ref = np.einsum("p,pmn->mn", rho, b)
    assert np.abs(vk - k_ref).max() < 1e-8 * np.abs(k_ref).max()
    assert np.abs(vj - j_ref).max() < 1e-8 * np.abs(j_ref).max()
    assert abs(np.vdot(d, vj) - rho @ rho) < 1e-13 * (rho @ rho)       # tr(D J) = ρ·ρ
    moves = dev.launcher.transfers["scf_jk"][before:]
    z_bytes = naux * 8 * nao * 4                                         # one fp32 plane of Z (padded factor)
    assert sum(m[1] for m in moves) < z_bytes                           # to the host: K's and J's (nao, nao) pairs
    assert sum(m[0] for m in moves) < z_bytes                           # to the device: C's and ρ's planes
    assert dev.launcher.kernels["scf_jk"] >= {"batched_gemm_x3", "resplit_x3", "syrk_x3", "gemm_x3"}


def test_tensor_planes_made_on_the_device_equal_the_hosts_split():
    """The SCF tensor goes to the device as an fp32 pair (8 bytes per element) and resplit_x3 makes both of
    its plane sets there: the host's split's planes (hi and x bit for bit, lo to its last bit), nothing back."""
    from mp2trn.devices.nki_device import _X3Block, _pad_rows
    from mp2trn.devices.nki_launch import EmulatorLauncher

    rng = np.random.default_rng(11)
    naux, rows, nao = 150, 160, 30
    b = _tensor(rng, naux, nao) * np.exp(2 * rng.standard_normal(naux))[:, None, None]
    launcher = EmulatorLauncher("trn1")
    made = _X3Block.pair_of(b, rows).made_on(launcher)
    ref = _X3Block.split(_pad_rows(b, rows), b)
    pairs = list(zip(made.by_mu, ref.by_mu)) + [p for m, r in zip(made.by_p, ref.by_p) for p in zip(m, r)]
    assert len(pairs) == 2 + 3 * len(ref.by_p)
    for got, want in pairs:
        assert got.shape == want.shape and got.dtype == want.dtype
        if want.dtype == np.float32:   # lo (and x): B's last bits differ from fp32(B) + fp32(B − fp32(B))
            ulp = np.spacing(np.abs(want))
            assert np.all(np.abs(got - want) <= ulp) and np.mean(got != want) < 1e-3
        else:
            assert np.array_equal(got.astype(np.float64), want.astype(np.float64))
    moved = launcher.transfer_record()["scf_jk"]
    assert moved["to_device"] == 8 * rows * nao * nao and moved["to_host"] == 0


@pytest.mark.parametrize("shape, rows", [((300, 70, 70), 384), ((5, 600, 600), 8), ((40, 9, 9), None)])
def test_fp32_copy_of_the_tensor_is_numpys_rounding_with_zero_rows(shape, rows, monkeypatch):
    """The fp32 builds' copy of the SCF tensor (made in parts on two threads, in prefaulted memory): NumPy's
    fp32 rounding of every element, the padded rows zero; cut along the rows or along another axis."""
    from mp2trn.precision import fp32_copy

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    x = np.random.default_rng(3).standard_normal(shape)
    got = fp32_copy(x, rows)
    assert got.dtype == np.float32 and got.shape == (max(rows or 0, shape[0]), *shape[1:])
    assert np.array_equal(got[: shape[0]], x.astype(np.float32)) and not got[shape[0]:].any()


def test_compensated_block_reuses_the_fp32_rows_the_device_holds():
    """At the SCF's precision switch a compensated block takes the fp32 builds' rows (Device.jk_tensor's
    ``previous``) as the first half of its fp32 pair: the same pair as made afresh, and the rows, already in
    device memory, not sent again; a previous handle of another shape is not taken."""
    from mp2trn.devices.nki_device import SimDevice
    from mp2trn.precision import fp32_pair

    block = np.random.default_rng(4).standard_normal((130, 24, 24))
    dev = SimDevice("fp32", "trn1")
    rows = dev.jk_tensor(block, np.float32)                   # (256, 24, 24): padded to whole 128-row tiles
    x3 = dev.jk_tensor(block, np.float64, planes=3, previous=rows)
    fresh = fp32_pair(block, rows.shape[0])
    assert x3.pair[0] is rows
    assert all(np.array_equal(a, b) for a, b in zip(x3.pair, fresh)) and not x3.pair[1][130:].any()
    c = np.random.default_rng(5).standard_normal((24, 3))
    dev.jk_block(rows, [(c, 1.0)], c @ c.T, True, True)      # an fp32 build: the rows sent once
    sent = dev.launcher.transfer_record()["scf_jk"]["to_device"]
    x3.made_on(dev.launcher)
    assert dev.launcher.transfer_record()["scf_jk"]["to_device"] - sent == rows.nbytes   # the second half only
    other = SimDevice("fp32", "trn1").jk_tensor(block[:100], np.float64, planes=3, previous=rows)   # unpadded
    assert other.pair[0] is not rows and other.pair[0].shape == (100, 24, 24)
    with pytest.raises(ValueError):
        fp32_pair(block, 256, hi=rows[:128])


def test_second_half_made_ahead_is_the_one_the_switch_makes():
    """Device.jk_second_half (made during the fp32 builds on a device off the host's cores) is the second half
    of the fp32 pair the switch would make, for packed rows too; jk_tensor takes it as is; nothing is made
    for rows it cannot reuse."""
    from mp2trn.devices.nki_device import SimDevice
    from mp2trn.precision import fp32_pair
    from pyscf import lib

    full = np.random.default_rng(6).standard_normal((130, 24, 24))
    full = full + full.transpose(0, 2, 1)
    for block in (full, lib.pack_tril(full)):
        dev = SimDevice("fp32", "trn1")
        rows = dev.jk_tensor(block, np.float32)
        lo = dev.jk_second_half(block, rows)
        assert np.array_equal(lo, fp32_pair(full, rows.shape[0])[1])
        x3 = dev.jk_tensor(block, np.float64, planes=3, previous=rows, second=lo)
        assert x3.pair[0] is rows and x3.pair[1] is lo
        assert dev.jk_second_half(block, rows[:192]) is None        # a view of other kept rows: not reusable
        assert dev.jk_second_half(block, rows.astype(np.float64)) is None


def test_resplit_x3_reads_a_group_too_tall_for_sbuf_twice():
    """A group of more rows than SBUF holds for its columns (3300 rows of 520 columns on trn1: 2816 fit) is
    read twice, for its column maxima and for the split: the same planes as the host's split."""
    from mp2trn.kernels.resplit import resplit_reference, resplit_x3, rows_that_fit

    rng = np.random.default_rng(5)
    rows, cols = 3300, 520
    z = rng.standard_normal((rows, cols)) * np.exp(rng.standard_normal(cols))
    exact = z.astype(np.float32)
    rest = ((z - exact) * 300).astype(np.float32)        # a corrections plane well above fp32 rounding
    assert rows > rows_that_fit(cols)
    planes, _ = run(resplit_x3, exact, rest, 6)
    for got, want in zip(planes, resplit_reference(exact, rest, 6)):
        assert np.array_equal(got.astype(np.float64), want.astype(np.float64))


def test_factor_widths_are_whole_tiles_with_little_padding():
    """A density factor's columns are padded to a multiple of 8 (Z's rows then fill whole 1024-row syrk_x3
    launches) with at most 12.5 % zero columns above 64 (Inosine's 70 occupied orbitals: 72, not the 128 of
    a power of two), never above MAX_BLOCK; within a run to the current width (few signatures), which a
    wider block raises and one under 3/4 of it resets (the initial guess's wider factor, a short last part)."""
    from mp2trn.devices.nki_device import MAX_BLOCK, SimDevice, factor_width

    for n in range(1, MAX_BLOCK + 1):
        w = factor_width(n)
        assert w % 8 == 0 and n <= w <= MAX_BLOCK
        assert w - n < 8 or (w - n) <= 0.125 * n
    assert factor_width(70) == 72 and factor_width(140) == 144
    dev = SimDevice("fp32", "trn1")
    assert [dev._factor_width(30, n) for n in (107, 70, 64, 70, 75, 12)] == [112, 72, 72, 72, 80, 16]
    assert [dev._factor_width(40, n) for n in (512, 8, 512, 8)] == [512, 8, 512, 8]   # nocc 520: 512 + 8


def test_packed_host_rows_give_the_devices_unpacked_blocks_and_the_same_builds(monkeypatch):
    """An NKI device takes the SCF tensor's packed host rows (half the host memory): its fp32 rows and the
    compensated builds' fp32 pair are those of the unpacked rows, bit for bit (unpacked in parts on two
    threads), and the builds give the same J and K (J's ρ reads the packed rows: fp64 rounding apart)."""
    from pyscf import lib

    from mp2trn.devices.nki_device import SimDevice

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    rng = np.random.default_rng(12)
    naux, nao = 140, 30
    b = _tensor(rng, naux, nao)
    packed = lib.pack_tril(b)
    c = rng.standard_normal((nao, 5)) / 3
    d = c @ c.T
    builds = []
    for rows in (packed, b):
        dev = SimDevice("fp32", "trn1")
        assert dev.jk_packed
        fp32 = dev.jk_tensor(rows, np.float32)
        x3 = dev.jk_tensor(rows, np.float64, planes=3, previous=fp32)
        assert fp32.shape == (256, nao, nao) and x3.pair[0] is fp32
        builds.append((fp32, x3.pair[1], dev.jk_block(fp32, [(c, 1.0)], d, True, True),
                       dev.jk_block(x3, [(c, 1.0)], d, True, True)))
    (r_p, lo_p, f32_p, x3_p), (r_u, lo_u, f32_u, x3_u) = builds
    assert np.array_equal(r_p, r_u) and np.array_equal(lo_p, lo_u)
    assert all(np.array_equal(p, u) for p, u in zip(f32_p, f32_u))          # fp32 builds: the same launches
    for p, u in zip(x3_p, x3_u):
        assert np.abs(p - u).max() < 1e-13 * np.abs(u).max()
