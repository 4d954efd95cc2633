"""Separation of categories, bifurcations, and distances between category centroids.

All distances here are cosine distances, ``d(x, y) = 1 - <x, y> / (||x|| ||y||)``:
the norm of the residual stream grows with depth, the theory lives on the
sphere, and a direction is what the next layer reads.

A category's centroid at a time step is the mean of its members' unit vectors,
``mu_c = mean_{j in c} x_j / ||x_j||``; the distance of a particle to it is
``1 - <x, mu_c> / (||x|| ||mu_c||)``.

Every separation score comes with its chance level: the same score computed
with the category labels shuffled (``n_permutations`` seeded permutations, the
same ones at every time step), and with a p-value corrected for picking the
best time step (the maximum over time steps of each shuffle:
:mod:`tokenfield.analysis.nulls`).

What is shuffled is the exchangeable unit: the prompt. When several particles
share a prompt (``--particles all``: every token of every prompt), the
prompt -> category map is permuted and each token takes its prompt's new
category; single tokens are never shuffled. Tokens of one prompt are
correlated (they share the prompt's context), so a token-level shuffle breaks
that correlation in the null but not in the real labels: on synthetic prompts
with a per-prompt offset and no category signal, "categories separate" then
held in every dataset (``tests/unit/test_nulls.py`` measures the rate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from tokenfield.analysis.nulls import max_null_pvalues
from tokenfield.errors import UserError

# distances below this are rounding noise (identical directions)
_DISTANCE_FLOOR = 1e-9


def _unit_states(ds: xr.Dataset) -> np.ndarray:
    x = np.asarray(ds["states"].transpose("time", "particle", "feature").values, dtype=np.float64)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)  # (time, particle, feature)


def category_labels(ds: xr.Dataset, labels: str | Sequence[str] = "category") -> np.ndarray:
    """The category of each particle as a string array: a coordinate name or values."""
    if isinstance(labels, str):
        if labels not in ds.coords and labels not in ds:
            raise UserError(
                f"the trajectory has no '{labels}' coordinate",
                "trace prompts with categories, or pass the labels explicitly",
            )
        values = ds[labels].values
    else:
        values = np.asarray(labels)
    values = np.array([str(v) for v in values], dtype=object)
    if len(values) != ds.sizes["particle"]:
        raise UserError(
            f"{len(values)} labels for {ds.sizes['particle']} particles",
            "give one label per particle",
        )
    return values


def can_separate(labels: np.ndarray) -> bool:
    """Whether a silhouette is defined: 2 <= categories <= particles - 1."""
    n_categories = len(set(labels.tolist()))
    return 2 <= n_categories <= len(labels) - 1


def shuffle_units(
    ds: xr.Dataset, names: np.ndarray, groups: str | Sequence[Any] | None = "auto"
) -> tuple[np.ndarray, str]:
    """The exchangeable unit of each particle, and its name.

    ``groups`` names a particle coordinate or gives one group per particle;
    particles of a group share a label and are shuffled together (a group whose
    particles differ in label is refused). ``"auto"`` (the default) groups by
    ``prompt_index`` when the run has it and each prompt's particles share one
    label, and shuffles single particles otherwise; ``None`` shuffles single
    particles. Returns ``(unit, name)``:
    ``unit`` the ``(particle,)`` integer unit of each particle (``0..U-1``, in
    order of first appearance) and ``name`` ``"prompt"`` or ``"particle"``.
    """
    n = len(names)
    single = (np.arange(n), "particle")
    if groups is None:
        return single
    explicit = not (isinstance(groups, str) and groups == "auto")
    if not explicit:
        groups = "prompt_index"
    if isinstance(groups, str):
        if groups not in ds.coords:
            if explicit:
                raise UserError(
                    f"the trajectory has no '{groups}' coordinate",
                    "name a particle coordinate, e.g. prompt_index",
                )
            return single
        values = np.asarray(ds[groups].values)
    else:
        values = np.asarray(groups)
    if values.shape != (n,):
        raise UserError(f"{values.size} groups for {n} particles", "give one group per particle")
    _, first, unit = np.unique(values, return_index=True, return_inverse=True)
    unit = unit.reshape(-1)
    order = np.argsort(np.argsort(first))  # units numbered by first appearance
    unit = order[unit]
    first_label = names[np.sort(first)]
    if not np.array_equal(first_label[unit], names):
        if explicit:
            raise UserError(
                "the particles of one group have different labels",
                "group particles whose label is the same (e.g. the tokens of one prompt)",
            )
        return single
    return unit, ("group" if explicit else "prompt")


def shuffled_labellings(
    codes: np.ndarray, unit: np.ndarray, n_permutations: int, seed: int
) -> np.ndarray:
    """``(n_permutations, particle)`` label codes, the units' labels permuted.

    Each shuffle permutes the unit -> label map and gives every particle its
    unit's new label. With one particle per unit, in order, this is the same
    draw as permuting the particles' labels.
    """
    rng = np.random.default_rng(seed)
    n_units = int(unit.max()) + 1 if unit.size else 0
    unit_codes = np.zeros(n_units, dtype=np.asarray(codes).dtype)
    unit_codes[unit] = codes
    if n_permutations <= 0:
        return np.zeros((0, len(codes)), dtype=int)
    return np.stack([rng.permutation(unit_codes)[unit] for _ in range(n_permutations)])


def cosine_distance_matrix(x: np.ndarray) -> np.ndarray:
    """Pairwise cosine distances between the rows of unit vectors ``x`` (n, f) -> (n, n)."""
    dist = 1.0 - x @ x.T
    np.fill_diagonal(dist, 0.0)
    return np.clip(dist, 0.0, 2.0)


def silhouette_batch(dist: np.ndarray, codes: np.ndarray, n_codes: int) -> np.ndarray:
    """Mean silhouette for many labelings at once, from a precomputed distance matrix.

    ``s_i = (b_i - a_i) / max(a_i, b_i)`` with ``a_i`` the mean distance to the
    other members of ``i``'s category and ``b_i`` the smallest mean distance to
    another category; ``s_i = 0`` for a category of one (scikit-learn's rule).

    Args:
        dist: (n, n) distances.
        codes: (batch, n) integer labels in ``[0, n_codes)``.
        n_codes: number of distinct labels.

    Returns:
        (batch,) mean silhouettes; equal to ``sklearn.metrics.silhouette_score``.

    Example:
        >>> from tokenfield.analysis import silhouette_batch
        >>> dist = np.array([[0, 0.1, 1, 1], [0.1, 0, 1, 1], [1, 1, 0, 0.1], [1, 1, 0.1, 0]])
        >>> silhouette_batch(dist, np.array([[0, 0, 1, 1], [0, 1, 0, 1]]), 2)
        array([ 0.9 , -0.45])
    """
    onehot = np.eye(n_codes)[codes]  # (batch, n, k)
    sums = np.einsum("ij,bjk->bik", dist, onehot)  # (batch, n, k)
    counts = onehot.sum(axis=1)  # (batch, k)
    own_count = np.take_along_axis(counts, codes, axis=1)  # (batch, n)
    own_sum = np.take_along_axis(sums, codes[..., None], axis=2)[..., 0]
    with np.errstate(invalid="ignore", divide="ignore"):
        a = own_sum / (own_count - 1)
        means = sums / counts[:, None, :]
    means = np.where(onehot.astype(bool) | (counts[:, None, :] == 0), np.inf, means)
    b = means.min(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = (b - a) / np.maximum(a, b)
    s = np.where(own_count > 1, np.nan_to_num(s, nan=0.0, posinf=0.0, neginf=0.0), 0.0)
    return s.mean(axis=1)


def distance_ratio_batch(dist: np.ndarray, codes: np.ndarray, n_codes: int) -> np.ndarray:
    """Mean between-category distance over mean within-category distance, per labeling.

    1 means the categories are no tighter than the whole cloud; large means
    tight, well separated categories. NaN when undefined.
    """
    n = dist.shape[0]
    onehot = np.eye(n_codes)[codes]  # (batch, n, k)
    sums = np.einsum("ij,bjk->bik", dist, onehot)
    within_sum = np.take_along_axis(sums, codes[..., None], axis=2)[..., 0].sum(axis=1)
    counts = onehot.sum(axis=1)
    within_pairs = (counts * (counts - 1)).sum(axis=1)
    between_sum = dist.sum() - within_sum
    between_pairs = n * (n - 1) - within_pairs
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (between_sum / between_pairs) / (within_sum / within_pairs)
    return np.where(np.isfinite(ratio), ratio, np.nan)


def separation(
    ds: xr.Dataset,
    labels: str | Sequence[str] = "category",
    *,
    n_permutations: int = 200,
    seed: int = 0,
    null_quantiles: tuple[float, float] = (0.025, 0.975),
    groups: str | Sequence[Any] | None = "auto",
) -> xr.Dataset:
    """How well the categories separate at every time step, with a permutation null.

    Scores per time step (cosine distances):

    - ``silhouette``: mean silhouette (scikit-learn's ``silhouette_score`` with
      ``metric="cosine"``), in [-1, 1]; near 1 for tight, distant categories.
    - ``ratio``: mean between-category distance / mean within-category distance.

    For each score, ``<score>_null_mean``, ``<score>_null_low`` and
    ``<score>_null_high`` (the ``null_quantiles`` of the shuffled-label scores)
    ``<score>_p`` (the permutation p-value ``(1 + #{null >= observed}) /
    (1 + n_permutations)``) and ``<score>_p_corrected`` (the same count against
    each shuffle's maximum over all time steps: the p-value to quote for a
    time step chosen because its score is the best; see
    :func:`tokenfield.analysis.nulls.max_null_pvalues`).

    Args:
        ds: a trajectory with ``states`` (time, particle, feature).
        labels: a particle coordinate name, or one label per particle.
        n_permutations: shuffled labelings for the null.
        seed: seeds the permutations.
        null_quantiles: the band reported for the null.
        groups: the exchangeable unit (:func:`shuffle_units`): a particle
            coordinate or one group per particle; the shuffles permute the
            groups' labels, the same shuffle at every time step. ``"auto"``:
            the prompt (``prompt_index``), when the run has one and its tokens
            share a label; ``None`` shuffles single particles.

    Returns:
        A Dataset over ``time`` with the variables above; attrs record the
        categories, ``n_permutations``, ``seed``, ``shuffle_unit``
        (``"prompt"``, ``"group"`` or ``"particle"``) and ``shuffled_units``.

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> sep = tf.separation(sim, ["a"] * 4 + ["b"] * 4, n_permutations=20)
        >>> sep.silhouette.dims, sep.attrs["shuffle_unit"]
        (('time',), 'particle')
    """
    from sklearn.metrics import silhouette_score

    names = category_labels(ds, labels)
    if not can_separate(names):
        raise UserError(
            "separation needs at least 2 categories and fewer categories than particles",
            "trace prompts from several categories",
        )
    categories, codes = np.unique(names.astype(str), return_inverse=True)
    n_codes = len(categories)
    unit_of, unit_name = shuffle_units(ds, names.astype(str), groups)
    shuffled = shuffled_labellings(codes, unit_of, n_permutations, seed)
    unit = _unit_states(ds)
    n_time = unit.shape[0]
    result: dict[str, np.ndarray] = {}
    for score in ("silhouette", "ratio"):
        for suffix in ("", "_null_mean", "_null_low", "_null_high", "_p", "_p_corrected"):
            result[score + suffix] = np.full(n_time, np.nan)
    null_grid = {
        score: np.full((len(shuffled), n_time), np.nan) for score in ("silhouette", "ratio")
    }
    for t in range(n_time):
        dist = cosine_distance_matrix(unit[t])
        if np.all(dist < _DISTANCE_FLOOR):
            # all particles at one point: the silhouette is undefined
            observed = {"silhouette": 0.0, "ratio": np.nan}
        else:
            observed = {
                "silhouette": float(silhouette_score(dist, codes, metric="precomputed")),
                "ratio": float(distance_ratio_batch(dist, codes[None], n_codes)[0]),
            }
        nulls = {
            "silhouette": silhouette_batch(dist, shuffled, n_codes),
            "ratio": distance_ratio_batch(dist, shuffled, n_codes),
        }
        for score, value in observed.items():
            result[score][t] = value
            null_grid[score][:, t] = nulls[score]
            null = nulls[score][np.isfinite(nulls[score])]
            if len(null) == 0:
                continue
            result[score + "_null_mean"][t] = null.mean()
            low, high = np.quantile(null, null_quantiles)
            result[score + "_null_low"][t] = low
            result[score + "_null_high"][t] = high
    for score in ("silhouette", "ratio"):
        pvalues = max_null_pvalues(result[score], null_grid[score])
        result[score + "_p"] = pvalues.p
        result[score + "_p_corrected"] = pvalues.p_corrected
    out = xr.Dataset(
        {name: ("time", values) for name, values in result.items()},
        coords={"time": ds["time"].values},
    )
    out.attrs = {
        "categories": [str(c) for c in categories],
        "n_permutations": int(n_permutations),
        "seed": int(seed),
        "null_quantiles": list(null_quantiles),
        "metric": "cosine",
        "shuffle_unit": unit_name,
        "shuffled_units": int(unit_of.max()) + 1,
    }
    return out


def centroid_distances(ds: xr.Dataset, labels: str | Sequence[str] = "category") -> xr.DataArray:
    """Cosine distance between every pair of category centroids at every time step.

    Args:
        ds: a trajectory with ``states`` (time, particle, feature).
        labels: a particle coordinate name, or one label per particle.

    Returns:
        (time, category, other) with ``1 - <mu_a, mu_b> / (||mu_a|| ||mu_b||)``,
        ``mu_c`` the mean unit vector of category ``c``.

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> dist = tf.centroid_distances(sim, ["a"] * 4 + ["b"] * 4)
        >>> dist.dims, dist.shape
        (('time', 'category', 'other'), (11, 2, 2))
    """
    names = category_labels(ds, labels).astype(str)
    categories = sorted(set(names.tolist()))
    unit = _unit_states(ds)
    centroids = np.stack([unit[:, names == c].mean(axis=1) for c in categories], axis=1)
    norms = np.linalg.norm(centroids, axis=-1, keepdims=True)
    centroids = centroids / np.where(norms > 0, norms, 1.0)  # (time, k, feature)
    dist = 1.0 - np.einsum("tkf,tlf->tkl", centroids, centroids)
    dist = np.clip(dist, 0.0, 2.0)
    idx = np.arange(len(categories))
    dist[:, idx, idx] = 0.0
    return xr.DataArray(
        dist,
        dims=("time", "category", "other"),
        coords={"time": ds["time"].values, "category": categories, "other": categories},
        name="centroid_distance",
    )


def bifurcation(
    ds: xr.Dataset,
    labels: str | Sequence[str] = "category",
    *,
    margin: float = 0.25,
) -> xr.Dataset:
    """When each particle joins its category's branch, and when it leaves for another's.

    For particle ``i`` of category ``c`` at time ``t`` (cosine distances to
    centroids of unit vectors):

    - ``d_own(t)``: distance to the centroid of the *other* members of ``c``
      (leave-one-out, so a particle never pulls its own centroid; NaN when
      ``c`` has one member);
    - ``d_other(t)``: distance to the nearest centroid of another category,
      which is ``nearest_other(t)``.

    ``i`` is *with its own bundle* at ``t`` when ``d_own < (1 - margin) d_other``
    and *with another bundle* when ``d_other < (1 - margin) d_own`` (clearly
    closer, by the factor ``1 - margin``; identical distances are neither).

    - ``split_layer``: the first time step ``t*`` such that ``i`` is with its
      own bundle at every ``t >= t*``: when its category's branch has split off
      from the rest for good. Two groups that travel together up to step 6 and
      go different ways from step 7 on have split layer 7.
    - ``bifurcation_layer``: the first time step ``t*`` such that ``i`` is with
      another category's bundle at every ``t >= t*``: when the particle has
      left its own category for good (the seed's prompt 15, a docstring that
      ends up among the code prompts); ``joined`` names that category (the
      nearest other at the last step). A particle that follows its own
      category up to step 6 and another's from step 7 on has bifurcation layer 7.

    Both are NaN (``joined`` is "") when the condition does not hold at the
    last step. They are time coordinates (layer indices for a trace).

    Args:
        ds: a trajectory with ``states`` (time, particle, feature).
        labels: a particle coordinate name, or one label per particle.
        margin: how much closer counts as "closer", in (0, 1).

    Returns:
        A Dataset with ``d_own``, ``d_other``, ``nearest_other`` (time,
        particle) and ``split_layer``, ``bifurcation_layer``, ``joined``
        (particle,).

    Example:
        >>> sim = tf.simulate(tf.Dynamics(beta=4.0), tf.initial_condition("uniform", n=8, d=3),
        ...                   t_max=1.0, dt=0.1)
        >>> bif = tf.bifurcation(sim, ["a"] * 4 + ["b"] * 4)
        >>> bif.d_own.dims, bif.split_layer.dims
        (('time', 'particle'), ('particle',))
    """
    if not 0 < margin < 1:
        raise UserError(f"margin must be in (0, 1), got {margin}", "use e.g. 0.25")
    names = category_labels(ds, labels).astype(str)
    categories = sorted(set(names.tolist()))
    if len(categories) < 2:
        raise UserError("bifurcation needs at least 2 categories", "trace several categories")
    code = np.array([categories.index(n) for n in names])
    unit = _unit_states(ds)  # (time, particle, feature)
    n_time, n_particle, _ = unit.shape
    times = np.asarray(ds["time"].values)
    sums = np.stack([unit[:, code == k].sum(axis=1) for k in range(len(categories))], axis=1)
    counts = np.bincount(code, minlength=len(categories)).astype(np.float64)

    def distance(x: np.ndarray, centre: np.ndarray) -> np.ndarray:
        norm = np.linalg.norm(centre, axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            d = 1.0 - np.sum(x * centre, axis=-1) / norm
        d = np.where(norm > 0, d, np.nan)
        return np.where(np.abs(d) < _DISTANCE_FLOOR, 0.0, d)

    # (time, particle, category): distance to each full centroid, own one leave-one-out
    to_centroid = np.stack(
        [distance(unit, sums[:, k][:, None, :]) for k in range(len(categories))], axis=-1
    )
    own_sum = sums[:, code] - unit  # (time, particle, feature)
    d_own = distance(unit, own_sum)
    d_own = np.where(counts[code][None, :] > 1, d_own, np.nan)
    others = to_centroid.copy()
    others[:, np.arange(n_particle), code] = np.inf
    nearest = np.argmin(others, axis=-1)  # (time, particle)
    d_other = np.take_along_axis(others, nearest[..., None], axis=-1)[..., 0]

    with np.errstate(invalid="ignore"):
        with_own = (d_own < (1 - margin) * d_other) & (d_other > _DISTANCE_FLOOR)
        with_other = (d_other < (1 - margin) * d_own) & (d_own > _DISTANCE_FLOOR)

    def first_of_final_run(flags: np.ndarray) -> np.ndarray:
        """Per particle, the time from which ``flags`` holds to the end (NaN if not at end)."""
        out = np.full(flags.shape[1], np.nan)
        for p in range(flags.shape[1]):
            column = flags[:, p]
            if not column[-1]:
                continue
            breaks = np.flatnonzero(~column)
            out[p] = float(times[breaks[-1] + 1] if len(breaks) else times[0])
        return out

    bif = first_of_final_run(with_other)
    joined = np.array(
        [categories[nearest[-1, p]] if np.isfinite(bif[p]) else "" for p in range(n_particle)],
        dtype=object,
    )
    particle_coords = {
        name: coord for name, coord in ds["states"].coords.items() if coord.dims == ("particle",)
    }
    out = xr.Dataset(
        {
            "d_own": (("time", "particle"), d_own),
            "d_other": (("time", "particle"), d_other),
            "nearest_other": (
                ("time", "particle"),
                np.array(categories, dtype=object)[nearest],
            ),
            "split_layer": ("particle", first_of_final_run(with_own)),
            "bifurcation_layer": ("particle", bif),
            "joined": ("particle", joined),
        },
        coords={"time": times, **particle_coords},
    )
    out.attrs = {"margin": margin, "categories": categories}
    return out
