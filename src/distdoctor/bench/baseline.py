"""`bench --baseline FILE --tolerance PCT`: compare a sweep with an earlier one, from distdoctor or from nccl-tests.

A baseline is read by content, whatever its name:
- distdoctor's `bench --format json` report (or `check --format json`, whose `bench` part is one);
- nccl-tests' `-J` JSON document (distdoctor's own `bench -J` writes the same): `results[]` with `size` and
  `out_of_place`/`in_place` objects holding `bus_bw` (see nccl_tests.py);
- nccl-tests' text output (or distdoctor's table, which has the same layout): the header line that names the
  columns (`size count type redop [root] time algbw busbw #wrong ...`, with or without -I's columns or
  `#bitdiff`) says where each placement's busbw is; the rows under it are read, everything else (NCCL INFO
  lines, `#  Rank` lines, timestamps after the last column) is ignored.

The rule, as Microsoft SuperBench's baseline rules put it (variance = value / baseline - 1, fail when it is
below -tolerance): a size fails when its busbw is below (1 - PCT/100) x the baseline's at the same size. Each
of our rows (size, placement) is compared with the baseline's same placement, or with its other placement where
it has only that one (torch has only an in-place all_reduce; nccl-tests times both). Sizes one side lacks are
listed, not failed. A failure names the size, the ratio and the slowest rank (and its host).
"""

from __future__ import annotations

import json
import re
import statistics

from distdoctor.collectives import get_spec
from distdoctor.errors import InputError

DEFAULT_TOLERANCE_PCT = 10.0  # nccl-tests' own bandwidth check (NCCL_TESTS_MIN_BW) allows 10% below the target


def load_baseline(path: str) -> dict:
    """{"path", "format", "op", "world_size", "sizes": {size: {"out_of_place": GB/s|None, "in_place": ...}}}."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise InputError(f"--baseline {path}", f"cannot read ({exc.strerror})") from None
    text = raw.decode("utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise InputError(f"--baseline {path}", f"corrupt or truncated JSON ({exc})") from None
        base = _from_json(doc)
    else:
        base = _from_text(text)
    if not base["sizes"]:
        raise InputError(f"--baseline {path}", f"no bandwidth row found in this {base['format']} file")
    base["path"] = path
    return base


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value \
        else None  # nccl-tests writes NaN as the string "nan"


def _from_json(doc) -> dict:
    if isinstance(doc, dict) and isinstance(doc.get("bench"), dict) and "rows" in doc["bench"]:
        doc = doc["bench"]  # a `check --format json` report
    if isinstance(doc, dict) and isinstance(doc.get("rows"), list):  # distdoctor bench --format json
        sizes: dict[int, dict] = {}
        for row in doc["rows"]:
            place = "in_place" if row.get("inplace") else "out_of_place"
            sizes.setdefault(int(row["size_bytes"]), {})[place] = _num(row.get("busbw_gbps"))
        return {"format": "distdoctor bench JSON", "op": doc.get("op"), "world_size": doc.get("world_size"),
                "sizes": sizes}
    if isinstance(doc, dict) and isinstance(doc.get("results"), list):  # nccl-tests -J
        samples: dict[int, dict[str, list[float]]] = {}
        for res in doc["results"]:
            if not isinstance(res, dict) or not isinstance(res.get("size"), int):
                continue
            for place in ("out_of_place", "in_place"):
                bw = _num((res.get(place) or {}).get("bus_bw")) if isinstance(res.get(place), dict) else None
                if bw is not None:  # -N repeats list a size again: the baseline is their mean
                    samples.setdefault(res["size"], {}).setdefault(place, []).append(bw)
        sizes = {size: {p: statistics.fmean(v) for p, v in places.items()} for size, places in samples.items()}
        devices = (doc.get("config") or {}).get("devices") or []
        name = (doc.get("results") or [{}])[0].get("experiment_name") if doc.get("results") else None
        return {"format": "nccl-tests JSON", "op": _op_name(name or " ".join(map(str, doc.get("args", [])[:1]))),
                "world_size": len(devices) or None, "sizes": sizes}
    raise InputError("--baseline", "JSON, but neither a distdoctor bench report nor an nccl-tests -J document")


def _from_text(text: str) -> dict:
    header: list[str] | None = None
    samples: dict[int, dict[str, list[float]]] = {}
    ranks = 0
    op = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            tokens = stripped.lstrip("#").split()
            if "size" in tokens and "busbw" in tokens and "count" in tokens:
                header = tokens
            elif tokens[:1] == ["Rank"]:
                ranks += 1
            elif "Collective test starting:" in stripped or stripped.startswith("# distdoctor bench:"):
                op = _op_name(stripped)
            continue
        tokens = stripped.split()
        if header is None or len(tokens) < 2 or not (tokens[0].isdigit() and tokens[1].isdigit()):
            continue
        bus = [i for i, name in enumerate(header) if name == "busbw"]
        per_place = (len(header) - header.index("time")) // 2 if "time" in header else 4
        if len(tokens) == len(header) - per_place and len(bus) == 2:
            bus = [None, bus[0]]  # nccl-tests leaves out-of-place blank when it did not run it
        for place, i in zip(("out_of_place", "in_place"), bus):
            if i is None or i >= len(tokens):
                continue
            try:
                value = float(tokens[i])
            except ValueError:
                continue  # N/A: that placement does not exist
            if value == value:
                samples.setdefault(int(tokens[0]), {}).setdefault(place, []).append(value)
    sizes = {size: {p: statistics.fmean(v) for p, v in places.items()} for size, places in samples.items()}
    return {"format": "nccl-tests text", "op": op, "world_size": ranks or None, "sizes": sizes}


def _op_name(text: str) -> str | None:
    """all_reduce from 'all_reduce_perf', 'Collective test starting: all_gather_perf' or our own headers."""
    m = re.search(r"(all_reduce|all_gather|reduce_scatter|broadcast|reduce|alltoall|all_to_all|gather|scatter|"
                  r"sendrecv)", text or "")
    if m is None:
        return None
    return get_spec(m.group(1)).name  # nccl-tests' spelling (alltoall) is one of the spec's aliases


def compare(report: dict, base: dict, tolerance_pct: float) -> dict:
    """The `baseline` field of the bench report: one row per (size, placement) of ours the baseline has."""
    floor = 1 - tolerance_pct / 100
    hosts = report.get("rank_hosts", {})
    rows, failing = [], {}
    for row in report["rows"]:
        place = "in_place" if row["inplace"] else "out_of_place"
        theirs = base["sizes"].get(row["size_bytes"])
        if not theirs:
            continue
        other = "out_of_place" if place == "in_place" else "in_place"
        against, ref = (place, theirs.get(place)) if theirs.get(place) is not None else (other, theirs.get(other))
        if not ref:
            continue
        ratio = row["busbw_gbps"] / ref
        slow = row["slowest_rank"]
        out = {"size_bytes": row["size_bytes"], "placement": place, "baseline_placement": against,
               "busbw_gbps": row["busbw_gbps"], "baseline_busbw_gbps": ref, "ratio": ratio, "ok": ratio >= floor,
               "slowest_rank": slow, "slowest_host": hosts.get(str(slow))}
        rows.append(out)
        if not out["ok"] and (row["size_bytes"] not in failing or ratio < failing[row["size_bytes"]]["ratio"]):
            failing[row["size_bytes"]] = out
    ours = {r["size_bytes"] for r in report["rows"]}
    notes = []
    if base.get("op") and base["op"] != report.get("op"):
        notes.append(f"the baseline is {base['op']}, this run {report.get('op')}")
    if base.get("world_size") and base["world_size"] != report.get("world_size"):
        notes.append(f"the baseline ran on {base['world_size']} ranks, this run on {report.get('world_size')} "
                     "(busbw is normalized by the bus factor, so they compare, roughly)")
    return {"path": base["path"], "format": base["format"], "op": base.get("op"),
            "world_size": base.get("world_size"), "tolerance_pct": tolerance_pct, "rows": rows,
            "failed_sizes": sorted(failing), "not_in_baseline": sorted(ours - set(base["sizes"])),
            "not_measured": sorted(set(base["sizes"]) - ours), "note": "; ".join(notes) or None,
            "failures": [_failure(f, tolerance_pct) for _, f in sorted(failing.items())]}


def _failure(f: dict, tolerance_pct: float) -> str:
    where = f"rank {f['slowest_rank']}" + (f" on {f['slowest_host']}" if f.get("slowest_host") else "")
    return (f"size {f['size_bytes']} B: busbw {f['busbw_gbps']:.3g} GB/s is {f['ratio']:.2f}x the baseline's "
            f"{f['baseline_busbw_gbps']:.3g} GB/s (tolerance {tolerance_pct:g}%); slowest {where}")


def format_baseline(b: dict) -> list[str]:
    """The comparison in bench's '#'-comment style, after the table."""
    lines = ["#", f"# Baseline: {b['path']} ({b['format']}), tolerance {b['tolerance_pct']:g}% below its busbw"]
    if b["note"]:
        lines.append(f"# Baseline note: {b['note']}")
    lines.append("# %12s  %12s  %10s  %10s  %6s  %s" % ("size (B)", "placement", "busbw", "baseline", "ratio",
                                                        "slowest rank"))
    for r in b["rows"]:
        mark = "" if r["ok"] else "   <-- below tolerance"
        lines.append("  %12d  %12s  %10.4g  %10.4g  %6.2f  %s%s" % (
            r["size_bytes"], r["placement"].replace("_", "-"), r["busbw_gbps"], r["baseline_busbw_gbps"], r["ratio"],
            r["slowest_rank"], mark))
    if b["not_in_baseline"]:
        lines.append(f"# Not in the baseline: {', '.join(map(str, b['not_in_baseline']))} B")
    return lines
