"""Run directories: the on-disk contract between tracing, simulation and analysis.

A run is a directory::

    RUN/
      run.json          kind, config, tokenfield version, status, progress
      trajectory.zarr/  an xarray Dataset stored with Zarr (format 3)
      metrics.json      written by analyses
      figures/          written by analyses and plots

``states`` has dims ``(time, particle, feature)``. Anyone can read a run with
``xarray.open_zarr(RUN / "trajectory.zarr")``.

Writes are streamed and resumable. :class:`RunWriter` appends pieces along a
growing dimension (``particle`` for traces, ``time`` for simulations) and then
records progress in ``run.json`` with an atomic rename. With ``flush_seconds``
it keeps pieces in memory and writes them together (one write per array and one
``run.json`` per flush, from where the last write ended, so the cost of a flush
does not grow with what is already stored; a flush for the bytes held writes
whole chunks only and keeps the rest for the next one). A process killed between
the two leaves extra rows in the Zarr store (or loses the pieces not yet
flushed); on resume they are trimmed back to what ``run.json`` recorded, so every
unit of work lands exactly once.

The package: ``layout`` (file names), ``info`` (run.json), ``read`` (open_run and
the store checks), ``writer`` (RunWriter).
"""

from __future__ import annotations

from tokenfield.runs.info import (
    CONFIG_ATTR,
    KINDS,
    RUN_FORMAT,
    RunInfo,
    RunKind,
    Status,
    canonical_config,
    check_against_store,
    interrupted_line,
    is_run,
    overwrite_plan,
    read_run_info,
    reset_write_log,
)
from tokenfield.runs.layout import (
    ATTRACTORS_HTML,
    ATTRACTORS_JSON,
    ATTRACTORS_ZARR,
    DERIVED,
    DERIVED_STORES,
    FIGURE_ANIMATIONS,
    FIGURE_STEMS,
    FIGURES,
    FLOW_HTML,
    FLOW_JSON,
    HYPOTHESES_HTML,
    HYPOTHESES_JSON,
    LENS_FIGURE_PREFIX,
    METRICS_JSON,
    PROJECTION_NPZ,
    RUN_JSON,
    THEORY_HTML,
    THEORY_JSON,
    TRAJECTORY,
    figures_dir,
    is_figure,
    strings,
)
from tokenfield.runs.read import (
    READABLE_OBJECT_CODECS,
    check_baseline,
    check_chunks,
    check_object_codecs,
    open_run,
)
from tokenfield.runs.store import checksummed, concat_pieces, store_encoding
from tokenfield.runs.writer import (
    CHUNK_BYTES,
    COORD_CHUNK,
    COORD_CHUNKS_PER_SHARD,
    RunWriter,
    check_results_writable,
    check_writable_dir,
)

__all__ = [
    "HYPOTHESES_JSON",
    "HYPOTHESES_HTML",
    "DERIVED_STORES",
    "ATTRACTORS_ZARR",
    "ATTRACTORS_JSON",
    "ATTRACTORS_HTML",
    "CHUNK_BYTES",
    "CONFIG_ATTR",
    "COORD_CHUNK",
    "COORD_CHUNKS_PER_SHARD",
    "DERIVED",
    "FIGURES",
    "FIGURE_ANIMATIONS",
    "FIGURE_STEMS",
    "FLOW_HTML",
    "FLOW_JSON",
    "KINDS",
    "LENS_FIGURE_PREFIX",
    "METRICS_JSON",
    "PROJECTION_NPZ",
    "READABLE_OBJECT_CODECS",
    "RUN_FORMAT",
    "RUN_JSON",
    "RunInfo",
    "RunKind",
    "RunWriter",
    "Status",
    "THEORY_HTML",
    "THEORY_JSON",
    "TRAJECTORY",
    "canonical_config",
    "check_against_store",
    "check_baseline",
    "check_chunks",
    "check_object_codecs",
    "check_results_writable",
    "check_writable_dir",
    "checksummed",
    "concat_pieces",
    "figures_dir",
    "interrupted_line",
    "is_figure",
    "is_run",
    "open_run",
    "overwrite_plan",
    "read_run_info",
    "reset_write_log",
    "store_encoding",
    "strings",
]
