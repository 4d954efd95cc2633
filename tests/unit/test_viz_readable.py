"""The figures a newcomer complained about: labelled axes, legends, readable numbers,
titles that fit, distinguishable thresholds."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.unit.synthetic_trajectories import clustered, trace_dataset
from tokenfield.analysis import analyze
from tokenfield.viz import plot_centroid_heatmaps, plot_separation


@pytest.fixture(scope="module")
def result():
    states, labels = clustered(n_per_category=3, n_time=6, n_feature=24)
    baseline, _ = clustered(n_per_category=3, n_time=6, n_feature=24, seed=9)
    return analyze(
        trace_dataset(states, labels), baseline=trace_dataset(baseline, labels), n_permutations=10
    )


def _inside(fig, artist) -> bool:
    fig.canvas.draw()
    box = artist.get_window_extent(fig.canvas.get_renderer())
    frame = fig.bbox
    return box.x0 >= frame.x0 - 1 and box.x1 <= frame.x1 + 1 and box.y1 <= frame.y1 + 1


def test_separation_has_y_labels_and_a_legend_for_the_null_bands(result):
    fig = plot_separation(result.separation, baseline=result.baseline.separation)
    for ax in fig.axes:
        assert ax.get_ylabel()  # what the numbers are
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    labels = [t.get_text() for legend in legends for t in legend.get_texts()]
    assert any("null" in label and "%" in label for label in labels)  # the band
    assert any(label.startswith("baseline") and "null" in label for label in labels)
    assert any("null mean" in label for label in labels)
    for legend in legends:
        assert _inside(fig, legend)


def test_centroid_numbers_are_readable(result):
    fig = plot_centroid_heatmaps(result.centroids, result.layers)
    for ax in fig.axes[:-1]:  # the last axes is the colour bar
        image = ax.images[0]
        texts = ax.texts
        assert texts and all(t.get_fontsize() >= 8 for t in texts)
        for text in texts:
            value = float(text.get_text())
            assert len(text.get_text().split(".")[1]) <= 2
            r, g, b, _ = image.cmap(image.norm(value))
            cell = 0.299 * r + 0.587 * g + 0.114 * b
            ink = 1.0 if text.get_color() == "white" else 0.0
            assert abs(ink - cell) > 0.3  # white on dark cells, black on light ones


def test_steered_paths_title_fits(tmp_path):
    from tokenfield.viz.steering import plot_steered_paths, save

    rng = np.random.default_rng(0)
    paths = np.cumsum(rng.normal(size=(8, 4, 2)), axis=0)
    loop = {
        "reference": {"paths": paths.tolist(), "category": ["A long target category"] * 4},
        "unsteered": {"paths": paths[:, :1].tolist()},
        "paths": {"steer": {"1.0": paths[:, :1].tolist(), "2.0": (paths[:, :1] + 1).tolist()}},
        "explained_variance_ratio": [0.5, 0.2],
        "source": "Word Problems With A Long Name",
        "target": "A long target category",
        "layer": 15,
    }
    ax = plot_steered_paths(loop)
    ax.figure.tight_layout()
    assert _inside(ax.figure, ax.title)
    written = save(ax, tmp_path / "steered_paths")
    assert all(p.stat().st_size > 0 for p in written)


def test_theory_clouds_thresholds_are_distinguishable():
    from tokenfield.viz.theory import plot_clouds

    t = np.arange(5)
    values = {
        "mean_cos": t * 0.1,
        "cluster_count": 10 - t,
        "cluster_count@0.1": 6 - t,
        "cluster_count@0.3": 3 - t * 0.5,
        "spread": 1 - t * 0.1,
        "effective_dim": 5 - t * 0.5,
    }
    clouds = SimpleNamespace(time=t, eps=0.01, values=values, mean=values.__getitem__)
    fig = plot_clouds(clouds, clouds)
    panel = fig.axes[1]
    markers = [line.get_marker() for line in panel.lines]
    assert len(set(markers[:3])) == 3  # one marker per eps level, within a source
    legend = [text.get_text() for text in panel.get_legend().get_texts()]
    assert legend == ["eps = 0.01", "eps = 0.1", "eps = 0.3"]
