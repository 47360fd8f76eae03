"""Devices behind one small interface (:class:`~mp2trn.devices.base.Device`).

``get_device(name, precision)`` builds one: ``cpu`` (NumPy), ``cuda`` (PyTorch), ``sim`` (NKI kernels
in the emulator or the real ``nki.simulate``), ``neuron`` (NKI kernels on Trainium), or ``auto``
(neuron > cuda > cpu, and the result says which it picked). A device that is asked for but absent is
an error naming what to install; nothing ever falls back silently.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import DeviceUnavailableError, InputError
from .base import Device

DEVICE_NAMES = ("cpu", "cuda", "sim", "neuron", "auto")
# where each device class lives, imported lazily so optional dependencies stay optional
_DEVICE_CLASSES = {
    "cpu": ("mp2trn.devices.cpu", "CpuDevice"),
    "cuda": ("mp2trn.devices.torch_backend", "TorchDevice"),
    "sim": ("mp2trn.devices.nki_device", "SimDevice"),
    "neuron": ("mp2trn.devices.nki_device", "NeuronDevice"),
}


def get_device(name: str | Device = "cpu", precision: str | None = None, **options: Any) -> Device:
    """Build the device ``name`` with ``precision`` (None: the device's default)."""
    if isinstance(name, Device):
        if precision is not None and precision != name.precision:
            raise InputError(f"device object runs {name.precision}, but precision {precision!r} was asked for")
        return name
    key = str(name).lower()
    if key == "auto":
        return _auto(precision, **options)
    base = key.split(":")[0]
    if base not in _DEVICE_CLASSES:
        raise InputError(f"unknown device {name!r}: choose one of {', '.join(DEVICE_NAMES)}")
    cls = _device_class(base)
    precision = precision or cls.supported_precisions[0]
    if precision not in cls.supported_precisions:
        raise InputError(
            f"precision {precision!r} is not available on device {base!r} "
            f"(choose {', '.join(cls.supported_precisions)})"
        )
    if base == "cuda":
        options.setdefault("torch_device", key)
    return cls(precision=precision, **options)


def _device_class(base: str) -> type[Device]:
    module_name, cls_name = _DEVICE_CLASSES[base]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise DeviceUnavailableError(f"device {base!r} is not part of this mp2trn build") from None
        raise
    return getattr(module, cls_name)


def _auto(precision: str | None, **options: Any) -> Device:
    errors = []
    for candidate in ("neuron", "cuda", "cpu"):
        try:
            device = get_device(candidate, precision, **options)
        except (DeviceUnavailableError, InputError) as exc:
            errors.append(f"{candidate}: {exc}")
            continue
        device.selection_note = "auto picked " + candidate + ("" if not errors else " (" + "; ".join(errors) + ")")
        return device
    raise DeviceUnavailableError("no device available: " + "; ".join(errors))


def available_devices() -> dict[str, str]:
    """Map device name → 'available' or the reason it is not (for ``mp2trn info``)."""
    status = {}
    for name in ("cpu", "cuda", "sim", "neuron"):
        try:
            dev = get_device(name)
            status[name] = "available: " + ", ".join(f"{k}={v}" for k, v in dev.describe().items() if k != "device")
            dev.close()
        except Exception as exc:  # report, never raise, from an info command
            status[name] = f"unavailable: {exc}"
    return status


__all__ = ["Device", "DEVICE_NAMES", "get_device", "available_devices"]
