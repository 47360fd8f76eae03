"""Output files: written atomically (the whole file or nothing), and checked before any work starts."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then move it into place; on any
    error ``path`` is left untouched and the temporary file removed."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` atomically (flushed to disk before it replaces the old file)."""

    def write(tmp: Path) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    atomic_write(path, write)


def write_json_atomic(path: str | os.PathLike, document: dict[str, Any]) -> None:
    """Write JSON so that ``path`` either gets the whole document or is left untouched."""
    write_text_atomic(path, json.dumps(document, indent=2, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def check_output_path(path: Path | None) -> None:
    """Fail before any work if an output file could not be written."""
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"cannot write {path}: directory {parent} does not exist")
    if path.is_dir():
        raise InputError(f"cannot write {path}: it is a directory")
    if not os.access(parent, os.W_OK):
        raise InputError(f"cannot write {path}: directory {parent} is not writable")


def check_output_dir(out: Path) -> None:
    """Fail before any work when ``out`` could not be created or written."""
    if out.exists():
        if not out.is_dir():
            raise InputError(f"--out {out}: exists and is not a directory")
        if not os.access(out, os.W_OK):
            raise InputError(f"--out {out}: directory is not writable")
        return
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise InputError(f"--out {out}: cannot create it ({parent} is not a writable directory)")


def replace_marked_block(path: str | os.PathLike, begin: str, end: str, block: str) -> None:
    """Put ``block`` (which starts with ``begin`` and ends with ``end``) in place of the text between those
    markers in the file at ``path``, or append it when the markers are not there yet (scripts that write
    their tables into the docs); the file is written atomically."""
    import re

    target = Path(path)
    text = target.read_text()
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _m: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    write_text_atomic(target, text)
