"""Write the heavy-element validation molecules (molecules/heavy/*.xyz) with their provenance.

Each structure starts from a textbook guess and is optimised at RHF (UHF for the radical) / def2-SVP with
the def2 effective core potentials, by PySCF's SCF and geomeTRIC's optimiser (``pip install geometric``).
The halogen-bonded complex NH3···I2 joins the two optimised monomers along the N···I–I axis at a chosen
N···I distance of 2.75 Å (Hartree–Fock binds it too weakly to optimise). The counterpoise entry is that
complex with one monomer's atoms as ghosts (each monomer in the complex's basis; ghost iodine carries its
functions but no ECP).

    python scripts/make_heavy_set.py            # rewrites molecules/heavy/*.xyz (a few minutes)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyscf
from pyscf import gto, scf
from pyscf.geomopt.geometric_solver import optimize

OUT = Path(__file__).resolve().parents[1] / "molecules" / "heavy"

#: name → (atoms in Å, charge, multiplicity, what it is)
GUESSES = {
    "hydrogen_bromide": ("H 0 0 0; Br 0 0 1.41", 0, 1, "HBr, all-electron Br (def2 ECPs start at Rb)"),
    "diiodomethane": ("C 0 0 0.9; H 0 0.9 1.5; H 0 -0.9 1.5; I 1.78 0 -0.3; I -1.78 0 -0.3", 0, 1,
                      "CH2I2, two 28-electron iodine ECPs"),
    "stannane": ("Sn 0 0 0; H 0.98 0.98 0.98; H -0.98 -0.98 0.98; H -0.98 0.98 -0.98; H 0.98 -0.98 -0.98", 0, 1,
                 "SnH4, a 5th-row hydride, 28-electron tin ECP"),
    "cisplatin": ("Pt 0 0 0; Cl 2.3 0 0; Cl 0 2.3 0; N -2.05 0 0; N 0 -2.05 0; "
                  "H -2.4 0.9 0.3; H -2.4 -0.5 0.8; H -2.4 -0.4 -0.9; "
                  "H 0.9 -2.4 0.3; H -0.5 -2.4 0.8; H -0.4 -2.4 -0.9", 0, 1,
                  "cis-[PtCl2(NH3)2], closed-shell 5d complex, 60-electron platinum ECP"),
    "iodomethyl": ("C 0 0 0; H 0 0.94 -0.5; H 0 -0.94 -0.5; I 0 0 2.05", 0, 2,
                   "CH2I radical (UHF, doublet), 28-electron iodine ECP"),
    "ammonia": ("N 0 0 0; H 0 0.94 -0.38; H 0.81 -0.47 -0.38; H -0.81 -0.47 -0.38", 0, 1, "NH3 monomer"),
    "iodine": ("I 0 0 0; I 0 0 2.67", 0, 1, "I2 monomer"),
}


def optimised(name: str) -> gto.Mole:
    atoms, charge, mult, _ = GUESSES[name]
    mol = gto.M(atom=atoms, basis="def2-svp", ecp="def2-svp", charge=charge, spin=mult - 1, verbose=0)
    mf = scf.RHF(mol) if mult == 1 else scf.UHF(mol)
    mf.conv_tol = 1e-10
    return optimize(mf, maxsteps=100)


def write_xyz(path: Path, symbols: list[str], coords: np.ndarray, comment: str) -> None:
    lines = [str(len(symbols)), comment] + [f"{s:<8}{x:14.8f}{y:14.8f}{z:14.8f}" for s, (x, y, z) in zip(symbols, coords)]
    path.write_text("\n".join(lines) + "\n")


def provenance(what: str, charge: int, mult: int) -> str:
    keys = (f" charge={charge}" if charge else "") + (f" multiplicity={mult}" if mult != 1 else "")
    return (f"{what}; {'UHF' if mult > 1 else 'RHF'}/def2-SVP+ECP geometry optimised with PySCF {pyscf.__version__} "
            f"+ geomeTRIC (scripts/make_heavy_set.py){keys}")


def complex_geometry(nh3: gto.Mole, i2: gto.Mole, r_ni: float = 2.75) -> tuple[list[str], np.ndarray]:
    """NH3···I–I: the N lone pair (the C3 axis, away from the H atoms) points at I2 along its bond axis."""
    a = nh3.atom_coords(unit="Angstrom")
    n, hs = a[0], a[1:]
    axis = n - hs.mean(axis=0)
    axis /= np.linalg.norm(axis)
    b = i2.atom_coords(unit="Angstrom")
    r_ii = np.linalg.norm(b[1] - b[0])
    iodines = np.array([n + axis * r_ni, n + axis * (r_ni + r_ii)])
    symbols = ["N", "H", "H", "H", "I", "I"]
    return symbols, np.vstack([a, iodines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated names to redo")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = set(args.only.split(",")) if args.only else None
    mols = {}
    for name, (_, charge, mult, what) in GUESSES.items():
        if name in ("ammonia", "iodine") or (wanted and name not in wanted):
            continue
        mol = optimised(name)
        write_xyz(OUT / f"{name}.xyz", [mol.atom_symbol(i) for i in range(mol.natm)], mol.atom_coords(unit="Angstrom"),
                  provenance(what, charge, mult))
        print("wrote", name)
    if wanted is None or "ammonia_iodine" in wanted:
        mols["ammonia"], mols["iodine"] = optimised("ammonia"), optimised("iodine")
        symbols, coords = complex_geometry(mols["ammonia"], mols["iodine"])
        note = ("NH3...I2 halogen-bonded complex: RHF/def2-SVP+ECP monomers (PySCF "
                f"{pyscf.__version__} + geomeTRIC, scripts/make_heavy_set.py) joined at r(N...I) = 2.75 A on the I-I axis")
        write_xyz(OUT / "ammonia_iodine.xyz", symbols, coords, note)
        ghost = ["Gh(N)", "Gh(H)", "Gh(H)", "Gh(H)", "I", "I"]
        write_xyz(OUT / "iodine_in_complex_basis.xyz", ghost, coords,
                  "I2 of the NH3...I2 complex with ghost NH3 (counterpoise monomer in the dimer basis); " + note)
        ghost_i2 = ["N", "H", "H", "H", "Gh(I)", "Gh(I)"]
        write_xyz(OUT / "ammonia_in_complex_basis.xyz", ghost_i2, coords,
                  "NH3 of the NH3...I2 complex with ghost I2 (ghost heavy atoms: functions, no ECP); " + note)
        print("wrote ammonia_iodine, iodine_in_complex_basis, ammonia_in_complex_basis")


if __name__ == "__main__":
    main()
