"""The diagnose HTML page at 1024 ranks: groups by the names the user gave them, wait-for edges labelled with the
collective, identical ranks collapsed into ranges, and the page loads in a real headless Chromium with no
console error. `DISTDOCTOR_WRITE_DOCS=1` also writes the screenshot docs/diagnose.md shows."""

import os
import re
from pathlib import Path

import pytest

from distdoctor.diagnose import analyze
from distdoctor.report.diagnose_waits_html import MAX_NODES, collapse
from distdoctor.report.findings import fmt_ranges
from distdoctor.report.html import render_html
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace, dumps

from chromium_cdp import errors, find_browser, load_page

WORLD, LATE, LOST = 1024, 517, 1023
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _call(i, seq, op, group, state, line):
    return Entry(index=i, group=group, op=op, seq=seq, in_sizes=[[1024]], out_sizes=[[1024]], in_dtypes=["float32"],
                 out_dtypes=["float32"], state=state, frames=[Frame("train_step", "/job/train.py", line)])


def write_job(directory: Path) -> None:
    """A 2-D mesh job (group '1' is the DeviceMesh dimension mesh_dp, every rank): rank 517 broadcasts on the
    default group while everyone else all-reduces on mesh_dp, and rank 1023 left no dump."""
    groups = {"0": GroupInfo("0", list(range(WORLD)), desc="default_pg"),
              "1": GroupInfo("1", list(range(WORLD)), desc="mesh_dp")}
    texts = {}
    for r in (0, LATE):
        entries = [_call(0, 1, "all_reduce", "1", "completed", 40), _call(1, 1, "broadcast", "0", "completed", 41),
                   _call(2, 2, "all_reduce", "1", "completed", 40)]
        entries.append(_call(3, 2, "broadcast", "0", "started", 44) if r == LATE else
                       _call(3, 3, "all_reduce", "1", "started", 40))
        trace = RankTrace(rank=r, source="native", world_size=WORLD, entries=entries, groups=groups,
                          dump_reason="hang: collective pending for 300 s")
        texts[r] = dumps(trace)
    for r in range(WORLD):
        if r != LOST:  # the same dump as rank 0's but for the rank in its header
            text = texts[LATE] if r == LATE else texts[0].replace('"rank": 0,', f'"rank": {r},', 1)
            (directory / f"rank_{r}.jsonl").write_text(text)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("mesh1024")
    write_job(d)
    return analyze(load_traces([str(d)], jobs=1))  # one process: starting workers costs more here


def test_rank_ranges():  # the HTML's boxes and the text report write rank lists alike
    assert fmt_ranges([5, 0, 1, 2, 3, 7, 8, 9]) == "0-3, 5, 7-9"
    assert fmt_ranges([4]) == "4" and fmt_ranges([]) == ""


def test_identical_ranks_collapse_and_edges_name_the_collective(report):
    nodes, edges = collapse(report)
    everyone_else = [r for r in range(WORLD) if r not in (LATE, LOST)]
    by_ranks = {tuple(n["ranks"]): n for n in nodes}
    assert len(nodes) <= MAX_NODES
    assert by_ranks[tuple(everyone_else)]["waiting"] == "all_reduce #3 on group '1' (mesh_dp)"
    assert by_ranks[(LATE,)]["waiting"] == "broadcast #2 on the default group '0'"
    assert by_ranks[(LOST,)]["state"] == "no trace"
    labels = {(tuple(nodes[e["src"]]["ranks"]), tuple(nodes[e["dst"]]["ranks"])): e["label"] for e in edges}
    assert labels[(tuple(everyone_else), (LATE,))] == "all_reduce #3 on group '1' (mesh_dp)"
    assert labels[(tuple(everyone_else), (LOST,))] == "all_reduce #3 on group '1' (mesh_dp)"
    assert labels[((LATE,), tuple(everyone_else))] == "broadcast #2 on the default group '0'"


def test_the_page_is_short_at_1024_ranks(report):
    page = render_html(report)
    assert "ranks 0-516, 518-1022 (1022)" in page and "(mesh_dp)" in page
    assert "all_reduce #3 on group &#x27;1&#x27; (mesh_dp)" in page  # an edge's label, drawn and in the table
    ranks_table = page.split("<h2>Ranks</h2>", 1)[1].split("</table>", 1)[0]
    assert ranks_table.count("<tr>") <= 6  # one row per kind of rank, not 1024
    assert page.count("<rect x=") - page.split("<h2>Wait-for graph</h2>", 1)[0].count("<rect x=") <= MAX_NODES


@pytest.mark.slow
@pytest.mark.skipif(find_browser() is None, reason="no chromium on this machine (Debian: apt-get install chromium)")
def test_the_1024_rank_page_loads_in_chromium(report, tmp_path):
    (tmp_path / "diagnose.html").write_text(render_html(report))
    page = load_page(str(tmp_path / "diagnose.html"), width=1100, height=900)
    assert errors(page) == []
    text = page["text"]
    assert "all_reduce #3 on group '1' (mesh_dp)" in text and "ranks 0-516, 518-1022 (1022)" in text
    assert not re.search(r"\brank 1000\b", text)  # no rank listed one by one
    assert page["png"][:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("DISTDOCTOR_WRITE_DOCS") == "1":
        (DOCS / "diagnose-1024.png").write_bytes(page["png"])


def test_too_many_distinct_waits_leave_the_table_alone(tmp_path):
    """32 pairs, each waiting for its own partner: 64 boxes would not read; the table lists every edge."""
    world = 64
    groups = {"0": GroupInfo("0", list(range(world)))}
    groups.update({f"pair{k}": GroupInfo(f"pair{k}", [2 * k, 2 * k + 1], desc=f"tp{k}") for k in range(world // 2)})
    for r in range(world):
        entries = [_call(0, 1, "all_reduce", "0", "completed", 40)]
        if r % 2 == 0:
            entries.append(_call(1, 1, "all_reduce", f"pair{r // 2}", "started", 50))
        trace = RankTrace(rank=r, source="native", world_size=world, entries=entries, groups=groups,
                          dump_reason="hang")
        (tmp_path / f"rank_{r}.jsonl").write_text(dumps(trace))
    report = analyze(load_traces([str(tmp_path)], jobs=1))
    nodes, edges = collapse(report)
    assert len(nodes) == world and len(edges) == world // 2
    section = render_html(report).split("<h2>Wait-for graph</h2>", 1)[1].split("<h2>Ranks</h2>", 1)[0]
    assert "too many to draw" in section and "<svg" not in section
    assert section.count("<tr>") == 1 + world // 2  # header + one row per pair
    assert "all_reduce #1 on group &#x27;pair7&#x27; (tp7)" in section and "rank 15 (" in section
