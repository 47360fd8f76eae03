"""Peak resident memory of the host work done while the device works (mp2trn.overlap), at a small budget.

    python scripts/bench_overlap_memory.py                 # benzene/cc-pVDZ, --memory 300 and 800
    python scripts/bench_overlap_memory.py --memory 200 --xyz molecules/gpu4pyscf/organic/020_Vitamin_C.xyz

The MP2 integrals made during the SCF (transform.EarlyIntegrals) and the compensated blocks' second halves
made during the fp32 builds (Device.jk_second_half) run only on a device that computes off the host's
cores (neuron, cuda). Here the same devices that run on this machine are made to say they compute off the
host's cores (a subclass of each, ``computes_on_host_cores`` False), so that both run, and each run is
set against the plain device's in a fresh process at the same budget:

- ``cpu`` with ``--gradient``: the early integrals (and the gradient after them);
- ``sim`` fp32: the early integrals and the second halves.

Printed per run: the peak RSS of the child (its own ``ru_maxrss`` at the end), the energy, and what ran. A
benchmark: it prints measurements and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, resource, sys
from mp2trn.devices.cpu import CpuDevice
from mp2trn.devices.nki_device import SimDevice
from mp2trn.options import RunOptions
from mp2trn.pipeline import compute

xyz, memory, device, off_host = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
base = CpuDevice if device == "cpu" else SimDevice

class OffHost(base):
    def computes_on_host_cores(self) -> bool:
        return False

cls = OffHost if off_host else base
dev = cls() if device == "cpu" else cls("fp32")
r, mf = compute(xyz, RunOptions(gradient=device == "cpu", max_memory=memory), dev)
print(json.dumps({"e_tot": r.e_tot, "early": r.what_ran.get("mp2_integrals_during_scf"),
                  "second_halves": r.scf.get("second_halves_ahead"),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(xyz: str, memory: float, device: str, off_host: bool) -> dict:
    """One run in a fresh process: its JSON line and peak RSS (MB)."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, xyz, str(memory), device, "1" if off_host else "0"],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"{device} run failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xyz", default=str(ROOT / "molecules" / "benzene.xyz"))
    ap.add_argument("--memory", type=float, nargs="+", default=[300.0, 800.0])
    args = ap.parse_args()
    print(f"{Path(args.xyz).name}; peak RSS of each run in a fresh process\n")
    print("| --memory MB | device | computes off the host | peak RSS MB | total energy | MP2 integrals during the "
          "SCF | second halves during the fp32 builds |\n|---:|---|---|---:|---:|---|---|")
    for memory in args.memory:
        for device in ("cpu", "sim"):
            for off_host in (False, True):
                r = run(args.xyz, memory, device, off_host)
                print(f"| {memory:.0f} | {device}{' --gradient' if device == 'cpu' else ' fp32'} | "
                      f"{'yes' if off_host else 'no'} | {r['peak_mb']:.0f} | {r['e_tot']:.10f} | {r['early'] or '–'} | "
                      f"{r['second_halves'] or '–'} |")


if __name__ == "__main__":
    main()
