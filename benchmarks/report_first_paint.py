"""Size and first paint of an HTML report in headless Chromium, against a baseline.

For a report file (default: a report of synthetic runs built here; pass the
demo's, e.g. ``runs/demo/report.html``), loads it ``--repeat`` times in Debian's
Chromium (Playwright, ``/usr/bin/chromium``) and reports the median of:

- first paint: the browser's ``first-contentful-paint``;
- plots drawn: until every interactive plot of the page has its SVG;

and the same for the baseline, a page holding plotly.js alone with one small
plot (what any offline plotly page pays), and their ratios. Also the file size
and what it is made of (plotly.js, figures, trajectory data).

    python benchmarks/report_first_paint.py runs/demo/report.html
    python benchmarks/report_first_paint.py report.html --repeat 9 --json paint.json

Machine-dependent by nature: compare numbers from one run of this script.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
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


def baseline_page(path: Path) -> Path:
    from plotly.offline import get_plotlyjs

    path.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body><h1>baseline</h1>"
        "<div id='p' class='tokenfield-views' style='height:400px'></div>"
        f"<script>{get_plotlyjs()}</script>"
        "<script>Plotly.newPlot('p', [{x: [1, 2, 3], y: [1, 3, 2]}]);</script></body></html>",
        encoding="utf-8",
    )
    return path


def measure(browser, path: Path, repeat: int) -> dict[str, float]:
    paints, drawn = [], []
    for _ in range(repeat):
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        started = time.perf_counter()
        page.goto(path.resolve().as_uri())
        page.wait_for_function(
            "[...document.querySelectorAll('.tokenfield-views, .tokenfield-figure')]"
            ".every(d => d.querySelector('.main-svg'))",
            timeout=60_000,
        )
        drawn.append(time.perf_counter() - started)
        fcp = page.evaluate(
            "performance.getEntriesByType('paint')"
            ".filter(e => e.name === 'first-contentful-paint').map(e => e.startTime)"
        )
        paints.append(fcp[0] / 1000 if fcp else float("nan"))
        page.close()
    return {"first_paint_s": statistics.median(paints), "plots_drawn_s": statistics.median(drawn)}


def composition(path: Path) -> dict[str, float]:
    text = path.read_text(encoding="utf-8")
    data = re.findall(r'<script type="application/json" id="[^"]+">(.*?)</script>', text, re.S)
    images = re.findall(r'src="data:image/[a-z]+;base64,([^"]+)"', text)
    from plotly.offline import get_plotlyjs

    plotly = get_plotlyjs()
    copies = text.count(plotly[:200])
    return {
        "size_mb": path.stat().st_size / 1e6,
        "plotly_js_copies": copies,
        "plotly_js_mb": copies * len(plotly) / 1e6,
        "figures_mb": sum(map(len, images)) / 1e6,
        "interactive_data_mb": sum(map(len, data)) / 1e6,
    }


def synthetic_report(folder: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.unit.synthetic_trajectories import clustered, trace_dataset, write_run

    from tokenfield.pipelines.report import write_report

    states, labels = clustered(n_per_category=5, n_time=31, n_feature=576)
    run = write_run(folder / "run", trace_dataset(states, labels))
    other = write_run(folder / "other", trace_dataset(states * 1.1, labels))
    return write_report([run], folder / "report.html", overlays=[(other, "other")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", nargs="?", type=Path, help="report.html (default: synthetic)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the numbers as JSON")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        report = args.report or synthetic_report(folder)
        base = baseline_page(folder / "baseline.html")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                measure(browser, base, 1)  # warm the browser's caches once
                baseline = measure(browser, base, args.repeat)
                mine = measure(browser, report, args.repeat)
            finally:
                browser.close()
        result = {
            "report": str(report),
            **composition(report),
            "report_first_paint_s": mine["first_paint_s"],
            "report_plots_drawn_s": mine["plots_drawn_s"],
            "baseline_first_paint_s": baseline["first_paint_s"],
            "baseline_plots_drawn_s": baseline["plots_drawn_s"],
            "first_paint_ratio": mine["first_paint_s"] / baseline["first_paint_s"],
            "plots_drawn_ratio": mine["plots_drawn_s"] / baseline["plots_drawn_s"],
            "repeat": args.repeat,
        }
    for key, value in result.items():
        print(f"{key:>24}: {value:.3f}" if isinstance(value, float) else f"{key:>24}: {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
