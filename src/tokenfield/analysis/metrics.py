"""``metrics.json`` read back: one frozen dataclass per section, built by
:meth:`Metrics.from_dict`.

The file is written by :meth:`tokenfield.analysis.run_analysis.RunAnalysis.to_dict`
(and ``pipelines.analyze``, which adds ``run``, ``baseline_run`` and ``figures``).
Reading it back through these classes checks every value's type once, in one
place, so that the report and the summary table read attributes, not nested
``.get()`` calls. Keys an older version did not write take their defaults (the
ones the report always assumed); keys this version does not know are kept in
``extra``. A value of the wrong type is one :class:`~tokenfield.errors.UserError`
that names the key.

Two sections stay records rather than classes, because their keys vary with the
run: ``particles`` (one row per prompt, columns present when the run has them;
each known column's type is still checked) and ``simulation`` (the free-form
result of :func:`tokenfield.analysis.simulation.analyze_simulation`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from tokenfield.analysis.nulls import claim_status
from tokenfield.errors import UserError

Number = Union[int, float]  # noqa: UP007 (typing.get_type_hints reads it at runtime)
Series = list[Union[int, float, None]]  # noqa: UP007 (NaN is written as null)


@dataclass(frozen=True)
class Info:
    """What was analysed."""

    kind: str = "trace"
    model: Any = ""
    n_particles: int | None = None
    n_particles_in_run: int | None = None
    n_time: int | None = None
    n_features: int | None = None
    time_first: Number | None = None
    time_last: Number | None = None
    categories: dict[str, int] | None = None
    system: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Options:
    """The analysis options (``times`` is ``seed`` in files written before it was recorded)."""

    times: str = "seed"
    sphere: bool = False
    per_layer: bool = False
    seed: int = 0
    n_permutations: int = 200
    particles: str = "last"
    bifurcation_margin: float = 0.25
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProjectionSummary:
    sphere: bool = False
    per_layer: bool = False
    include_final_norm: bool = False
    n_components: int | None = None
    explained_variance_ratio: Series = field(default_factory=list)
    file: str | None = None
    time_convention: str | None = None
    times: Series = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Spearman:
    overall_spearman: float | None = None
    median_spearman: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DepthSummary:
    component: int = 1
    overall_spearman: float | None = None
    median_spearman: float | None = None
    by_times: dict[str, Spearman] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KinematicsSummary:
    step: Series = field(default_factory=list)
    mean_step_length: Series = field(default_factory=list)
    mean_relative_step: Series = field(default_factory=list)
    mean_angular_step_deg: Series = field(default_factory=list)
    mean_turning_angle_deg: Series = field(default_factory=list)
    mean_norm: Series = field(default_factory=list)
    most_common_fastest_relative_step: Number | None = None
    median_velocity_dpc2_dpc1: Series | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PerLayerProjection:
    time: Series = field(default_factory=list)
    explained_variance_ratio_pc1: Series = field(default_factory=list)
    explained_variance_ratio_pc2: Series | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BestSeparation:
    """The layer with the best silhouette; its claim is judged on the corrected p."""

    silhouette: float | None
    silhouette_null_high: float | None
    silhouette_p: float | None
    time: Number
    silhouette_p_corrected: float | None = None
    ratio: float | None = None
    ratio_p: float | None = None
    ratio_p_corrected: float | None = None
    claim: str | None = None
    alpha: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """``claim`` as written, or judged from the corrected p (files before ``claim``)."""
        return self.claim or claim_status(self.silhouette_p_corrected)


@dataclass(frozen=True)
class SeparationSummary:
    """Category separation by time step, with its permutation null."""

    time: Series
    silhouette: Series
    silhouette_null_mean: Series
    silhouette_null_low: Series
    silhouette_null_high: Series
    silhouette_p: Series
    ratio: Series
    ratio_null_high: Series
    best: BestSeparation
    silhouette_p_corrected: Series | None = None
    ratio_null_mean: Series | None = None
    ratio_null_low: Series | None = None
    ratio_p: Series | None = None
    ratio_p_corrected: Series | None = None
    categories: list[str] = field(default_factory=list)
    n_permutations: int | None = None
    seed: int | None = None
    null_quantiles: Series | None = None
    metric: str | None = None
    shuffle_unit: str | None = None
    shuffled_units: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CentroidSummary:
    categories: list[str]
    by_time: dict[str, list[Series]]
    metric: str = "cosine"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BifurcationSummary:
    margin: float | None = None
    category_split_layer: dict[str, Number | None] = field(default_factory=dict)
    n_left_category: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


#: The per-prompt columns and their types (a row holds those the run has).
PARTICLE_COLUMNS: dict[str, Any] = {
    "particle": Union[int, str],  # noqa: UP007
    "label": str,
    "prompt_index": int,
    "category": str,
    "prompt": str,
    "token": str,
    "spearman_pc1_time": Union[float, None],  # noqa: UP007
    "fastest_step": Union[Number, None],  # noqa: UP007
    "fastest_relative_step": Union[Number, None],  # noqa: UP007
    "split_layer": Union[Number, None],  # noqa: UP007
    "bifurcation_layer": Union[Number, None],  # noqa: UP007
    "joined": Union[str, None],  # noqa: UP007
}


@dataclass(frozen=True)
class Metrics:
    """A whole ``metrics.json``; ``baseline`` is the same analysis of the baseline run.

    Attributes:
        info, options: what was analysed and how.
        projection, depth_ordering, kinematics: the summaries of the global frame.
        per_layer_projection: the per-layer frame's summary, when asked for.
        separation, centroid_distances, bifurcation: ``None`` without categories.
        particles: one dict per analysed particle.
        simulation: the simulation analysis (simulated runs, by :func:`tokenfield.analyze_run`).
        baseline: the baseline run's metrics.
        run, baseline_run: the runs' paths.
        figures: the figure files written.
        extra: fields this version does not know (kept on a round trip).

    Example:
        >>> from tokenfield.analysis import Metrics
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> metrics = Metrics.from_dict(tf.analyze(sim).to_dict())
        >>> metrics.info.kind, metrics.separation is None      # no categories
        ('simulation', True)
    """

    info: Info = field(default_factory=Info)
    options: Options = field(default_factory=Options)
    projection: ProjectionSummary = field(default_factory=ProjectionSummary)
    depth_ordering: DepthSummary = field(default_factory=DepthSummary)
    kinematics: KinematicsSummary = field(default_factory=KinematicsSummary)
    per_layer_projection: PerLayerProjection | None = None
    separation: SeparationSummary | None = None
    centroid_distances: CentroidSummary | None = None
    bifurcation: BifurcationSummary | None = None
    particles: list[dict[str, Any]] = field(default_factory=list)
    simulation: dict[str, Any] | None = None
    baseline: Metrics | None = None
    run: str | None = None
    baseline_run: str | None = None
    figures: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, source: str = "metrics.json") -> Metrics:
        """Check and convert ``metrics.json`` data (as ``json.load`` returns it).

        Raises:
            UserError: a value of the wrong type or a missing required key, named
                by its path (``separation.best.time``) in ``source``.
        """
        return _build(cls, data, "", source)

    @property
    def kind(self) -> str:
        return self.info.kind

    @property
    def is_trace(self) -> bool:
        return self.info.kind == "trace"


# ---------------------------------------------------------------------------
# One checker for every section: the dataclass annotations are the schema.


def _malformed(source: str, where: str, problem: str) -> UserError:
    return UserError(
        f"{source} is malformed: {where or 'the file'} {problem}",
        "run 'tokenfield analyze RUN' again to rewrite it",
    )


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _conform(value: Any, hint: Any, where: str, source: str) -> Any:
    """``value`` checked against the annotation ``hint`` (dataclasses built)."""
    if hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _conform(value, option, where, source)
            except UserError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        names = " or ".join(_hint_name(o) for o in options)
        raise _malformed(source, f"'{where}'", f"should be {names}, got {_type_name(value)}")
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where, source)
    if origin is list:
        if not isinstance(value, list):
            raise _malformed(source, f"'{where}'", f"should be a list, got {_type_name(value)}")
        (item,) = typing.get_args(hint)
        return [_conform(v, item, f"{where}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _malformed(source, f"'{where}'", f"should be an object, got {_type_name(value)}")
        _key, item = typing.get_args(hint)
        return {str(k): _conform(v, item, f"{where}.{k}", source) for k, v in value.items()}
    ok = {
        str: lambda v: isinstance(v, str),
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    }[hint](value)
    if not ok:
        raise _malformed(
            source, f"'{where}'", f"should be {_hint_name(hint)}, got {_type_name(value)}"
        )
    return value


def _hint_name(hint: Any) -> str:
    names = {str: "a string", bool: "true or false", int: "an integer", float: "a number"}
    if hint in names:
        return names[hint]
    origin = typing.get_origin(hint)
    return {list: "a list", dict: "an object"}.get(origin, "an object")


def _build(cls: Any, data: Any, where: str, source: str) -> Any:
    if not isinstance(data, dict):
        name = f"'{where}'" if where else ""
        raise _malformed(source, name, f"should be a JSON object, got {_type_name(data)}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "extra":
            continue
        key = f"{where}.{f.name}" if where else f.name
        if f.name in data:
            values[f.name] = _conform(data[f.name], hints[f.name], key, source)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _malformed(source, f"'{key}'", "is missing")
    if cls is Metrics and "particles" in values:
        values["particles"] = [
            _particle_row(row, f"particles[{i}]", source)
            for i, row in enumerate(values["particles"])
        ]
    values["extra"] = {k: v for k, v in data.items() if k not in known}
    return cls(**values)


def _particle_row(row: dict[str, Any], where: str, source: str) -> dict[str, Any]:
    for key, hint in PARTICLE_COLUMNS.items():
        if key in row:
            _conform(row[key], hint, f"{where}.{key}", source)
    return row


# ---------------------------------------------------------------------------
# The short summary (the CLI's table after `analyze`, the report's first table).


def summary_rows(metrics: Metrics | dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """(name, value, baseline value) rows for the short summary table.

    Args:
        metrics: a :class:`Metrics` or its dict (``metrics.json``).

    Returns:
        ``(name, value, baseline value)`` strings; the baseline value is
        ``None`` without a baseline.

    Example:
        >>> from tokenfield.analysis import summary_rows
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> summary_rows(tf.analyze(sim).to_dict())[0]
        ('particles x time steps', '8 x 11', None)
    """
    if not isinstance(metrics, Metrics):
        metrics = Metrics.from_dict(metrics)
    main = _summary(metrics)
    base = _summary(metrics.baseline) if metrics.baseline else None
    return [(name, value, base.get(name) if base else None) for name, value in main.items()]


def _summary(m: Metrics) -> dict[str, str]:
    out: dict[str, str] = {}
    info = m.info
    step = "layer" if info.kind == "trace" else "time"
    unit = "prompt" if info.kind == "trace" else "particle"
    out["particles x time steps"] = f"{info.n_particles} x {info.n_time}"
    ratio = m.projection.explained_variance_ratio
    if ratio:
        out["explained variance PC1 / PC2"] = " / ".join(_fmt(r, "{:.1%}") for r in ratio[:2])
    depth = m.depth_ordering
    if len(depth.by_times) > 1:
        for name in ("seed", "all"):
            if name in depth.by_times:
                label = "0..L-1, as the seed" if name == "seed" else "0..L"
                out[f"Spearman(PC1, {step}) overall / median, {step}s {label}"] = (
                    f"{_fmt(depth.by_times[name].overall_spearman)} / "
                    f"{_fmt(depth.by_times[name].median_spearman)}"
                )
    else:
        out[f"Spearman(PC1, {step}) overall"] = _fmt(depth.overall_spearman)
        out[f"Spearman(PC1, {step}) median per {unit}"] = _fmt(depth.median_spearman)
    kin = m.kinematics
    out[f"most common fastest {step} (relative step)"] = _fmt(
        kin.most_common_fastest_relative_step, "{}"
    )
    turning = [v for v in kin.mean_turning_angle_deg if v is not None]
    if turning:
        out["mean turning angle (deg)"] = _fmt(float(np.mean(turning)), "{:.1f}")
    sep = m.separation
    if sep:
        best = sep.best
        out[f"best silhouette ({step})"] = f"{_fmt(best.silhouette)} ({_fmt(best.time, '{}')})"
        out[f"  null 97.5% / p at that {step}"] = (
            f"{_fmt(best.silhouette_null_high)} / {_fmt(best.silhouette_p, '{:.3g}')}"
        )
        if best.silhouette_p_corrected is not None:
            out[f"  p corrected for the best of {len(sep.time)} {step}s"] = (
                f"{_fmt(best.silhouette_p_corrected, '{:.3g}')}: categories separate: "
                f"{best.verdict}"
            )
    if m.bifurcation:
        out["prompts that leave their category"] = str(m.bifurcation.n_left_category)
    final = (m.simulation or {}).get("final")
    if isinstance(final, dict):
        out["final cluster count"] = _fmt(final.get("cluster_count"), "{}")
        out["final energy"] = _fmt(final.get("energy"), "{:.4g}")
    return out


def _fmt(value: Any, pattern: str = "{:.3f}") -> str:
    if value is None:
        return "n/a"
    try:
        return pattern.format(value)
    except (TypeError, ValueError):
        return str(value)
