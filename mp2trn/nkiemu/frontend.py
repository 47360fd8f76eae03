"""The front end's language check: the Python constructs the NKI 0.3.0 compiler rejects.

The emulator runs kernels as plain Python, so without this check it would accept code the real compiler
refuses. Before a kernel's first launch, :func:`check_kernel` parses its source and the source of every
helper it calls (the compiler inlines them all at specialisation), and raises
:class:`~mp2trn.nkiemu.errors.NkiRuleError` naming the construct, the file and the line:

==========================  ==============================================================================
rule                        what is rejected (source)
==========================  ==============================================================================
``frontend.is_operator``    ``is`` / ``is not`` — "The NKI 0.3.0 compiler does not support Python's ``is``
                            / ``is not`` operators" (migration/nki-0-3-0-update-guide.rst, Language
                            Restrictions); use ``==`` / ``!=``
``frontend.kwonly``         the ``*`` keyword-only separator in a kernel's signature (same guide)
``frontend.import``         ``import`` inside kernel code: NKI code is not Python (deep-dives/nki-compiler.rst);
                            its values are None, bool, int, float, str, tensors and tuple/list/dict/simple
                            classes (get-started/nki-language-guide.rst, "NKI Values")
``frontend.slice_object``   ``slice(...)`` objects: not an NKI value (same list); index with ``a:b`` syntax
==========================  ==============================================================================

Helpers are found by name: a call ``f(...)`` or ``module.f(...)`` whose target is a Python function
defined outside the NKI modules (and outside NumPy and the standard library) is checked as inlined code.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types

from .errors import NkiRuleError

#: modules whose functions are the NKI API or host libraries, not inlined kernel code
_NOT_INLINED = ("mp2trn.nkiemu", "nki", "numpy", "builtins", "math", "functools", "itertools", "typing",
                "dataclasses")
_IS_MESSAGE = ("the NKI 0.3.0 compiler does not support Python's `is` / `is not` operators (they check object "
               "identity, which is not meaningful during NKI compilation tracing); use == / != instead")
_checked: dict = {}


def check_kernel(func) -> None:
    """Raise NkiRuleError for the first unsupported construct in ``func`` or a helper it calls (cached per
    code object and the code of what its closure holds, :func:`_closure_key`: one kernel body made by a
    factory calls different helpers per instance, and each such instance is checked)."""
    code = getattr(func, "__code__", None)
    if code is None:
        return
    key = (code, _closure_key(func))
    if key in _checked:
        if _checked[key] is not None:
            raise _checked[key]
        return
    try:
        _check(func, top=True, seen=set())
        _checked[key] = None
    except NkiRuleError as exc:
        _checked[key] = exc
        raise


def _closure_key(func, depth: int = 0) -> tuple:
    """The code of the functions ``func``'s closure holds — unwrapped as :func:`_callees` unwraps them
    (``.func``) — and of what their closures hold in turn (a few levels: factories of factories)."""
    out = []
    for cell in getattr(func, "__closure__", None) or ():
        if not _has_contents(cell):
            continue
        held = getattr(cell.cell_contents, "func", cell.cell_contents)
        if isinstance(held, types.FunctionType):
            out.append((held.__code__, _closure_key(held, depth + 1) if depth < 4 else ()))
    return tuple(out)


def _source(func):
    try:
        lines, first = inspect.getsourcelines(func)
    except (OSError, TypeError):
        return None, None, 0  # no source (built in, generated): nothing to check
    try:
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except SyntaxError:
        if func.__name__ != "<lambda>":
            raise
        # a lambda's lines are those of the statement around it, which need not parse alone; the check
        # looks at function definitions only, so a lambda was never checked
        return None, None, 0
    return tree, inspect.getsourcefile(func) or "<kernel>", first - 1


def _check(func, top: bool, seen: set) -> None:
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is None or code in seen:
        return
    seen.add(code)
    tree, path, offset = _source(func)
    if tree is None:
        return
    fdef = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if fdef is None:
        return
    where = lambda node: f"{path}:{getattr(node, 'lineno', 1) + offset}"  # noqa: E731
    name = func.__qualname__
    if top and fdef.args.kwonlyargs:
        raise NkiRuleError("frontend.kwonly", name,
                           f"the NKI 0.3.0 compiler does not support the `*` separator in kernel signatures; move "
                           f"the parameters with defaults to the end of the signature ({where(fdef)})")
    for node in ast.walk(fdef):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            raise NkiRuleError("frontend.is_operator", name, f"{_IS_MESSAGE} ({where(node)})")
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node is not fdef:
            raise NkiRuleError("frontend.import", name,
                               f"`import` inside kernel code: NKI kernels and the helpers they call cannot import; "
                               f"import at module level ({where(node)})")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "slice":
            raise NkiRuleError("frontend.slice_object", name,
                               f"`slice(...)` objects are not NKI values; index with start:stop syntax ({where(node)})")
    for helper in _callees(func, fdef):
        _check(helper, top=False, seen=seen)


def _callees(func, fdef) -> list:
    """Python functions ``func`` calls by name or as ``module.name`` (the helpers the compiler inlines)."""
    scope = dict(getattr(func, "__globals__", {}))
    if func.__closure__:
        scope.update({n: c.cell_contents for n, c in zip(func.__code__.co_freevars, func.__closure__)
                      if _has_contents(c)})
    out = []
    for node in ast.walk(fdef):
        if not isinstance(node, ast.Call):
            continue
        target = None
        if isinstance(node.func, ast.Name):
            target = scope.get(node.func.id)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            owner = scope.get(node.func.value.id)
            if isinstance(owner, types.ModuleType):
                target = getattr(owner, node.func.attr, None)
        target = getattr(target, "func", target)  # a JitKernel-like wrapper: its Python function
        if isinstance(target, types.FunctionType) and _inlined(target):
            out.append(target)
    return out


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _inlined(func) -> bool:
    module = getattr(func, "__module__", "") or ""
    if module.startswith(_NOT_INLINED) or module in sys.stdlib_module_names:
        return False
    return not module.split(".")[0] in sys.stdlib_module_names


__all__ = ["check_kernel"]
