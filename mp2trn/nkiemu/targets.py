"""Trainium generations the emulator knows (sizes: nki/get-started/about/memory-hierarchy-overview.rst; engine specs: nki/guides/architecture/*_arch.rst, aws-neuron-sdk at Neuron 2.29).

The active generation is chosen, in priority order, by

1. ``nki.simulate(kernel, target="trn1")`` (per call),
2. the context manager ``with mp2trn.nkiemu.target("trn1"): ...`` (or :func:`set_default_target`),
3. the environment variable ``NEURON_PLATFORM_TARGET_OVERRIDE`` (``trn1``/``gen2``, ``trn2``/``gen3``,
   ``trn3``/``gen4``), as for the real NKI,
4. :data:`DEFAULT_TARGET` (``trn1``, also the default of mp2trn's sim and neuron devices).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

__all__ = ["Target", "TARGETS", "get_target", "current_target", "target", "set_default_target"]

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma", "cc")   # cc: collective-communication cores


@dataclass(frozen=True)
class Target:
    name: str                 # "trn1"
    gen: int                  # 2, 3, 4 (nisa.nc_version)
    core: str                 # "NeuronCore-v2"
    clock_hz: dict            # engine -> Hz (tensor/vector/scalar/gpsimd)
    sbuf_partition_bytes: int  # physical SBUF bytes per partition
    sbuf_usable_bytes: int    # nl.tile_size.total_available_sbuf_size
    psum_partition_bytes: int = 16384
    psum_bank_bytes: int = 2048
    psum_banks: int = 8
    partitions: int = 128
    dma_queues: int = 16
    dma_queue_bw: float = 17e9      # sustained bytes/s per DMA engine (queue)
    #: queue seconds per DMA descriptor (one contiguous run of a transfer): see the targets below
    dma_descriptor_s: float = 0.0
    peak_flops: dict = field(default_factory=dict)  # {"fp32": .., "bf16": ..} TensorE dense peak
    moving_fmax_fp32_dst: int = 512
    moving_fmax_bf16_dst: int = 512
    psum_dst_bf16: bool = False     # NC-v4 allows bf16 matmul dst
    vector_bf16_perf_mode: bool = False  # NC-v3+ VectorE 2x/4x for 16-bit operands
    #: bytes/s one NeuronCore's collectives get from the chip's inter-chip links: the chip's figure
    #: ("Inter-chip Interconnect (GB/sec/chip)": 384 Trainium, 1280 Trainium2; about-neuron/arch/
    #: neuron-hardware/trainium2.rst) shared by its NeuronCores (2 on Trainium, 8 on Trainium2)
    link_bw: float = 192e9

    @property
    def dma_bw(self) -> float:
        return self.dma_queues * self.dma_queue_bw

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return f"{self.name} ({self.core})"


#: DMA descriptor time. A descriptor moves one contiguous run (source address, destination address,
#: length; nki/deep-dives/nki-dge.rst) and "every DMA transfer incurs descriptor setup" that small payloads
#: cannot amortize (nki/deep-dives/nki-dma-bandwidth-guide.rst, which publishes no figure for it).
#: NeuronCore-v2 has no hardware DGE: its descriptors are pre-computed in HBM and fetched by the queues
#: (nki-dge.rst, mode "none"). trn1's 71 ns per descriptor per queue is FITTED, not published: to the
#: pre-2.29 trn1 bf16 tiled and hoisted matmul timings (scripts/cost_model_vs_published.py,
#: DESCRIPTOR_FIT), and checked on every other trn1 point of that script. trn2/trn3: 0 — hardware DGE,
#: and the DMA overview's two trn2 transfers last their bytes at 23 B/ns (nki-dma-overview.rst).
TRN1_DMA_DESCRIPTOR_S = 71e-9

TRN1 = Target(
    name="trn1", gen=2, core="NeuronCore-v2",
    clock_hz={"tensor": 2.8e9, "vector": 1.12e9, "scalar": 1.4e9, "gpsimd": 1.4e9},
    sbuf_partition_bytes=192 * 1024, sbuf_usable_bytes=180224,
    dma_queue_bw=17e9, dma_descriptor_s=TRN1_DMA_DESCRIPTOR_S, peak_flops={"fp32": 23e12, "bf16": 92e12},
)
TRN2 = Target(
    name="trn2", gen=3, core="NeuronCore-v3",
    clock_hz={"tensor": 2.4e9, "vector": 0.96e9, "scalar": 1.2e9, "gpsimd": 1.2e9},
    sbuf_partition_bytes=224 * 1024, sbuf_usable_bytes=212984,
    dma_queue_bw=23e9, peak_flops={"fp32": 20e12, "bf16": 79e12},
    vector_bf16_perf_mode=True, link_bw=1280e9 / 8,
)
TRN3 = Target(
    name="trn3", gen=4, core="NeuronCore-v4",
    clock_hz={"tensor": 2.4e9, "vector": 1.2e9, "scalar": 1.2e9, "gpsimd": 1.2e9},
    sbuf_partition_bytes=256 * 1024, sbuf_usable_bytes=245752,
    dma_queue_bw=33e9, peak_flops={"fp32": 20e12, "bf16": 79e12},
    moving_fmax_fp32_dst=4096, moving_fmax_bf16_dst=8192, psum_dst_bf16=True,
    vector_bf16_perf_mode=True, link_bw=1280e9 / 8,   # no Trainium3 figure in the 2.29 docs: Trainium2's
)

TARGETS = {"trn1": TRN1, "trn2": TRN2, "trn3": TRN3}
_ALIASES = {"trn1": "trn1", "gen2": "trn1", "inf2": "trn1", "nc-v2": "trn1",
            "trn2": "trn2", "gen3": "trn2", "nc-v3": "trn2",
            "trn3": "trn3", "gen4": "trn3", "nc-v4": "trn3"}

ENV_VAR = "NEURON_PLATFORM_TARGET_OVERRIDE"
DEFAULT_TARGET = "trn1"
_stack: list = []
_default: list = [None]


def get_target(name) -> Target:
    """``"trn1"``/``"gen2"`` ... -> :class:`Target` (a Target passes through)."""
    if isinstance(name, Target):
        return name
    key = str(name).strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"unknown NKI target {name!r}; use one of trn1/gen2, trn2/gen3, trn3/gen4")
    return TARGETS[_ALIASES[key]]


def current_target() -> Target:
    """The generation a kernel launched now would be emulated for."""
    if _stack:
        return _stack[-1]
    if _default[0] is not None:
        return _default[0]
    env = os.environ.get(ENV_VAR)
    if env:
        return get_target(env)
    return TARGETS[DEFAULT_TARGET]


@contextlib.contextmanager
def target(name):
    """``with target("trn1"): ...`` — emulate launches inside the block for that generation."""
    _stack.append(get_target(name))
    try:
        yield _stack[-1]
    finally:
        _stack.pop()


def set_default_target(name=None) -> None:
    """Set (or with ``None`` clear) the process-wide default generation (overrides the env var)."""
    _default[0] = None if name is None else get_target(name)
