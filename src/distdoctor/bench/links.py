"""`distdoctor bench --links`: point-to-point bandwidth and latency between hosts, to point at a slow host.

A collective makes every rank wait for the slowest link, so per-rank collective times come out equal and
cannot say which host is slow. Pairs can: each host is represented by its lowest rank, and every pair of hosts
is measured alone, in the rounds of a round-robin tournament (circle method: H-1 rounds of disjoint pairs for
an even number of hosts H, H rounds with one host idle per round for an odd H), so all pairs are covered in
O(H) rounds and no two measurements share a host's link. A world barrier separates rounds. Then, where hosts
have two or more ranks, one more round measures every host's two lowest ranks against each other (intra-host,
at the same time on every host: they share no link). The whole schedule runs PASSES (3) times, the `iters`
transfers of a direction spread over the passes, and a row pools its direction's transfers of every pass: a
burst of load on a shared machine lasts a round, not the probe, so a pair timed only while it lasted would
look slow where the same pair a pass later does not.

One direction src -> dst: one warmup transfer, then `iters` transfers of `nbytes`, each followed by a
one-element acknowledgement back so that src's clock sees the data arrive, each timed on src with perf_counter
(after a CUDA synchronize on GPU). A row's time_us is the median transfer of every pass (one scheduling
hiccup on a busy host must not make a healthy link look slow); gbps = nbytes / time_us; best_gbps from the
fastest. latency_us: half the median round trip of a one-element ping-pong. Then the same from dst to src.
Tensors live on the rank's device and only isend/irecv are used, so it runs on gloo and NCCL alike; every wait
is bounded by the world's timeout.
A slow link must neither make the probe crawl nor push a round past the timeout of the ranks idling in the
barrier: src times the warmup transfer and tells dst how many of the `iters` transfers fit in
DIRECTION_BUDGET_S (2 s, over all passes) or a quarter of the timeout, whichever is less (at least one per
pass; rows carry the count).

Verdict (reporter), over the inter-host rows, on each direction's fastest transfer (best_gbps): load on a
host only ever slows a transfer down, a slow link is slow on every one, so the best transfer separates them
where a mean would not (the table also shows the median, gbps).
- A host's best_gbps is the fastest of its links: a link is as fast as its slower end, so a host with one
  healthy partner reaches its own speed there. A host is slow when even that is at most SLOW_RATIO (0.25) of
  the median best_gbps of the other hosts. It needs a reference, so 3 or more hosts. Reported with the median
  of its links against the median of the links between the other (not slow) hosts, and their ratio.
- A link (host pair) is slow when, between hosts that are not slow, its faster direction is at most SLOW_RATIO
  of the median pair (a bad cable or switch port between two healthy hosts).
- With 2 hosts there is one link and nothing to compare it with: no host or link is named, `links_note` says so.
- With a rank lost, pairs are missing and the comparison would be lopsided: the rows are kept, nothing is named.
A slow host or link fails the run, as --min-busbw does.
"""

from __future__ import annotations

import socket
import statistics
import time

# A quarter, not a half: on a busy host a healthy link measured 0.45x its peers; a faulty one (a rate-limited
# port, a link negotiated down) is an order of magnitude slower.
SLOW_RATIO = 0.25
DIRECTION_BUDGET_S = 2.0  # timed transfers per direction stop at --link-iters or about this long
PASSES = 3  # the schedule runs this many times (fewer when --link-iters is smaller); a row pools every pass
NAME_BYTES = 256  # room for a host name (HOST_NAME_MAX is 64) plus the node rank


def tournament(n: int) -> list[list[tuple[int, int]]]:
    """Round-robin schedule of 0..n-1 (circle method): every pair exactly once, disjoint pairs per round."""
    players: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = [(players[i], players[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        players = [players[0], players[-1], *players[1:-1]]
    return [pairs for pairs in rounds if pairs]  # one host: no round at all


def _host_names(ctx) -> list[str]:
    """Every rank's host, agreed by all ranks (an all_gather of fixed-size byte tensors, on the rank's device).

    The node rank from the launcher (GROUP_RANK) is part of the key, so two machines that share a host name
    (containers) still count as two hosts; it is shown only when names collide."""
    import os

    import torch
    import torch.distributed as dist

    key = f"{os.environ.get('GROUP_RANK', '0')}|{socket.gethostname()}".encode()[:NAME_BYTES]
    mine = torch.zeros(NAME_BYTES, dtype=torch.uint8)
    mine[:len(key)] = torch.tensor(list(key), dtype=torch.uint8)
    everyone = [torch.zeros(NAME_BYTES, dtype=torch.uint8, device=ctx.device) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, mine.to(ctx.device))
    keys = [bytes(t.cpu().tolist()).rstrip(b"\0").decode(errors="replace") for t in everyone]
    names = {k: k.split("|", 1)[1] for k in keys}
    for k in set(keys):
        node, name = k.split("|", 1)
        if sum(1 for other in set(keys) if other.split("|", 1)[1] == name) > 1:
            names[k] = f"{name}[node{node}]"
    return [names[k] for k in keys]


class _Peer:
    """Blocking send/recv with one peer, every wait bounded by the world's timeout."""

    def __init__(self, ctx, peer: int):
        self.ctx, self.peer = ctx, peer
        self.cuda = ctx.device is not None and str(ctx.device).startswith("cuda")

    def send(self, t) -> None:
        import torch.distributed as dist

        dist.isend(t, self.peer).wait(self.ctx.timeout)

    def recv(self, t) -> None:
        import torch.distributed as dist

        dist.irecv(t, self.peer).wait(self.ctx.timeout)

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.ctx.device)


def _exchange(link: _Peer, leading: bool, out, back) -> None:
    """The leading side sends `out` and waits for `back`; the other side mirrors it."""
    if leading:
        link.send(out)
        link.recv(back)
    else:
        link.recv(out)
        link.send(back)
    link.sync()


def _one_way(link: _Peer, sending: bool, buf, ack, iters: int, budget_s: float) -> list[float]:
    """One direction: the seconds of each timed transfer, as the sender sees them (the receiver's are noise)."""
    import torch

    def transfer():
        _exchange(link, sending, buf, ack)

    t0 = time.perf_counter()
    transfer()  # warmup; also tells the sender how long one transfer takes
    warm = time.perf_counter() - t0
    count = torch.zeros(1, dtype=torch.int64, device=buf.device)
    if sending:
        count.fill_(max(1, min(iters, int(budget_s / warm) if warm > 0 else iters)))
        link.send(count)
    else:
        link.recv(count)
    n = int(count.item())
    link.sync()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        transfer()
        times.append(time.perf_counter() - t0)
    return times


def _ping_pong(link: _Peer, leading: bool, tiny, iters: int) -> list[float]:
    """The seconds of each round trip of a one-element message, as the leading side sees them."""
    def trip():
        _exchange(link, leading, tiny, tiny)

    trip()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        trip()
        times.append(time.perf_counter() - t0)
    return times


def _measure_pair(ctx, me: int, peer: int, hosts: list[str], nbytes: int, iters: int, budget_s: float,
                  tag: str) -> None:
    """Both directions between `me` and `peer` (lower rank sends first); the sender emits each direction's
    transfer and round-trip seconds of this pass (summarize_links pools the passes into one row)."""
    import torch

    link = _Peer(ctx, peer)
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=ctx.device)
    ack = torch.zeros(1, dtype=torch.float32, device=ctx.device)
    for src, dst in ((min(me, peer), max(me, peer)), (max(me, peer), min(me, peer))):
        sending = me == src
        with ctx.phase(f"bench links {tag}: rank {src} -> rank {dst}, {buf.numel() * 4} B"):
            times = _one_way(link, sending, buf, ack, iters, budget_s)
            trips = _ping_pong(link, sending, ack, iters)
        if sending:
            ctx.emit({"kind": "link", "src_rank": src, "dst_rank": dst, "src_host": hosts[src],
                      "dst_host": hosts[dst], "bytes": buf.numel() * 4, "times_s": times, "trips_s": trips})


def _row(records: list[dict]) -> dict:
    """One direction's row from its records of every pass: the median and fastest of all their transfers."""
    times = [t for rec in records for t in rec["times_s"]]
    trips = [t for rec in records for t in rec["trips_s"]]
    first, nb = records[0], records[0]["bytes"]
    median, fastest = statistics.median(times), min(times)
    return {"src_rank": first["src_rank"], "dst_rank": first["dst_rank"], "src_host": first["src_host"],
            "dst_host": first["dst_host"], "bytes": nb, "iters": len(times), "passes": len(records),
            "time_us": median * 1e6, "gbps": nb / median / 1e9 if median > 0 else 0.0,
            "best_gbps": nb / fastest / 1e9 if fastest > 0 else 0.0,
            "latency_us": statistics.median(trips) / 2 * 1e6 if trips else 0.0}


def _schedule(hosts: list[str]) -> list[tuple[str, list[tuple[int, int]]]]:
    """One pass: the tournament's rounds between hosts' lowest ranks, then the intra-host round, each tagged."""
    ranks_on: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        ranks_on.setdefault(h, []).append(r)
    reps = [ranks[0] for ranks in ranks_on.values()]  # in order of each host's lowest rank
    rounds = tournament(len(reps))
    out = [(f"round {i + 1}/{len(rounds)}", [(reps[a], reps[b]) for a, b in pairs]) for i, pairs in enumerate(rounds)]
    intra = [(ranks[0], ranks[1]) for ranks in ranks_on.values() if len(ranks) >= 2]
    return out + ([("intra-host", intra)] if intra else [])


def links_worker(ctx, nbytes: int, iters: int) -> dict:
    """Runs on every rank after the sweep: PASSES times the inter-host rounds and the intra-host round."""
    import torch.distributed as dist

    hosts = _host_names(ctx)
    schedule = _schedule(hosts)
    passes = max(1, min(PASSES, iters))
    budget_s = min(DIRECTION_BUDGET_S / passes, ctx.timeout.total_seconds() / 4)
    for p in range(passes):
        share = iters // passes + (p < iters % passes)  # the pass's part of --link-iters
        for i, (name, pairs) in enumerate(schedule):
            tag = f"{name}, pass {p + 1}/{passes}" if passes > 1 else name
            for a, b in pairs:
                if ctx.rank in (a, b):
                    _measure_pair(ctx, ctx.rank, b if ctx.rank == a else a, hosts, nbytes, share, budget_s, tag)
            with ctx.phase(f"bench links {tag}: barrier"):
                dist.barrier()  # rounds must not overlap: a pair measured alone has its hosts' links to itself
            ctx.progress(p * len(schedule) + i + 1, passes * len(schedule), f"links {tag}")
    return {"hosts": hosts, "rounds": len(schedule), "passes": passes}


# ---------------------------------------------------------------------------------------------- reporter
def summarize_links(job, nbytes: int, iters: int) -> dict:
    """The JSON fields `bench --links` adds: links, link_bytes, link_iters, link_hosts, slow_hosts, slow_links,
    links_note (see the module docstring for the verdict)."""
    passes: dict[tuple[int, int], list[dict]] = {}
    for records in job.records.values():
        for rec in records:
            if rec.get("kind") == "link":
                passes.setdefault((rec["src_rank"], rec["dst_rank"]), []).append(rec)
    links = sorted((_row(recs) for recs in passes.values()),
                   key=lambda r: (r["src_host"] == r["dst_host"], r["src_rank"], r["dst_rank"]))
    inter = [r for r in links if r["src_host"] != r["dst_host"]]
    hosts = sorted({h for r in inter for h in (r["src_host"], r["dst_host"])})
    touching = {h: [r for r in inter if h in (r["src_host"], r["dst_host"])] for h in hosts}
    best = {h: max(r["best_gbps"] for r in rows) for h, rows in touching.items()}
    link_hosts = [{"host": h, "best_gbps": best[h], "median_gbps": statistics.median(r["gbps"] for r in rows),
                   "links": len(rows)} for h, rows in touching.items()]
    slow_hosts, slow_links, note = [], [], None
    if job.lost:  # missing pairs would make the comparison lopsided: no verdict rather than a guess
        note = (f"incomplete: {len(job.lost)} rank(s) lost during the run, {len(links)} link row(s) measured; "
                "no slow host or link is named")
    elif len(hosts) >= 3:
        reference = {h: statistics.median(best[g] for g in hosts if g != h) for h in hosts}
        slow = {h for h in hosts if reference[h] > 0 and best[h] <= SLOW_RATIO * reference[h]}
        healthy = [r for r in inter if r["src_host"] not in slow and r["dst_host"] not in slow]
        others = statistics.median(r["gbps"] for r in healthy) if healthy else None
        for h in sorted(slow):
            med = statistics.median(r["gbps"] for r in touching[h])
            slow_hosts.append({"host": h, "median_gbps": med, "others_median_gbps": others,
                               "ratio": med / others if others else None, "best_gbps": best[h],
                               "others_best_gbps": reference[h]})
        pairs: dict[tuple[str, str], list[dict]] = {}
        for r in healthy:
            pairs.setdefault(tuple(sorted((r["src_host"], r["dst_host"]))), []).append(r)
        pair_best = {p: max(r["best_gbps"] for r in rows) for p, rows in pairs.items()}
        ref = statistics.median(pair_best.values()) if pair_best else 0.0
        for (a, b), rows in sorted(pairs.items()):
            if ref > 0 and pair_best[(a, b)] <= SLOW_RATIO * ref:
                slow_links.append({"hosts": [a, b], "gbps": statistics.median(r["gbps"] for r in rows),
                                   "best_gbps": pair_best[(a, b)], "others_best_gbps": ref,
                                   "ratio": pair_best[(a, b)] / ref})
    elif len(hosts) == 2:
        a, b = hosts
        note = (f"2 hosts: one link ({a} <-> {b}, {statistics.median(r['gbps'] for r in inter):.3g} GB/s median) "
                "and nothing to compare it with: a slow side cannot be told apart (3 or more hosts can)")
    else:
        note = "1 host: intra-host pairs only" if links else "no link was measured"
    return {"links": links, "link_bytes": nbytes, "link_iters": iters, "link_hosts": link_hosts,
            "slow_hosts": slow_hosts, "slow_links": slow_links, "links_note": note}


def link_failures(report: dict) -> list[str]:
    """A slow host or link fails the run (like --min-busbw): one reason each."""
    out = [f"slow host {s['host']}: {_times(s['ratio'])} the other hosts' link speed "
           f"({s['median_gbps']:.3g} vs {_gbps(s['others_median_gbps'])}, median)"
           for s in report.get("slow_hosts", [])]
    out += [f"slow link {a} <-> {b}: {s['best_gbps']:.3g} GB/s at best, {s['ratio']:.2g}x the other links"
            for s in report.get("slow_links", []) for a, b in [s["hosts"]]]
    return out


def format_links(report: dict) -> list[str]:
    """The link table and the verdict lines, in bench's '#'-comment style."""
    lines = ["#", f"# Links: {report['link_bytes']} B point-to-point, {report['link_iters']} timed transfers per "
                  "direction, one rank per host (intra-host: each host's two lowest ranks)",
             "# %-22s  %-22s  %10s  %8s  %8s  %9s  %5s" % ("src host (rank)", "dst host (rank)", "time(us)", "GB/s",
                                                           "best", "lat(us)", "iters")]
    for r in report["links"]:
        lines.append("  %-22s  %-22s  %10.1f  %8.4g  %8.4g  %9.1f  %5d" % (
            f"{r['src_host']} ({r['src_rank']})", f"{r['dst_host']} ({r['dst_rank']})", r["time_us"], r["gbps"],
            r["best_gbps"], r["latency_us"], r["iters"]))
    for s in report["slow_hosts"]:
        lines.append(f"# Slow host: {s['host']}: its links run at {_times(s['ratio'])} the other hosts' (median "
                     f"{s['median_gbps']:.3g} vs {_gbps(s['others_median_gbps'])}; fastest {s['best_gbps']:.3g} vs "
                     f"{s['others_best_gbps']:.3g} GB/s)")
    for s in report["slow_links"]:
        a, b = s["hosts"]
        lines.append(f"# Slow link: {a} <-> {b}: {s['ratio']:.2g}x the other links ({s['best_gbps']:.3g} GB/s at "
                     f"best, theirs {s['others_best_gbps']:.3g} GB/s); both hosts are fast on their other links")
    if report["links_note"]:
        lines.append(f"# Links: {report['links_note']}")
    elif not report["slow_hosts"] and not report["slow_links"]:
        lines.append(f"# Links: no slow host or link among {len(report['link_hosts'])} hosts")
    return lines


def _gbps(value: float | None) -> str:
    return "n/a (no two healthy hosts)" if value is None else f"{value:.3g} GB/s"


def _times(ratio: float | None) -> str:
    return "far below" if ratio is None else f"{ratio:.2g}x"
