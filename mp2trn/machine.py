"""The machine a result was measured on, for benchmark and validation reports."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from .version import __version__


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, OS and the versions of the numerical stack."""
    import pyscf

    mem_gb = None
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    except (ValueError, OSError, AttributeError):
        pass
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "memory_gb": None if mem_gb is None else round(mem_gb, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyscf": pyscf.__version__,
        "mp2trn": __version__,
    }


def machine_text(info: dict[str, Any]) -> str:
    """One line for a report: what :func:`machine_info` returned."""
    return (f"{info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB RAM, {info['os']}; Python {info['python']}, "
            f"NumPy {info['numpy']}, PySCF {info['pyscf']}, mp2trn {info['mp2trn']}")


def machine_description() -> str:
    """CPU, cores, Python and the current load average (for benchmark tables)."""
    load = ", load average {:.1f}".format(os.getloadavg()[0]) if hasattr(os, "getloadavg") else ""
    return f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}{load}"
