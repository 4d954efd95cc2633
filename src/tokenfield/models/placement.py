"""Model-parallel placement: spread one model over devices with accelerate.

``--device-map auto|balanced|sequential`` is passed to Hugging Face
``from_pretrained(device_map=...)``, which asks accelerate to place every block
on a GPU, on the CPU, or (with ``--offload-folder``) on disk, within
``--max-memory`` per device. Accelerate's hooks move each block's inputs to the
block's device; tokenfield's capture hooks read each block's output where that
block lives and copy the kept rows to the CPU as float32
(:mod:`tokenfield.models.capture`), so a trace of a spread model stores the
same states as a trace of the model on one device.

This module only validates and translates the flags (pure; no torch work).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tokenfield._io import make_dirs
from tokenfield.errors import UserError

__all__ = ["DEVICE_MAPS", "Placement", "input_device", "parse_max_memory"]

DEVICE_MAPS = ("auto", "balanced", "sequential")
MEMORY_FIX = "write it as DEVICE=SIZE,... e.g. --max-memory cuda:0=20GiB,cpu=60GiB"


def _size(device: str, text: str) -> str | int:
    """A size as accelerate takes it: ``"20GiB"``, or a plain number of bytes as an
    ``int`` (accelerate refuses the string ``"1"``, though a number of bytes is valid)."""
    from accelerate.utils import convert_file_size_to_int

    text = text.strip()
    size: str | int = int(text) if text.isdigit() else text
    try:
        value = convert_file_size_to_int(size)
    except (ValueError, TypeError):
        value = -1
    if value <= 0:
        raise UserError(
            f"--max-memory has a bad size '{text}' for {device}",
            "give sizes like 500MB, 20GiB or a number of bytes",
        )
    return size


def _device_key(text: str) -> int | str:
    """``cpu``, ``mps``, ``disk``, ``N`` or ``cuda:N`` -> accelerate's key."""
    key = text.strip().lower()
    if key in ("cpu", "mps", "disk"):
        return key
    index = key.removeprefix("cuda:").removeprefix("cuda")
    if index.isdigit():
        return int(index)
    raise UserError(f"--max-memory names an unknown device '{text}'", MEMORY_FIX)


def parse_max_memory(value: Mapping[Any, Any] | str | None) -> dict[int | str, str | int] | None:
    """``"cuda:0=20GiB,cpu=60GiB"`` (or a mapping) -> ``{0: "20GiB", "cpu": "60GiB"}``.

    Raises:
        UserError: a malformed entry, an unknown device, a bad size, a GPU that
            this machine does not have.
    """
    if value is None:
        return None
    if isinstance(value, str):
        entries = [e for e in value.split(",") if e.strip()]
        if not entries:
            raise UserError("--max-memory is empty", MEMORY_FIX)
        pairs = []
        for entry in entries:
            if "=" not in entry:
                raise UserError(f"--max-memory entry '{entry}' has no '='", MEMORY_FIX)
            device, size = entry.split("=", 1)
            pairs.append((device, size))
    else:
        pairs = [(str(k), str(v)) for k, v in value.items()]
    out: dict[int | str, str | int] = {}
    for device, size in pairs:
        key = _device_key(device)
        if isinstance(key, int) and key >= torch.cuda.device_count():
            raise UserError(
                f"--max-memory names GPU {key}, but this machine has "
                f"{torch.cuda.device_count()} GPU(s)",
                "name only the GPUs it has, and cpu",
            )
        out[key] = _size(device, size)
    return out


def input_device(device_map: Mapping[str, Any]) -> torch.device:
    """The device a spread model takes its inputs on: its first module's (the
    CPU when that module is offloaded to disk)."""
    first = next(iter(device_map.values()))
    if isinstance(first, int):
        return torch.device("cuda", first)
    if str(first) in ("disk", "meta"):
        return torch.device("cpu")
    return torch.device(str(first))


@dataclass(frozen=True)
class Placement:
    """Validated ``--device-map``, ``--max-memory`` and ``--offload-folder``."""

    device_map: str
    max_memory: tuple[tuple[int | str, str | int], ...] | None = None
    offload_folder: str | None = None

    @classmethod
    def parse(
        cls,
        device_map: str | None,
        max_memory: Mapping[Any, Any] | str | None = None,
        offload_folder: str | Path | None = None,
    ) -> Placement:
        """Check the three flags together.

        Raises:
            UserError: an unknown device map; ``--max-memory`` or
                ``--offload-folder`` without ``--device-map``; a bad memory
                entry; an offload folder that cannot be written.
        """
        if device_map is None:
            given = "--max-memory" if max_memory is not None else "--offload-folder"
            raise UserError(f"{given} needs --device-map", "add --device-map auto")
        if device_map not in DEVICE_MAPS:
            raise UserError(
                f"unknown --device-map '{device_map}'", f"use one of: {', '.join(DEVICE_MAPS)}"
            )
        memory = parse_max_memory(max_memory)
        folder = None
        if offload_folder is not None:
            path = Path(offload_folder).expanduser()
            make_dirs(path, f"--offload-folder '{offload_folder}'", "choose a writable directory")
            if not os.access(path, os.W_OK | os.X_OK):
                raise UserError(
                    f"--offload-folder '{offload_folder}' is not writable",
                    "choose a writable directory",
                )
            folder = str(path)
        return cls(device_map, tuple(memory.items()) if memory else None, folder)

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``from_pretrained``."""
        kwargs: dict[str, Any] = {"device_map": self.device_map}
        if self.max_memory:
            kwargs["max_memory"] = dict(self.max_memory)
        if self.offload_folder:
            kwargs["offload_folder"] = self.offload_folder
        return kwargs

    def load_args(self) -> dict[str, Any]:
        """The same as :func:`tokenfield.load_model` arguments (for Dask workers)."""
        return {
            "device_map": self.device_map,
            "max_memory": {str(k): v for k, v in self.max_memory} if self.max_memory else None,
            "offload_folder": self.offload_folder,
        }
