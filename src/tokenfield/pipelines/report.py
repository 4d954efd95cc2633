"""The report workflow (``tokenfield report``): gather each run, render, write one file.

For each run: open it, read its ``metrics.json`` back (typed:
:class:`~tokenfield.analysis.metrics.Metrics`) with its ``projection.npz`` and
``figures/``; a run that was not analysed is analysed here, in memory, its
figures drawn into a temporary directory (the run is left untouched;
:func:`unanalysed_runs` names them so that the command can say so). The
theory-lens figures that ``tokenfield lens`` wrote (``RUN/figures/theory_*.png``)
are shown either way. The overlays are opened here too. :mod:`tokenfield.report`
then only renders what it is given; this module writes the page atomically.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import xarray as xr

from tokenfield._io import write_atomic
from tokenfield._progress import stage
from tokenfield.analysis.metrics import Metrics
from tokenfield.analysis.projection import PROJECTION_NPZ, fit_projection, load_projection
from tokenfield.analysis.run_analysis import analyze, select_particles
from tokenfield.analysis.simulation import analyze_simulation
from tokenfield.errors import UserError
from tokenfield.report.html import (
    FIGURE_ORDER,
    REPORT_MARKER,
    THEORY_PREFIX,
    Image,
    RunPage,
    Section,
    render_page,
)
from tokenfield.report.paths import Overlay
from tokenfield.runs import (
    ATTRACTORS_HTML,
    FIGURES,
    METRICS_JSON,
    check_writable_dir,
    open_run,
    read_run_info,
)
from tokenfield.viz import write_figures

__all__ = [
    "is_report",
    "parse_overlay",
    "read_metrics",
    "unanalysed_runs",
    "write_report",
]


def write_report(
    run_paths: Sequence[str | Path] | str | Path,
    out: str | Path,
    *,
    title: str = "tokenfield report",
    sections: Sequence[str | Path] = (),
    overwrite: bool = False,
    overlays: Sequence[str | Path | tuple[str | Path, str]] = (),
) -> Path:
    """Write one self-contained, offline HTML report for the given runs.

    Args:
        run_paths: run directories (may be empty when ``sections`` are given).
        out: the HTML file to write (its directory is created).
        title: the page title.
        sections: HTML fragments to append, e.g. the ``meanfield.html`` written by
            ``scripts/meanfield_tables.py`` or the theory-lens section. A run's
            ``attractors.html`` (``tokenfield attractors``) is appended without
            being named.
        overwrite: replace ``out`` even when it is not a tokenfield report (an
            earlier report is always replaced; any other file is refused).
        overlays: other runs (``path`` or ``(path, label)``, or ``"path:label"``)
            drawn in the first run's interactive trajectories, in its frozen PCA
            frames; another model is first aligned layer by layer by an
            orthogonal Procrustes rotation over the shared prompts.

    Returns:
        The path written.

    Example:
        >>> tf.write_report(["runs/categories", "runs/categories-random"],
        ...                 "runs/report.html")                 # doctest: +SKIP
        PosixPath('runs/report.html')
    """
    if isinstance(run_paths, (str, Path)):
        run_paths = [run_paths]
    paths = [Path(p) for p in run_paths]
    reported = {p.resolve() for p in paths}
    fragments = [_read_section(Path(s), reported) for s in sections]
    # a run's own 'tokenfield attractors' fragment comes with it (once)
    given = {Path(s).resolve() for s in sections}
    for path in paths:
        own = path / ATTRACTORS_HTML
        if own.is_file() and own.resolve() not in given:
            fragments.append(_read_section(own, reported))
    if not paths and not fragments:
        raise UserError("no runs given", "pass one or more run directories")
    out = Path(out)
    if out.is_dir():
        raise UserError(f"--out '{out}' is a directory", "give a file name such as report.html")
    check_writable_dir(out.parent)
    if out.exists() and not overwrite and not is_report(out):
        raise UserError(
            f"--out '{out}' exists and is not a tokenfield report; refusing to replace it",
            "choose another --out, or pass --overwrite to replace it",
        )
    for path in paths:
        read_run_info(path)  # a clear error before any work
    overlay_list = [parse_overlay(o) for o in overlays]
    if overlay_list and not paths:
        raise UserError("--overlay needs a run to draw on", "give the reference run first")
    for other, _label in overlay_list:
        read_run_info(other)
    from plotly.offline import get_plotlyjs

    opened = [Overlay(path=p, label=label, ds=open_run(p)) for p, label in overlay_list]
    runs = [_gather(path, opened if i == 0 else ()) for i, path in enumerate(paths)]
    page = render_page(
        runs,
        title=title,
        generated=_dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        sections=fragments,
        plotly_js=get_plotlyjs(),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, page)  # the usual mode: a report is for sharing
    return out


def read_metrics(path: str | Path) -> Metrics:
    """A run's ``metrics.json``, read back and checked (:meth:`Metrics.from_dict`).

    Args:
        path: a run directory or its ``metrics.json``.

    Returns:
        The :class:`~tokenfield.analysis.metrics.Metrics`.

    Raises:
        UserError: the file is not JSON, or a value has the wrong type.

    Example:
        >>> from tokenfield.pipelines.report import read_metrics
        >>> read_metrics("runs/spectrum").depth_ordering       # doctest: +SKIP
    """
    file = Path(path)
    if file.is_dir():
        file = file / METRICS_JSON
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(
            f"{file} is not valid JSON ({exc})",
            f"run 'tokenfield analyze {file.parent}' again",
        ) from None
    except OSError as exc:
        raise UserError(
            f"cannot read {file} ({exc.strerror or type(exc).__name__})", "check the run"
        ) from None
    try:
        return Metrics.from_dict(data, source=str(file))
    except UserError as exc:
        raise UserError(exc.problem, f"run 'tokenfield analyze {file.parent}' again") from None


def _gather(path: Path, overlays: Sequence[Overlay]) -> RunPage:
    """One run as the page shows it: analysed (from its files, else in memory)."""
    stage(f"{path.name or path}: reading")
    ds = open_run(path)
    if (path / METRICS_JSON).is_file():
        metrics = read_metrics(path)
        if (path / PROJECTION_NPZ).is_file():
            frame = load_projection(path)
        else:
            selected = select_particles(ds, metrics.options.particles).load()
            frame = fit_projection(selected, sphere=metrics.options.sphere)
        images = read_images(path / FIGURES)
    else:
        stage(f"{path.name or path}: analysing in memory (no metrics.json)")
        result = analyze(ds)
        metrics = Metrics.from_dict(result.to_dict(), source=f"the analysis of {path}")
        frame = result.frame
        with tempfile.TemporaryDirectory() as tmp:
            write_figures(result, tmp, animation=False)
            images = read_images(Path(tmp))
        # The lens's figures live in the run whether or not it was analysed.
        theory = read_images(path / FIGURES)
        images.update({k: v for k, v in theory.items() if k.startswith(THEORY_PREFIX)})
    return RunPage(
        path=path,
        ds=ds,
        metrics=metrics,
        frame=frame,
        images=images,
        simulation=_simulation_analysis(ds, metrics),
        overlays=overlays,
    )


def _simulation_analysis(ds: xr.Dataset, metrics: Metrics) -> dict[str, Any] | None:
    """A simulated run's energy and clusters against time: its metrics', or measured here."""
    if metrics.info.kind != "simulation":
        return None
    if isinstance(metrics.simulation, dict):
        return metrics.simulation
    if "system" in ds["states"].dims:
        ds = ds.isel(system=0)
    try:
        return analyze_simulation(ds, max_frames=200)
    except UserError:
        return None  # no beta in the config: no energy


def _read_section(section: Path, reported: set[Path]) -> Section:
    if not section.is_file():
        raise UserError(f"section file '{section}' does not exist", "check the path")
    try:
        fragment = section.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        if isinstance(exc, UnicodeDecodeError):
            reason = f"not UTF-8 text: byte {exc.start} {exc.reason}"
        else:
            reason = exc.strerror or type(exc).__name__
        raise UserError(
            f"cannot read section file '{section}' ({reason})",
            "pass an HTML fragment in UTF-8, such as RUN/theory.html from 'tokenfield lens'",
        ) from None
    if section.name == "theory.html" and section.parent.resolve() not in reported:
        # RUN/theory.html alone: its figures come with it (with RUN, in RUN's section).
        images = read_images(section.parent / FIGURES)
        return Section(fragment, {k: v for k, v in images.items() if k.startswith(THEORY_PREFIX)})
    return Section(fragment)


def is_report(path: str | Path) -> bool:
    """Whether ``path`` is a report written by tokenfield (it carries the marker).

    Args:
        path: a file.

    Returns:
        True for a tokenfield report; False for any other file or none.

    Example:
        >>> from tokenfield.pipelines.report import is_report
        >>> is_report("no-such-report.html")
        False
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    # reports written before the marker existed start exactly like this
    legacy = b"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>tokenfield"
    return REPORT_MARKER.encode() in head or head.startswith(legacy)


def parse_overlay(spec: str | Path | tuple[str | Path, str]) -> tuple[Path, str]:
    """``RUN`` or ``RUN:LABEL`` (a path that exists is taken whole) -> (path, label).

    Args:
        spec: ``"RUN"``, ``"RUN:LABEL"`` or a ``(path, label)`` pair.

    Returns:
        ``(path, label)``.

    Example:
        >>> from tokenfield.pipelines.report import parse_overlay
        >>> parse_overlay("runs/spectrum-steered:steered")
        (PosixPath('runs/spectrum-steered'), 'steered')
    """
    if isinstance(spec, tuple):
        path, label = Path(spec[0]), str(spec[1])
        return path, label or path.name
    text = str(spec)
    if not Path(text).exists() and ":" in text:
        head, label = text.rsplit(":", 1)
        return Path(head), label or Path(head).name
    return Path(text), Path(text).name or text


def unanalysed_runs(run_paths: Sequence[str | Path]) -> list[Path]:
    """The runs without ``metrics.json``: the report analyses them in memory.

    Args:
        run_paths: run directories.

    Returns:
        Those of them without ``metrics.json``.

    Example:
        >>> from tokenfield.pipelines.report import unanalysed_runs
        >>> unanalysed_runs(["runs/categories", "runs/spectrum"])   # doctest: +SKIP
        [PosixPath('runs/spectrum')]
    """
    return [Path(p) for p in run_paths if not (Path(p) / METRICS_JSON).is_file()]


def read_images(directory: Path) -> dict[str, Image]:
    """The figures in ``directory`` (a run's ``figures/``), never one reached
    through a symbolic link (the directory itself or a file in it): the report
    embeds only what lies inside the run."""
    if directory.is_symlink() or not directory.is_dir():
        return {}
    found = {}
    for file in sorted(directory.iterdir()):
        if file.suffix in (".png", ".gif") and not file.name.startswith("."):
            content = _read_regular(file)
            if content is not None:
                found[file.stem] = ("image/png" if file.suffix == ".png" else "image/gif", content)
    order = {name: i for i, name in enumerate(FIGURE_ORDER)}

    def rank(name: str) -> tuple[int, int, str]:  # the analysis's, then others, then the lens's
        return (name.startswith(THEORY_PREFIX), order.get(name, len(order)), name)

    return dict(sorted(found.items(), key=lambda item: rank(item[0])))


def _read_regular(file: Path) -> bytes | None:
    """The bytes of ``file`` if it is a regular file and not a symbolic link
    (opened with ``O_NOFOLLOW``, so a link swapped in meanwhile is not followed)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return handle.read()
