"""Pack GPU4PySCF and PySCF for a GPU machine that fetches nothing and takes at most 64 MiB a command: the
archives ``scripts/bench_gpu4pyscf.py`` needs there, built here (Linux x86-64 with pip, nm, a C compiler, xz).

    python scripts/pack_gpu4pyscf.py --out .whl            # .whl/part1.tar.xz (~45 MiB), .whl/part2.tar.xz (~45 MiB)

On the GPU machine, one command per archive to the same warm machine (``tar -C /tmp/site -xJf part1.tar.xz``,
then the same with part 2), then ``PYTHONPATH=/tmp/site python3 scripts/bench_gpu4pyscf.py``. GPU4PySCF's libraries that are
not on the DF-RHF/DF-MP2 path (DFT grids, periodic multigrid, semi-empirical, solvent) and its 110 MB libxc
are replaced by stand-ins that export the same function names and abort with a message when called, so a
run that needs one fails loudly rather than computing with it. libxc's stand-in answers the two questions
GPU4PySCF's import asks (its version, how many functionals: none). Its molecular integrals need the real
``libpbc`` (``PBCsort_pair_ij`` sorts the shell pairs of its screening) and ``libgvhf_md`` (its DF
integrals): both travel. The machine's own CuPy must match the wheel's CUDA major version (``--cuda``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

#: GPU4PySCF's libraries replaced by stand-ins (not on the DF-RHF/DF-MP2 path)
STANDINS = ("libgdft", "libmgrid_v3", "libsem", "libsolvent")
#: libxc's functions GPU4PySCF's import binds; the first two answer, the rest abort
LIBXC_FUNCTIONS = ("xc_func_alloc", "xc_func_end", "xc_func_free", "xc_func_info_get_ext_params_name",
                   "xc_func_info_get_n_ext_params", "xc_func_init", "xc_func_set_ext_params_name",
                   "xc_functional_get_name")
#: the big libraries, the second archive (each archive under the 64 MiB a command takes, with the repository)
LARGE = ("libgvhf_rys", "libgint", "libpbc")
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def download(name: str, into: Path) -> Path:
    """One wheel for CPython 3.12 on x86-64 Linux, without its dependencies."""
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(into), name],
                   check=True)
    stem = name.split("==")[0].replace("-", "_")
    return next(into.glob(f"{stem}-*.whl"))


def aborting_function(lib: str, name: str) -> str:
    return (f'int {name}(void){{fprintf(stderr, "stand-in {lib}.{name} called\\n"); abort(); return 1;}}\n')


def compile_standin(source: str, out: Path) -> None:
    c = out.with_suffix(".c")
    c.write_text("#include <stdio.h>\n#include <stdlib.h>\n" + source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(c)], check=True)
    c.unlink()


def exported_functions(library: Path) -> list[str]:
    """The functions a shared library defines (nm's 'T' symbols, leading underscores left out)."""
    listing = subprocess.run(["nm", "-D", "--defined-only", str(library)], check=True, capture_output=True,
                             text=True).stdout
    return [f[2] for f in (line.split() for line in listing.splitlines())
            if len(f) == 3 and f[1] == "T" and not f[2].startswith("_")]


def make_standins(site: Path) -> None:
    lib = site / "gpu4pyscf" / "lib"
    for name in STANDINS:
        real = lib / f"{name}.so"
        compile_standin("".join(aborting_function(name, f) for f in exported_functions(real)), real)
    xc = lib / "deps" / "lib" / "libxc.so"
    xc.parent.mkdir(parents=True, exist_ok=True)
    compile_standin('const char *xc_version_string(void){return "7.0.0";}\n'
                    "int xc_number_of_functionals(void){return 0;}\n"
                    "void xc_available_functional_numbers(int *list){(void)list;}\n"
                    + "".join(aborting_function("libxc", f) for f in LIBXC_FUNCTIONS), xc)


def archive(root: Path, members: list[Path], out: Path) -> None:
    with tarfile.open(out, "w:xz") as tar:
        for m in members:
            tar.add(m, arcname=str(m.relative_to(root)))
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(".whl"))
    ap.add_argument("--cuda", default="13", choices=["12", "13"], help="the GPU machine's CuPy CUDA major version")
    ap.add_argument("--gpu4pyscf", default="1.9.0")
    ap.add_argument("--pyscf", default="2.14.0")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        site = tmp / "site"
        for wheel in (download(f"pyscf=={args.pyscf}", tmp), download(f"gpu4pyscf-cuda{args.cuda}x=={args.gpu4pyscf}", tmp)):
            zipfile.ZipFile(wheel).extractall(site)
        for tests in list(site.glob("gpu4pyscf/**/tests")):
            subprocess.run(["rm", "-rf", str(tests)], check=True)
        make_standins(site)
        lib = site / "gpu4pyscf" / "lib"
        large = [lib / f"{name}.so" for name in LARGE]
        for p in large:   # out of the tree for the first archive
            p.rename(tmp / p.name)
        archive(site, sorted(site.iterdir()), args.out / "part1.tar.xz")
        for p in large:
            (tmp / p.name).rename(p)
        archive(site, large, args.out / "part2.tar.xz")

if __name__ == "__main__":
    main()
