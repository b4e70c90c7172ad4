"""Per-rank pipeline action lists in torch.distributed.pipelining's form, and the checks torch would make.

An action is what `torch.distributed.pipelining.schedules._Action` holds: (stage index, computation type,
micro-batch index, sub-actions). Types: F (forward), B (full backward), I (backward for inputs), W (backward
for weights), SEND_F / RECV_F / SEND_B / RECV_B (activation and gradient transfers), UNSHARD / RESHARD (FSDP),
REDUCE_GRAD (data-parallel gradient reduction), OVERLAP_F_B (a forward and a backward run together, written
`(0F1;1B0)OVERLAP_F_B`). The CSV form is torch's `_dump_csv`: one row per rank, one action string per cell
(`2F0`, `1SEND_B3`, `0UNSHARD`); an empty cell is an idle step. Parsing follows torch's `_Action.from_str`
grammar, so CSV files need no torch; this module never imports it.

`check_actions` makes the checks of torch's `_validate_schedule` — every stage runs every micro-batch's
forward and backward once, a backward after its forward, W after its I, a stage on one rank — plus, for lists
with communication, what the runtime (`_PipelineScheduleRuntime`) needs: every send has its matching receive
on the peer in the same order, a compute runs after the receive of its input, a send after the compute whose
output it sends. It reports all problems, each a `ScheduleFinding` naming ranks, stage and micro-batch.
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

from distdoctor.errors import InputError

COMPUTE = ("F", "B", "I", "W")
COMMS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
OTHER = ("UNSHARD", "RESHARD", "REDUCE_GRAD")  # no pipeline data dependency; not simulated
KINDS = COMPUTE + COMMS + OTHER + ("OVERLAP_F_B",)
_ACTION = re.compile(r"(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$")
_NAMES = {"F": "forward", "B": "backward", "I": "backward-input", "W": "backward-weight", "SEND_F": "send of "
          "the activation", "RECV_F": "receive of the activation", "SEND_B": "send of the gradient",
          "RECV_B": "receive of the gradient"}


class Act(NamedTuple):
    stage: int
    kind: str
    mb: int | None = None
    subs: tuple[Act, ...] | None = None

    def __str__(self) -> str:  # torch's repr: 1F0, 2SEND_B3, (0F1;1B0)OVERLAP_F_B
        if self.subs is not None:
            return f"({';'.join(map(str, self.subs))}){self.kind}"
        return f"{self.stage}{self.kind}{'' if self.mb is None else self.mb}"

    def leaves(self) -> tuple[Act, ...]:
        return self.subs if self.subs is not None else (self,)


def parse_action(text: str) -> Act | None:
    """One CSV cell, in torch's `_Action.from_str` grammar; None for an empty cell."""
    text = text.strip()
    if not text:
        return None
    if text.startswith("(") and ")" in text:
        end = text.index(")")
        kind = text[end + 1:]
        if kind not in KINDS:
            raise ValueError(f"unknown computation type {kind!r}")
        subs = tuple(a for a in (parse_action(x) for x in text[1:end].split(";")) if a is not None)
        return Act(-1, kind, None, subs or None)
    m = _ACTION.match(text)
    if not m:
        raise ValueError("expected [stage][type][micro-batch], e.g. 2F0, 1SEND_B3, 0UNSHARD")
    return Act(int(m.group(1)), m.group(2), int(m.group(3)) if m.group(3) else None)


def read_csv(text: str, source: str) -> dict[int, list[Act | None]]:
    """torch's CSV form: row r is rank r's actions."""
    out: dict[int, list[Act | None]] = {}
    for r, row in enumerate(csv.reader(io.StringIO(text))):
        acts = []
        for col, cell in enumerate(row):
            try:
                acts.append(parse_action(cell))
            except ValueError as exc:
                raise InputError(f"{source}: rank {r} step {col}", f"{cell.strip()!r}: {exc}") from None
        out[r] = acts
    if not out:
        raise InputError(source, "no rows (expected one row of actions per rank)")
    return out


def write_csv(actions: dict[int, list[Act | None]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for r in sorted(actions):
        writer.writerow(["" if a is None else str(a) for a in actions[r]])
    return buf.getvalue()


def has_comms(actions: dict[int, list[Act | None]]) -> bool:
    return any(a is not None and a.kind in COMMS for acts in actions.values() for a in acts)


@dataclass
class ScheduleFinding:
    """One problem of an action list: kind, the ranks involved, where (stage, micro-batch, step) and why."""

    kind: str
    ranks: list[int]
    detail: str
    stage: int | None = None
    microbatch: int | None = None
    step: int | None = None  # index in the rank's action list
    evidence: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"kind": self.kind, "ranks": sorted(set(self.ranks)), "stage": self.stage,
                "microbatch": self.microbatch, "step": self.step, "detail": self.detail}


def infer_stage_to_rank(actions: dict[int, list[Act | None]]) -> tuple[dict[int, int], list[ScheduleFinding]]:
    """Which rank runs each stage (where its actions are), as torch's `_validate_schedule` infers it."""
    where: dict[int, int] = {}
    findings = []
    for r in sorted(actions):
        for step, a in enumerate(actions[r]):
            for x in () if a is None else a.leaves():
                if x.kind not in COMPUTE or x.stage in where and where[x.stage] == r:
                    continue
                if x.stage in where:
                    findings.append(ScheduleFinding(
                        "stage_on_two_ranks", [where[x.stage], r], f"stage {x.stage} has actions on rank "
                        f"{where[x.stage]} and on rank {r} (step {step}: {x}); a stage lives on one rank",
                        stage=x.stage, step=step))
                else:
                    where[x.stage] = r
    return where, findings


def check_actions(actions: dict[int, list[Act | None]], num_stages: int, microbatches: int,
                  stage_to_rank: dict[int, int]) -> list[ScheduleFinding]:
    """Every problem torch's validation or runtime would hit, in distdoctor's words (empty: the list is sound)."""
    findings: list[ScheduleFinding] = []
    seen: dict[tuple[int, str, int], tuple[int, int]] = {}  # (stage, kind, mb) -> (rank, step) first seen
    valid: list[tuple[Act, int, int]] = []
    for r in sorted(actions):
        for step, a in enumerate(actions[r]):
            for x in () if a is None else a.leaves():
                if x.kind in OTHER:
                    continue
                if not 0 <= x.stage < num_stages:
                    findings.append(ScheduleFinding("unknown_stage", [r], f"rank {r} step {step}: {x} names stage "
                                                    f"{x.stage}, but the pipeline has stages 0-{num_stages - 1}",
                                                    stage=x.stage, microbatch=x.mb, step=step))
                elif x.mb is None or not 0 <= x.mb < microbatches:
                    findings.append(ScheduleFinding("unknown_microbatch", [r], f"rank {r} step {step}: {x} names "
                                                    f"micro-batch {x.mb}, but the step has micro-batches "
                                                    f"0-{microbatches - 1}", stage=x.stage, microbatch=x.mb,
                                                    step=step))
                elif (x.stage, x.kind, x.mb) in seen:
                    r0, s0 = seen[(x.stage, x.kind, x.mb)]
                    findings.append(ScheduleFinding("duplicate_action", [r0, r], f"stage {x.stage} runs the "
                                                    f"{_NAMES[x.kind]} of micro-batch {x.mb} twice (rank {r0} step "
                                                    f"{s0} and rank {r} step {step})", stage=x.stage,
                                                    microbatch=x.mb, step=step))
                else:
                    seen[(x.stage, x.kind, x.mb)] = (r, step)
                    valid.append((x, r, step))
    comms = has_comms(actions)
    for x, r, step in valid:
        findings += _order_findings(x, r, step, seen)
        if comms and x.kind in ("F", "B", "I"):
            findings += _input_findings(x, r, step, seen, stage_to_rank, num_stages)
    for s in range(num_stages):
        findings += _count_findings(s, seen, microbatches, stage_to_rank)
    if comms:
        findings += _comm_findings(actions, stage_to_rank, num_stages)
    return findings


def _order_findings(x: Act, r: int, step: int, seen) -> list[ScheduleFinding]:
    """A backward before its forward, W before its I, a send before the compute that produces its data."""
    need = {"B": ("F",), "I": ("F",), "W": ("I",), "SEND_F": ("F",), "SEND_B": ("B", "I")}.get(x.kind, ())
    if not need or any((x.stage, k, x.mb) in seen and seen[(x.stage, k, x.mb)] <= (r, step) for k in need):
        return []
    what = " or ".join(_NAMES[k] for k in need)
    later = [seen[(x.stage, k, x.mb)] for k in need if (x.stage, k, x.mb) in seen]
    when = f" (it comes later, at step {later[0][1]})" if later else ""
    kind = {"B": "backward_before_forward", "I": "backward_before_forward", "W": "weight_before_input"}.get(
        x.kind, "send_before_compute")
    return [ScheduleFinding(kind, [r], f"rank {r} step {step}: the {_NAMES[x.kind]} of stage {x.stage} micro-batch "
                            f"{x.mb} ({x}) before its {what}{when}", stage=x.stage, microbatch=x.mb, step=step)]


def _count_findings(s: int, seen, microbatches: int, stage_to_rank) -> list[ScheduleFinding]:
    rank = stage_to_rank.get(s)
    ranks = [] if rank is None else [rank]
    out = []
    fwd = {mb for (st, k, mb) in seen if st == s and k == "F"}
    missing = [mb for mb in range(microbatches) if mb not in fwd]
    if missing:
        out.append(ScheduleFinding("missing_microbatch", ranks, f"stage {s}{_on(rank)} runs no forward for "
                                   f"micro-batch{'es' if len(missing) > 1 else ''} {_list(missing)} (of "
                                   f"{microbatches})", stage=s, microbatch=missing[0]))
    full = {mb for (st, k, mb) in seen if st == s and k == "B"}
    inp = {mb for (st, k, mb) in seen if st == s and k == "I"}
    wgt = {mb for (st, k, mb) in seen if st == s and k == "W"}
    for mb in sorted(inp ^ wgt):
        out.append(ScheduleFinding("unbalanced_backward", ranks, f"stage {s}{_on(rank)} micro-batch {mb} has "
                                   f"{'I without W' if mb in inp else 'W without I'}: the split backward needs both",
                                   stage=s, microbatch=mb))
    if full or inp or wgt:  # a forward-only list has no backward at all: torch accepts it for eval
        nob = [mb for mb in range(microbatches) if mb not in full and mb not in inp]
        if nob and len(nob) < microbatches:
            out.append(ScheduleFinding("missing_microbatch", ranks, f"stage {s}{_on(rank)} runs no backward for "
                                       f"micro-batch{'es' if len(nob) > 1 else ''} {_list(nob)} (of "
                                       f"{microbatches})", stage=s, microbatch=nob[0]))
        for mb in sorted(full & inp):
            out.append(ScheduleFinding("duplicate_action", ranks, f"stage {s}{_on(rank)} micro-batch {mb} runs "
                                       f"both a full backward (B) and a split one (I/W)", stage=s, microbatch=mb))
    return out


def _comm_findings(actions, stage_to_rank, num_stages) -> list[ScheduleFinding]:
    """What `_PipelineScheduleRuntime` needs of a list with sends and receives."""
    out = []
    # (src rank, dst rank) -> what each end posts, in order: NCCL pairs point-to-point ops in posting order
    posted: dict[tuple[int, int], dict[str, list[tuple[Act, int, int]]]] = defaultdict(lambda: {"send": [], "recv": []})
    for r in sorted(actions):
        for step, a in enumerate(actions[r]):
            for x in () if a is None else a.leaves():
                if x.kind in COMMS and 0 <= x.stage < num_stages:
                    peer = _peer(x, stage_to_rank)
                    if peer is None:
                        out.append(ScheduleFinding("unmatched_send" if x.kind.startswith("SEND") else
                                                   "unmatched_recv", [r], f"rank {r} step {step}: {x} has no peer "
                                                   f"stage (stage {x.stage} is the "
                                                   f"{'last' if x.kind in ('SEND_F', 'RECV_B') else 'first'})",
                                                   stage=x.stage, microbatch=x.mb, step=step))
                    elif peer == r:
                        out.append(ScheduleFinding("self_p2p", [r], f"rank {r} step {step}: {x} transfers between "
                                                   f"two stages on rank {r}; the runtime passes that tensor locally "
                                                   f"and posts no send or receive", stage=x.stage, microbatch=x.mb,
                                                   step=step))
                    elif x.kind.startswith("SEND"):
                        posted[(r, peer)]["send"].append((x, r, step))
                    else:
                        posted[(peer, r)]["recv"].append((x, r, step))
    for (src, dst), sides in sorted(posted.items()):
        sends, recvs = sides["send"], sides["recv"]
        got = {_message(x) for x, _, _ in recvs}
        sent = {_message(x) for x, _, _ in sends}
        for x, _, step in sends:
            if _message(x) not in got:
                out.append(ScheduleFinding("unmatched_send", [src, dst], f"rank {src} step {step}: {x} sends to rank "
                                           f"{dst}, which posts no matching receive", stage=x.stage,
                                           microbatch=x.mb, step=step))
        for x, _, step in recvs:
            if _message(x) not in sent:
                out.append(ScheduleFinding("unmatched_recv", [src, dst], f"rank {dst} step {step}: {x} receives "
                                           f"from rank {src}, which posts no matching send", stage=x.stage,
                                           microbatch=x.mb, step=step))
        if got != sent:
            continue
        for n, ((xs, _, ss), (xr, _, sr)) in enumerate(zip(sends, recvs)):
            if _message(xs) != _message(xr):
                out.append(ScheduleFinding(
                    "p2p_order_mismatch", [src, dst], f"rank {src}'s send #{n + 1} to rank {dst} is {xs} (step {ss}) "
                    f"but rank {dst}'s receive #{n + 1} from rank {src} is {xr} (step {sr}): NCCL pairs them in "
                    f"posting order, so the wrong tensor arrives, or the sizes differ and both hang",
                    stage=xr.stage, microbatch=xr.mb, step=sr))
                break  # later pairs are shifted by this one
    return out


def _input_findings(x: Act, r: int, step: int, seen, stage_to_rank, num_stages) -> list[ScheduleFinding]:
    """A compute whose input comes from another rank needs its receive first; from the same rank, the producer."""
    if x.kind == "F":
        src, recv, producers = x.stage - 1, "RECV_F", ("F",)
    else:
        src, recv, producers = x.stage + 1, "RECV_B", ("B", "I")
    if not 0 <= src < num_stages:
        return []
    if stage_to_rank.get(src) == r:
        if any((src, k, x.mb) in seen and seen[(src, k, x.mb)] < (r, step) for k in producers):
            return []
        return [ScheduleFinding("local_input_order", [r], f"rank {r} step {step}: {x} uses the output of stage "
                                f"{src} micro-batch {x.mb}, which this rank computes only later or never",
                                stage=x.stage, microbatch=x.mb, step=step)]
    got = seen.get((x.stage, recv, x.mb))
    if got is not None and got < (r, step):
        return []
    return [ScheduleFinding("compute_before_recv", [r, stage_to_rank.get(src, r)], f"rank {r} step {step}: {x} "
                            f"runs before the {_NAMES[recv]} from stage {src} "
                            f"({'at step ' + str(got[1]) if got else 'never posted'})",
                            stage=x.stage, microbatch=x.mb, step=step)]


def _peer(x: Act, stage_to_rank: dict[int, int]) -> int | None:
    other = x.stage + 1 if x.kind in ("SEND_F", "RECV_B") else x.stage - 1
    return stage_to_rank.get(other)


def _message(x: Act) -> tuple[str, int, int | None]:
    """The transfer an op belongs to, named by its sending stage (both ends agree on it)."""
    if x.kind == "SEND_F":
        return ("act", x.stage, x.mb)
    if x.kind == "RECV_F":
        return ("act", x.stage - 1, x.mb)
    if x.kind == "SEND_B":
        return ("grad", x.stage, x.mb)
    return ("grad", x.stage + 1, x.mb)


def _on(rank: int | None) -> str:
    return "" if rank is None else f" (rank {rank})"


def _list(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:12])) + (f", ... ({len(xs)} in all)" if len(xs) > 12 else "")
