"""`distdoctor sim torch-schedule`: a torch pipeline schedule (by class name, or torch's CSV form) as a program.

`load_schedule` reads the action lists (from torch's class, or a CSV file), checks them the way torch would
(`schedule_actions.check_actions`) and, when sound, builds the program the runtime would run
(`schedule_program.actions_to_program`). An unsound list comes back as findings, not a program: the command
prints them (one sentence each, with ranks, stage and micro-batch) and exits 1, as for a deadlock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.errors import InputError
from distdoctor.sim.ir import Program, check_program, read_text
from distdoctor.sim.plans.schedule_actions import (COMPUTE, Act, ScheduleFinding, check_actions, has_comms,
                                                   infer_stage_to_rank, read_csv, write_csv)
from distdoctor.sim.plans.schedule_program import ScheduleTiming, actions_to_program


@dataclass
class LoadedSchedule:
    name: str  # torch class name, or the CSV file's name
    origin: str  # "torch" | "csv"
    stages: int
    ranks: int
    microbatches: int
    stage_to_rank: dict[int, int]
    actions: dict[int, list[Act | None]]
    lowered: bool  # the sends and receives were added by torch's runtime lowering
    torch_version: str | None
    findings: list[ScheduleFinding] = field(default_factory=list)
    program: Program | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    own_loop: bool = False  # torch runs a hand-written step loop for this class, not its action list

    def info(self) -> dict:
        return {"schedule": self.name, "origin": self.origin, "torch_version": self.torch_version,
                "stages": self.stages, "ranks": self.ranks, "microbatches": self.microbatches,
                "stage_to_rank": {str(s): r for s, r in sorted(self.stage_to_rank.items())},
                "actions": sum(1 for acts in self.actions.values() for a in acts if a is not None),
                "comms_added_by_torch_lowering": self.lowered, "not_simulated": dict(sorted(self.skipped.items()))}

    def preface(self) -> str:
        where = "torch " + self.torch_version if self.torch_version else "a CSV file"
        per = ", ".join(f"rank {r}: {_stages(s for s, rr in self.stage_to_rank.items() if rr == r)}"
                        for r in sorted(set(self.stage_to_rank.values()))[:8])
        lowered = "; sends and receives added by torch's runtime lowering" if self.lowered else ""
        skipped = (f"; not simulated: {', '.join(f'{n} {k}' for k, n in sorted(self.skipped.items()))}"
                   if self.skipped else "")
        return (f"{self.name} from {where}: {self.stages} stages on {self.ranks} ranks ({per}), "
                f"{self.microbatches} micro-batches{lowered}{skipped}.")


def _stages(xs) -> str:
    xs = sorted(xs)
    return ("stage " if len(xs) == 1 else "stages ") + ", ".join(map(str, xs))


def load_schedule(name: str | None, csv_path: str | None, stages: int | None, microbatches: int | None,
                  ranks: int | None, timing: ScheduleTiming, comm_model: str = "nccl",
                  defer_recv: bool = False) -> LoadedSchedule:
    if (name is None) == (csv_path is None):
        raise InputError("torch-schedule", "give a schedule name (e.g. Interleaved1F1B) or --csv FILE, not both")
    if name is not None:
        from distdoctor.sim.plans.torch_schedule import resolve, schedule_actions

        resolve(name)  # an unknown name is the first thing wrong, before the sizes it would need
        if stages is None or microbatches is None:
            raise InputError(name, "--stages and --microbatches are needed to build a torch schedule")
        ts = schedule_actions(name, stages, microbatches, ranks, defer_recv)
        loaded = LoadedSchedule(ts.name, "torch", ts.stages, ts.ranks, ts.microbatches, ts.stage_to_rank,
                                ts.actions, ts.lowered, ts.torch_version, ts.findings, own_loop=ts.own_loop)
    else:
        loaded = _load_csv(Path(csv_path), stages, microbatches, ranks, defer_recv)
    if not loaded.findings:
        loaded.findings = check_actions(loaded.actions, loaded.stages, loaded.microbatches, loaded.stage_to_rank)
    if not loaded.findings:
        loaded.program, loaded.skipped = actions_to_program(loaded.actions, loaded.stage_to_rank, loaded.stages,
                                                            loaded.microbatches, timing, loaded.name, comm_model)
        check_program(loaded.program)  # the same checks as a user's plan file
    return loaded


def _load_csv(path: Path, stages: int | None, microbatches: int | None, ranks: int | None,
              defer_recv: bool) -> LoadedSchedule:
    actions = read_csv(read_text(path), path.name)
    if ranks is not None and ranks != len(actions):
        raise InputError(str(path), f"has {len(actions)} rows (ranks) but --ranks is {ranks}")
    leaves = [x for acts in actions.values() for a in acts if a is not None for x in a.leaves()]
    if not any(x.kind in COMPUTE for x in leaves):
        raise InputError(str(path), "holds no compute action (F, B, I or W)")
    stages = stages or max(x.stage for x in leaves) + 1
    microbatches = microbatches or max(x.mb for x in leaves if x.mb is not None) + 1
    stage_to_rank, findings = infer_stage_to_rank(actions)
    lowered = False
    torch_version = None
    if not findings and not has_comms(actions):
        # a compute-only list: torch's runtime adds the sends and receives (its own code does it)
        findings = check_actions(actions, stages, microbatches, stage_to_rank)
        if not findings:
            import torch

            from distdoctor.sim.plans.torch_schedule import lower_compute_only

            stage_to_rank, actions = lower_compute_only(actions, stages, len(actions), microbatches, defer_recv)
            lowered, torch_version = True, torch.__version__
    return LoadedSchedule(path.name, "csv", stages, len(actions), microbatches, stage_to_rank, actions, lowered,
                          torch_version, findings)


def dump_csv(loaded: LoadedSchedule, path: str) -> None:
    """torch's CSV form of the lists as simulated (with sends and receives: format="compute_comms")."""
    Path(path).write_text(write_csv(loaded.actions))


def findings_json(loaded: LoadedSchedule) -> dict:
    return {"valid": False, "torch_schedule": loaded.info(),
            "findings": [f.to_json() for f in loaded.findings]}


def findings_text(loaded: LoadedSchedule, top: int = 20) -> str:
    fs = loaded.findings
    kinds = sorted({f.kind for f in fs})
    out = [f"INVALID SCHEDULE: {len(fs)} problem(s) in {loaded.name} ({', '.join(kinds)}); torch's runtime would "
           f"reject it, hang, or pass the wrong tensors. Not simulated."]
    out += [f"  {f.kind}: {f.detail}." for f in fs[:top]]
    if len(fs) > top:
        out.append(f"  ... and {len(fs) - top} more (--format json lists all)")
    if loaded.own_loop:
        out.append(f"  Note: {loaded.name} runs its own step loop (_step_microbatches), not this list; the list is "
                   f"its pipeline_order, which torch's schedule tools (_simulate_comms_compute, the visualizer, "
                   f"_dump_csv) read.")
    return "\n".join(out)
