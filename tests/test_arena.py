"""The gradient's arena (mp2trn.memory.Arena, carving): arrays carved in turn from one mapping, never two
live arrays in the same bytes, pages given back on trim, and the gradient the same with it as without."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import mp2trn
from mp2trn import memory
from mp2trn.memory import Arena, carving, prefaulted_empty

MB = 1 << 20


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _inside(arena: Arena, a: np.ndarray) -> bool:
    start = np.frombuffer(arena._map, dtype=np.uint8).__array_interface__["data"][0]
    return start <= _address(a) < start + arena.size


def test_live_arrays_never_share_bytes_and_dead_ones_are_reused():
    arena = Arena(8 * MB)
    a = arena.carve((MB // 8,))                    # 1 MB of fp64
    b = arena.carve((256, 1024), np.float32)       # 1 MB of fp32
    assert a is not None and b is not None and not np.shares_memory(a, b)
    assert not a.any() and not b.any() and a.flags.c_contiguous and b.flags.c_contiguous
    a[:] = 1.0
    b[:] = 2.0
    first = _address(a)
    assert arena.live == 2
    del a, b
    gc.collect()
    assert arena.live == 0
    c = arena.carve((MB // 8,))
    assert _address(c) == first and not c.any()    # the same pages again, zero-filled


def test_a_view_keeps_its_carved_bytes_taken():
    arena = Arena(4 * MB)
    a = arena.carve((512, 256))
    view = a[::2].T
    view[...] = 3.0
    del a
    gc.collect()
    assert arena.live == 1                         # the view holds it
    b = arena.carve((512, 256))
    assert not np.shares_memory(b, view) and np.all(view == 3.0)
    del view, b
    gc.collect()
    assert arena.live == 0


def test_the_space_of_arrays_gone_is_the_next_ones():
    arena = Arena(8 * MB)
    a = arena.carve((MB // 8,))
    b = arena.carve((MB // 8,))
    a_at, b_at = _address(a), _address(b)
    del b
    gc.collect()
    c = arena.carve((MB // 8,))
    assert _address(c) == b_at                     # b was the last: its space is c's
    del a
    gc.collect()
    d = arena.carve((MB // 8,))
    assert _address(d) == a_at                     # a's space, below the live c, is d's
    assert not np.shares_memory(c, d)


def test_what_does_not_fit_is_not_carved():
    arena = Arena(2 * MB)
    assert arena.carve((3 * MB // 8,)) is None
    assert arena.carve((0,)) is None
    keep = arena.carve((MB // 8,))
    assert arena.carve((MB // 8 + 1,)) is None     # the rest of the mapping is one page short
    assert keep is not None


def test_trim_gives_back_only_pages_past_the_live_arrays():
    arena = Arena(4 * MB)
    a = arena.carve((MB // 8,))
    a[:] = 5.0
    assert arena.trim(0) == MB and np.all(a == 5.0)     # a's pages stay
    assert arena.trim(3 * MB) == 3 * MB
    b = arena.carve((2 * MB // 8,))
    assert not b.any() and not np.shares_memory(a, b)


def test_first_gap_that_holds_it():
    arena = Arena(8 * MB)
    a, b, c = (arena.carve((MB // 8,)) for _ in range(3))
    a_at, b_at = _address(a), _address(b)
    del a
    gc.collect()
    big = arena.carve((2 * MB // 8,))             # a's 1 MB gap is too small: past c
    assert _address(big) > _address(c)
    small = arena.carve((MB // 16,))              # half a MB: in a's gap
    assert _address(small) == a_at and not np.shares_memory(small, b)
    assert _address(b) == b_at


def test_prefaulted_empty_carves_only_inside_carving(monkeypatch):
    monkeypatch.setattr(memory, "_PREFAULT_MIN_BYTES", 1)
    outside = prefaulted_empty((100, 100))
    with carving(8 * MB) as arena:
        assert arena is not None
        inside = prefaulted_empty((100, 100))
        with carving(8 * MB) as nested:
            assert nested is None                  # the outer arena stays the active one
            again = prefaulted_empty((100, 100))
        too_big = prefaulted_empty((2 * MB,))      # 16 MB: its own mapping
        assert _inside(arena, inside) and _inside(arena, again) and not _inside(arena, too_big)
        assert not _inside(arena, outside)
        assert not np.shares_memory(inside, again)
    assert memory._ACTIVE_ARENA is None
    inside[...] = 1.0                              # still valid after the block: its pages are its own
    assert inside.sum() == inside.size


def test_a_mapping_refused_means_no_arena(monkeypatch):
    def refused(self, nbytes):
        raise OSError("Cannot allocate memory")

    monkeypatch.setattr(Arena, "__init__", refused)
    with carving(128 * MB) as arena:
        assert arena is None and memory._ACTIVE_ARENA is None
        assert prefaulted_empty((100 * MB // 8,)).shape == (100 * MB // 8,)


def test_gradient_with_the_arena_equals_the_one_without(monkeypatch):
    """Water/cc-pVDZ with every prefaulted array carved (the size threshold lowered): the same gradient to
    1e-12 as with each array in a mapping of its own; the arena carved arrays, and the stage before each trim
    between stages (before the response, before the JK-fit pass) had dropped all of its own."""
    from mp2trn.grad import dfmp2

    trims = []
    real_trim = Arena.trim

    def watched_trim(self, keep=0):
        trims.append((keep, self.live, self.carves))
        return real_trim(self, keep)

    off = mp2trn.run("molecules/water.xyz", basis="cc-pvdz", gradient=True)
    monkeypatch.setattr(memory, "_PREFAULT_MIN_BYTES", 1)
    monkeypatch.setattr(Arena, "trim", watched_trim)
    on = mp2trn.run("molecules/water.xyz", basis="cc-pvdz", gradient=True)
    assert np.max(np.abs(on.gradient - off.gradient)) < 1e-12
    between = [t for t in trims if t[0] > 0]       # before the response and before the JK-fit pass
    assert len(between) == 2 and all(live == 0 and carves > 0 for _, live, carves in between)
    assert dfmp2.carving is carving
