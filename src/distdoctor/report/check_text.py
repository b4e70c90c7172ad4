"""Text of `distdoctor check`: the one-line verdict (also the JSON's `verdict`) and the short report under it."""

from __future__ import annotations


def _not_run(r: dict) -> bool:
    return r["status"] == "skipped" and (r.get("reason") or "").startswith("not run")


def _counts(validate: dict) -> tuple[int, int, int]:
    """(passed, failed, skipped) — checks the world never reached are not counted as skipped."""
    rows = validate["results"]
    return (sum(r["status"] == "pass" for r in rows), sum(r["status"] == "fail" for r in rows),
            sum(r["status"] == "skipped" and not _not_run(r) for r in rows))


def _where(report: dict) -> str:
    device = "GPU" if report["device"] == "cuda" else "CPU"
    iface = f", iface {report['iface']}" if report.get("iface") else ""
    return f"{report['world_size']} ranks, {report['backend']} on {device}{iface}"


def _peak(bench: dict) -> dict | None:
    return max(bench["rows"], key=lambda r: r["busbw_gbps"], default=None)


def verdict(report: dict) -> str:
    """One line a person reads in five seconds."""
    validate, bench = report["validate"], report["bench"]
    n_pass, n_fail, n_skip = _counts(validate)
    if report["passed"]:
        peak = _peak(bench)
        bw = f"all_reduce busbw {peak['busbw_gbps']:.2f} GB/s at {_size(peak['size_bytes'])}" if peak else "no bench"
        return (f"PASS: collectives correct on {_where(report)} ({n_pass} checks passed, {n_skip} skipped); "
                f"{bw}")
    # Causes before consequences, as validate names them: the ranks validate blames (one that skipped a call, a
    # wrong result, a rank lost on its own), then the ranks that only timed out waiting for them.
    culprits = validate.get("culprits", [])
    lost = {lr["rank"]: lr for lr in report["lost"]}
    reasons = [_lost(lost[c["rank"]]) if c["rank"] in lost and c["why"][0].startswith("lost")
               else f"rank {c['rank']}: {'; '.join(c['why'][:2])}" for c in culprits]
    from distdoctor.world.blame import is_vague

    others = [lr for r, lr in lost.items() if r not in {c["rank"] for c in culprits}]
    # Only a rank that just stopped answering (timed out, exited) is a consequence; one that crashed on its own
    # is named as lost whatever else validate blames (a straggler beside it explains nothing).
    victims = [lr for lr in others if is_vague(lr["reason"])] if culprits else []
    causes = [lr for lr in others if lr not in victims]
    reasons += [_lost(lr) for lr in causes]
    if victims:
        ranks = ", ".join(str(lr["rank"]) for lr in victims)
        reasons.append(f"then rank{'s' if len(victims) > 1 else ''} {ranks} timed out or failed waiting for "
                       f"{'them' if len(culprits) + len(causes) > 1 else 'it'}")
    if n_fail and not reasons:
        reasons.append(f"{n_fail} of {len(validate['results'])} checks failed")
    for why in bench.get("failures", []):
        if not why.startswith("lost"):
            reasons.append(f"bench: {why}")
    return f"FAIL on {_where(report)}: " + "; ".join(reasons or ["see the validate and bench parts"])


def _lost(lr: dict) -> str:
    return f"rank {lr['rank']} lost ({lr['reason']}" + (f", in {lr['in_op']})" if lr["in_op"] else ")")


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def format_check(report: dict) -> str:
    env, validate, bench = report["env"], report["validate"], report["bench"]
    n_pass, n_fail, n_skip = _counts(validate)
    groups = sorted({r["group"].split("[")[0] for r in validate["results"]})
    ops = sorted({r["op"] for r in validate["results"]})
    dtypes = list(dict.fromkeys(r["dtype"] for r in validate["results"] if r["dtype"]))  # in the plan's order
    rows = bench["rows"]
    lines = [report["verdict"], ""]
    count = env["device_count"]
    gpus = (f"{count} GPU" + ("s" if count != 1 else "")) if count else "no GPU"
    backends = ", ".join(env["available_backends"]) or "none"
    lines.append(f"  env       torch {env['torch_version']}, backends {backends}, {gpus}, {env['cpu_count']} CPUs "
                 f"-> {env['mode']}")
    n_not_run = sum(_not_run(r) for r in validate["results"])
    not_run = f", {n_not_run} not run" if n_not_run else ""
    lines.append(f"  validate  {'PASS' if validate['passed'] else 'FAIL'}: {n_pass} passed, {n_fail} failed, "
                 f"{n_skip} skipped{not_run} ({len(ops)} collectives x {', '.join(dtypes)}; "
                 f"groups {', '.join(groups)})")
    if rows:
        peak = _peak(bench)
        wrong = sum(r["wrong"] or 0 for r in rows)
        lines.append(f"  bench     all_reduce {_size(rows[0]['size_bytes'])}..{_size(rows[-1]['size_bytes'])}: "
                     f"avg busbw {bench['avg_busbw_gbps']:.2f} GB/s, peak {peak['busbw_gbps']:.2f} GB/s at "
                     f"{_size(peak['size_bytes'])}, {wrong} wrong")
    else:
        why = f" ({'; '.join(bench['failures'])})" if bench.get("failures") else ""
        lines.append("  bench     not measured" + why)
    for lr in report["lost"]:
        lines.append(f"  lost      rank {lr['rank']} on {lr['host']}: {lr['reason']}"
                     + (f", in {lr['in_op']}" if lr["in_op"] else ""))
    failures = [r for r in validate["results"] if r["status"] == "fail"]
    for r in failures[:5]:
        lines.append(f"  failed    {r['op']} {r['dtype']} count={r['count']} on {r['group']}: {r['reason'][:100]}")
    if len(failures) > 5:
        lines.append(f"            … and {len(failures) - 5} more (run `distdoctor validate` for the full table)")
    lines.append(f"  took      {report['wall_s']:.1f} s")
    return "\n".join(lines)
