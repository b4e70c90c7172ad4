"""The cluster HTML report (`check`, `validate`, `bench` with --html): self-contained, every string escaped, and
loaded in a real headless Chromium with no console error (chromium_cdp: the DevTools protocol over a pipe)."""

import copy
import re

import pytest

from distdoctor.report.cluster_html import render_cluster_html

from chromium_cdp import errors, find_browser, load_page

EVIL = "<script>alert('x')</script>&\"quote\""
NO_BROWSER = "no chromium on this machine (Debian: apt-get install chromium)"


def bench_report(host_prefix: str = "host") -> dict:
    """A bench report as run_bench returns it with --links and --baseline: three hosts, host1 slow."""
    hosts = [f"{host_prefix}{i}" for i in range(3)]
    links = []
    for a in range(3):
        for b in range(3):
            if a != b:
                slow = 1 in (a, b)
                links.append({"src_host": hosts[a], "dst_host": hosts[b], "src_rank": a, "dst_rank": b,
                              "bytes": 1 << 20, "iters": 3, "time_us": 80000.0 if slow else 900.0,
                              "gbps": 0.012 if slow else 1.1, "best_gbps": 0.013 if slow else 1.6,
                              "latency_us": 300.0})
    rows = [{"op": "all_reduce", "size_bytes": s, "count": s // 4, "dtype": "float32", "inplace": True,
             "time_us": 100.0 + s / 1e4, "algbw_gbps": s / 1e9, "busbw_gbps": s / 1e9 * 4 / 3, "wrong": 0,
             "redop": "sum", "root": None, "per_rank_time_us": [1.0, 1.0, 1.0], "slowest_rank": 1}
            for s in (1024, 65536, 4 << 20)]
    baseline_rows = [{"size_bytes": r["size_bytes"], "placement": "in_place", "baseline_placement": "in_place",
                      "busbw_gbps": r["busbw_gbps"], "baseline_busbw_gbps": r["busbw_gbps"] * 2, "ratio": 0.5,
                      "ok": False, "slowest_rank": 1, "slowest_host": hosts[1]} for r in rows]
    return {"world_size": 3, "backend": "gloo", "device": "cpu", "iface": "eth0", "rows": rows, "op": "all_reduce",
            "dtype": "float32", "avg_busbw_gbps": 0.002, "passed": False,
            "failures": [f"slow host {hosts[1]}: 0.011x the other hosts' link speed"],
            "rank_hosts": {str(i): h for i, h in enumerate(hosts)}, "lost": [],
            "per_rank_time_us": {"0": 0.99, "1": 1.4, "2": 1.0}, "links": links, "link_bytes": 1 << 20,
            "link_iters": 3, "link_hosts": [],
            "slow_hosts": [{"host": hosts[1], "median_gbps": 0.012, "others_median_gbps": 1.1, "ratio": 0.011,
                            "best_gbps": 0.013, "others_best_gbps": 1.6}], "slow_links": [], "links_note": None,
            "baseline": {"path": "h100.txt", "format": "nccl-tests text", "op": "all_reduce", "world_size": 3,
                         "tolerance_pct": 10.0, "rows": baseline_rows, "failed_sizes": [1024, 65536, 4 << 20],
                         "not_in_baseline": [], "not_measured": [], "note": None, "failures": []}}


def validate_report(reason: str = "ranks [2] off by up to 3 (tolerance 0)") -> dict:
    results = [{"op": "all_reduce", "dtype": "float32", "count": 1, "group": "world", "inplace": True,
                "max_abs_err": 3.0, "ranks_agree": False, "status": "fail", "reason": reason, "form": None,
                "redop": "sum", "root": None, "culprit_ranks": [2]},
               {"op": "broadcast", "dtype": "float32", "count": 1, "group": "world", "inplace": True,
                "max_abs_err": 0.0, "ranks_agree": True, "status": "pass", "reason": "", "form": None,
                "redop": None, "root": 0, "culprit_ranks": []}]
    return {"passed": False, "world_size": 4, "backend": "gloo", "device": "cpu", "iface": "lo", "results": results,
            "counts": {"pass": 1, "fail": 1, "skipped": 0}, "culprit_ranks": [2],
            "culprits": [{"rank": 2, "why": [f"wrong result in #1 all_reduce ({reason})"]}], "stragglers": [],
            "per_rank_late_s": {"0": 0.001, "1": 0.002, "2": 0.0, "3": 0.001},
            "lost": [{"rank": 3, "host": "node<3>", "reason": "exited with code 17", "in_op": reason}],
            "straggler_threshold_s": 0.1, "injected": []}


def external_references(page: str) -> list[str]:
    """Anything that would make the browser fetch: src/href attributes, CSS url()/@import, http(s) links
    (the SVG namespace URI is a name, not a fetch)."""
    page = page.replace("xmlns='http://www.w3.org/2000/svg'", "")
    return re.findall(r"\b(?:src|href)\s*=|url\(|@import|https?://", page)


def test_every_string_from_a_report_is_escaped():
    bench = bench_report(host_prefix=EVIL)
    bench["failures"] = [EVIL]
    bench["baseline"]["path"] = EVIL
    page = render_cluster_html(validate=validate_report(EVIL), bench=bench)
    assert "<script" not in page and "alert('x')" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;&quot;quote&quot;" in page
    assert "node&lt;3&gt;" in page
    assert external_references(page) == []


def test_the_page_has_each_part():
    page = render_cluster_html(bench=bench_report())
    assert "Bus bandwidth vs size" in page and "baseline in-place" in page  # the baseline is drawn
    assert "Links between hosts" in page and page.count("stroke='#d00'") == 4  # host1's row and column
    assert "Per-rank timing" in page and "Failed checks" in page
    check = {"passed": False, "verdict": "FAIL on 4 ranks", "world_size": 4, "backend": "gloo", "device": "cpu",
             "iface": "lo", "lost": validate_report()["lost"], "wall_s": 3.2,
             "env": {"torch_version": "2.13.0", "launcher_kind": "slurm"}, "validate": validate_report(),
             "bench": {**bench_report(), "links": [], "baseline": None, "failures": []}}
    page = render_cluster_html(check=check)
    assert "distdoctor check" in page and "launcher slurm" in page and "Collective checks" in page
    assert "median lateness at the barrier" in page and "rank 3 on node&lt;3&gt;" in page


@pytest.mark.slow
@pytest.mark.skipif(find_browser() is None, reason=NO_BROWSER)
def test_the_browser_check_reports_console_errors(tmp_path):
    # The check the report pages pass must be able to fail: a planted script error and a missing image.
    (tmp_path / "broken.html").write_text("<!DOCTYPE html><html><body><p>x</p><script>console.error('boom');"
                                          "nope();</script><img src='missing.png'></body></html>")
    page = load_page(str(tmp_path / "broken.html"))
    found = errors(page)
    assert any("boom" in e for e in found) and any("nope" in e for e in found)
    assert any("ERR_FILE_NOT_FOUND" in e for e in found)
    assert page["png"][:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.skipif(find_browser() is None, reason=NO_BROWSER)
def test_links_and_baseline_page_loads_in_chromium(tmp_path):
    evil = copy.deepcopy(bench_report(host_prefix=EVIL))
    (tmp_path / "bench.html").write_text(render_cluster_html(bench=evil))
    page = load_page(str(tmp_path / "bench.html"))
    assert errors(page) == []  # the escaped <script> stays text: nothing runs
    assert "Links between hosts" in page["text"] and EVIL + "1" in page["text"]


def test_a_rank_early_at_the_barrier_draws_no_negative_height():
    """Validate's lateness is negative for a rank that arrives early: its bar goes below the axis, never a
    `height='-…'` a browser rejects (seen as a console error on a loaded machine)."""
    from distdoctor.report.cluster_html import _bars

    svg = _bars({0: -0.8, 1: 150.0, 2: -0.3}, "lateness", "{:.1f}", 100.0, 100.0, {})
    heights = [float(h) for h in re.findall(r"<rect [^>]*height='(-?[0-9.]+)'", svg)]
    assert len(heights) == 3 and min(heights) >= 0
