"""The HTML report in a real headless browser (Chromium from Debian, installed by .ci/install_chromium.sh).

The Kubeflow UI shows an HTML artifact by putting the file into ``<iframe sandbox="allow-scripts"
srcdoc=...>`` (kubeflow/pipelines frontend/src/components/viewers/HTMLViewer.tsx). The first test does the
same: it loads the report into such an iframe and lets a probe script, added to a copy of the report
only for the test, tell the parent page through ``postMessage`` whether every image decoded and whether
anything was fetched from the network. The second test takes a screenshot of the report and looks for
the colours the pictures paint (the capacity scale of a spec picture, the orchestrator's star on the
Pareto plot), so it checks what a person would see, not only the markup. The third opens the report at
1280 px, the width it is read at, and measures where the browser put things: the page must not scroll
sideways and every table value, the SFT warm-up's included (its sweep text is one very long cell), must
lie inside the window and inside its own cell.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_report import LEVELS, demo_run

from lemon_core.plots import plot_reward_curve
from lemon_core.report import sft_rows, write_report
from lemon_core.spec_picture import PALETTE

PROBE = """<script>
addEventListener('load', function () {
  var images = Array.prototype.map.call(document.images, function (i) {
    return {alt: i.alt, kind: i.src.slice(5, i.src.indexOf(';')), width: i.naturalWidth, height: i.naturalHeight};
  });
  var fetched = performance.getEntriesByType('resource').map(function (e) { return e.name; })
    .filter(function (name) { return name.indexOf('data:') !== 0; });
  parent.postMessage(JSON.stringify({images: images, fetched: fetched,
    details: document.querySelectorAll('details').length}), '*');
});
</script>"""

VIEWER = """<!doctype html><html><body>
<iframe sandbox="allow-scripts" style="width:1200px;height:2000px" srcdoc="{srcdoc}"></iframe>
<pre id="probe">no message from the report</pre>
<script>addEventListener('message', function (e) {{ document.getElementById('probe').textContent = e.data; }});</script>
</body></html>"""


LAYOUT_PROBE = """<script>
addEventListener('load', function () {
  var width = document.documentElement.clientWidth;
  var tables = Array.prototype.map.call(document.querySelectorAll('table[id]'), function (table) {
    var hidden = Array.prototype.filter.call(table.querySelectorAll('td'), function (td) {
      var box = td.getBoundingClientRect();
      var cut = td.scrollWidth > td.clientWidth + 1;
      return td.textContent.trim() && (box.left < 0 || box.right > width + 0.5 || cut);
    }).map(function (td) { return td.textContent.slice(0, 60); });
    return {id: table.id, hidden: hidden, cells: table.querySelectorAll('td').length};
  });
  var out = document.createElement('pre');
  out.id = 'layout-probe';
  out.textContent = JSON.stringify({viewport: width, page: document.documentElement.scrollWidth, tables: tables});
  document.body.appendChild(out);
});
</script>"""

# The teacher sweep as a real `make run` reports it: six candidates in one cell, hundreds of characters long.
SWEEP = {"tasks": 8, "taught": {"chain@large": 8}, "fallback_tasks": 3, "teacher_score": 0.5, "candidates": [
    {"candidate": name, "solved": 6 - i, "n": 8, "mean_reward": 0.7 - i / 20, "reward_se": 0.15,
     "mean_cost": 1.13e-4 * (i + 1), "ci": [0.3, 0.86]}
    for i, name in enumerate(["chain@large", "cot@large", "sc@small+large", "tree@medium", "debate@large", "cot@small"])
]}
SFT = {"teacher": "sweep", "sweep": SWEEP, "valid_rate_before": 0.0, "valid_rate_after": 1.0,
       "valid_rate_after_ci": [0.8928, 1.0], "valid_samples": 32, "loss_first": 1.115, "loss_last": 5.09e-05,
       "pairs": 8, "steps": 16, "rounds": 1}
# a row with the widest figures a run writes, so the results table is measured at its widest
WIDE_ROW = {"benchmark": "multiarith", "method": "complete", "n": 300, "accuracy": 0.123, "mean_cost_usd": 1.234e-4,
            "mean_tokens": 12345.678, "mean_latency_s": 123.456, "cached_calls": 1234, "failures": 300,
            "truncated_answers": 300, "looped_answers": 300}
WIDE_ORCHESTRATOR = {**WIDE_ROW, "method": "lemon-sft", "orchestrator_cost_usd": 1.234e-5, "valid_rate": 0.987,
                     "invalid": 4}


def need(program: str, package: str) -> str:
    """Path of a system program; CI installs it, so there its absence fails the test instead of skipping."""
    for name in (program, f"{program}-browser") if program == "chromium" else (program,):
        if path := shutil.which(name):
            return path
    if os.environ.get("CI") == "true":
        pytest.fail(f"{program} is missing in CI; .ci/install_chromium.sh installs the Debian package {package}")
    pytest.skip(f"{program} is not installed (apt-get install {package})")


def chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", f"--user-data-dir={profile}"]
    return subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture
def report(tmp_path: Path) -> Path:
    """A report of the demo run with a reward curve, as the pipeline's report stage writes it."""
    rows, traces = demo_run()
    rows += [WIDE_ROW, WIDE_ORCHESTRATOR]
    curve = plot_reward_curve(
        [{"step": s, "reward/mean": 0.1 * s, "reward/ci_low": 0.05 * s, "reward/ci_high": 0.15 * s,
          "valid_rate": 0.5 + 0.1 * s, "success_rate": 0.2 * s, "cost/mean": 1e-5, "capacity_share/small": 0.5,
          "capacity_share/large": 0.5, "delta/drop_dependency": 0.1, "delta_count/drop_dependency": 4}
         for s in (1, 2, 3)],
        tmp_path / "reward_curve.png",
    )
    return write_report(rows, tmp_path / "report", title="lemon report: browser test", traces=traces,
                        levels=LEVELS, extra_images={"Reward curve": curve},
                        tables={"SFT warm-up": sft_rows(SFT)})["html"]


@pytest.mark.slow
def test_pictures_decode_in_the_kubeflow_viewer_iframe(report: Path, tmp_path: Path) -> None:
    binary = need("chromium", "chromium")
    page = report.read_text()
    probed = page.replace("</body>", PROBE + "</body>")
    viewer = tmp_path / "viewer.html"
    viewer.write_text(VIEWER.format(srcdoc=html.escape(probed, quote=True)))
    # Chromium puts a sandboxed iframe into a process of its own, and the virtual-time budget does not wait
    # for a cross-process postMessage: 3 of 20 dumps came before the probe's message (measured 2026-12-04,
    # Chromium 156). Keeping the iframe in the page's process made it 0 of 30; the sandbox (opaque origin,
    # scripts only) is the same either way, and that is what this test checks.
    dom = chromium(binary, tmp_path / "profile", "--disable-features=IsolateSandboxedIframes",
                   "--virtual-time-budget=15000", "--dump-dom", viewer.as_uri()).stdout
    message = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert message, f"the viewer page did not render: {dom[:500]}"
    result = json.loads(html.unescape(message.group(1)))
    images = result["images"]
    kinds = [i["kind"] for i in images]
    # the Pareto plot, the reward curve, and one spec picture per valid example in the gallery (2 + 2)
    assert kinds == ["image/png", "image/png"] + ["image/svg+xml"] * 4, images
    assert all(i["width"] > 50 and i["height"] > 50 for i in images), f"an image did not decode: {images}"
    four_agents = images[2]
    assert four_agents["height"] > images[3]["height"], "the 4-agent spec is taller than the 1-agent one"
    assert result["fetched"] == [], "the report fetched something from outside the file"
    assert result["details"] == page.count("<details"), "collapsible outputs are there"


@pytest.mark.slow
def test_screenshot_shows_the_pictures(report: Path, tmp_path: Path) -> None:
    from PIL import Image

    binary = need("chromium", "chromium")
    shot = tmp_path / "report.png"
    chromium(binary, tmp_path / "profile", "--window-size=1280,4800", "--hide-scrollbars",
             f"--screenshot={shot}", report.as_uri())
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 4800)
    colours = colour_counts(image)

    def count(hex_colour: str) -> int:
        rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        return colours.get(rgb, 0)

    assert count(PALETTE[-1]) > 2000, "the large-capacity agent's dark fill is painted (spec picture)"
    assert count(PALETTE[2]) > 2000, "the medium-capacity fill is painted too"
    assert count("#c0392b") > 50, "the orchestrator's star and error bar on the Pareto plot are painted"
    assert count("#fff4e5") > 2000, "orchestrator rows of the results table are highlighted"


@pytest.mark.slow
def test_at_1280_px_the_page_does_not_scroll_sideways_and_every_value_is_in_view(report: Path, tmp_path: Path) -> None:
    binary = need("chromium", "chromium")
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    dom = chromium(binary, tmp_path / "profile", "--window-size=1280,2000", "--hide-scrollbars",
                   "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()).stdout
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom, re.S)
    assert found, f"the probe did not run: {dom[-500:]}"
    result = json.loads(html.unescape(found.group(1)))
    assert result["viewport"] == 1280
    assert result["page"] <= result["viewport"], f"the page scrolls sideways: {result['page']} px wide"
    tables = {t["id"]: t for t in result["tables"]}
    assert {"table-results", "table-sft-warm-up", "table-what-the-orchestrator-chose"} <= set(tables)
    assert tables["table-sft-warm-up"]["cells"] == 2 * len(sft_rows(SFT))
    assert {name: t["hidden"] for name, t in tables.items() if t["hidden"]} == {}, "values out of view or cut"


def colour_counts(image: Any) -> dict[tuple[int, int, int], int]:
    """Pixels per RGB colour of a screenshot."""
    return {rgb: n for n, rgb in image.getcolors(maxcolors=1 << 20)}
