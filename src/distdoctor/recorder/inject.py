"""`distdoctor run --inject KIND:RANK[:ARG][@WHEN]`: plant a fault into any job at the torch.distributed boundary.

A drill: prove that the team's hang alerting (and distdoctor's verdict) names the right rank before production
does. The grammar is the one of validate's `--inject` (world/faults.py, RUN_KINDS); `run` hands the texts to
every process in DISTDOCTOR_INJECT (a JSON list), and the rank a fault names plants it:

- at a call (the wrappers of patch.py, one layer outside the recording one, so what the recorder records is what
  the rank did): skip it, issue it twice, change its size / dtype / root / peer, raise, exit, kill itself, stop
  (sleep forever, or hold the GIL forever), slow every call from then on, end a named thread;
- at an optimizer step (`@step=N`: torch.optim's global step hook), the kinds that need no call (raise, crash,
  exit, kill, hang, endthread) fire right there, outside any collective; the others at the next call;
- after T seconds (`@after=T`), kill, exit, crash, endthread and hang:gil fire from a timer thread; the others at
  the next call.

Before it acts, the rank writes what it does and where (the call's op, group and sequence number, the step, the
caller's file:line) to `.injected.rank_<r>.json` beside the dumps (hidden: it is no trace); `run` gathers them
into `.injected.json`, the truth a drill is scored against. Nothing here runs when no fault is configured:
patch.py installs this layer only when DISTDOCTOR_INJECT is set.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import inspect
import itertools
import json
import os
import signal
import sys
import threading
import time

from distdoctor.recorder.config import INJECT_ENV, warn
from distdoctor.recorder.dumpfile import write_atomic
from distdoctor.world.faults import CRASH_EXIT_CODE, KINDS, RUN_KINDS, Fault, parse_fault

TRUTH_FILE = ".injected.json"
RANK_TRUTH = ".injected.rank_{}.json"
MESSAGE = "distdoctor --inject {}: injected fault"
OUTSIDE = ("raise", "crash", "exit", "kill", "hang", "endthread")  # need no call: fire at a step boundary too
FROM_TIMER = ("crash", "exit", "kill", "endthread")  # can fire from a timer thread (and hang:gil)
ROOTED = ("broadcast", "reduce", "gather", "scatter")
PEERED = ("send", "recv", "isend", "irecv")
_tls = threading.local()


def faults_from_env() -> list[Fault]:
    raw = os.environ.get(INJECT_ENV)
    if not raw:
        return []
    try:
        texts = json.loads(raw)
        return [parse_fault(str(t), RUN_KINDS) for t in texts]
    except Exception as exc:
        warn(f"{INJECT_ENV}={raw[:200]!r} cannot be read ({exc}); no fault injected")
        return []


class _DoneWork:
    """What a skipped async call hands back: a Work that is already complete."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def get_future(self):
        import torch

        fut = torch.futures.Future()
        fut.set_result([])
        return fut


class _Armed:
    __slots__ = ("fault", "call", "group", "after", "step", "fired")

    def __init__(self, fault: Fault):
        when = dict(fault.when)
        self.fault = fault
        nth = fault.arg if KINDS[fault.kind].arg == "N" and isinstance(fault.arg, int) else None
        self.call = when.get("call", nth)
        self.group = when.get("group")
        self.after = when.get("after")
        self.step = when.get("step")
        self.fired = False


class Injector:
    def __init__(self, faults: list[Fault], c10d, recorder_getter):
        self.faults = faults
        self.c10d = c10d
        self.recorder = recorder_getter
        self.t0 = time.time()
        self.mine: list[_Armed] | None = None  # this rank's faults, once the rank is known
        self.rank: int | None = None
        self.calls = 0
        self.group_calls: dict[str, int] = {}
        self.step = 1
        self.fired: list[dict] = []
        self._lock = threading.RLock()
        self._signatures: dict[str, inspect.Signature] = {}
        self._step_hooked = False
        self._start_timer()

    # ---- whose faults ------------------------------------------------------------------------------------
    def _my_faults(self) -> list[_Armed]:
        if self.mine is not None:
            return self.mine
        rank = None
        try:
            if self.c10d.is_initialized():
                rank = self.c10d.get_rank()
        except Exception:
            rank = None
        if rank is None:
            env = os.environ.get("RANK")
            if env is None or not env.isdigit():
                return []  # not known yet: no process group, no launcher's RANK
            rank = int(env)
        self.rank = rank
        self.mine = [_Armed(f) for f in self.faults if f.rank == rank]
        return self.mine

    # ---- when ----------------------------------------------------------------------------------------------
    def _due(self, a: _Armed, outside: bool) -> bool:
        if a.fired and a.fault.kind != "delay":
            return False
        if a.after is not None and time.time() - self.t0 < a.after:
            return False
        if a.step is not None and self.step < a.step:
            return False
        if a.call is not None:
            count = self.group_calls.get(a.group, 0) if a.group is not None else self.calls
            if count < a.call:
                return False
        if outside:
            return a.fault.kind in OUTSIDE
        return True

    # ---- at a call -----------------------------------------------------------------------------------------
    def wrap(self, name: str, fn, describer):
        injector = self

        @functools.wraps(fn)
        def injected(*args, **kwargs):
            if getattr(_tls, "busy", False):
                return fn(*args, **kwargs)
            mine = injector._my_faults()
            if not mine:
                return fn(*args, **kwargs)
            if not injector._step_hooked:
                injector.hook_step()
            _tls.busy = True
            try:
                return injector._at_call(name, fn, describer, args, kwargs)
            finally:
                _tls.busy = False

        injected._distdoctor_original = getattr(fn, "_distdoctor_original", fn)
        return injected

    def _group_names(self, name, describer, args, kwargs) -> tuple[str | None, str | None] | None:
        """(name, description) of the call's group; None when this rank is no member (torch does nothing)."""
        c10d = self.c10d
        try:
            if name == "batch_isend_irecv":
                pg = args[0][0].group if args and args[0] else kwargs["p2p_op_list"][0].group
            else:
                pg = describer(*args, **kwargs).group
            pg = pg if pg is not None else c10d._world.default_pg
            if pg is None or pg is c10d.GroupMember.NON_GROUP_MEMBER:
                return None
            return str(c10d._get_process_group_name(pg)), str(getattr(pg, "group_desc", "") or "")
        except Exception:
            return None, None

    def _at_call(self, name, fn, describer, args, kwargs):
        names = self._group_names(name, describer, args, kwargs)
        if names is None:
            return fn(*args, **kwargs)
        with self._lock:
            self.calls += 1
            for key in {n for n in names if n}:
                self.group_calls[key] = self.group_calls.get(key, 0) + 1
            due = [a for a in self.mine if self._due(a, False) and (a.group is None or a.group in names)]
        for a in due:
            if a.fault.kind == "delay":
                if not a.fired:
                    a.fired = True
                    self._truth(a, "call", name, names)
                time.sleep(float(a.fault.arg))
                continue
            changed = self._apply(a, name, fn, args, kwargs, names)
            if changed is not None:
                return changed[0]
        return fn(*args, **kwargs)

    def _apply(self, a: _Armed, name, fn, args, kwargs, names):
        """Plant `a` on this call: (result,) when the call's outcome is decided here, None to go on."""
        kind = a.fault.kind
        if kind in ("reroot", "repeer", "resize", "retype"):
            new = self._changed_args(kind, name, fn, args, kwargs)
            if new is None:
                return None  # this call has nothing to change: the next one that has
            a.fired = True
            self._truth(a, "call", name, names, change=new[2])
            return (fn(*new[0], **new[1]),)
        a.fired = True
        self._truth(a, "call", name, names)
        if kind == "skip":
            return (self._skipped(name, args, kwargs),)
        if kind == "twice":
            first = fn(*args, **kwargs)
            if hasattr(first, "wait"):
                first.wait()
            return (fn(*args, **kwargs),)
        self._act(a, "call")
        return None

    # ---- what a fault does ----------------------------------------------------------------------------------
    def _act(self, a: _Armed, where: str) -> None:
        """The faults that need no call: raise, crash, exit, kill, hang, endthread."""
        kind, arg = a.fault.kind, a.fault.arg
        main = threading.current_thread() is threading.main_thread()
        if kind == "raise":
            raise RuntimeError(MESSAGE.format(a.fault))
        if kind == "crash":
            os._exit(CRASH_EXIT_CODE)
        if kind == "exit":
            if main and where != "timer":
                sys.exit(int(arg))
            os._exit(int(arg))
        if kind == "kill":
            os.kill(os.getpid(), getattr(signal, str(arg)))
            return  # SIGSTOP: it goes on once continued
        if kind == "hang":
            if arg == "gil":
                collections.deque(itertools.repeat(None), maxlen=0)  # a C loop that never lets the GIL go
            while True:
                time.sleep(3600)
        if kind == "endthread":
            end_thread(str(arg))

    def _skipped(self, name, args, kwargs):
        if name == "batch_isend_irecv":
            ops = args[0] if args else kwargs.get("p2p_op_list", [])
            return [_DoneWork() for _ in ops]
        bound = self._bind(name, args, kwargs)
        if bound is not None and bound.arguments.get("async_op"):
            return _DoneWork()
        if name in ("isend", "irecv"):
            return _DoneWork()
        if name == "recv" and bound is not None:
            return bound.arguments.get("src")
        return None

    def _bind(self, name, args, kwargs):
        fn = getattr(self.c10d, name, None)
        try:
            sig = self._signatures.get(name)
            if sig is None:
                sig = self._signatures[name] = inspect.signature(fn)
            bound = sig.bind(*args, **kwargs)
            return bound
        except (TypeError, ValueError):
            return None

    def _changed_args(self, kind, name, fn, args, kwargs):
        """(args, kwargs, what changed) for this call with its root / peer / size / dtype changed, or None."""
        bound = self._bind(name, args, kwargs)
        if bound is None:
            return None
        if kind in ("reroot", "repeer"):
            if name not in (ROOTED if kind == "reroot" else PEERED):
                return None
            change = self._move_root(bound)
        else:
            change = self._change_tensor(kind, bound)
        if change is None:
            return None
        return bound.args, bound.kwargs, change

    def _move_root(self, bound):
        c10d = self.c10d
        group = bound.arguments.get("group") or c10d._world.default_pg
        ranks = list(c10d.get_process_group_ranks(group))
        for key, global_ in (("group_src", False), ("group_dst", False), ("group_peer", False), ("src", True),
                             ("dst", True)):
            value = bound.arguments.get(key)
            if value is None:
                continue
            members = ranks if global_ else list(range(len(ranks)))
            if value not in members or len(members) < 2:
                return None
            me = self.rank if global_ else ranks.index(self.rank) if self.rank in ranks else None
            i = members.index(value)
            new = members[(i + 1) % len(members)]
            if self._is_p2p(bound) and new == me and len(members) > 2:  # a p2p peer is never this rank itself
                new = members[(i + 2) % len(members)]
            bound.arguments[key] = new
            return {key: [value, new]}
        return None

    @staticmethod
    def _is_p2p(bound) -> bool:
        return "tag" in bound.signature.parameters

    @staticmethod
    def _change_tensor(kind, bound):
        import torch

        chosen = None
        for key, value in bound.arguments.items():
            if isinstance(value, torch.Tensor):
                chosen = key  # the last tensor argument: the input of (output, input) signatures
        if chosen is None:
            return None
        t = bound.arguments[chosen]
        if kind == "resize":
            shape = list(t.shape) or [1]
            shape[0] += 1
            bound.arguments[chosen] = torch.zeros(shape, dtype=t.dtype, device=t.device)
            return {chosen: [list(t.shape), shape]}
        dtype = torch.float32 if t.dtype == torch.float64 else torch.float64
        bound.arguments[chosen] = t.detach().to(dtype)
        return {chosen: [str(t.dtype).replace("torch.", ""), str(dtype).replace("torch.", "")]}

    # ---- at a step, after a time ---------------------------------------------------------------------------
    def hook_step(self) -> None:
        """Count optimizer steps (torch.optim's global hook), once a process group exists: torch.optim cannot be
        imported while torch.distributed itself is being imported."""
        if self._step_hooked or not any(dict(f.when).get("step") for f in self.faults):
            return
        self._step_hooked = True
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except ImportError:
            warn("this torch has no optimizer step hook: @step faults fire at no step")
            return
        register_optimizer_step_post_hook(self._after_step)

    def _after_step(self, optimizer, args, kwargs) -> None:
        self.step += 1
        mine = self._my_faults()
        with self._lock:
            due = [a for a in mine if self._due(a, True) and a.step is not None]
        for a in due:
            a.fired = True
            self._truth(a, "step", None, None)
            self._act(a, "step")

    def _start_timer(self) -> None:
        if any(dict(f.when).get("after") and (f.kind in FROM_TIMER or f.arg == "gil") for f in self.faults):
            threading.Thread(target=self._timer, name="distdoctor-inject", daemon=True).start()

    def _timer(self) -> None:
        while True:
            mine = self._my_faults()
            with self._lock:
                due = [a for a in mine if a.after is not None and (a.fault.kind in FROM_TIMER or a.fault.arg == "gil")
                       and self._due(a, True)]
            for a in due:
                a.fired = True
                self._truth(a, "timer", None, None)
                self._act(a, "timer")
            if self.mine is not None and all(a.fired for a in mine if a.after is not None):
                return
            time.sleep(0.05)

    # ---- the truth ---------------------------------------------------------------------------------------
    def _truth(self, a: _Armed, where: str, op_name, names, change=None) -> None:
        """Write what is about to happen, before it happens (a killed rank writes nothing after)."""
        record = {"fault": str(a.fault), **a.fault.to_dict(), "fired_at": time.time(),
                  "after_s": round(time.time() - self.t0, 3), "where": where, "step": self.step,
                  "call_index": self.calls, "pid": os.getpid()}
        if op_name is not None:
            record["call"] = self._call_of(op_name, names)
        if change:
            record["change"] = change
        site = user_site()
        if site:
            record["site"] = site
        with self._lock:
            self.fired.append(record)
            body = json.dumps({"rank": self.rank, "fired": self.fired}, indent=1).encode()
        rec = self.recorder()
        dump_dir = rec.config.dump_dir if rec is not None else os.environ.get("DISTDOCTOR_DUMP_DIR")
        if not dump_dir:
            return
        try:
            os.makedirs(dump_dir, exist_ok=True)
            write_atomic(os.path.join(dump_dir, RANK_TRUTH.format(self.rank)), body)
        except OSError as exc:
            warn(f"cannot write the injection's record to {dump_dir}: {exc}")
        print(f"distdoctor.recorder: injecting {a.fault} on rank {self.rank} ("
              + (f"at {op_name} on group {names[0]}" if op_name else f"at step {self.step}" if where == "step"
                 else f"after {record['after_s']:g} s") + ")",
              file=sys.stderr, flush=True)

    def _call_of(self, op_name: str, names) -> dict:
        group = names[0] if names else None
        out: dict = {"op": op_name, "group": group}
        rec = self.recorder()
        if rec is not None and group is not None and op_name not in PEERED and op_name != "batch_isend_irecv":
            out["seq"] = rec.seq.get(group, 0) + 1  # the sequence number this call has (had) on its group
        return out


def user_site() -> str | None:
    """file:line of the innermost frame that is neither torch's nor ours."""
    f = sys._getframe(1)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith(here) or "/torch/" in name or name.startswith("<") or "/contextlib.py" in name
                or "/functools.py" in name):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return None


def end_thread(name: str) -> bool:
    """End the thread named `name` by raising SystemExit in it (at its next bytecode)."""
    for t in threading.enumerate():
        if t.name == name and t.ident is not None:
            done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(SystemExit))
            return done == 1
    warn(f"--inject endthread: no thread named {name!r} (threads: "
         f"{', '.join(sorted(t.name for t in threading.enumerate()))})")
    return False


def gather_truth(dump_dir: str, specs: list[str]) -> dict:
    """`run`'s record of a drill: the faults asked for and what each rank did, from its `.injected.rank_<r>.json`
    (merged into TRUTH_FILE, the per-rank files removed)."""
    import glob

    fired = []
    for path in sorted(glob.glob(os.path.join(glob.escape(dump_dir), RANK_TRUTH.format("*")))):
        try:
            with open(path) as f:
                fired.extend(json.load(f).get("fired") or [])
        except (OSError, ValueError, AttributeError):
            continue
    truth = {"inject": specs, "faults": [parse_fault(s, RUN_KINDS).to_dict() for s in specs],
             "fired": sorted(fired, key=lambda r: r.get("fired_at") or 0)}
    write_atomic(os.path.join(dump_dir, TRUTH_FILE), json.dumps(truth, indent=1).encode())
    for path in glob.glob(os.path.join(glob.escape(dump_dir), RANK_TRUTH.format("*"))):
        try:
            os.unlink(path)
        except OSError:
            pass
    return truth


_injector: Injector | None = None


def install(c10d, wrappers: dict, describers: dict, recorder_getter) -> None:
    """Wrap `wrappers` (name -> the recording wrapper) in place with the injection layer, when faults are set."""
    global _injector
    faults = faults_from_env()
    if not faults:
        return
    if _injector is None:
        _injector = Injector(faults, c10d, recorder_getter)
    init = wrappers.get("init_process_group")
    if init is not None:
        wrappers["init_process_group"] = _after_init(init, _injector)
    for name in list(wrappers):
        if name in describers or name == "batch_isend_irecv":
            describer = describers.get(name, (None,))[0]
            wrappers[name] = _injector.wrap(name, wrappers[name], describer)


def _after_init(init, injector: Injector):
    @functools.wraps(init)
    def init_process_group(*args, **kwargs):
        result = init(*args, **kwargs)
        injector.hook_step()
        return result

    init_process_group._distdoctor_original = getattr(init, "_distdoctor_original", init)
    return init_process_group
