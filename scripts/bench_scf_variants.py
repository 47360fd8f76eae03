"""SCF variants tried for the whole-run speed goal and not adopted: what they change, measured.

    python scripts/bench_scf_variants.py diis             # PySCF DIIS settings: cycles and SCF time
    python scripts/bench_scf_variants.py fp64-coulomb     # fp32 builds with J from the fp64 tensor
    python scripts/bench_scf_variants.py incremental      # after the switch: fp64 reference + fp32 ΔD builds

Inosine/cc-pVDZ by default (``--case vitaminc-tz`` for Vitamin C/cc-pVTZ), device J/K on the cpu device,
conv_tol 1e-10, PySCF's conv_check off (as ``mp2trn.run`` runs it), the memory budget of a run.

``diis``: fp64 SCFs with ``diis_space`` 8 (PySCF's default), 12 and 16, and with PySCF's ADIIS and EDIIS
in place of CDIIS; prints cycles, SCF seconds and the energy.

``fp64-coulomb``: fp32 SCFs whose builds take K in fp32 and J in fp64 from the host tensor (an
experiment: this script patches the J of ``DeviceJK.get_jk``), switching to fp64 when the orbital gradient
falls below ``--grad`` (no other rule); prints the fp32 gradients, the cycles in each precision, the mean
seconds of each kind of build (from the SCF's own build records) and the SCF time, against the default
mixed SCF; the variants take turns ``--repeat`` times and each keeps its faster run.

``incremental``: fp32 SCFs (RHF) whose first build after the precision switch is a full fp64 reference
build, and every later build adds an fp32 build on ΔD = D − D_ref to it: with C = C_ref·U + Δ (U the
orthogonal Procrustes rotation between the two occupied spaces, so Δ is small), Y_P = B_P Δ,
W_P = B_P C_ref U + Y_P/2, K(ΔD) = Σ_P W_P Y_Pᵀ + Y_P W_Pᵀ and ρ_P(ΔD) = 2 Σ W_P∘Δ, all in fp32 from the
reference's half-transform B_P C_ref kept in fp32 — the rounding noise scales with |ΔD| instead of |D|.
An experiment (this script patches ``DeviceJK.get_jk``): the reference build here recomputes B_P C_ref in
fp32 (its seconds are counted), where a built-in version would keep it from the fp64 build.

A benchmark: it prints measurements and asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import numpy as np
from pyscf import df, scf
from pyscf.scf import diis as scf_diis

from mp2trn import jk as jk_module
from mp2trn.benchmark import END_TO_END
from mp2trn.jk import PrecisionSchedule, density_fit_jk, precision_runs
from mp2trn.machine import machine_description
from mp2trn.memory import default_memory_mb
from mp2trn.molecule import build_mole
from mp2trn.threads import one_blas_pool


def _scf(mol, precision: str, **attrs):
    mf = scf.RHF(mol).density_fit()
    mf.max_memory = default_memory_mb()
    mf.with_df.auxmol = df.addons.make_auxmol(mol, mf.with_df.auxbasis)
    mf = density_fit_jk(mf, device="cpu", precision=precision)
    mf.conv_tol, mf.verbose, mf.conv_check = 1e-10, 0, False
    for key, value in attrs.items():
        setattr(mf, key, value)
    return mf


def _run(mf) -> float:
    t0 = time.perf_counter()
    with one_blas_pool():   # as mp2trn's own SCF runs (mp2trn/threads.py)
        mf.kernel()
    return time.perf_counter() - t0


def diis_variants(mol) -> None:
    print("| DIIS | cycles | SCF (s) | converged | E_SCF (Eh) |\n|---|---:|---:|---|---:|")
    for label, attrs in (("CDIIS, space 8 (default)", {}), ("CDIIS, space 12", {"diis_space": 12}),
                         ("CDIIS, space 16", {"diis_space": 16}), ("ADIIS", {"DIIS": scf_diis.ADIIS}),
                         ("EDIIS", {"DIIS": scf_diis.EDIIS, "max_cycle": 50})):
        mf = _scf(mol, "fp64", **attrs)
        t = _run(mf)
        print(f"| {label} | {mf.cycles} | {t:.1f} | {mf.converged} | {mf.e_tot:.10f} |", flush=True)


@contextlib.contextmanager
def _patched_get_jk(make):
    """Inside the block DeviceJK.get_jk is ``make(original get_jk)``."""
    original = jk_module.DeviceJK.get_jk
    jk_module.DeviceJK.get_jk = make(original)
    try:
        yield
    finally:
        jk_module.DeviceJK.get_jk = original


def _fp64_coulomb_get_jk(original):
    """get_jk whose reduced-precision builds take J from the fp64 host tensor."""

    def get_jk(self, dm, hermi=1, with_j=True, with_k=True, *args, **kwargs):
        reduced = self.schedule.reduced
        vj, vk = original(self, dm, hermi, with_j and not reduced, with_k, *args, **kwargs)
        if with_j and reduced:
            t0 = time.perf_counter()
            flat = self._full.reshape(self._full.shape[0], -1)
            dms = np.asarray(dm).reshape(-1, flat.shape[1])
            vj = ((flat @ dms.T).T @ flat).reshape(np.shape(dm))
            self.builds[-1]["seconds"] += time.perf_counter() - t0
        return vj, vk

    return get_jk


#: the table the build-level variants print
BUILDS_HEADER = ("| SCF | cycles | first build s (makes the tensor) | mean s per later build | all builds s | SCF (s) | "
                 "E_SCF (Eh) |\n|---|---|---:|---|---:|---:|---:|")


def _default_mixed(best: dict, mol, label: str) -> None:
    """One run of the default mixed SCF, kept in ``best`` under ``label`` when it is the faster."""
    mf = _scf(mol, "fp32")
    _keep(best, label, mf, _run(mf), None)


def _incremental_get_jk(original):
    """get_jk that, after the switch, makes one fp64 reference build, then fp32 builds on ΔD (RHF)."""

    def get_jk(self, dm, hermi=1, with_j=True, with_k=True, *args, **kwargs):
        if self.schedule.reduced or not (with_j and with_k):
            return original(self, dm, hermi, with_j, with_k, *args, **kwargs)
        c_now = jk_module.density_factors(dm)[0][0][0]
        ref = getattr(self, "_reference", None)
        if ref is None:   # the fp64 reference build, and B_P C_ref in fp32 for the later ones
            vj, vk = original(self, dm, hermi, with_j, with_k, *args, **kwargs)
            t0 = time.perf_counter()
            full, nao = self._full, c_now.shape[0]
            x32 = [(full[p0 : p0 + 256].reshape(-1, nao).astype(np.float32) @ c_now.astype(np.float32))
                   for p0 in range(0, full.shape[0], 256)]
            self._reference = {"c": c_now, "j": vj, "k": vk, "x": x32, "s": self.mol.intor_symmetric("int1e_ovlp")}
            self.builds[-1]["seconds"] += time.perf_counter() - t0
            return vj, vk
        t0 = time.perf_counter()
        w_, _, vt = np.linalg.svd(ref["c"].T @ ref["s"] @ c_now)
        u = w_ @ vt                                  # C_ref·U is the reference orbital set closest to C
        delta = (c_now - ref["c"] @ u).astype(np.float32)
        u32 = u.astype(np.float32)
        full, nao, n = self._full, c_now.shape[0], c_now.shape[1]
        vj, vk = ref["j"].copy(), ref["k"].copy()
        for k, p0 in enumerate(range(0, full.shape[0], 256)):
            b32 = full[p0 : p0 + 256].astype(np.float32)
            p = b32.shape[0]
            y = b32.reshape(p * nao, nao) @ delta
            w = ref["x"][k] @ u32
            w += 0.5 * y
            rho = 2.0 * (w.reshape(p, nao * n) @ delta.ravel())
            wt = np.ascontiguousarray(w.reshape(p, nao, n).transpose(1, 0, 2)).reshape(nao, p * n)
            yt = np.ascontiguousarray(y.reshape(p, nao, n).transpose(1, 0, 2)).reshape(nao, p * n)
            g = (wt @ yt.T).astype(np.float64)
            vk += g + g.T
            vj += (rho @ b32.reshape(p, nao * nao)).reshape(nao, nao)
        self.builds.append({"precision": "fp32 on ΔD", "seconds": time.perf_counter() - t0})
        return vj.reshape(np.shape(dm)), vk.reshape(np.shape(dm))

    return get_jk


def incremental(mol, repeat: int) -> None:
    """Default mixed SCF and the incremental variant take turns ``repeat`` times; each keeps its faster run."""
    print(BUILDS_HEADER)
    best: dict = {}
    for _ in range(repeat):
        _default_mixed(best, mol, "default mixed (fp32, then fp64)")
        with _patched_get_jk(_incremental_get_jk):
            mf = _scf(mol, "fp32")
            _keep(best, "fp32, then fp64 reference + fp32 on ΔD", mf, _run(mf), None)
    for label, (seconds, mf, _) in best.items():
        _report(label, mf, seconds)
        print(f"|  | builds: {precision_runs([b['precision'] for b in mf.with_df.log.builds])} | | | | | |")


def _gradient_switch(mf, threshold: float) -> list:
    """Switch on the orbital gradient alone; returns the list the reduced cycles' gradients go to."""
    log = mf.with_df.log
    log.schedule = PrecisionSchedule(log.schedule.start, switch_grad=threshold, min_reduced=10**9, max_reduced=40)
    gradients: list = []
    mf.callback = lambda envs: gradients.append(envs["norm_gorb"]) \
        if log.cycles[-1].startswith(log.schedule.start.name) else None
    return gradients


def _report(label: str, mf, seconds: float) -> None:
    first, *later = mf.with_df.log.builds   # the first build also makes the tensor
    means = {p: statistics.mean(b["seconds"] for b in later if b["precision"] == p)
             for p in sorted({b["precision"] for b in later})}
    total = sum(b["seconds"] for b in mf.with_df.log.builds)
    print(f"| {label} | {precision_runs(mf.with_df.log.cycles)} | {first['seconds']:.2f} | "
          + ", ".join(f"{p} {s:.3f}" for p, s in means.items()) + f" | {total:.1f} | {seconds:.1f} | {mf.e_tot:.10f} |",
          flush=True)


def fp64_coulomb(mol, grads: list[float], repeat: int) -> None:
    """The variants take turns ``repeat`` times (the first run in a process also pays for fresh memory);
    each row is a variant's faster run."""
    print(BUILDS_HEADER)
    best: dict = {}
    for _ in range(repeat):
        _default_mixed(best, mol, "default mixed (fp32 J and K, default switch rules)")
        with _patched_get_jk(_fp64_coulomb_get_jk):
            for g in grads:
                mf = _scf(mol, "fp32")
                gradients = _gradient_switch(mf, g)
                _keep(best, f"fp32 K + fp64 J, switch at abs(g) < {g:g}", mf, _run(mf), gradients)
    for label, (seconds, mf, gradients) in best.items():
        _report(label, mf, seconds)
        if gradients:
            print("|  | fp32 gradients: " + " ".join(f"{x:.1e}" for x in gradients) + " | | | | | |")


def _keep(best: dict, label: str, mf, seconds: float, gradients) -> None:
    if label not in best or seconds < best[label][0]:
        best[label] = (seconds, mf, gradients)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("diis", "fp64-coulomb", "incremental"))
    ap.add_argument("--case", default="inosine-dz", choices=list(END_TO_END))
    ap.add_argument("--grad", nargs="+", type=float, default=[1.5e-5])
    ap.add_argument("--repeat", type=int, default=2, help="fp64-coulomb: turns per variant (the faster is kept)")
    args = ap.parse_args()
    path, basis = END_TO_END[args.case]
    mol = build_mole(path, basis=basis)
    print(f"{args.case}: {machine_description()}")
    if args.what == "diis":
        diis_variants(mol)
    elif args.what == "incremental":
        incremental(mol, args.repeat)
    else:
        fp64_coulomb(mol, args.grad, args.repeat)


if __name__ == "__main__":
    main()
