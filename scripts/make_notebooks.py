"""Write the research notebooks (outputs stripped) from the cell sources below.

    python scripts/make_notebooks.py            # rewrites notebooks/*.ipynb

Keeping the source here makes diffs readable; the test suite executes the .ipynb files themselves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def write(name: str, cells: list[tuple[str, str]]) -> None:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
    nbformat.write(nb, NOTEBOOKS / name)


QUICKSTART = [
    ("md", """# mp2trn quickstart

Density-fitted MP2 in a few lines: a molecule from an XYZ file, RHF and UHF references, SCS-MP2, frozen
core, the same calculation through PySCF side by side, and the JSON result read back. Everything runs on
the CPU in seconds."""),
    ("code", """import json, tempfile
from pathlib import Path

import mp2trn
from mp2trn.molecule import build_mole
from pyscf import df, scf
from pyscf.mp import dfmp2, dfump2

MOLECULES = Path("..") / "molecules"
print("mp2trn", mp2trn.__version__)"""),
    ("md", """## 1. A molecule from XYZ, then RHF + DF-MP2

`build_mole` reads standard XYZ (Angstrom by default) into a PySCF `Mole`; charge and multiplicity come from
the comment line when present. `mp2trn.DFMP2(mf)` follows PySCF's conventions (`e_corr`, `e_corr_os`,
`e_corr_ss`, `e_tot`)."""),
    ("code", """mol = build_mole(MOLECULES / "water.xyz", basis="cc-pvdz")
mf = scf.RHF(mol).density_fit().run(conv_tol=1e-10, verbose=0)
pt = mp2trn.DFMP2(mf).run()
print(f"E(HF)        = {mf.e_tot:.10f} Eh")
print(f"E_corr(MP2)  = {pt.e_corr:.10f} Eh  (os {pt.e_corr_os:.10f}, ss {pt.e_corr_ss:.10f})")
print(f"E(MP2)       = {pt.e_tot:.10f} Eh")
print("aux basis:", pt.result.what_ran["auxbasis"], "| device:", pt.result.what_ran["device"])"""),
    ("md", """## 2. An open shell: UHF + DF-UMP2

The hydroxyl radical's XYZ comment says `multiplicity=2`, so `mp2trn.run` builds a UHF reference.
For UHF, αα and ββ pairs give the same-spin part and αβ pairs the opposite-spin part."""),
    ("code", """res = mp2trn.run(MOLECULES / "hydroxyl.xyz", basis="cc-pvdz")
print(res.reference, "multiplicity", res.molecule["molecular_multiplicity"])
print(f"E_corr = {res.e_corr:.10f} Eh  (os {res.e_corr_os:.10f}, ss {res.e_corr_ss:.10f})")"""),
    ("md", """## 3. SCS-MP2 and frozen core

SCS-MP2 rescales the components, 6/5·E_os + 1/3·E_ss (Grimme 2003, as PySCF's `SCSMP2`).
`frozen="auto"` freezes noble-gas cores (here O 1s); an integer freezes the lowest N orbitals per spin."""),
    ("code", """for frozen in (None, "auto", 1):
    p = mp2trn.DFMP2(mf, frozen=frozen).run()
    print(f"frozen={str(frozen):5s} E_corr={p.e_corr:.10f}  SCS E_corr={p.e_scs_corr:.10f}  ({p.result.what_ran['frozen']})")"""),
    ("md", """## 4. The same calculations through PySCF, side by side

Set the MP2 fitting basis explicitly on both sides: PySCF's `DFMP2` on a density-fitted SCF would otherwise
reuse the SCF's JK-fit basis, which shifts E_corr by tens of µEh."""),
    ("code", """rows = []
for name, basis in [("water", "cc-pvdz"), ("ammonia", "def2-svp"), ("hydroxyl", "cc-pvdz"), ("oxygen_triplet", "cc-pvdz")]:
    m = build_mole(MOLECULES / f"{name}.xyz", basis=basis)
    mf_ = (scf.UHF(m) if m.spin else scf.RHF(m)).density_fit().run(conv_tol=1e-10, verbose=0)
    ref = (dfump2.DFUMP2 if m.spin else dfmp2.DFMP2)(mf_)
    ref.with_df = df.DF(m, auxbasis=df.make_auxbasis(m, mp2fit=True))
    ref.verbose = 0
    ref.run()
    ours = mp2trn.DFMP2(mf_).run()
    rows.append((name, basis, "UHF" if m.spin else "RHF", ref.e_corr, ours.e_corr, abs(ref.e_corr - ours.e_corr)))
print(f"{'molecule':16s}{'basis':10s}{'ref':5s}{'PySCF E_corr':>17s}{'mp2trn E_corr':>17s}{'|Δ| (Eh)':>11s}")
for r in rows:
    print(f"{r[0]:16s}{r[1]:10s}{r[2]:5s}{r[3]:17.10f}{r[4]:17.10f}{r[5]:11.1e}")
assert max(r[5] for r in rows) < 1e-8"""),
    ("md", """## 5. JSON output, read back

`mp2trn run --json out.json` (or `result.to_qcschema()`) writes a QCSchema `AtomicResult`-shaped document:
energies under `properties`, and what actually ran (device, precision, bases, frozen orbitals, timings)
under `extras.mp2trn`."""),
    ("code", """from mp2trn.result import write_json_atomic

with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "water.json"
    write_json_atomic(path, pt.result.to_qcschema())
    doc = json.loads(path.read_text())
props, extras = doc["properties"], doc["extras"]["mp2trn"]
print(doc["schema_name"], "| method", doc["model"]["method"], "| basis", doc["model"]["basis"])
for key in ("scf_total_energy", "mp2_opposite_spin_correlation_energy", "mp2_same_spin_correlation_energy",
            "mp2_correlation_energy", "return_energy"):
    print(f"{key:40s} {props[key]: .10f}")
print("ran on:", extras["device"], extras["precision"], "| aux:", extras["auxbasis"], "| SCS E_corr:", round(extras["scs_mp2_correlation_energy"], 10))"""),
]


if __name__ == "__main__":
    targets = sys.argv[1:] or ["01"]
    if "01" in targets:
        write("01_quickstart.ipynb", QUICKSTART)
    print("wrote", ", ".join(targets))
