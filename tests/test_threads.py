"""mp2trn.threads: one BLAS pool on the cores at a time."""

import os

import numpy as np
import pytest
import scipy.linalg  # noqa: F401  (loads SciPy's BLAS)

threadpoolctl = pytest.importorskip("threadpoolctl")

from mp2trn.threads import _blas_libraries, one_blas_pool, pool_note  # noqa: E402


def _threads(owner: str) -> list[int]:
    mine, _ = _blas_libraries(owner)
    return [lib.num_threads for lib in mine]


def _separate_pools() -> bool:
    mine, others = _blas_libraries("numpy")
    return bool(mine) and any(lib.num_threads > 1 for lib in others)


@pytest.mark.skipif(not _separate_pools(), reason="NumPy and SciPy share one BLAS here, or it has one thread")
def test_pools_are_held_and_restored():
    numpy_before, scipy_before = _threads("numpy"), _threads("scipy")
    with one_blas_pool() as held:
        assert "scipy" in held
        assert _threads("scipy") == [1] * len(scipy_before)
        assert _threads("numpy") == numpy_before
        with one_blas_pool("scipy"):   # nested: SciPy's solve gets its threads back, NumPy's is held
            assert _threads("scipy") == scipy_before
            assert _threads("numpy") == [1] * len(numpy_before)
        assert _threads("scipy") == [1] * len(scipy_before)
        assert _threads("numpy") == numpy_before
    assert _threads("scipy") == scipy_before and _threads("numpy") == numpy_before


@pytest.mark.skipif(not _separate_pools(), reason="NumPy and SciPy share one BLAS here, or it has one thread")
def test_pools_restored_after_an_error():
    scipy_before = _threads("scipy")
    with pytest.raises(RuntimeError):
        with one_blas_pool():
            raise RuntimeError("boom")
    assert _threads("scipy") == scipy_before


def test_results_unchanged_inside_the_block():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((300, 300))
    s = a @ a.T + 300 * np.eye(300)
    want = scipy.linalg.eigh(s)[0]
    with one_blas_pool():
        got = scipy.linalg.eigh(s)[0]
    assert np.allclose(got, want, rtol=0, atol=1e-10)


def test_pool_note_names_numpys_pool():
    note = pool_note()
    assert "NumPy" in note or "one BLAS library" in note


_ENV_CHILD = """
import os, sys
import mp2trn  # noqa: F401  (before NumPy, as the CLI and python -m mp2trn import it)
loaded = "numpy" in sys.modules   # NumPy's OpenBLAS reads the variable when it loads: it must not be loaded yet
print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), os.environ.get("OMP_WAIT_POLICY"), loaded)
"""


@pytest.mark.parametrize("given, expected", [(None, "4"), ("28", "28")])
def test_import_puts_openblas_workers_to_sleep_unless_the_user_chose(given, expected):
    """``import mp2trn`` sets OPENBLAS_THREAD_TIMEOUT=4 (OpenBLAS's workers sleep at once after a call, so they
    do not spin beside the cpu device's own threads) and OMP_WAIT_POLICY=PASSIVE, and NumPy is not loaded
    by then (OpenBLAS reads the variable as it loads); a value the user set wins (28: OpenBLAS's default)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_THREAD_TIMEOUT", "OMP_WAIT_POLICY")}
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    done = subprocess.run([sys.executable, "-c", _ENV_CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [expected, "PASSIVE", "False"]
