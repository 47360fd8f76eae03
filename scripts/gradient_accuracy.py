"""How accurate the analytic DF-MP2 gradient and relaxed dipole are, measured (numbers for docs/gradients.md).

    python scripts/gradient_accuracy.py                     # all sections
    python scripts/gradient_accuracy.py --only fd,pyscf      # some of: fd, pyscf, precision, rohf
    python scripts/gradient_accuracy.py --only precision --devices cpu:fp32 sim:fp32 sim:fp32x3 \
        --conv-tols 1e-12 1e-10

- fd: max |analytic − 5-point finite difference (h = 1e-3 bohr)| of mp2trn's own energies, per case.
- pyscf: against PySCF's conventional (non-DF) MP2 gradient and the finite-field dipole of PySCF's
  conventional MP2 energy (the density-fitting error, not a formula error).
- rohf: the same finite differences for ROHF-MBPT(2) (--reference rohf: a doublet, a triplet with frozen core,
  SOS-MP2, an ECP radical), and a closed shell's ROHF gradient against its RHF gradient.
- precision: max |g(device, precision) − g(cpu, fp64, SCF to 1e-12)| on the small-molecule validation set,
  with the SCF converged to each of ``--conv-tols`` (1e-10 is the CLI's default); the cpu:fp64 row shows
  what the SCF convergence alone contributes.
Prints Markdown tables and records those docs/gradients.md quotes in docs/records/gradient_accuracy.json
(scripts/accuracy_records.py). A measurement script, not a test.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from pyscf import gto, mp, scf

import mp2trn
from accuracy_records import record, short

DOC = "docs/gradients.md"
WATER = "O 0 0 0.1; H 0 0.76 -0.5; H 0 -0.72 -0.45"
HYDROXYL = "O 0 0 0; H 0.1 0 1.05"
METHYLENE = "C 0 0 0.1004; H 0 0.9911 -0.3115; H 0 -0.9811 -0.3315"     # triplet, distorted
VALIDATION = ["molecules/water.xyz", "molecules/hydroxyl.xyz", "molecules/ammonia.xyz", "molecules/formaldehyde.xyz",
              "molecules/methyl.xyz", "molecules/hydrogen_fluoride.xyz"]
TIGHT = {"conv_tol": 1e-12}


def _run(mol, gradient=False, **kw):
    return mp2trn.run(mol, basis=mol.basis, multiplicity=mol.spin + 1, gradient=gradient, **TIGHT, **kw)


def _five_point(mol, **kw) -> np.ndarray:
    """The 5-point finite-difference gradient (h = 1e-3 bohr) of mp2trn's energy, every component."""
    h = 1e-3
    coords = mol.atom_coords()
    fd = np.zeros_like(coords)
    for a in range(mol.natm):
        for x in range(3):
            e = {}
            for k in (-2, -1, 1, 2):
                c = coords.copy()
                c[a, x] += k * h
                e[k] = _run(mol.set_geom_(c, unit="Bohr", inplace=False), **kw).e_tot
            fd[a, x] = (e[-2] - 8 * e[-1] + 8 * e[1] - e[2]) / (12 * h)
    return fd


def rohf_section() -> None:
    cases = [("hydroxyl ROHF", HYDROXYL, 1, {}, {}),
             ("methylene triplet ROHF, frozen core", METHYLENE, 2, {}, {"frozen": "auto"}),
             ("hydroxyl ROHF SOS-MP2, frozen core", HYDROXYL, 1, {}, {"frozen": "auto", "method": "sos-mp2"}),
             ("IO def2-SVP (ECP) ROHF, frozen core", "I 0 0 0; O 0 0.1 1.87", 1,
              {"basis": "def2-svp", "ecp": "def2-svp"}, {"frozen": "auto"})]
    # |Σ_A FD_A|: the finite differences' own departure from translational invariance, i.e. the noise of the
    # energies they difference (the analytic gradient's sum is the column before it)
    lines = ["| case | max \\|analytic − 5-point FD\\| (Eh/bohr) | max \\|g\\| | \\|Σ_A g_A\\| | \\|Σ_A FD_A\\| |",
             "|---|---|---|---|---|"]
    figures = {}
    for label, atom, spin, molkw, kw in cases:
        mol = gto.M(atom=atom, spin=spin, verbose=0, **{"basis": "cc-pvdz", **molkw})
        g = _run(mol, True, reference="rohf", **kw).gradient
        fd = _five_point(mol, reference="rohf", **kw)
        figures[label] = {"max_fd_error": np.abs(g - fd).max(), "max_gradient": np.abs(g).max(),
                          "net_force": np.abs(g.sum(0)).max(), "fd_net_force": np.abs(fd.sum(0)).max()}
        lines.append(f"| {label} | {np.abs(g - fd).max():.1e} | {np.abs(g).max():.3f} | {np.abs(g.sum(0)).max():.0e} "
                     f"| {np.abs(fd.sum(0)).max():.1e} |")
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    closed = np.abs(_run(mol, True, reference="rohf", frozen="auto").gradient
                    - _run(mol, True, reference="rhf", frozen="auto").gradient).max()
    figures["water ROHF vs RHF, frozen core"] = {"max_rhf_difference": closed}
    table = "\n".join(lines)
    phrase = f"its ROHF gradient is the RHF one to {short(closed)} Eh/bohr"
    print(table + "\n" + phrase)
    record("gradient_accuracy", "rohf", DOC, figures, [table, phrase])


def fd_section() -> None:
    cases = [("water RHF, frozen core", WATER, 0, {}, {"frozen": "auto"}),
             ("hydroxyl UHF, frozen core", HYDROXYL, 1, {}, {"frozen": "auto"}),
             ("water SCS-MP2", WATER, 0, {}, {"method": "scs-mp2"}),
             ("water + ghost He", WATER + "; ghost-He 0 0 2.6", 0, {}, {"frozen": "auto"}),
             ("HI def2-SVP (ECP)", "I 0 0 0; H 0 0.1 1.65", 0, {"basis": "def2-svp", "ecp": "def2-svp"}, {"frozen": "auto"})]
    lines = ["| case | max \\|analytic − 5-point FD\\| (Eh/bohr) | max \\|g\\| | \\|Σ_A g_A\\| |", "|---|---|---|---|"]
    figures = {}
    for label, atom, spin, molkw, kw in cases:
        mol = gto.M(atom=atom, spin=spin, verbose=0, **{"basis": "cc-pvdz", **molkw})
        g = _run(mol, True, **kw).gradient
        fd = _five_point(mol, **kw)
        figures[label] = {"max_fd_error": np.abs(g - fd).max(), "max_gradient": np.abs(g).max(),
                          "net_force": np.abs(g.sum(0)).max()}
        lines.append(f"| {label} | {np.abs(g - fd).max():.1e} | {np.abs(g).max():.3f} | {np.abs(g.sum(0)).max():.0e} |")
    table = "\n".join(lines)
    print(table)
    record("gradient_accuracy", "fd", DOC, figures, [table])


def pyscf_section() -> None:
    lines = ["| molecule | max \\|g_mp2trn − g_PySCF conventional\\| (Eh/bohr) | \\|Δμ\\| relaxed dipole (a.u.) |",
             "|---|---|---|"]
    figures = {}
    for label, atom, spin in (("water (distorted)", WATER, 0), ("hydroxyl", HYDROXYL, 1)):
        mol = gto.M(atom=atom, basis="cc-pvdz", spin=spin, verbose=0)
        mf = scf.RHF(mol) if spin == 0 else scf.UHF(mol)
        mf.conv_tol = 1e-12
        conventional = mp.MP2(mf.run()).run().nuc_grad_method().kernel()
        ours = _run(mol, True)
        fd = np.zeros(3)
        h0 = mf.get_hcore()
        r = mol.intor("int1e_r")
        for x in range(3):
            e = []
            for sign in (-1, 1):
                m = scf.RHF(mol) if spin == 0 else scf.UHF(mol)
                h = h0 + sign * 1e-3 * r[x]
                m.get_hcore = lambda *args, h=h: h
                m.conv_tol = 1e-12
                e.append(mp.MP2(m.run()).run().e_tot)
            fd[x] = -(e[1] - e[0]) / 2e-3
        nuclear = np.einsum("a,ax->x", mol.atom_charges(), mol.atom_coords())
        dmu = np.abs(np.asarray(ours.dipoles["mp2_relaxed"]) - (fd + nuclear)).max()
        figures[label] = {"max_gradient_difference": np.abs(ours.gradient - conventional).max(), "dipole_difference": dmu}
        lines.append(f"| {label} | {np.abs(ours.gradient - conventional).max():.1e} | {dmu:.1e} |")
    table = "\n".join(lines)
    print(table)
    record("gradient_accuracy", "pyscf", DOC, figures, [table])


def precision_section(devices: list[str], conv_tols: list[float]) -> None:
    """Per device:precision and SCF convergence, the largest gradient error against the tight fp64 reference."""
    ref = {p: mp2trn.run(p, gradient=True, **TIGHT).gradient for p in VALIDATION}
    specs = ["cpu:fp64", *devices]
    worst: dict[str, dict[str, float]] = {spec: {} for spec in specs}
    for tol in conv_tols:
        print(f"\nSCF converged to {tol:g} Eh; errors against cpu:fp64 at 1e-12 (Eh/bohr)")
        print("| device:precision | " + " | ".join(p.split("/")[-1].removesuffix(".xyz") for p in VALIDATION)
              + " | max | wall (s) |")
        print("|---|" + "---|" * (len(VALIDATION) + 2))
        for spec in specs:
            device, precision = spec.split(":")
            t0 = time.perf_counter()
            errs = [np.abs(mp2trn.run(p, gradient=True, device=device, precision=precision, conv_tol=tol).gradient
                           - ref[p]).max() for p in VALIDATION]
            worst[spec][f"{tol:g}"] = max(errs)
            print(f"| {spec} | " + " | ".join(f"{e:.1e}" for e in errs) + f" | {max(errs):.1e} | "
                  f"{time.perf_counter() - t0:.1f} |")
    lines = ["| device:precision | " + " | ".join(f"max error, `--conv-tol {tol:g}`" for tol in conv_tols) + " |",
             "|---|" + "---|" * len(conv_tols)]
    lines += [f"| {spec} | " + " | ".join(f"{worst[spec][f'{tol:g}']:.1e}" for tol in conv_tols) + " |" for spec in specs]
    table = "\n".join(lines)
    print("\n" + table)
    record("gradient_accuracy", "precision " + " ".join(devices), DOC, worst, [table])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="fd,pyscf,precision,rohf")
    parser.add_argument("--devices", nargs="*", default=["cpu:fp32"])
    parser.add_argument("--conv-tols", nargs="*", type=float, default=[1e-12],
                        help="SCF convergence thresholds of the precision section (Eh)")
    args = parser.parse_args()
    sections = args.only.split(",")
    if "fd" in sections:
        fd_section()
    if "pyscf" in sections:
        pyscf_section()
    if "precision" in sections:
        precision_section(args.devices, args.conv_tols)
    if "rohf" in sections:
        rohf_section()


if __name__ == "__main__":
    main()
