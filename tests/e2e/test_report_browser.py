"""The HTML report in a real headless browser (Debian's chromium, driven by Playwright).

Needs /usr/bin/chromium (``make browser-deps`` installs it); never downloads a browser.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run
from tokenfield.pipelines.report import write_report
from tokenfield.runs import strings

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags chromium's own connections are refused
# on an offline machine and show up as errors.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium: run make browser-deps"),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    states, labels = clustered(n_per_category=3, n_time=12, n_feature=32)
    run = write_run(root / "run", trace_dataset(states, labels))
    return write_report([run], root / "report.html")


def test_report_loads_draws_and_the_slider_moves_the_plot(report):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            errors: list[str] = []
            remote: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on(
                "request",
                lambda r: None if r.url.startswith(("file:", "data:")) else remote.append(r.url),
            )
            page.goto(report.as_uri(), timeout=120_000)
            plot = "#trajectories-0"
            page.wait_for_selector(f"{plot} svg.main-svg", timeout=20_000)
            assert page.locator(f"{plot}.plotly-graph-div, {plot} .plotly").count() >= 1
            # 15 prompt paths + start and end markers for 5 categories
            assert page.locator(f"{plot} .scatterlayer .trace").count() == 15 + 2 * 5

            def paths() -> list[str]:
                return page.eval_on_selector_all(
                    f"{plot} .scatterlayer .trace path.js-line",
                    "els => els.map(e => e.getAttribute('d'))",
                )

            def slider_label() -> str:
                return page.locator(f"{plot} .slider-container text").first.text_content()

            before = paths()
            assert len(before) == 15 and all(before)
            assert slider_label().strip() == "layer: 10"  # times 0..L-1: the seed convention

            # drag the slider's grip to about a third of the rail
            rail = page.locator(f"{plot} .slider-rail-touch-rect").first
            rail.scroll_into_view_if_needed()
            grip = page.locator(f"{plot} .slider-grip-rect").first.bounding_box()
            box = rail.bounding_box()
            y = grip["y"] + grip["height"] / 2
            page.mouse.move(grip["x"] + grip["width"] / 2, y)
            page.mouse.down()
            page.mouse.move(box["x"] + 0.3 * box["width"], y, steps=8)
            page.mouse.up()
            page.wait_for_function(
                f"document.querySelector('{plot} .slider-container text').textContent"
                " !== 'layer: 11'",
                timeout=5_000,
            )
            page.wait_for_timeout(200)
            after = paths()
            assert slider_label().strip() != "layer: 11"
            assert sum(a != b for a, b in zip(before, after, strict=True)) == 15
            # the paths now stop early: shorter SVG paths
            assert sum(len(a) for a in after) < sum(len(b) for b in before)

            # clicking a category in the legend hides its 3 prompts and their markers
            page.locator(f"{plot} .legend .traces .legendtoggle").first.click()
            page.wait_for_function(
                f"document.querySelectorAll('{plot} .scatterlayer .trace').length < 25",
                timeout=5_000,
            )
            hidden = page.evaluate(
                f"document.querySelector('{plot}').data"
                ".filter(t => t.visible === 'legendonly').length"
            )
            assert hidden == 3 + 2

            assert errors == []
            assert remote == []  # works offline: nothing fetched
        finally:
            browser.close()


# --- hover with the logit lens, 3-D and frame toggles, overlays, generated tokens ---

N_GEN = 3


def _with_lens_and_generation(states, labels, n_gen: int = N_GEN, seed: int = 1):
    """A trace with a (made-up, recognisable) logit lens and ``n_gen`` generated
    tokens after each of the first two prompts."""
    rng = np.random.default_rng(seed)
    n_time, n_prompt, n_feature = states.shape
    owners = [0] * n_gen + [1] * n_gen
    # each generated token a step further along its own direction: far from the prompts
    away = rng.normal(size=(len(owners), n_feature))
    away /= np.linalg.norm(away, axis=-1, keepdims=True)
    step = np.array([j + 1 for _ in (0, 1) for j in range(n_gen)])[:, None]
    scale = np.linalg.norm(states[:, owners], axis=-1, keepdims=True)  # (time, gen, 1)
    gen_states = states[:, owners] + 0.6 * scale * step * away
    ds = trace_dataset(
        np.concatenate([states, gen_states], axis=1), labels + [labels[o] for o in owners]
    )
    n = ds.sizes["particle"]
    is_generated = np.arange(n) >= n_prompt
    owner = np.array(list(range(n_prompt)) + owners)
    position = np.where(is_generated, 4 + 1 + np.array([0] * n_prompt + list(range(n_gen)) * 2), 4)
    tokens = [f"tok{i}" for i in range(n_prompt)] + [
        f"gen{o}_{j}" for o in (0, 1) for j in range(n_gen)
    ]
    ds = ds.assign_coords(
        prompt_index=("particle", owner),
        prompt=("particle", strings(f"prompt {o} about {labels[o]}" for o in owner)),
        label=("particle", strings(str(o + 1) for o in owner)),
        position=("particle", position),
        token=("particle", strings(tokens)),
        token_piece=("particle", strings(tokens)),
        is_last=("particle", ~is_generated),
        is_generated=("particle", is_generated),
    )
    words = np.array(
        [[[f"w{p}_{t}_{j}" for j in range(5)] for p in range(n)] for t in range(n_time)],
        dtype=object,
    )
    probs = np.tile(np.array([0.5, 0.2, 0.1, 0.05, 0.01], dtype=np.float32), (n_time, n, 1))
    return ds.assign(
        lens_top=(("time", "particle", "lens_k"), strings(words.ravel()).reshape(words.shape)),
        lens_prob=(("time", "particle", "lens_k"), probs),
    )


@pytest.fixture(scope="module")
def rich_report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rich")
    states, labels = clustered(n_per_category=3, n_time=12, n_feature=32)
    run = write_run(root / "run", _with_lens_and_generation(states, labels))
    rng = np.random.default_rng(5)
    steered = write_run(
        root / "steered", trace_dataset(states + rng.normal(scale=0.3, size=states.shape), labels)
    )
    # another model: other width, other depth, a rotation of the first one's states
    rotation, _ = np.linalg.qr(rng.normal(size=(40, 40)))
    wider = np.concatenate([states, np.zeros((*states.shape[:2], 8))], axis=-1) @ rotation
    other = write_run(
        root / "other", trace_dataset(wider[np.arange(0, 12, 2)], labels, model="other-model")
    )
    return write_report(
        [run], root / "report.html", overlays=[(steered, "steered"), f"{other}:other model"]
    )


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _open(browser, report: Path):
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.on(
        "request",
        lambda r: None if r.url.startswith(("file:", "data:")) else problems.append(r.url),
    )
    page.goto(report.as_uri(), timeout=120_000)
    page.wait_for_selector("#trajectories-0 svg.main-svg", timeout=20_000)
    page.locator("#trajectories-0").scroll_into_view_if_needed()
    return page, problems


PLOT = "document.getElementById('trajectories-0')"


def _only_the_run(page) -> None:
    """Hide the overlays (their points lie close to the run's)."""
    page.evaluate(
        f"""(() => {{ const gd = {PLOT};
        const others = gd.data.map((t, i) => (t.legendgroup || '').startsWith('overlay') ? i : -1)
          .filter(i => i >= 0);
        return Plotly.restyle(gd, {{visible: 'legendonly'}}, others); }})()"""
    )


def _isolated_points(page, kind: str = "path") -> list[tuple[int, int]]:
    """(trace, point) of the visible traces of a kind, farthest from any other
    visible point first (in pixels), so that hovering one hovers that one."""
    found = page.evaluate(
        f"""(() => {{ const gd = {PLOT}, xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const shown = gd.data.map((t, i) => [t, i]).filter(p => p[0].visible !== 'legendonly');
        const all = [];
        shown.forEach(([t, i]) => t.x.forEach((_, k) => all.push([i, k, xa.l2p(t.x[k]), ya.l2p(t.y[k])])));
        const out = [];
        all.forEach(([i, k, x, y]) => {{
          const t = gd.data[i];
          if (!t.meta || t.meta.kind !== '{kind}') return;
          let best = 1e9;
          all.forEach(([j, m, u, v]) => {{ if (j !== i || m !== k) best = Math.min(best, Math.hypot(u - x, v - y)); }});
          if (best > 10) out.push([best, i, k]);
        }});
        return out.sort((a, b) => b[0] - a[0]).map(o => [o[1], o[2]]); }})()"""
    )
    return [tuple(p) for p in found]


def _hover_point(page, trace: int, point: int) -> str:
    x, y = page.evaluate(
        f"""(() => {{ const gd = {PLOT}, t = gd.data[{trace}];
        const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
        return [box.left + gd._fullLayout.xaxis.l2p(t.x[{point}]),
                box.top + gd._fullLayout.yaxis.l2p(t.y[{point}])]; }})()"""
    )
    page.mouse.move(5, 5)  # off the plot: the last hover label goes
    page.wait_for_function(
        "!document.querySelector('#trajectories-0 .hoverlayer .hovertext')", timeout=5_000
    )
    page.mouse.move(x + 25, y + 25)
    page.mouse.move(x, y, steps=4)
    page.wait_for_selector("#trajectories-0 .hoverlayer .hovertext", timeout=5_000)
    page.wait_for_timeout(100)
    return page.locator("#trajectories-0 .hoverlayer").text_content()


def test_hover_shows_the_token_layer_norm_and_the_logit_lens_at_that_layer(browser, rich_report):
    page, problems = _open(browser, rich_report)
    # the first prompt's path; its points are layers 0..11
    meta = page.evaluate(f"{PLOT}.data[0].meta")
    assert meta["kind"] == "path"
    _only_the_run(page)
    points = _isolated_points(page)
    layers = sorted({point for _, point in points})
    assert len(points) >= 3 and len(layers) >= 2
    chosen = [points[0], next(p for p in points if p[1] != points[0][1])]
    for trace, point in chosen:
        p = trace  # the first traces are the prompts' paths, in order
        label = ["code", "math", "story", "word problems", "pseudocode"][p // 3]
        text = _hover_point(page, trace, point)
        assert f"'tok{p}'" in text and f"layer {point}" in text and "norm" in text
        assert f"prompt {p} about {label}" in text and f"{p + 1} · {label}" in text
        assert f"'w{p}_{point}_0' 0.50" in text and f"'w{p}_{point}_4' 0.01" in text
        assert f"'w{p}_{(point + 1) % 12}_0'" not in text  # not another layer's lens
    assert problems == []


def test_the_3d_toggle_draws_scatter3d_and_its_slider_moves_the_paths(browser, rich_report):
    page, problems = _open(browser, rich_report)
    assert page.evaluate(f"{PLOT}.data.every(t => t.type === 'scatter')")
    before = page.evaluate(f"{PLOT}._fullLayout.yaxis.range")
    page.locator('input[value="3d"]').first.check()
    page.wait_for_function(f"{PLOT}.data.length && {PLOT}.data[0].type === 'scatter3d'")
    page.wait_for_selector("#trajectories-0 .gl-container canvas", timeout=10_000)
    assert page.evaluate(f"{PLOT}.data.every(t => t.type === 'scatter3d')")
    assert page.evaluate(f"{PLOT}.data[0].x.length") == 11  # layers 0..L-1 (seed convention)
    # the slider's first step: every path back to its first point (the 3-D frames work)
    page.evaluate(
        f"Plotly.animate({PLOT}, ['t0'], {{mode: 'immediate', frame: {{duration: 0, redraw: true}}}})"
    )
    page.wait_for_function(f"{PLOT}.data[0].x.length === 1", timeout=5_000)
    # play runs through the layers again
    page.locator("#trajectories-0 .updatemenu-button").first.click()
    page.wait_for_function(f"{PLOT}.data[0].x.length > 3", timeout=10_000)
    # back to 2-D, on the unit sphere: another frame, other coordinates
    page.locator('input[value="2d"]').first.check()
    page.locator('input[value="sphere"]').first.check()
    page.wait_for_function(f"{PLOT}.data[0].type === 'scatter'")
    after = page.evaluate(f"{PLOT}._fullLayout.yaxis.range")
    assert after != before and max(abs(v) for v in after) < 5  # unit-sphere coordinates
    assert problems == []


def test_each_overlays_legend_entry_toggles_its_traces(browser, rich_report):
    page, problems = _open(browser, rich_report)
    groups = page.evaluate(f"{PLOT}.data.map(t => t.legendgroup || '')")
    names = page.evaluate(f"{PLOT}.data.map(t => t.showlegend ? t.name : null)")
    assert "steered" in names and "other model" in names
    for name in ("steered", "other model"):
        group = groups[names.index(name)]
        members = [i for i, g in enumerate(groups) if g == group]
        assert len(members) == 15 + 5  # its paths and its end markers
        entry = page.locator("#trajectories-0 .legend .traces", has_text=name).first
        entry.locator(".legendtoggle").click()
        page.wait_for_function(
            f"{PLOT}.data.filter(t => t.visible === 'legendonly').length === {len(members)}"
        )
        hidden = page.evaluate(
            f"{PLOT}.data.map((t, i) => t.visible === 'legendonly' ? i : -1).filter(i => i >= 0)"
        )
        assert hidden == members
        entry.locator(".legendtoggle").click()
        page.wait_for_function(f"{PLOT}.data.every(t => t.visible !== 'legendonly')")
    # the other model was aligned by Procrustes, and says so
    notes = page.evaluate(f"{PLOT}.data.map(t => t.hovertemplate || '')")
    assert any("orthogonal Procrustes" in n for n in notes)
    assert not any("Procrustes" in n and "[steered]" in n for n in notes)
    assert problems == []


def test_generated_tokens_continue_from_the_prompts_last_point(browser, rich_report):
    page, problems = _open(browser, rich_report)
    gens = page.evaluate(
        f"{PLOT}.data.map((t, i) => [i, t.meta && t.meta.kind]).filter(p => p[1] === 'gen')"
    )
    assert len(gens) == 2  # prompts 1 and 2 generated
    for index, _ in gens:
        trace = page.evaluate(f"(() => {{ const t = {PLOT}.data[{index}]; return [t.x, t.y]; }})()")
        owner = 0 if index == gens[0][0] else 1
        path = page.evaluate(f"(() => {{ const t = {PLOT}.data[{owner}]; return [t.x, t.y]; }})()")
        assert len(trace[0]) == 1 + N_GEN
        assert [trace[0][0], trace[1][0]] == [path[0][-1], path[1][-1]]  # starts at the last point
        drawn = page.locator(
            f"#trajectories-0 .scatterlayer .trace:nth-child({index + 1}) path.js-line"
        )
        assert drawn.count() == 1 and len(drawn.first.get_attribute("d")) > 10
    # the slider moves the continuation with the layer: at layer 4 it starts at the
    # prompt's point of layer 4, and its text is that layer's
    first = gens[0][0]
    full = page.evaluate(f"{PLOT}.data[0].x.slice()")
    page.evaluate(f"Plotly.animate({PLOT}, ['t4'], {{mode: 'immediate', frame: {{duration: 0}}}})")
    page.wait_for_function(f"{PLOT}.data[0].x.length === 5", timeout=5_000)
    assert page.evaluate(f"{PLOT}.data[{first}].x[0]") == full[4]
    assert "layer 4" in page.evaluate(f"{PLOT}.data[{first}].text[1]")
    page.evaluate(f"Plotly.animate({PLOT}, ['t10'], {{mode: 'immediate', frame: {{duration: 0}}}})")
    page.wait_for_function(f"{PLOT}.data[0].x.length === 11", timeout=5_000)
    _only_the_run(page)
    trace, point = next(p for p in _isolated_points(page, "gen") if p[1] > 0)
    owner = 0 if trace == gens[0][0] else 1  # point 0 is the prompt's own last token
    text = _hover_point(page, trace, point)
    assert "generated" in text and f"'gen{owner}_{point - 1}'" in text
    # the lens of that token, at the shown layer (the last)
    assert f"'w{15 + N_GEN * owner + point - 1}_10_0'" in text
    assert problems == []


@pytest.mark.parametrize("d", [2, 3])
def test_a_simulation_section_renders(browser, tmp_path, d):
    rng = np.random.default_rng(d)
    n_time, n = 30, 12
    start = rng.normal(size=(n, d))
    target = rng.normal(size=d)
    weights = np.linspace(0, 1, n_time)[:, None, None]
    states = (1 - weights) * start + weights * target  # all particles meet at one point
    states /= np.linalg.norm(states, axis=-1, keepdims=True)
    ds = trace_dataset(states, time=np.linspace(0.0, 5.8, n_time))
    ds.attrs["run"]["config"]["dynamics"] = {"beta": 1.0}
    run = write_run(tmp_path / "sim", ds, kind="simulation")
    report = write_report([run], tmp_path / "report.html")
    page, problems = _open(browser, report)
    first = "document.getElementById('simulation-0-0')"
    page.wait_for_selector("#simulation-0-0 .main-svg", timeout=20_000)
    page.wait_for_selector("#simulation-0-1 .main-svg", timeout=20_000)
    if d == 3:
        assert page.evaluate(f"{first}.data.map(t => t.type)") == ["surface", "scatter3d"]
        page.wait_for_selector("#simulation-0-0 .gl-container canvas", timeout=10_000)
        # the time slider: the first frame puts the particles back at their start
        page.evaluate(
            f"Plotly.animate({first}, ['s0'], {{mode: 'immediate', frame: {{redraw: true}}}})"
        )
        page.wait_for_function(f"{first}.data[1].x[0] === {round(float(states[0, 0, 0]), 4)}")
    else:
        x = page.evaluate(f"{first}.data[0].x.length")
        assert x == n_time * n  # every particle's angle at every time
        angles = page.evaluate(f"{first}.data[0].y")
        expected = np.arctan2(states[..., 1], states[..., 0]).ravel()
        assert np.allclose(angles, expected, atol=1e-3)
    energy = page.evaluate("document.getElementById('simulation-0-1').data.map(t => t.name)")
    assert energy == ["energy", "clusters"]
    counts = page.evaluate("document.getElementById('simulation-0-1').data[1].y")
    assert counts[-1] == 1 and counts[0] > 1  # they end in one cluster
    label = page.locator("#trajectories-0 .slider-container text").first.text_content()
    assert label.strip() == "time: 5.8"  # times shown as numbers, not 5.800000000000001
    assert problems == []


# --- issue 21: the axes show the bulk; the 3-D box is not cut off -----------------


@pytest.fixture(scope="module")
def outlier_report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("outlier")
    states, labels = clustered(n_per_category=3, n_time=12, n_feature=32)
    states = states.copy()
    states[4:7, 7] += 60 * np.abs(states).max()  # prompt 8 thrown far out at layers 4..6
    return write_report([write_run(root / "run", trace_dataset(states, labels))], root / "r.html")


def test_one_far_prompt_does_not_set_the_axes_and_is_marked(browser, outlier_report, tmp_path):
    page, problems = _open(browser, outlier_report)
    page.screenshot(path=str(tmp_path / "outlier-2d.png"))  # what a reader sees
    marks = page.evaluate(
        f"{PLOT}.data.map((t, i) => [i, t.meta && t.meta.kind]).filter(p => p[1] === 'outside')"
    )
    assert len(marks) == 1
    index = marks[0][0]
    legend = page.locator("#trajectories-0 .legend .traces", has_text="outside the axes")
    assert legend.count() == 1 and "3 points outside the axes" in legend.first.text_content()
    # every other point is drawn inside the plot area, and the prompts' last points
    # (the end markers) spread over a good part of it: not squashed into a corner
    inside = page.evaluate(
        f"""(() => {{ const gd = {PLOT}, xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const [x0, x1] = xa.range, [y0, y1] = ya.range;
        const pts = [];
        gd.data.forEach(t => {{ if (!t.meta || t.meta.kind !== 'path') return;
          t.x.forEach((x, k) => pts.push([x, t.y[k], t.hovertemplate.startsWith('<b>8<') && k >= 4 && k <= 6])); }});
        const kept = pts.filter(p => !p[2]);
        const out = kept.filter(p => p[0] < x0 || p[0] > x1 || p[1] < y0 || p[1] > y1).length;
        const ys = kept.map(p => p[1]), xs = kept.map(p => p[0]);
        return [out, (Math.max(...xs) - Math.min(...xs)) / (x1 - x0),
                (Math.max(...ys) - Math.min(...ys)) / (y1 - y0)]; }})()"""
    )
    assert inside[0] == 0
    assert inside[1] > 0.8 and inside[2] > 0.8  # the bulk fills the axes
    text = _hover_point(page, index, 1)
    assert "outside the axes" in text and "layer 5" in text and "8 · " in text
    # 3-D: the whole box and its axis titles above the slider
    page.locator('input[value="3d"]').first.check()
    page.wait_for_selector("#trajectories-0 .gl-container canvas", timeout=10_000)
    page.wait_for_timeout(1500)
    page.locator("#trajectories-0").screenshot(path=str(tmp_path / "outlier-3d.png"))
    # the same without the slider and buttons (hidden, not removed: nothing moves),
    # so that what is left at the scene's edge is the 3-D drawing itself
    page.add_style_tag(content=".slider-container, .updatemenu-container {visibility: hidden}")
    page.wait_for_timeout(300)
    shot = tmp_path / "outlier-3d-scene.png"
    page.locator("#trajectories-0").screenshot(path=str(shot))
    left, right, bottom, slider_top = page.evaluate(
        f"""(() => {{ const gd = {PLOT}, s = gd._fullLayout._size, d = gd._fullLayout.scene.domain;
        const top = gd.querySelector('.slider-container').getBoundingClientRect().top
          - gd.getBoundingClientRect().top;
        return [s.l + d.x[0] * s.w, s.l + d.x[1] * s.w, s.t + (1 - d.y[0]) * s.h, top]; }})()"""
    )
    assert bottom < slider_top
    # What a reader sees: nothing of the box (its lines, ticks, axis titles) runs into
    # the bottom edge of the scene, where the drawing would be cut off.
    from PIL import Image

    image = np.asarray(Image.open(shot).convert("RGB"), dtype=int)
    scale = image.shape[1] / page.evaluate(f"{PLOT}.getBoundingClientRect().width")
    rows = image[
        int((bottom - 4) * scale) : int(bottom * scale), int(left * scale) : int(right * scale)
    ]
    dark = int((rows.min(axis=-1) < 160).sum())
    assert dark <= 3, f"{dark} dark pixels on the scene's bottom edge: the 3-D box is cut off"
    assert problems == []
