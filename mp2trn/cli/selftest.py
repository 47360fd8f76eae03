"""``mp2trn selftest``: each device operation (NKI kernels on sim/neuron) against NumPy, water against
PySCF, launch and compile counts; one line per check and a final PASS/FAIL (exit status 1 on FAIL)."""

from __future__ import annotations

import typer

from .common import DeviceFlag, PrecisionFlag, TargetFlag, app, cli_errors, console


@app.command()
@cli_errors
def selftest(
    device: DeviceFlag = "cpu",
    precision: PrecisionFlag = None,
    target: TargetFlag = None,
) -> None:
    """Check this machine: every kernel on a few shapes, a molecule against PySCF, PASS or FAIL."""
    from ..selftest import selftest as run_selftest

    passed, _, _ = run_selftest(device, precision, target, report=lambda line: console.print(line, markup=False, highlight=False,
                                                                                             soft_wrap=True))
    if not passed:
        raise typer.Exit(1)
