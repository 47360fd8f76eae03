#!/usr/bin/env python3
"""The water-dimer counterpoise check of docs/accuracy.md: `mp2trn interaction` against a counterpoise
calculation written directly in PySCF (ghost-atom monomers, the same explicit JK-fit and RI bases).

    python scripts/validate_water_dimer_cp.py [--basis cc-pvdz] [--frozen-core none|auto] [--scf-jk auto|pyscf]

Prints ΔE (SCF, MP2 correlation, MP2 total, SCS-MP2 total) from both, with and without counterpoise
correction, and the largest difference; exits 1 if any difference exceeds 1e-8 Eh. Records the figures and
the table docs/accuracy.md quotes in docs/records/validate_water_dimer_cp.json (scripts/accuracy_records.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyscf import df, gto, scf
from pyscf.data import elements
from pyscf.mp import dfmp2

from accuracy_records import record, short
from mp2trn.interaction import DELTA_KEYS, interaction_energy
from mp2trn.molecule import read_xyz
from mp2trn.result import HARTREE_TO_KCAL

XYZ = Path(__file__).resolve().parents[1] / "molecules" / "s22" / "02_water_dimer.xyz"
LABELS = {"scf": "SCF", "mp2_correlation": "MP2 correlation", "mp2_total": "MP2 total", "scs_mp2_total": "SCS-MP2 total"}


def pyscf_energies(atom: str, basis: str, jk: str, ri: str, conv_tol: float, frozen_core: bool) -> dict[str, float]:
    mol = gto.M(atom=atom, basis=basis, unit="Angstrom", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=jk)
    mf.conv_tol = conv_tol
    mf.kernel()
    assert mf.converged
    pt = dfmp2.DFMP2(mf, frozen=int(elements.chemcore(mol)) if frozen_core else None)
    pt.with_df = df.DF(mol, auxbasis=ri)
    pt.verbose = 0
    pt.run()
    return {"scf": mf.e_tot, "mp2_correlation": pt.e_corr, "mp2_total": mf.e_tot + pt.e_corr,
            "scs_mp2_total": mf.e_tot + 1.2 * pt.e_corr_os + pt.e_corr_ss / 3}


def pyscf_interaction(basis, jk, ri, conv_tol, counterpoise, frozen_core):
    geom = read_xyz(XYZ)
    n_a = geom.fragments[0]
    atoms = [(a.symbol, a.coords) for a in geom.atoms]

    def line(sym, x, ghost=False):
        return f"{'ghost-' if ghost else ''}{sym} {x[0]} {x[1]} {x[2]}"

    dimer = "; ".join(line(s, x) for s, x in atoms)
    if counterpoise:
        a = "; ".join(line(s, x, i >= n_a) for i, (s, x) in enumerate(atoms))
        b = "; ".join(line(s, x, i < n_a) for i, (s, x) in enumerate(atoms))
    else:
        a = "; ".join(line(s, x) for s, x in atoms[:n_a])
        b = "; ".join(line(s, x) for s, x in atoms[n_a:])
    e = [pyscf_energies(m, basis, jk, ri, conv_tol, frozen_core) for m in (dimer, a, b)]
    return {k: e[0][k] - e[1][k] - e[2][k] for k in DELTA_KEYS}


def doc_table(basis: str, rows: dict[str, dict[str, list[float]]]) -> str:
    """The Markdown table of docs/accuracy.md: per ΔE, mp2trn / PySCF / |difference| with and without CP."""

    def eh(value: float) -> str:
        return f"{value:.10f}".replace("-", "−")

    lines = [f"| ΔE, {basis} | mp2trn, CP (Eh) | PySCF direct, CP (Eh) | \\|difference\\| | mp2trn, no CP (Eh) "
             "| PySCF direct, no CP (Eh) | \\|difference\\| |", "|---|---|---|---|---|---|---|"]
    for k in DELTA_KEYS:
        cells = [f"{eh(ours)} | {eh(ref)} | {short(abs(ours - ref))}" for ours, ref in (rows["cp"][k], rows["no_cp"][k])]
        lines.append(f"| {LABELS[k]} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--frozen-core", default="none", choices=["none", "auto"])
    ap.add_argument("--scf-jk", default="auto", choices=["auto", "device", "pyscf"],
                    help="mp2trn's SCF J/K builds (pyscf: PySCF's get_jk, the same SCF iterations as the reference)")
    args = ap.parse_args(argv)
    jk, ri, conv = f"{args.basis}-jkfit", f"{args.basis}-ri", 1e-12
    worst = 0.0
    rows: dict[str, dict[str, list[float]]] = {}
    for cp in (True, False):
        ref = pyscf_interaction(args.basis, jk, ri, conv, cp, args.frozen_core == "auto")
        ours = interaction_energy(XYZ, counterpoise=cp, basis=args.basis, auxbasis=ri, jkbasis=jk, conv_tol=conv,
                                  frozen=args.frozen_core, scf_jk=args.scf_jk).delta
        rows["cp" if cp else "no_cp"] = {k: [ours[k], ref[k]] for k in DELTA_KEYS}
        print(f"\nwater dimer (S22-2), {args.basis}, JK {jk}, RI {ri}, frozen core {args.frozen_core}, "
              f"SCF J/K {args.scf_jk}, "
              f"{'counterpoise-corrected' if cp else 'no counterpoise correction'}")
        print("| ΔE | mp2trn (Eh) | PySCF direct (Eh) | |difference| (Eh) | mp2trn (kcal/mol) |")
        print("|---|---|---|---|---|")
        for k in DELTA_KEYS:
            d = abs(ours[k] - ref[k])
            worst = max(worst, d)
            print(f"| {k} | {ours[k]:.10f} | {ref[k]:.10f} | {d:.1e} | {ours[k] * HARTREE_TO_KCAL:.4f} |")
    print(f"\nlargest difference {worst:.2e} Eh ({'within' if worst <= 1e-8 else 'ABOVE'} 1e-8 Eh)")
    table = doc_table(args.basis, rows)
    print("\n" + table)
    key = f"{args.basis}, frozen core {args.frozen_core}"
    if args.scf_jk != "auto":
        key += f", scf-jk {args.scf_jk}"
        quoted = [f"With `--scf-jk {args.scf_jk}`", f"largest difference {short(worst)} Eh"]
    elif args.frozen_core == "none":
        quoted = [table, f"Largest difference {short(worst)} Eh"]
    else:
        quoted = [f"with `--frozen-core auto`: {short(worst)} Eh"]
    record("validate_water_dimer_cp", key, "docs/accuracy.md", {"largest_difference_eh": worst, "delta_eh": rows},
           quoted)
    return 0 if worst <= 1e-8 else 1


if __name__ == "__main__":
    sys.exit(main())
