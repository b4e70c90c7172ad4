"""The real-job fuzzer: real programs (fuzz/jobs.py) x injected faults x ranks x moments, sampled with a seed, each
run under `distdoctor run --inject` and scored in every mode.

    python fuzz/run_jobs.py --runs 40 --seed 1 [--programs ddp,tp] [--nproc 4,8] [--healthy 0.2] [--out runs.jsonl]
    python fuzz/run_jobs.py --scoreboard runs.jsonl        # the table (program x fault x mode), from a results file

A run is right in a mode when that mode's first finding names exactly the injected rank and its kind fits the
fault (FITS); a healthy run (no fault) is right when the mode has no finding. Modes:
- live: the verdict `run` printed while the job hung (only runs that hung before ending);
- closing: the verdict `run` printed at the end, and its closing line (`the job failed: rank R ...`) naming R alone;
- recorder, fr_pickle, fr_json: `diagnose` of the recorder's dumps alone, of Flight Recorder's pickles alone, of
  Flight Recorder's JSON dumps alone (DISTDOCTOR_FR_JSON=1 has each rank write them).
A mode with no dump of its form (a killed rank writes none; gloo's Flight Recorder may hold nothing) is scored
on the dumps there are. The truth is `run`'s DUMP_DIR/.injected.json: a fault that never fired is not scored.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = Path(__file__).resolve().parent / "jobs.py"
PROGRAMS = ("ddp", "fsdp", "hsdp", "tp", "pipeline", "moe", "dcp", "objects")
STEPS = 6
# fault class -> (spec template, finding kinds that fit it)
LOST = ("missing_dump", "missing_ranks", "crashed")
FAULTS = {
    "hang": ("hang:{r}@step={n}", ("missing_ranks", "missing_dump")),
    "sigkill": ("kill:{r}:SIGKILL@step={n}", LOST),
    "sigsegv": ("kill:{r}:SIGSEGV@step={n}", LOST),
    "sigterm": ("kill:{r}:SIGTERM@step={n}", LOST),
    "sigstop": ("kill:{r}:SIGSTOP@step={n}", ("missing_ranks", "missing_dump")),
    "raise": ("raise:{r}@step={n}", ("crashed",)),
    "exit": ("exit:{r}:3@step={n}", LOST),
    "skip": ("skip:{r}@call={k}", ("missing_ranks", "type_mismatch", "order_deadlock", "size_mismatch",
                                  "p2p_deadlock", "p2p_mismatch", "crashed")),
    "resize": ("resize:{r}@call={k}", ("size_mismatch", "crashed", "missing_ranks")),
    "retype": ("retype:{r}@call={k}", ("dtype_mismatch", "crashed", "missing_ranks")),
}
# programs that make calls of their own at the Python boundary (DDP's and FSDP's are issued from C++ or by
# functional collectives, which the call-counted faults cannot reach)
CALLS = {"ddp": 1, "fsdp": 1, "hsdp": 1, "tp": 5, "pipeline": 0, "moe": 6, "dcp": 0, "objects": 4}  # per step
MODES = ("live", "closing", "recorder", "fr_pickle", "fr_json")
FR_MODES = ("fr_pickle", "fr_json")  # Flight Recorder keeps no exception: a rank that raised reads as absent there
FR_FITS = {"raise": ("crashed", "missing_ranks", "missing_dump")}
# healthy runs dump too; start-up (no collective yet, a group's first call) is held to 60 s, not 12: a loaded host
# starts slowly, and a fault at a group's first call is still caught well within a run's time limit
RUN_ARGS = ["--suspect-floor", "2", "--hang-timeout", "12", "--start-timeout", "60", "--kill-on-hang", "--dump-on-exit"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample(rng: random.Random, programs, nprocs, healthy: float) -> dict:
    program = rng.choice(programs)
    nproc = rng.choice(nprocs)
    if rng.random() < healthy:
        return {"program": program, "nproc": nproc, "fault": "healthy", "spec": None, "rank": None}
    classes = [c for c in FAULTS if CALLS[program] or not FAULTS[c][0].count("{k}")]
    fault = rng.choice(classes)
    rank = rng.randrange(nproc)
    spec = FAULTS[fault][0].format(r=rank, n=rng.randint(2, STEPS - 1), k=rng.randint(2, max(2, CALLS[program] * (STEPS - 1))))
    return {"program": program, "nproc": nproc, "fault": fault, "spec": spec, "rank": rank}


def run_one(case: dict, work: Path, timeout: float) -> dict:
    dumps = work / "dumps"
    cmd = [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps), *RUN_ARGS]
    if case["spec"]:
        cmd += ["--inject", case["spec"]]
    cmd += ["--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(case["nproc"]),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(JOBS), case["program"], str(STEPS)]
    env = dict(os.environ, OMP_NUM_THREADS="1", DISTDOCTOR_FR_JSON="1", FUZZ_CKPT=str(work / "ckpt"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        _kill_leftovers(dumps)  # ranks in sessions of their own hold the pipes open: communicate() would wait on
        out, err = proc.communicate()  # them forever
        return {**case, "error": f"timed out after {timeout} s", "stderr": err[-2000:]}
    finally:
        _kill_leftovers(dumps)
    result = {**case, "rc": proc.returncode, "wall_s": round(time.monotonic() - t0, 1)}
    truth_path = dumps / ".injected.json"
    truth = json.loads(truth_path.read_text()) if truth_path.exists() else {"fired": []}
    result["fired"] = [f.get("fault") for f in truth.get("fired", [])]
    result["modes"] = score_modes(case, out, dumps)
    if case["spec"] is None:  # healthy: exit 0, no hang, and no verdict with a finding
        blocks = _verdicts(out)
        result["modes"]["closing"] = {"ok": proc.returncode == 0 and all(b[1] is None for b in blocks)
                                      and "HANG" not in out, "first": blocks[-1][1] if blocks else None}
    result["closing_line"] = next((ln for ln in out.splitlines() if ln.startswith("distdoctor run: the job failed")),
                                  None)
    if result["modes"].get("closing") and case["rank"] is not None and result["closing_line"]:
        result["modes"]["closing"]["line_names_only_it"] = _names_only(result["closing_line"], case["rank"])
    return result


def _names_only(line: str, rank: int) -> bool:
    """The closing line names `rank` first and no other rank."""
    named = [int(n) for grp in re.findall(r"ranks? ([\d, -]+)", line) for n in re.findall(r"\d+", grp)]
    return bool(named) and named[0] == rank and set(named) == {rank}


FIRST = re.compile(r"^1\. (\w+): ranks \[([\d, ]*)\]")


def _verdicts(out: str) -> list[tuple[str, str | None]]:
    """(header line, first finding 'kind:ranks' or None) for each verdict block `run` printed, in order."""
    blocks, current = [], None
    for ln in out.splitlines():
        if ln.startswith("verdict: "):
            current = [ln, None]
            blocks.append(current)
        elif current is not None and current[1] is None and (m := FIRST.match(ln)):
            current[1] = (m.group(1), [int(x) for x in m.group(2).split(",") if x.strip()])
    return blocks


def score_modes(case: dict, out: str, dumps: Path) -> dict:
    blocks = _verdicts(out)
    hung = "HANG SUSPECTED" in out or "HANG CONFIRMED" in out
    modes: dict = {}
    if hung and blocks:
        modes["live"] = _judge(case, blocks[0][1])
    if blocks:
        modes["closing"] = _judge(case, blocks[-1][1])
    for mode, pattern in (("recorder", "rank_*.jsonl"), ("fr_pickle", "rank_*.fr.pkl"),
                          ("fr_json", ".fr-json/rank_*.fr.json")):
        files = sorted(dumps.glob(pattern)) + sorted(dumps.glob("host-*/" + pattern))
        if files:
            first, verdict = _diagnose(files, case["nproc"])
            modes[mode] = {**_judge(case, first, mode), "verdict": verdict}
    return modes


def _diagnose(files: list[Path], world_size: int):
    """(the first finding, the verdict) of `diagnose --world-size N` on these files alone (in a directory of their
    own): the user knows the job's size, which Gloo's Flight Recorder dumps do not record. An `undecided` verdict
    (no dump holds a call) has no finding: wrong for an injected run, yet no false claim; the table counts it."""
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            shutil.copy(f, Path(tmp) / f.name)
        proc = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", tmp, "--format", "json",
                               "--world-size", str(world_size)],
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return ("error", []), "error"
    first = (report.get("findings") or [None])[0]
    return ((first["kind"], first["ranks"]) if first else None), report.get("verdict")


def _judge(case: dict, first, mode: str = "") -> dict:
    if case["spec"] is None:
        return {"ok": first is None, "first": first}
    fits = FR_FITS.get(case["fault"], FAULTS[case["fault"]][1]) if mode in FR_MODES else FAULTS[case["fault"]][1]
    ok = first is not None and first[1] == [case["rank"]] and first[0] in fits
    return {"ok": ok, "first": first}


def _kill_leftovers(dumps: Path) -> None:
    """No rank of this run outlives it (torchrun starts each in its own session)."""
    needle = f"DISTDOCTOR_DUMP_DIR={dumps}\0".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read() + b"\0" and int(pid) != os.getpid():
                    os.kill(int(pid), 9)
        except OSError:
            continue


def scoreboard(results: list[dict]) -> str:
    """Markdown: one row per (program, fault), right/scored per mode (and how many of the wrong ones said
    `undecided` rather than a wrong claim); the totals last."""
    cells: dict = {}
    for r in results:
        if "modes" not in r or (r["spec"] and not r.get("fired")):
            continue
        for mode, judged in r["modes"].items():
            if r["spec"] is not None:  # judged again by today's table (results files outlive it)
                judged = {**judged, **_judge(r, tuple(judged["first"]) if judged.get("first") else None, mode)}
            ok = judged["ok"] and judged.get("line_names_only_it", True)
            for key in ((r["program"], r["fault"]), ("all", "injected" if r["spec"] else "healthy")):
                got = cells.setdefault(key, {}).setdefault(mode, [0, 0, 0])
                got[0] += ok
                got[1] += 1
                got[2] += not ok and judged.get("verdict") == "undecided"
    lines = ["| program | fault | " + " | ".join(MODES) + " |", "|---|---|" + "---|" * len(MODES)]
    for (program, fault), by_mode in sorted(cells.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        row = [f"{by_mode[m][0]}/{by_mode[m][1]}" + (f" ({by_mode[m][2]} undecided)" if by_mode[m][2] else "")
               if m in by_mode else "-" for m in MODES]
        lines.append(f"| {program} | {fault} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--nproc", default="4")
    ap.add_argument("--healthy", type=float, default=0.2, help="share of runs with no fault")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    ap.add_argument("--out", default=None, help="append one JSON line per run here")
    ap.add_argument("--scoreboard", default=None, metavar="RESULTS", help="print the table of a results file")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the dumps of every run scored wrong here")
    args = ap.parse_args()
    if args.scoreboard:
        print(scoreboard([json.loads(ln) for ln in Path(args.scoreboard).read_text().splitlines() if ln.strip()]))
        return 0
    programs = [p for p in args.programs.split(",") if p]
    unknown = sorted(set(programs) - set(PROGRAMS))
    if unknown:
        print(f"run_jobs: unknown program(s) {', '.join(unknown)} (one of {', '.join(PROGRAMS)})", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    results = []
    for i in range(args.runs):
        case = sample(rng, programs, [int(n) for n in args.nproc.split(",")], args.healthy)
        with tempfile.TemporaryDirectory(prefix="fuzzjob") as work:
            result = run_one(case, Path(work), args.timeout)
            wrong = [m for m, j in result.get("modes", {}).items()
                     if not (j["ok"] and j.get("line_names_only_it", True))]
            if args.keep and (wrong or "error" in result) and (Path(work) / "dumps").exists():
                shutil.copytree(Path(work) / "dumps", Path(args.keep) / f"{args.seed}-{i + 1}", dirs_exist_ok=True)
        results.append(result)
        print(f"[{i + 1}/{args.runs}] {case['program']} x{case['nproc']} {case['spec'] or 'healthy'}: "
              f"{'error ' + result['error'] if 'error' in result else 'wrong in ' + ', '.join(wrong) if wrong else 'right'}"
              f" ({result.get('wall_s', '?')} s)", flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(result) + "\n")
    print(scoreboard(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
