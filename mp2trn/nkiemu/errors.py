"""Exceptions raised by the NKI emulator.

Every hardware or API rule the emulator enforces raises a :class:`NkiRuleError` (or a subclass) whose
message names the rule, the instruction and the shapes involved, e.g.::

    [rule nc_matmul.moving_fmax] nc_matmul: moving free size 640 exceeds 512
    (dst (128, 640), stationary (128, 128), moving (128, 640))

The attributes ``rule`` (a stable dotted identifier, listed in docs/emulator.md), ``instruction`` and
``shapes`` (a dict name -> shape) let callers wrap the error into their own exception types.
"""

from __future__ import annotations

__all__ = [
    "NkiError",
    "NkiRuleError",
    "NkiCapacityError",
    "NkiRemovedAPIError",
    "NkiUnsupportedError",
    "NkiSpillWarning",
]


class NkiError(Exception):
    """Base class of every error raised by :mod:`mp2trn.nkiemu`."""


class NkiRuleError(NkiError):
    """A kernel broke an NKI 0.3.0 / Trainium rule (shape, buffer, dtype, engine, API)."""

    def __init__(self, rule: str, instruction: str, detail: str, shapes=None):
        self.rule = rule
        self.instruction = instruction
        self.detail = detail
        self.shapes = {k: tuple(v) if isinstance(v, (tuple, list)) else v for k, v in dict(shapes or {}).items()}
        text = f"[rule {rule}] {instruction}: {detail}"
        if self.shapes:
            text += " (" + ", ".join(f"{k} {v}" for k, v in self.shapes.items()) + ")"
        super().__init__(text)

    def __reduce__(self):  # keep picklable (multiprocessing, pytest-xdist)
        return (type(self), (self.rule, self.instruction, self.detail, self.shapes))


class NkiCapacityError(NkiRuleError):
    """Live SBUF bytes per partition or PSUM banks exceed the target generation's capacity."""


class NkiRemovedAPIError(NkiRuleError):
    """An API that NKI 0.3.0 removed or never supported was used (``nl.divide``, ``tensor_copy(dtype=)``...)."""


class NkiUnsupportedError(NkiError, NotImplementedError):
    """A legal NKI feature that this emulator does not implement (raised instead of guessing)."""


class NkiSpillWarning(UserWarning):
    """Live SBUF data of a kernel overflowed the capacity: the compiler would spill to HBM and refill
    (memory-hierarchy-overview.rst); the emulator models the traffic and warns (strict mode raises)."""
