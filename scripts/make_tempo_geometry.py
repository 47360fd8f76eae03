"""Write molecules/tempo.xyz: the TEMPO radical (C9H18NO, 29 atoms) from SMILES with RDKit.

    pip install rdkit && python scripts/make_tempo_geometry.py

The geometry is a force-field one: RDKit's ETKDGv3 embedding with a fixed seed, then MMFF94 minimised to
convergence. It is a benchmark input (its size and its open shell are what matter), not an equilibrium
structure of any quantum-chemical method; the comment line says so, with the RDKit version and the seed.
"""

from __future__ import annotations

from pathlib import Path

from rdkit import Chem, rdBase
from rdkit.Chem import AllChem, rdMolTransforms

from mp2trn.files import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
SMILES = "CC1(C)CCCC(C)(C)N1[O]"  # 2,2,6,6-tetramethylpiperidin-1-oxyl; [O] keeps the unpaired electron
SEED = 0xF00D


def build() -> tuple[Chem.Mol, float]:
    """The embedded, MMFF94-minimised molecule (hydrogens explicit) and its N–O length in Å."""
    mol = Chem.AddHs(Chem.MolFromSmiles(SMILES))
    params = AllChem.ETKDGv3()
    params.randomSeed = SEED
    if AllChem.EmbedMolecule(mol, params) != 0:
        raise RuntimeError("ETKDG embedding failed")
    force_field = AllChem.MMFFGetMoleculeForceField(mol, AllChem.MMFFGetMoleculeProperties(mol, mmffVariant="MMFF94"))
    if force_field.Minimize(maxIts=10000) != 0:
        raise RuntimeError("MMFF94 minimisation did not converge")
    nitrogen = next(a.GetIdx() for a in mol.GetAtoms() if a.GetSymbol() == "N")
    oxygen = next(a.GetIdx() for a in mol.GetAtoms() if a.GetSymbol() == "O")
    return mol, rdMolTransforms.GetBondLength(mol.GetConformer(), nitrogen, oxygen)


def main() -> None:
    mol, n_o = build()
    conformer = mol.GetConformer()
    comment = (f"TEMPO radical C9H18NO from SMILES {SMILES}: RDKit {rdBase.rdkitVersion} ETKDGv3 seed {SEED} + MMFF94 "
               f"minimised (force-field geometry, N-O {n_o:.3f} A; a benchmark input, not an ab initio minimum) "
               "multiplicity=2")
    rows = [f"{atom.GetSymbol():2s} {x:12.6f} {y:12.6f} {z:12.6f}"
            for atom, (x, y, z) in zip(mol.GetAtoms(), conformer.GetPositions())]
    path = ROOT / "molecules" / "tempo.xyz"
    write_text_atomic(path, "\n".join([str(mol.GetNumAtoms()), comment, *rows]) + "\n")
    print(f"wrote {path}: {mol.GetNumAtoms()} atoms, N-O {n_o:.3f} A")


if __name__ == "__main__":
    main()
