"""Wall time of a whole `mp2trn run molecules/benzene.xyz --device sim` (SCF included), per precision.

    python scripts/bench_sim_wall.py

Issue 4's goal: under 60 s on a 2-core machine. Prints the times and their ratio to the goal; asserts nothing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 60.0


def main() -> None:
    for precision in ("fp32", "fp32x3"):
        cmd = [sys.executable, "-c", "from mp2trn.cli import app; app()", "run", str(ROOT / "molecules" / "benzene.xyz"),
               "--basis", "cc-pvdz", "--device", "sim", "--precision", precision, "--quiet"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        wall = time.perf_counter() - t0
        print(f"benzene/cc-pVDZ --device sim --precision {precision}: {wall:.1f} s wall "
              f"({wall / GOAL_S:.2f} of the {GOAL_S:.0f} s goal)")


if __name__ == "__main__":
    main()
