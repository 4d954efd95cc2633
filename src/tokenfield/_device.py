"""The one device parser: what ``--device`` (and ``device=``) accepts, everywhere.

``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (CUDA when available, else the CPU).
Used by model loading (:mod:`tokenfield.models.load`) and by the particle
simulator (``tokenfield simulate``), so both accept the same values.
"""

from __future__ import annotations

from typing import Any

from tokenfield.errors import ParameterError

__all__ = ["DEVICES_HELP", "parse_device"]

DEVICES_HELP = "cpu, cuda, cuda:N or auto"


def parse_device(device: Any, *, param: str = "device") -> Any:
    """A ``torch.device`` from ``cpu``, ``cuda``, ``cuda:N``, ``auto`` or a
    ``torch.device``.

    Raises:
        ParameterError: an unknown device, a device that is not ``cpu`` or
            ``cuda``, or CUDA asked for on a machine without it (or without
            that many GPUs).
    """
    import torch

    text = str(device).strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(text)
    except RuntimeError:
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):
        raise ParameterError(param, f"unknown {{name}} '{device}'", f"use {DEVICES_HELP}")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ParameterError(
                param,
                f"{{name}} {device} was asked for, but CUDA is not available",
                "use {name} cpu (or auto)",
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ParameterError(
                param,
                f"{{name}} {device} was asked for, but this machine has "
                f"{torch.cuda.device_count()} GPU(s)",
                "use {name} cuda:0 (or auto)",
            )
    return resolved
