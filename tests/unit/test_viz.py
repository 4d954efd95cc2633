"""Figures are written, decode, and have the size asked for."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.unit.synthetic_trajectories import clustered, straight_lines, trace_dataset
from tokenfield.analysis import analyze
from tokenfield.viz import (
    GIF_NAME,
    animate_trajectories,
    plot_centroid_heatmap,
    plot_separation,
    plot_speed,
    plot_trajectories,
    save_figure,
    write_figures,
)
from tokenfield.viz._common import DPI, new_figure


@pytest.fixture(scope="module")
def result():
    states, labels = clustered(n_per_category=3, n_time=8, n_feature=32)
    baseline, _ = clustered(n_per_category=3, n_time=8, n_feature=32, seed=9)
    return analyze(
        trace_dataset(states, labels),
        baseline=trace_dataset(baseline, labels),
        per_layer=True,
        n_permutations=10,
    )


def test_write_figures_writes_png_svg_and_gif(result, tmp_path):
    paths = write_figures(result, tmp_path)
    names = {p.name for p in paths}
    for stem in (
        "trajectories",
        "pcs_vs_layer",
        "speed",
        "separation",
        "centroid_distances",
        "trajectories_per_layer",
        "trajectories_baseline",
    ):
        assert {f"{stem}.png", f"{stem}.svg"} <= names
    assert GIF_NAME in names
    for path in paths:
        assert path.is_file() and path.stat().st_size > 1000
    with Image.open(tmp_path / "trajectories.png") as image:
        image.load()
        assert image.size == (8 * DPI, 6 * DPI)
    assert (tmp_path / "speed.svg").read_text().lstrip().startswith("<?xml")
    with Image.open(tmp_path / GIF_NAME) as gif:
        assert gif.n_frames == 7  # one frame per layer, times 0..L-1 (the seed convention)
        assert gif.size == (560, 420)


def test_plots_draw_on_given_axes(result, tmp_path):
    fig, axes = new_figure((12, 4), ncols=3)
    plot_trajectories(result.pcs, axes[0])
    plot_centroid_heatmap(result.centroids, result.layers[-1], axes[1])
    assert axes[0].lines and axes[1].images
    fig2, pair = new_figure((10, 4), ncols=2)
    assert plot_separation(result.separation, pair) is fig2
    assert len(pair[0].collections) == 1  # the null band
    paths = save_figure(fig, tmp_path, "panel", formats=("png",))
    with Image.open(paths[0]) as image:
        assert image.size == (12 * DPI, 4 * DPI)


def test_figures_of_a_run_without_categories(tmp_path):
    ds = trace_dataset(straight_lines(n_particle=50), None, time=np.linspace(0, 1, 12))
    result = analyze(ds)
    fig = plot_speed(result.kinematics, time_name="time")
    assert len(fig.axes) == 3
    paths = write_figures(result, tmp_path, animation=False)
    assert {p.name for p in paths} == {
        f"{stem}.{ext}"
        for stem in ("trajectories", "pcs_vs_layer", "speed")
        for ext in ("png", "svg")
    }
    gif = animate_trajectories(result.pcs, tmp_path / "sim.gif", max_frames=5)
    with Image.open(gif) as image:
        assert image.n_frames == 5
