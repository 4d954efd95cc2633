"""The HTML report in a real headless browser (Debian's chromium, driven by Playwright).

Needs /usr/bin/chromium (``make browser-deps`` installs it); never downloads a browser.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run
from tokenfield.report import write_report

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
            page.goto(report.as_uri())
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
