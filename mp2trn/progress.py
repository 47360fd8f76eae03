"""The progress callback every long stage reports to: ``progress(stage, done, total)``.

Stages: "scf" (cycles), "ao_to_mo" (AO blocks), "metric" (spins or column blocks), "pairs" (block pairs).
"""

from collections.abc import Callable

Progress = Callable[[str, int, int], None]
