#!/usr/bin/env python
"""PySCF's own double-hybrid whole run: DF Kohn–Sham SCF with the functional's DFT part + DFMP2 on the
Kohn–Sham orbitals, scaled (+ D3(BJ) from pyscf-dispersion where the functional has it).

    python scripts/pyscf_double_hybrid_run.py XYZ BASIS --xc "0.53*HF + 0.47*B88, 0.73*LYP" --c-os 0.27 --c-ss 0.27
        [--jkbasis NAME] [--rifit NAME] [--d3 dsdpbep86] [--grid 3] [--conv-tol 1e-10] [--max-memory MB]

Imports PySCF only (not mp2trn), so that ``scripts/bench_double_hybrid.py`` runs it in a fresh process with
the environment it chooses. Prints one JSON line: seconds (whole, SCF, of which XC on the grid, MP2),
SCF cycles and energies (Eh).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xyz")
    ap.add_argument("basis")
    ap.add_argument("--xc", required=True)
    ap.add_argument("--c-os", type=float, required=True)
    ap.add_argument("--c-ss", type=float, required=True)
    ap.add_argument("--jkbasis", default=None, help="JK-fit basis (default: PySCF's for the basis)")
    ap.add_argument("--rifit", default=None, help="RI basis (default: PySCF's mp2fit for the basis)")
    ap.add_argument("--d3", default=None, help="the dftd3 library's functional name for D3(BJ)")
    ap.add_argument("--grid", type=int, default=None)
    ap.add_argument("--conv-tol", type=float, default=1e-10)
    ap.add_argument("--max-memory", type=float, default=None)
    args = ap.parse_args()
    from pyscf import df, dft, gto
    from pyscf.mp import dfmp2

    t0 = time.perf_counter()
    mol = gto.M(atom=args.xyz, basis=args.basis, verbose=0)
    mf = dft.RKS(mol)
    mf.xc = args.xc
    if args.grid is not None:
        mf.grids.level = args.grid
    mf = mf.density_fit(auxbasis=args.jkbasis)
    mf.conv_tol, mf.verbose = args.conv_tol, 0
    if args.max_memory:
        mf.max_memory = args.max_memory
    xc_seconds = [0.0]
    nr_rks = mf._numint.nr_rks

    def timed_nr_rks(*a, **k):   # the grid work of each Fock build (the semilocal XC potential)
        t = time.perf_counter()
        out = nr_rks(*a, **k)
        xc_seconds[0] += time.perf_counter() - t
        return out

    mf._numint.nr_rks = timed_nr_rks
    mf.kernel()
    t_scf = time.perf_counter() - t0
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=args.rifit or df.make_auxbasis(mol, mp2fit=True))
    pt.verbose = 0
    if args.max_memory:
        pt.max_memory = args.max_memory
    pt.kernel(with_t2=False)
    e_disp = 0.0
    if args.d3:
        from pyscf.dispersion import dftd3

        e_disp = float(dftd3.DFTD3Dispersion(mol, xc=args.d3, version="d3bj").get_dispersion()["energy"])
    t = time.perf_counter() - t0
    e_tot = float(mf.e_tot) + args.c_os * float(pt.e_corr_os) + args.c_ss * float(pt.e_corr_ss) + e_disp
    print(json.dumps({"seconds": t, "scf_seconds": t_scf, "xc_seconds": xc_seconds[0], "mp2_seconds": t - t_scf,
                      "cycles": int(mf.cycles), "converged": bool(mf.converged), "grid_points": int(len(mf.grids.weights)),
                      "e_ks": float(mf.e_tot), "e_disp": e_disp, "e_tot": e_tot}))


if __name__ == "__main__":
    main()
