"""The per-rank lateness chart of a passing run shows its bars: lateness of microseconds under a 100 ms threshold
is drawn on its own scale (and says so), not as bars too flat to see."""

from __future__ import annotations

import json
import re

from world_helpers import distdoctor


def test_lateness_bars_of_a_passing_run_are_visible(tmp_path):
    page = tmp_path / "v.html"
    out = distdoctor("validate", "--nproc", "2", "--ops", "all_reduce", "--dtypes", "float32", "--sizes", "1,1K",
                     "--html", page, "--format", "json", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    late = json.loads(out.stdout)["per_rank_late_s"]
    html = page.read_text()
    figure = html[html.index("validate: median lateness"):]
    figure = figure[:figure.index("</figure>")]
    heights = [float(h) for h in re.findall(r"<rect [^>]*height='([-\d.]+)'", figure)]
    assert len(heights) == len(late) == 2, figure
    assert min(heights) >= 0 and "height='-" not in figure, figure  # never a negative height, nor -0.0
    largest = max(abs(v) for v in late.values())
    assert largest * 1e3 < 10, late  # a passing run: ranks arrive within a fraction of a millisecond
    if largest == 0:  # every rank's median lateness exactly zero (coarse clocks): nothing to draw, nothing zoomed
        assert max(heights) == 0 and "drawn to the largest" not in figure, figure
        return
    assert "drawn to the largest" in figure  # far below the 100 ms threshold: the largest bar is 150/1.15 px
    assert max(heights) > 100, heights
