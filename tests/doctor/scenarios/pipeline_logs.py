"""Per-rank glog logs of a 2-stage pipeline that deadlocks the way the OneFlow/LiBai Swin 3-D job did (the seed).

Every kernel launch is wrapped in `before: <op>` / `after: <op>` lines (OneFlow's Kernel::Launch), one glog line
per marker with the OS thread id. Ranks 0..R/2-1 are stage 0, the others stage 1. Each rank has a source thread
(System-Src-WaitAndSendIds), a forward stream, a backward stream and an NCCL stream. Iterations run forward then
backward over the micro-batches, then the data-parallel all-reduce. In the last iteration stage 1's backward never
starts (its first buffer op was placed on the forward stream, as in the incident), so it never sends the gradient
of micro-batch 1: on every stage-0 rank the backward stream is stuck in `before: System-Boxing-Recv-Grad-2108`,
while the forward stream waits with nothing open. Every rank's source thread has begun the next batch's
WaitAndSendIds and waits for the user (two befores, one after: normal, as the incident's engineers found).

Also what real logs have: glog's header lines, an eager-boxing block, multi-line messages, warnings, a watchdog
line a minute later, and on chosen ranks: unreadable marker lines (bad bytes in an op name; a line whose thread
column is lost), a begin logged twice before its end, a log that starts with an end, a truncated last line.

`write_pipeline_logs(...)` writes `rank<r>/oneflow.<host>.root.log.INFO.<date>.<pid>` (glog's name) with the
`oneflow.INFO` link glog keeps to it and a WARNING file, and returns what the logs show, for the tests to compare.
"""

from __future__ import annotations

import os
from pathlib import Path

SRC = "System-Src-WaitAndSendIds_1157"
RECV_GRAD = "System-Boxing-Recv-Grad-2108"
SEND_GRAD = "System-Boxing-Send-Grad-2107"
SEND_ACT, RECV_ACT = "System-Boxing-Send-Act-2001", "System-Boxing-Recv-Act-2002"
NCCL_TP = "System-NCCL-Logical-(*S0)2(*B)-1210"
BOXING = ("eager_boxing_logger.cpp:42] Boxing route: symmetric-acyclic-nd-sbp-to-nd-sbp -> naive-b-to-1 -> "
          "naive-1-to-1 -> naive-1-to-p -> symmetric-acyclic-nd-sbp-to-nd-sbp",
          "eager_boxing_logger.cpp:43] Logical shape: (256,100)",
          "eager_boxing_logger.cpp:44] Altered state of sbp: (S(0), B) -> (B, B) -> (B, B) -> (B, B) -> (P, P) "
          "-> (S(0), B)")


def stage_ops(stage: int, blocks: int) -> tuple[list[str], list[str], str]:
    """(forward stream ops, backward stream ops, the data-parallel all-reduce) of one micro-batch of a stage."""
    if stage == 0:
        fwd = [f"model.layers.0.blocks.{b}.attn-matmul-{100 + b}" for b in range(blocks)] + [NCCL_TP, SEND_ACT]
        bwd = [RECV_GRAD] + [f"model.layers.0.blocks.{b}.attn-matmul-{100 + b}_grad" for b in reversed(range(blocks))]
    else:
        fwd = [RECV_ACT] + [f"model.layers.1.blocks.{b}.mlp-fc-{200 + b}" for b in range(blocks)] + \
            ["model.head-loss-300"]
        bwd = ["model.head-loss-300_grad"] + [f"model.layers.1.blocks.{b}.mlp-fc-{200 + b}_grad"
                                             for b in reversed(range(blocks))] + [SEND_GRAD]
    return fwd, bwd, f"System-NCCL-AllReduce-stage{stage}-3000"


class _Log:
    """Lines of one rank's log with glog prefixes, a clock, and the line number of what the tests look for."""

    def __init__(self, t0: float) -> None:
        self.lines: list[str] = []
        self.t = t0

    def add(self, tid: int, msg: str, severity: str = "I", dt: float = 0.000137) -> int:
        self.t += dt
        sec = self.t % 60
        minute = int(self.t // 60) % 60
        self.lines.append(f"{severity}20220419 11:{minute:02d}:{sec:09.6f} {tid} {msg}")
        return len(self.lines)

    def marker(self, tid: int, kind: str, op: str) -> int:
        return self.add(tid, f"kernel.cpp:{51 if kind == 'before' else 55}] {kind}: {op}")


def rank_log(rank: int, ranks: int, iterations: int, micro: int, blocks: int, faults: bool = True) -> tuple[str, dict]:
    """One rank's log text and its facts: threads, the stuck op's line, ..."""
    stage = 0 if rank < ranks // 2 else 1
    base = 2_720_000 + 1000 * rank
    tids = {"src": base + 12, "fwd": base + 30, "bwd": base + 41, "nccl": base + 55, "misc": base + 2}
    fwd, bwd, allreduce = stage_ops(stage, blocks)
    log = _Log(41 * 60 + 20.0)
    log.lines += ["Log file created at: 2022/04/19 11:41:20", f"Running on machine: node-{rank // 8}",
                  "Running duration (h:mm:ss): 0:00:00",
                  "Log line format: [IWEF]yyyymmdd hh:mm:ss.uuuuuu threadid file:line] msg"]
    facts: dict = {"stage": stage, "threads": {k: str(v) for k, v in tids.items()}, "skipped": 0}
    if faults and rank == 6:  # the log starts inside the source op: an end without a begin
        log.marker(tids["src"], "after", SRC)
    for line in BOXING:
        log.add(tids["misc"], line)
    for it in range(1, iterations + 1):
        last = it == iterations
        log.marker(tids["src"], "before", SRC)
        log.marker(tids["src"], "after", SRC)
        for mb in range(1, micro + 1):
            for op in fwd:
                if op == NCCL_TP:
                    log.marker(tids["nccl"], "before", op)
                    log.marker(tids["nccl"], "after", op)
                    continue
                twice = faults and rank == 5 and it == 2 and mb == 1 and op == fwd[1]
                log.marker(tids["fwd"], "before", op)
                if twice:  # a begin logged twice before its end
                    log.marker(tids["fwd"], "before", op)
                if faults and rank == 3 and it == 2 and mb == 2 and op == fwd[2]:
                    bad = log.lines.pop()  # bad bytes inside the op name
                    log.lines.append(bad.replace(".blocks.", ".blo\udcff\udcfeks.", 1))
                    facts["skipped"] += 1
                log.marker(tids["fwd"], "after", op)
            if mb == 1 and it == 1:
                log.add(tids["misc"], "session.cpp:211] first micro-batch forward done; tensor dump:")
                log.lines += ["  shape (256, 100)", "  sbp (S(0), B)"]  # a multi-line message: no prefix
        if last:
            if stage == 0:  # stage 1 never sends the gradient of micro-batch 1
                facts["stuck_line"] = log.marker(tids["bwd"], "before", RECV_GRAD)
            facts["src_line"] = log.marker(tids["src"], "before", SRC)  # the next batch, waiting for the user
            break
        for mb in range(1, micro + 1):
            for op in bwd:
                log.marker(tids["bwd"], "before", op)
                if faults and rank == 3 and it == 3 and mb == 1 and op == bwd[2]:
                    broken = log.lines.pop()  # the thread-id column lost
                    log.lines.append(broken.replace(f" {tids['bwd']} ", " ", 1))
                    facts["skipped"] += 1
                log.marker(tids["bwd"], "after", op)
        log.marker(tids["nccl"], "before", allreduce)
        log.marker(tids["nccl"], "after", allreduce)
        log.add(tids["misc"], f"session.cpp:318] iteration {it} done, loss {2.31 - 0.01 * it:.2f}")
        if it == 2:
            log.add(tids["misc"], "cuda_stream.cpp:77] stream synchronize took 120 ms", severity="W")
    log.add(tids["misc"], "watchdog.cpp:40] no kernel finished for 60 s", severity="W", dt=60.0)
    text = "\n".join(log.lines) + "\n"
    if faults and rank == 7:
        text += "I20220419 11:4"  # cut off mid-line when the job was killed
    facts["lines"] = len(log.lines) + (1 if faults and rank == 7 else 0)
    return text, facts


def write_pipeline_logs(out: Path, ranks: int = 8, iterations: int = 6, micro: int = 4, blocks: int = 6,
                        faults: bool = True, layout: str = "glog", only=None) -> dict:
    """Write every rank's log (or the ranks in `only`) under `out`; return {"paths": {rank: path}, "facts":
    {rank: facts}, ...}. layout "glog": rank<r>/ folders as glog writes them; "flat": rank_<r>.log files."""
    out.mkdir(parents=True, exist_ok=True)
    paths, facts = {}, {}
    for r in range(ranks) if only is None else only:
        text, facts[r] = rank_log(r, ranks, iterations, micro, blocks, faults)
        if layout == "flat":
            path = out / f"rank_{r}.log"
        else:
            folder = out / f"rank{r}"
            folder.mkdir(exist_ok=True)
            name = f"oneflow.node-{r // 8}.root.log.INFO.20220419-114120.{3_100_000 + r}"
            path = folder / name
            (folder / f"oneflow.node-{r // 8}.root.log.WARNING.20220419-114120.{3_100_000 + r}").write_text(
                "Log file created at: 2022/04/19 11:41:20\n"
                "W20220419 11:42:18.000001 2720002 cuda_stream.cpp:77] stream synchronize took 120 ms\n")
            link = folder / "oneflow.INFO"
            if not link.exists():
                os.symlink(name, link)
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        paths[r] = str(path)
    return {"paths": paths, "facts": facts, "stuck_op": RECV_GRAD, "src_op": SRC,
            "stuck_ranks": list(range(ranks // 2))}


if __name__ == "__main__":  # python tests/doctor/scenarios/pipeline_logs.py --out DIR: the example of docs/diagnose.md
    import argparse

    ap = argparse.ArgumentParser(description="Write the stalled pipeline's per-rank glog logs.")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--layout", choices=("glog", "flat"), default="glog")
    a = ap.parse_args()
    write_pipeline_logs(a.out, ranks=a.ranks, layout=a.layout)
