#!/usr/bin/env python
"""Writes the API coverage tables of docs/emulator.md (between the ``api_table`` markers): every
instruction of the NKI 0.3.0 ``nki.isa`` reference and every function of ``nki.language``, whether the
emulator implements it (else why not), and which tests exercise it.

    python scripts/emulator_api_table.py            # rewrites the section of docs/emulator.md
    python scripts/emulator_api_table.py --print    # prints it

The name lists are those of the reference at the Neuron 2.29 release (aws-neuron/aws-neuron-sdk,
``nki/api/nki/isa/__init__.py`` — 49 functions — and ``nki/api/nki.language.rst``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mp2trn.nkiemu.isa as nisa  # noqa: E402
import mp2trn.nkiemu.language as nl  # noqa: E402

ISA_REFERENCE = """activation activation_reduce affine_select bn_aggr bn_stats core_barrier dma_compute dma_copy
dma_transpose dropout exponential get_nc_version iota local_gather max8 memset nc_find_index8 nc_match_replace8
nc_matmul nc_matmul_mx nc_n_gather nc_stream_shuffle nc_transpose nonzero_with_count quantize_mx rand2
rand_get_state rand_set_state range_select reciprocal register_alloc register_load register_move register_store rng
scalar_tensor_tensor select_reduce sendrecv sequence_bounds set_rng_seed tensor_copy tensor_copy_predicated
tensor_partition_reduce tensor_reduce tensor_scalar tensor_scalar_cumulative tensor_scalar_reduce tensor_tensor
tensor_tensor_scan""".split()

LANGUAGE_REFERENCE = """ndarray zeros ones full zeros_like empty_like shared_identity_matrix rand random_seed load
load_transpose2d store copy matmul transpose abs add arctan ceil cos exp floor log maximum minimum multiply negative
power reciprocal rsqrt sign sin sqrt square subtract tan tanh trunc relu sigmoid silu silu_dx gelu gelu_dx
gelu_apprx_sigmoid gelu_apprx_sigmoid_dx gelu_apprx_tanh mish softplus softmax erf erf_dx dropout rms_norm all max
mean min prod sum var equal not_equal less less_equal greater greater_equal logical_and logical_or logical_xor
logical_not bitwise_and bitwise_or bitwise_xor invert left_shift right_shift broadcast_to ds expand_dims where
gather_flattened affine_range dynamic_range sequential_range static_range device_print no_reorder program_id
num_programs program_ndim""".split()

#: nki.language functions the emulator leaves out, and why
LANGUAGE_MISSING = {
    "rand": "random-number state: bit-exact streams are not documented",
    "random_seed": "random-number state: bit-exact streams are not documented",
    "dropout": "random-number state: bit-exact streams are not documented",
    "load_transpose2d": "a DMA transpose of 2-byte data with a hardware layout; use nisa.dma_transpose/nc_transpose",
    "gather_flattened": "dynamic (tensor-valued) indices are not emulated",
    "softmax": "a composite whose instruction sequence the reference does not give",
    "rms_norm": "a composite whose instruction sequence the reference does not give",
    "silu_dx": "derivative activations are not in the emulator's activation table",
    "gelu_dx": "derivative activations are not in the emulator's activation table",
    "erf_dx": "derivative activations are not in the emulator's activation table",
    "gelu_apprx_sigmoid": "the sigmoid approximation's constants are not documented",
    "gelu_apprx_sigmoid_dx": "the sigmoid approximation's constants are not documented",
}


def _tests_using(pattern: str) -> list[str]:
    out = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if re.search(pattern, path.read_text()):
            out.append(str(path.relative_to(ROOT / "tests")))
    return out


def _engines(name: str) -> str:
    if name in nisa.ENGINES:
        return ", ".join(e.name for e in nisa.ENGINES[name])
    fixed = {"nc_matmul": "tensor", "nc_matmul_mx": "tensor", "nc_transpose": "tensor, vector", "activation": "scalar",
             "activation_reduce": "scalar", "tensor_scalar_reduce": "vector", "tensor_reduce": "vector",
             "reciprocal": "vector", "iota": "gpsimd", "affine_select": "gpsimd", "tensor_partition_reduce": "gpsimd",
             "dma_transpose": "dma", "get_nc_version": "-"}
    return fixed.get(name, "vector")


def isa_table() -> str:
    rows = ["| `nki.isa` | emulated | engines | tests |", "|---|---|---|---|"]
    for name in ISA_REFERENCE:
        if name in nisa.INSTRUCTIONS or name == "get_nc_version":
            tests = ", ".join(_tests_using(rf"nisa\.{name}\(")[:3]) or "-"
            rows.append(f"| `{name}` | yes | {_engines(name)} | {tests} |")
        else:
            rows.append(f"| `{name}` | no: {nisa.NOT_EMULATED[name]} | - | test_isa_more.py (the refusal) |")
    return "\n".join(rows)


def language_table() -> str:
    have = [n for n in LANGUAGE_REFERENCE if n not in LANGUAGE_MISSING and hasattr(nl, n)]
    missing = [n for n in LANGUAGE_REFERENCE if n not in have]
    unexplained = [n for n in missing if n not in LANGUAGE_MISSING]
    if unexplained:
        raise SystemExit(f"nki.language functions neither emulated nor explained: {unexplained}")
    lines = [f"Emulated ({len(have)} of {len(LANGUAGE_REFERENCE)}): " + ", ".join(f"`{n}`" for n in have) + ".",
             "", "| `nki.language` not emulated | why |", "|---|---|"]
    lines += [f"| `{n}` | {LANGUAGE_MISSING[n]} |" for n in missing]
    return "\n".join(lines)


def section() -> str:
    n_isa = sum(1 for n in ISA_REFERENCE if n in nisa.INSTRUCTIONS or n == "get_nc_version")
    return "\n".join([
        "<!-- BEGIN api_table (written by scripts/emulator_api_table.py) -->",
        f"**`nki.isa`: {n_isa} of the reference's {len(ISA_REFERENCE)} functions are emulated**, each with its "
        "documented semantics, operand rules and a cost (the page: `nki/api/nki/isa/__init__.py` at the 2.29 "
        "release, one docstring per instruction); the rest raise `NkiUnsupportedError` with the reason below.",
        "",
        isa_table(),
        "",
        language_table(),
        "<!-- END api_table -->",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--print", action="store_true")
    args = ap.parse_args()
    text = section()
    if args.print:
        print(text)
        return
    doc = ROOT / "docs" / "emulator.md"
    body = doc.read_text()
    begin, end = "<!-- BEGIN api_table", "<!-- END api_table -->"
    if begin in body:
        body = body[:body.index(begin)] + text + body[body.index(end) + len(end):]
    else:
        body = body.replace("## Semantics", text + "\n\n## Semantics", 1)
    doc.write_text(body)
    print(f"wrote {doc}")


if __name__ == "__main__":
    main()
