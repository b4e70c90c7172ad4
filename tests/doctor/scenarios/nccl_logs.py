"""NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,COLL) logs of a 4-rank job, in the line formats of several NCCL versions.

A 2x2 layout: the world communicator, and a 2-rank tensor-parallel communicator per pair ({0,1}, {2,3}) split from
it. Each step: an AllGather on the pair, then an AllReduce on the world. `stop`: that rank stops before the world
AllReduce of the last step (it made the pair's AllGather), so the others' last AllReduce waits for it.

Versions (the Init COMPLETE line changed; the call line did not):
- "2.17": `comm 0x.. rank r nranks n cudaDev d busId b - Init COMPLETE` (no commId: communicators are matched
  across ranks by size and creation order);
- "2.18": `comm 0x.. rank r nranks n cudaDev d nvmlDev d busId b commId 0x.. - Init COMPLETE`;
- "2.21": `ncclCommInitRank comm 0x.. ...` and `ncclCommSplit comm 0x.. ... parent 0x.. color c key k commId ..`,
  each line prefixed with NCCL_DEBUG_TIMESTAMP_FORMAT's `[2024-05-01 10:00:00] `;
- "ray": 2.21 lines behind a launcher's `(RayTrainWorker pid=.., ip=..) ` prefix.
"""

from __future__ import annotations

from pathlib import Path

WORLD_ID, PAIR_IDS = "0x7a3b9f2c1e4d5a6b", ("0x11aa22bb33cc44dd", "0x55ee66ff77001122")


def rank_lines(rank: int, steps: int, stop: int | None, version: str) -> list[str]:
    pid = 4001 + rank
    host = f"node-{rank // 2}"
    world, pair = f"0x55d0a1b2c{rank}d0", f"0x55d0a1b2e{rank}f0"
    stream = f"0x55d0aa{rank}0"
    pre = {"2.21": "[2024-05-01 10:00:00] ", "ray": f"(RayTrainWorker pid={pid}, ip=10.0.0.{rank}) "}.get(version, "")
    head = f"{pre}{host}:{pid}:{pid + 40} [{rank % 2}] NCCL INFO "
    main = f"{pre}{host}:{pid}:{pid} [{rank % 2}] NCCL INFO "
    lines = [f"{main}Bootstrap : Using eth0:10.0.0.{rank}<0>", f"{main}NCCL version {version}.5+cuda12.4"]

    def init(comm, r, n, cid, split=False):
        if version == "2.17":
            return (f"{head}comm {comm} rank {r} nranks {n} cudaDev {rank % 2} busId {1000 * (rank % 2 + 1)} "
                    f"- Init COMPLETE")
        tail = f"cudaDev {rank % 2} nvmlDev {rank % 2} busId {1000 * (rank % 2 + 1)}"
        if version == "2.18":
            return f"{head}comm {comm} rank {r} nranks {n} {tail} commId {cid} - Init COMPLETE"
        if split:
            return (f"{head}ncclCommSplit comm {comm} rank {r} nranks {n} {tail} parent {world} color {rank // 2} "
                    f"key {r} commId {cid} - Init COMPLETE")
        return f"{head}ncclCommInitRank comm {comm} rank {r} nranks {n} {tail} commId {cid} - Init COMPLETE"

    def call(name, op_count, count, comm, n, dtype=7, root=0):
        return (f"{main}{name}: opCount {op_count:x} sendbuff 0x7f00{rank}000 recvbuff 0x7f00{rank}800 count {count} "
                f"datatype {dtype} op 0 root {root} comm {comm} [nranks={n}] stream {stream}")

    lines.append(init(world, rank, 4, WORLD_ID))
    lines.append(f"{main}Channel 00/02 :    0   1   2   3")
    lines.append(init(pair, rank % 2, 2, PAIR_IDS[rank // 2], split=True))
    lines.append(call("Broadcast", 0, 4096, world, 4, root=0))
    for step in range(steps):
        lines.append(call("AllGather", step, 512, pair, 2, dtype=9))
        if stop == rank and step == steps - 1:
            break
        lines.append(call("AllReduce", step + 1, 1024, world, 4))
    return lines


def write_nccl_logs(out: Path, steps: int = 10, stop: int | None = 3, version: str = "2.21") -> dict[int, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for rank in range(4):
        paths[rank] = out / f"rank_{rank}.log"
        paths[rank].write_text("\n".join(rank_lines(rank, steps, stop, version)) + "\n")
    return paths


if __name__ == "__main__":  # python tests/doctor/scenarios/nccl_logs.py --out DIR: the example of docs/diagnose.md
    import argparse

    ap = argparse.ArgumentParser(description="Write a 4-rank job's NCCL_DEBUG=INFO logs; rank 3 stops early.")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--version", choices=("2.17", "2.18", "2.21", "ray"), default="2.21")
    a = ap.parse_args()
    write_nccl_logs(a.out, version=a.version)
