"""Many molecules, one after another: ``mp2trn batch`` and :func:`run_batch`.

Inputs are molecule files (anything ``mp2trn run`` reads), folders of them, or list files (one path per
line, ``#`` comments; relative paths are relative to the list). Each finished molecule appends ONE line
to a JSON-lines file, written under an exclusive lock and flushed to disk before the next starts, so a
killed batch leaves only whole records:

    {"source": "<path>", "status": "ok", "result": <what `mp2trn run --json` writes>, "seconds": ...,
     "peak_memory_mb": <this process's (rank's) peak resident memory so far>}
    {"source": "<path>", "status": "error", "error": "<the CLI's one-line message>", "error_type": "InputError",
     "exit_code": 2, "seconds": ...}

A failure is recorded and the batch goes on. ``resume=True`` skips every source that already has an
``ok`` record (failed ones run again). Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) each rank takes
every WORLD_SIZE-th molecule, all ranks append to the same file, and only rank 0 prints the summary.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError, Mp2trnError
from .files import _json_default
from .memory import peak_rss_mb
from .options import RunOptions
from .parallel import rank_and_size

#: file name endings taken from a folder (ASE formats need the extra, like `mp2trn run`)
MOLECULE_SUFFIXES = (".xyz", ".pdb", ".sdf", ".mol", ".cif")


@dataclass
class BatchSummary:
    """What a batch did: sources run, succeeded, failed, skipped (resume), and the wall time (s)."""

    total: int = 0
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)


def collect_sources(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """The molecule files named by ``inputs`` (files, folders, ``.txt``/``.list`` list files), in order,
    each once; a missing input or an empty selection is an InputError."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.suffix.lower() in MOLECULE_SUFFIXES)
            if not found:
                raise InputError(f"{p}: no molecule files ({', '.join(MOLECULE_SUFFIXES)}) in this folder")
            out += found
        elif p.is_file() and p.suffix.lower() in (".txt", ".list"):
            for line in p.read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    entry = Path(line) if Path(line).is_absolute() else p.parent / line
                    out.append(entry)
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"no such file or folder: {p}")
    seen, unique = set(), []
    for p in out:
        key = str(p.resolve())
        if key not in seen:
            seen.add(key)
            unique.append(p)
    if not unique:
        raise InputError("no molecules to run")
    return unique


def done_sources(path: Path) -> set[str]:
    """Sources with an ``ok`` record in the JSON-lines file (a torn last line is ignored)."""
    done: set[str] = set()
    if not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("status") == "ok":
            done.add(rec.get("source", ""))
    return done


def drop_torn_tail(path: Path) -> None:
    """Cut a last line that a kill left half-written (a file that does not end in a newline)."""
    if not path.exists():
        return
    with open(path, "rb+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            data = fh.read()
            if data and not data.endswith(b"\n"):
                fh.truncate(data.rfind(b"\n") + 1)
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line under an exclusive lock, flushed to disk (safe across processes)."""
    line = json.dumps(record, default=_json_default) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run_batch(inputs: Iterable[str | os.PathLike], out: str | os.PathLike, options: RunOptions | None = None,
              resume: bool = False, progress: Callable[[int, int, str, float], None] | None = None,
              rank: int | None = None, world_size: int | None = None, optimize: bool = False,
              convergence: str = "gau", max_steps: int = 100, freq: bool = False) -> BatchSummary:
    """Run every molecule of ``inputs`` with ``options``, appending one record each to ``out``.

    ``progress(done, total, source, eta_seconds)`` after each molecule. ``rank``/``world_size`` default to
    the torchrun environment; this rank runs sources rank, rank + world_size, ... With ``optimize`` each
    molecule's geometry is optimised (:func:`mp2trn.geomopt.optimize`, ``convergence``, ``max_steps``) and
    its record holds the final geometry and energy; one that does not converge is a failed record. With
    ``freq`` each molecule's frequencies and thermochemistry follow (at the final geometry when optimised):
    the record's result is the hessian document (:meth:`mp2trn.hessian.FrequencyResult.to_qcschema`), or the
    optimisation record with it under ``frequencies``.
    """
    from .pipeline import run

    options = RunOptions.build(options, distributed=False)   # whole molecules per rank
    out = Path(out)
    if out.exists() and not resume:
        raise InputError(f"{out} exists: use --resume to continue that batch, or another --out")
    if not out.parent.is_dir():
        raise InputError(f"cannot write {out}: directory {out.parent} does not exist")
    sources = collect_sources(inputs)
    r, n = rank_and_size()
    r = r if rank is None else rank
    n = n if world_size is None else world_size
    if resume:
        drop_torn_tail(out)
    done = done_sources(out) if resume else set()
    mine = [s for k, s in enumerate(sources) if k % n == r]
    todo = [s for s in mine if str(s) not in done]
    summary = BatchSummary(total=len(mine), skipped=len(mine) - len(todo))
    t_start = time.perf_counter()
    for k, source in enumerate(todo):
        t0 = time.perf_counter()
        record: dict[str, Any] = {"source": str(source)}
        try:
            if optimize:
                record.update(status="ok", result=_optimised(source, options, convergence, max_steps, freq))
            elif freq:
                record.update(status="ok", result=_frequencies(source, options))
            else:
                record.update(status="ok", result=run(source, options).to_qcschema())
            summary.ok += 1
        except Mp2trnError as exc:
            record.update(status="error", error=str(exc), error_type=type(exc).__name__, exit_code=exc.exit_code)
            summary.failed += 1
            summary.failures.append((str(source), str(exc)))
        record["seconds"] = time.perf_counter() - t0
        record["peak_memory_mb"] = peak_rss_mb()   # of this process (rank) so far
        if n > 1:
            record["rank"] = r
        append_record(out, record)
        if progress:
            elapsed = time.perf_counter() - t_start
            eta = elapsed / (k + 1) * (len(todo) - k - 1)
            progress(k + 1, len(todo), str(source), eta)
    summary.seconds = time.perf_counter() - t_start
    return summary


def _frequencies(source: Path, options: RunOptions, coords_bohr=None) -> dict[str, Any]:
    """The hessian document of one molecule (at ``coords_bohr`` when given), on this rank alone."""
    from .hessian import run_frequencies
    from .pipeline import open_device
    from .scratch import run_scratch

    with run_scratch(options.scratch), open_device(options) as device:
        return run_frequencies(source, options, device, coords_bohr=coords_bohr).to_qcschema()


def _optimised(source: Path, options: RunOptions, convergence: str, max_steps: int,
               freq: bool = False) -> dict[str, Any]:
    """The record of one optimised molecule: final molecule (QCSchema), energy, XYZ, steps and SCF cycles
    (and with ``freq`` the hessian document at the final geometry)."""
    from .geomopt import optimize
    from .pipeline import open_device
    from .scratch import run_scratch

    with run_scratch(options.scratch), open_device(options) as device:
        opt = optimize(source, RunOptions.build(options, gradient=True), device, convergence, max_steps)
    final = opt.final
    return {"energy": final.energy, "final_molecule": final.result.molecule if final.result else None,
            "final_xyz": opt.final_xyz(), "converged": opt.converged, "steps": len(opt.steps),
            "max_gradient": final.max_gradient, "scf_cycles": [s.scf_cycles for s in opt.steps],
            "method": options.method, "basis": options.basis,
            **({"frequencies": _frequencies(source, options, final.coords)} if freq else {})}


__all__ = ["BatchSummary", "collect_sources", "run_batch", "done_sources", "append_record", "drop_torn_tail"]
