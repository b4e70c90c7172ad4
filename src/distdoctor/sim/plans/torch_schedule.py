"""torch.distributed.pipelining's own schedules, read from torch: the action lists it would run.

`schedule_actions(name, stages, microbatches, ranks)` instantiates torch's schedule class with stub stages
(what torch's own `_schedule_visualizer.get_schedule_ops` does with mocks) and reads its per-rank lists:
`pipeline_order_with_comms` where the class builds it (the runtime schedules: LoopedBFS, Interleaved1F1B, the
zero-bubble ones, DualPipeV), else `pipeline_order` lowered the way the runtime lowers a compute-only list
(`_PipelineScheduleRuntime._prepare_schedule_with_comms`: torch's `_add_send_recv` places each receive when its
sender's compute is scheduled). Schedule classes are discovered in the module, so a schedule a later torch adds
works without changes here. `lower_compute_only` lowers a compute-only list read from a CSV the same way.

torch is imported only here, and only when a torch schedule is asked for.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field

from distdoctor.errors import InputError
from distdoctor.sim.plans.schedule_actions import OTHER, Act, check_actions


@dataclass
class TorchSchedule:
    name: str  # torch's class name
    stages: int
    ranks: int
    microbatches: int
    stage_to_rank: dict[int, int]
    actions: dict[int, list[Act | None]]  # with sends and receives, as the runtime runs them
    lowered: bool  # True when distdoctor asked torch's runtime to add the sends and receives
    torch_version: str
    findings: list = field(default_factory=list)  # problems of a compute-only list (then not lowered)
    own_loop: bool = False  # a one-stage-per-rank class: torch runs its _step_microbatches, not this list


class _StubStage:
    """What a schedule's constructor reads of a stage; nothing runs (as torch's visualizer's mock)."""

    def __init__(self, index: int, num_stages: int, group_size: int):
        self.stage_index = index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = 0
        self.submod = None
        self.stage_index_to_group_rank: dict[int, int] = {}
        self.is_first = index == 0
        self.is_last = index == num_stages - 1


def _schedules_module():
    import torch.distributed.pipelining.schedules as schedules

    # torch logs "Using <schedule>" at INFO on construction; the report is ours
    logging.getLogger(schedules.__name__).setLevel(logging.WARNING)
    return schedules


def schedule_classes() -> dict[str, type]:
    """Concrete schedule classes torch ships, by short name (ScheduleInterleaved1F1B -> Interleaved1F1B)."""
    mod = _schedules_module()
    base = mod._PipelineSchedule
    hidden = {"PipelineScheduleSingle", "PipelineScheduleMulti", "_PipelineScheduleRuntime"}
    out = {}
    for name, cls in vars(mod).items():
        if (inspect.isclass(cls) and issubclass(cls, base) and not inspect.isabstract(cls)
                and cls.__module__ == mod.__name__ and name not in hidden and not name.startswith("_")):
            out[name.removeprefix("Schedule")] = cls
    return dict(sorted(out.items()))


def resolve(name: str) -> type:
    classes = schedule_classes()
    key = name.lower().removeprefix("schedule")
    for short, cls in classes.items():
        if short.lower() == key:
            return cls
    import torch

    raise InputError(name, f"unknown torch pipeline schedule (torch {torch.__version__} ships: "
                           f"{', '.join(classes)})")


def _convert(acts) -> list[Act | None]:
    out: list[Act | None] = []
    for a in acts:
        if a is None:
            out.append(None)
            continue
        subs = tuple(Act(s.stage_index, s.computation_type.value, s.microbatch_index) for s in a.sub_actions) \
            if a.sub_actions else None
        out.append(Act(a.stage_index, a.computation_type.value, a.microbatch_index, subs))
    return out


def to_torch_action(a: Act):
    mod = _schedules_module()
    subs = tuple(to_torch_action(s) for s in a.subs) if a.subs else None
    return mod._Action(a.stage, mod._ComputationType(a.kind), a.mb, subs)


def schedule_actions(name: str, stages: int, microbatches: int, ranks: int | None = None,
                     defer_recv: bool = False) -> TorchSchedule:
    """Instantiate torch's schedule `name` for `stages` stages (in all) on `ranks` ranks and read its lists."""
    import torch

    mod = _schedules_module()
    cls = resolve(name)
    single = issubclass(cls, mod.PipelineScheduleSingle)
    if stages < 1 or microbatches < 1:
        raise InputError("--stages/--microbatches", f"must be at least 1 (got {stages} and {microbatches})")
    if ranks is None:
        ranks = stages if single else max(1, stages // 2)
    if ranks < 1 or stages % ranks:
        raise InputError("--ranks", f"{stages} stages do not divide over {ranks} ranks")
    per_rank = stages // ranks
    if single and per_rank != 1:
        raise InputError("--stages", f"{cls.__name__} runs one stage per rank: use --stages {ranks} (got {stages} "
                                     f"stages on {ranks} ranks)")
    kwargs = {}
    if defer_recv:
        if "defer_pp_recv" not in inspect.signature(cls.__init__).parameters:
            raise InputError("--defer-recv", f"{cls.__name__} in torch {torch.__version__} has no defer_pp_recv")
        kwargs["defer_pp_recv"] = True
    stubs = [_StubStage(k * ranks, stages, ranks) for k in range(per_rank)]
    try:
        sched = cls(stubs[0] if single else stubs, microbatches, **kwargs)
    except (ValueError, AssertionError, RuntimeError) as exc:  # torch's own refusal of the combination
        raise InputError(cls.__name__, f"torch refuses {stages} stages on {ranks} ranks with {microbatches} "
                                       f"micro-batches: {_first_line(exc)}") from None
    with_comms = getattr(sched, "pipeline_order_with_comms", None)
    if with_comms:
        stage_to_rank = dict(sched.stage_index_to_group_rank)
        actions = {r: _convert(with_comms[r]) for r in sorted(with_comms)}
        lowered = False
    else:
        order = sched.pipeline_order
        if not order:
            raise InputError(cls.__name__, "builds no action list (pipeline_order) to simulate")
        actions = {r: _convert(order[r]) for r in sorted(order)}
        stage_to_rank = dict(getattr(sched, "stage_index_to_group_rank", None) or {s: s % ranks
                                                                                   for s in range(stages)})
        findings = check_actions(actions, stages, microbatches, stage_to_rank)
        if findings:  # torch's own list is unsound: report it rather than let torch's lowering raise
            return TorchSchedule(cls.__name__, stages, ranks, microbatches, stage_to_rank, actions, False,
                                 torch.__version__, findings, single)
        stage_to_rank, actions = lower_compute_only(actions, stages, ranks, microbatches, defer_recv)
        lowered = True
    return TorchSchedule(cls.__name__, stages, ranks, microbatches, stage_to_rank, actions, lowered,
                         torch.__version__, own_loop=single)


def lower_compute_only(actions: dict[int, list[Act | None]], stages: int, ranks: int, microbatches: int,
                       defer_recv: bool = False) -> tuple[dict[int, int], dict[int, list[Act | None]]]:
    """Add sends and receives to a compute-only list the way torch's runtime does (its own code). The list
    must already pass `schedule_actions.check_actions`; torch validates it again."""
    mod = _schedules_module()
    stubs = [_StubStage(k * ranks, stages, ranks) for k in range(max(1, stages // ranks))]
    kwargs = {"defer_pp_recv": True} if defer_recv else {}
    runtime = mod._PipelineScheduleRuntime(stubs, microbatches, **kwargs)
    # the runtime adds UNSHARD/RESHARD/REDUCE_GRAD itself and refuses them in a compute-only list
    torch_actions = {r: [to_torch_action(a) for a in acts if a is not None and a.kind not in OTHER]
                     for r, acts in actions.items()}
    try:
        runtime._prepare_schedule_with_comms(torch_actions)
    except (ValueError, AssertionError, RuntimeError) as exc:
        raise InputError("schedule", f"torch cannot add the sends and receives: {_first_line(exc)}") from None
    with_comms = runtime.pipeline_order_with_comms
    return dict(runtime.stage_index_to_group_rank), {r: _convert(with_comms[r]) for r in sorted(with_comms)}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
