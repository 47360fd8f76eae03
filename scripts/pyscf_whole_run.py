#!/usr/bin/env python
"""PySCF's own whole run, as a new user writes it: density-fitted RHF (JK-fit basis) + DFMP2 (RI basis).

    python scripts/pyscf_whole_run.py XYZ BASIS [--conv-tol 1e-10] [--max-memory MB]

Imports PySCF only (not mp2trn, which sets thread-related environment defaults on import), so that
``scripts/bench_end_to_end.py`` can run it in a process of its own, with the environment it chooses.
Prints one JSON line: seconds (whole, SCF, MP2), SCF cycles, E_SCF and E_total (Eh), peak RSS (MB).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xyz")
    ap.add_argument("basis")
    ap.add_argument("--conv-tol", type=float, default=1e-10)
    ap.add_argument("--max-memory", type=float, default=None, help="MB (PySCF's default when omitted)")
    args = ap.parse_args()
    from pyscf import df, gto, scf
    from pyscf.mp import dfmp2

    t0 = time.perf_counter()   # after the imports, as for mp2trn
    mol = gto.M(atom=args.xyz, basis=args.basis, verbose=0)
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol, mf.verbose = args.conv_tol, 0
    if args.max_memory:
        mf.max_memory = args.max_memory
    mf.kernel()
    t_scf = time.perf_counter() - t0
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    pt.verbose = 0
    if args.max_memory:
        pt.max_memory = args.max_memory
    pt.kernel(with_t2=False)
    t = time.perf_counter() - t0
    import resource

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6   # Linux: KiB
    print(json.dumps({"seconds": t, "scf_seconds": t_scf, "mp2_seconds": t - t_scf, "cycles": int(mf.cycles),
                      "converged": bool(mf.converged), "e_scf": float(mf.e_tot),
                      "e_tot": float(mf.e_tot + pt.e_corr), "peak_rss_mb": peak_mb}))


if __name__ == "__main__":
    main()
