"""The 0.3.0 front end's language check: `is`/`is not`, the `*` separator, imports and slice objects are
rejected with the rule and the line, in the kernel and in the helpers it inlines; the legal spellings run;
our own kernels pass."""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import pytest

import mp2trn.nkiemu as nki
import mp2trn.nkiemu.isa as nisa
import mp2trn.nkiemu.language as nl
from mp2trn.nkiemu import NkiRuleError
from mp2trn.nkiemu.frontend import check_kernel


def _copy(x, out):
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)


def k_is(x, flag=None):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    if flag is None:
        _copy(x, out)
    return out


def k_eq(x, flag=0):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    if flag == 0:
        _copy(x, out)
    return out


def k_kwonly(x, *, scale=1.0):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    _copy(x, out)
    return out


def k_positional(x, scale=1.0):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    _copy(x, out)
    return out


def k_import(x):
    import math  # noqa: F401

    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    _copy(x, out)
    return out


def k_slice(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    rows = slice(0, x.shape[0])
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[rows, :], src=x[rows, :])
    nisa.dma_copy(dst=out, src=t)
    return out


def k_slice_syntax(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[0:x.shape[0], :], src=x[0:x.shape[0], :])
    nisa.dma_copy(dst=out, src=t)
    return out


def _helper_with_is_not(x, out, extra):
    if extra is not None:
        return
    _copy(x, out)


def k_helper(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    _helper_with_is_not(x, out, None)
    return out


def _line(func, text):
    lines, first = inspect.getsourcelines(func)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("bad,good,rule,text", [
    (k_is, k_eq, "frontend.is_operator", "flag is None"),
    (k_kwonly, k_positional, "frontend.kwonly", "def k_kwonly"),
    (k_import, k_eq, "frontend.import", "import math"),
    (k_slice, k_slice_syntax, "frontend.slice_object", "slice(0"),
])
def test_unsupported_construct_is_rejected_with_its_line(bad, good, rule, text):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(NkiRuleError) as err:
        nki.simulate(nki.jit(bad))(x)
    assert err.value.rule == rule
    assert f"test_frontend.py:{_line(bad, text)}" in str(err.value)
    np.testing.assert_array_equal(nki.simulate(nki.jit(good))(x), x)


def test_is_operator_message_is_the_documented_one():
    with pytest.raises(NkiRuleError, match=r"does not support Python's `is` / `is not` operators.*use == / !="):
        check_kernel(k_is)


def test_inlined_helpers_are_checked():
    with pytest.raises(NkiRuleError) as err:
        nki.simulate(nki.jit(k_helper))(np.ones((2, 2), np.float32))
    assert err.value.rule == "frontend.is_operator" and err.value.instruction == "_helper_with_is_not"
    assert f"test_frontend.py:{_line(_helper_with_is_not, 'extra is not None')}" in str(err.value)


@pytest.mark.parametrize("module", ["gemm", "batched_gemm", "mp2_energy", "syrk", "coulomb", "trsm"])
def test_our_kernels_pass_the_front_end(module):
    mod = importlib.import_module(f"mp2trn.kernels.{module}")
    kernels = [v for v in vars(mod).values() if isinstance(v, nki.JitKernel)]
    assert kernels
    for k in kernels:
        check_kernel(k.func)   # raises on any `is`, local import, slice object or `*` in what it inlines


def _helper_plain(x, out):
    _copy(x, out)


def _helper_with_is(x, out):
    if out is not None:
        _copy(x, out)


def _kernel_calling(helper):
    """One kernel body (one code object) per factory call, calling the helper its closure holds."""
    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        helper(x, out)
        return out
    return kernel


def test_each_closure_instance_is_checked():
    """The front end's cache tells kernels of one code object apart by the helpers their closures hold:
    an instance calling a helper with `is` is rejected even after a clean instance passed (before, the
    first instance's verdict stood for every later one)."""
    check_kernel(_kernel_calling(_helper_plain))
    with pytest.raises(NkiRuleError, match="frontend.is_operator"):
        check_kernel(_kernel_calling(_helper_with_is))
    check_kernel(_kernel_calling(_helper_plain))


class _Wrapped:
    """A helper behind a ``.func`` (as a jit wrapper holds its function): the front end inlines the function."""

    def __init__(self, func):
        self.func = func

    def __call__(self, *args):
        return self.func(*args)


def _factory_of(helper):
    def inner(x, out):
        helper(x, out)
    return inner


@pytest.mark.parametrize("wrap", [_Wrapped, _factory_of], ids=["dot-func", "nested-factory"])
def test_closure_instances_checked_through_wrappers_and_factories(wrap):
    """The cache key looks through what _callees looks through: helpers behind ``.func`` and helpers held by
    the closures of helpers (review: both passed a second instance with `is` before)."""
    check_kernel(_kernel_calling(wrap(_helper_plain)))
    with pytest.raises(NkiRuleError, match="frontend.is_operator"):
        check_kernel(_kernel_calling(wrap(_helper_with_is)))
