"""``nki.typing``: shape annotations such as ``x: nt.tensor[128, 512]`` (no runtime checking)."""

from __future__ import annotations

__all__ = ["tensor", "scalar"]


class _Annotated:
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype=None):
        self.shape = shape
        self.dtype = dtype

    def __repr__(self):
        return f"tensor[{', '.join(map(str, self.shape))}]"


class tensor:
    """``tensor[128, 512]`` (optionally ``tensor[128, 512, nl.float32]``) -> an annotation object."""

    def __class_getitem__(cls, item):
        item = item if isinstance(item, tuple) else (item,)
        dims = tuple(i for i in item if isinstance(i, int))
        rest = [i for i in item if not isinstance(i, int)]
        return _Annotated(dims, rest[0] if rest else None)


class scalar:
    def __class_getitem__(cls, item):
        return _Annotated((), item)
