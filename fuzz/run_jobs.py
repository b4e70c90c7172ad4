"""The real-job fuzzer: real programs (fuzz/jobs.py) x injected faults x ranks x moments, sampled with a seed, each
run under `distdoctor run --inject` and scored in every mode.

    python fuzz/run_jobs.py --runs 40 --seed 1 [--programs ddp,tp] [--nproc 4,8] [--healthy 0.2] [--out runs.jsonl]
                            [--jobs 2] [--store DIR]
    python fuzz/run_jobs.py --scoreboard runs.jsonl        # the table (program x fault x mode), from a results file
    python fuzz/run_jobs.py --rescore DIR --out new.jsonl  # every stored run judged again by today's diagnose

`--jobs N` runs N jobs at once (each waits for its hang timeout most of its time); `--store DIR` keeps every
run's dumps and `run`'s output (DIR/SEED-I/), so that a later `--rescore DIR` can diagnose them again with the
code of that day: the dump modes are re-diagnosed, live and closing are judged again from the stored output.

A run is right in a mode when that mode's first finding names exactly the injected rank and its kind fits the
fault (FITS); a healthy run (no fault) is right when the mode has no finding. Modes:
- live: the verdict `run` printed while the job hung (only runs that hung before ending);
- closing: the verdict `run` printed at the end, and its closing line (`the job failed: rank R ...`) naming R alone;
- recorder, fr_pickle, fr_json: `diagnose` of the recorder's dumps alone, of Flight Recorder's pickles alone, of
  Flight Recorder's JSON dumps alone (DISTDOCTOR_FR_JSON=1 has each rank write them);
- mixed: `diagnose` of one dump a rank, the forms taken in turn (rank r's is form (r + a draw of the run) mod 3,
  or the next form it left), as a job whose ranks left different forms; scored only when two forms meet;
- fr_log, mixed_log: fr_pickle's and mixed's dumps with the job's console log (torchrun's, which every job
  leaves: how each rank ended), less the lines distdoctor itself wrote there (`run`'s and the recorder's, among
  them the injection's: a job without distdoctor has none).
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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = Path(__file__).resolve().parent / "jobs.py"
PROGRAMS = ("ddp", "fsdp", "hsdp", "tp", "pipeline", "moe", "dcp", "objects")
STEPS = 6
# fault class -> (spec template, finding kinds that fit it)
LOST = ("missing_dump", "missing_ranks", "crashed")
# a call one rank alone skipped or issued twice: the group's calls no longer line up
ODD_CALL = ("missing_ranks", "type_mismatch", "order_deadlock", "size_mismatch", "p2p_deadlock", "p2p_mismatch",
            "crashed", "missing_dump")
FAULTS = {
    "hang": ("hang:{r}@step={n}", ("missing_ranks", "missing_dump")),
    "sigkill": ("kill:{r}:SIGKILL@step={n}", LOST),
    "sigsegv": ("kill:{r}:SIGSEGV@step={n}", LOST),
    "sigterm": ("kill:{r}:SIGTERM@step={n}", LOST),
    "sigstop": ("kill:{r}:SIGSTOP@step={n}", ("missing_ranks", "missing_dump")),
    "raise": ("raise:{r}@step={n}", ("crashed",)),
    "exit": ("exit:{r}:3@step={n}", LOST),
    "skip": ("skip:{r}@call={k}", ODD_CALL),
    "twice": ("twice:{r}@call={k}", ODD_CALL),
    "crash": ("crash:{r}@call={k}", LOST),
    "gil": ("hang:{r}:gil@step={n}", ("missing_ranks", "missing_dump")),
    "slow": ("delay:{r}:0.5@step=1", ("straggler",)),  # from the first step on: late "consistently"
    "resize": ("resize:{r}@call={k}", ("size_mismatch", "crashed", "missing_ranks", "missing_dump")),
    "retype": ("retype:{r}@call={k}", ("dtype_mismatch", "crashed", "missing_ranks", "missing_dump")),
    "reroot": ("reroot:{r}@call={k}", ("root_mismatch", "crashed", "missing_ranks", "missing_dump")),
    "repeer": ("repeer:{r}@call={k}", ("p2p_mismatch", "p2p_deadlock", "crossed_p2p", "missing_ranks", "crashed",
                                      "missing_dump")),
}
# A call fault's missing_dump fits when it names that rank alone: Gloo can abort the faulty rank's process from
# C++ (no dump at all), and then what it did to the call died with it; that it left nothing is the true claim.
# programs that make calls of their own at the Python boundary, per step (DDP's and FSDP's are issued from C++ or
# by functional collectives, which the call-counted faults cannot reach; a pipeline's end stages send and receive
# 8 times a step, its middle ones 16)
CALLS = {"ddp": 1, "fsdp": 1, "hsdp": 1, "tp": 5, "pipeline": 8, "moe": 6, "dcp": 0, "objects": 4}
# the faults that change one argument, and the programs whose own calls have it (a root, a peer)
ARGUMENT = {"reroot": ("objects",), "repeer": ("pipeline",)}
MODES = ("live", "closing", "recorder", "fr_pickle", "fr_json", "mixed", "fr_log", "mixed_log")
FR_MODES = ("fr_pickle", "fr_json", "fr_log")  # Flight Recorder keeps no exception: a rank that raised reads as absent there
FR_FITS = {"raise": ("crashed", "missing_ranks", "missing_dump")}
# run's flags: dumps from healthy runs too; start-up (no collective yet) held to 60 s: a loaded host starts slowly;
# the hang thresholds are the suite's quick ones unless the campaign sets its own (--suspect-floor /
# --hang-timeout: a loaded machine needs run's default floor)
RUN_ARGS = ["--start-timeout", "60", "--kill-on-hang", "--kill-grace", "10", "--dump-on-exit"]
QUICK = {"suspect_floor": 2.0, "hang_timeout": 12.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fits_program(fault: str, program: str) -> bool:
    """Whether `program` has what `fault` needs: calls of its own to count, an argument to change."""
    return bool(CALLS[program] or "{k}" not in FAULTS[fault][0]) and program in ARGUMENT.get(fault, (program,))


def sample(rng: random.Random, programs, nprocs, healthy: float, faults=tuple(FAULTS)) -> dict:
    program = rng.choice(programs)
    nproc = rng.choice(nprocs)
    if rng.random() < healthy:
        return {"program": program, "nproc": nproc, "fault": "healthy", "spec": None, "rank": None}
    classes = [c for c in faults if fits_program(c, program)]
    fault = rng.choice(classes)
    rank = rng.randrange(nproc)
    spec = FAULTS[fault][0].format(r=rank, n=rng.randint(2, STEPS - 1), k=rng.randint(2, max(2, CALLS[program] * (STEPS - 1))))
    return {"program": program, "nproc": nproc, "fault": fault, "spec": spec, "rank": rank}


def run_one(case: dict, work: Path, timeout: float, store: Path | None = None, thresholds: dict = QUICK) -> dict:
    dumps = work / "dumps"
    cmd = [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps), *RUN_ARGS,
           "--suspect-floor", str(thresholds["suspect_floor"]), "--hang-timeout", str(thresholds["hang_timeout"])]
    if case["spec"]:
        cmd += ["--inject", case["spec"]]
    cmd += ["--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(case["nproc"]),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(JOBS), case["program"], str(STEPS)]
    env = dict(os.environ, OMP_NUM_THREADS="1", DISTDOCTOR_FR_JSON="1", FUZZ_CKPT=str(work / "ckpt"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p))
    t0 = time.monotonic()
    load = os.getloadavg()[0]
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
    meta = {"rc": proc.returncode, "wall_s": round(time.monotonic() - t0, 1), "load": round(load, 1),
            "commit": _commit(), **thresholds}
    if store is not None:
        _keep(store, case, meta, out, err, dumps)
    return judge_run(case, meta, out, dumps, err)


def judge_run(case: dict, meta: dict, out: str, dumps: Path, err: str = "") -> dict:
    """A run scored in every mode from what it left: `run`'s output and its dump directory."""
    result = {**case, **meta}
    truth_path = dumps / ".injected.json"
    truth = json.loads(truth_path.read_text()) if truth_path.exists() else {"fired": []}
    result["fired"] = [f.get("fault") for f in truth.get("fired", [])]
    result["modes"] = score_modes(case, out, dumps, err)
    if case["spec"] is None:  # healthy: exit 0, no hang, and no verdict with a finding
        blocks = _verdicts(out)
        result["modes"]["closing"] = {"ok": meta["rc"] == 0 and all(b[1] is None for b in blocks)
                                      and "HANG" not in out, "first": blocks[-1][1] if blocks else None}
    result["closing_line"] = next((ln for ln in out.splitlines() if ln.startswith("distdoctor run: the job failed")),
                                  None)
    if result["modes"].get("closing") and case["rank"] is not None and result["closing_line"]:
        result["modes"]["closing"]["line_names_only_it"] = _names_only(result["closing_line"], case["rank"])
    return result


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=False,
                              capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _keep(store: Path, case: dict, meta: dict, out: str, err: str, dumps: Path) -> None:
    """One stored run: its case, `run`'s output, and its dumps (what `--rescore` reads)."""
    where = store / case["id"]
    if dumps.exists():
        shutil.copytree(dumps, where / "dumps", dirs_exist_ok=True)
    where.mkdir(parents=True, exist_ok=True)
    (where / "case.json").write_text(json.dumps({"case": case, "meta": meta}))
    (where / "out.txt").write_text(out)
    (where / "err.txt").write_text(err[-200000:])


def rescore(store: Path) -> list[dict]:
    """Every run kept under `store`, judged again with today's diagnose and today's table."""
    results = []
    for where in sorted(store.glob("*/case.json")):
        kept = json.loads(where.read_text())
        err = where.parent / "err.txt"
        results.append(judge_run(kept["case"], kept["meta"], (where.parent / "out.txt").read_text(),
                                 where.parent / "dumps", err.read_text() if err.exists() else ""))
    return results


def _names_only(line: str, rank: int) -> bool:
    """The closing line names `rank` first and no other rank."""
    named = [int(n) for grp in re.findall(r"ranks? ([\d, -]+)", line) for n in re.findall(r"\d+", grp)]
    return bool(named) and named[0] == rank and set(named) == {rank}


FIRST = re.compile(r"^1\. (\w+): ranks \[([\d, ]*)\]")
ONE_OF = re.compile(r"^\s+one of ranks ([\d, -]+):")


def _verdicts(out: str) -> list[tuple[str, str | None]]:
    """(header line, first finding (kind, ranks) or None) for each verdict block `run` printed, in order. A first
    finding whose detail opens with "one of ranks ..." claims no more than one of those: they are its ranks."""
    blocks, current, opened = [], None, False
    for ln in out.splitlines():
        if ln.startswith("verdict: "):
            current, opened = [ln, None], False
            blocks.append(current)
        elif current is not None and current[1] is None and (m := FIRST.match(ln)):
            current[1], opened = (m.group(1), [int(x) for x in m.group(2).split(",") if x.strip()]), True
        elif opened and ln.strip():
            if m := ONE_OF.match(ln):
                current[1] = (current[1][0], _rank_list(m.group(1)))
            opened = False
    return blocks


def _rank_list(text: str) -> list[int]:
    """'0, 2' or '0-3' (findings.kinds.fmt_ranks) as a list."""
    ranks: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        ranks.update(range(int(lo), int(hi or lo) + 1))
    return sorted(ranks)


FORMS = {"recorder": "rank_*.jsonl", "fr_pickle": "rank_*.fr.pkl", "fr_json": ".fr-json/rank_*.fr.json"}


def job_log(err: str) -> str:
    """The job's console log as a job without distdoctor leaves it: the lines `run` and the recorder wrote there
    (the injection's among them) taken out."""
    return "".join(ln for ln in err.splitlines(keepends=True) if not ln.startswith("distdoctor"))


def score_modes(case: dict, out: str, dumps: Path, err: str = "") -> dict:
    blocks = _verdicts(out)
    hung = "HANG SUSPECTED" in out or "HANG CONFIRMED" in out
    modes: dict = {}
    if hung and blocks:
        modes["live"] = _judge(case, blocks[0][1])
    if blocks:
        modes["closing"] = _judge(case, blocks[-1][1])
    by_form = {form: _files(dumps, pattern) for form, pattern in FORMS.items()}
    for mode, files in by_form.items():
        if files:
            first, verdict = _diagnose(list(files.values()), case["nproc"])
            modes[mode] = {**_judge(case, first, mode), "verdict": verdict}
    log = job_log(err)
    if by_form["fr_pickle"] and log.strip():
        first, verdict = _diagnose(list(by_form["fr_pickle"].values()), case["nproc"], log)
        modes["fr_log"] = {**_judge(case, first, "fr_log"), "verdict": verdict}
    chosen = mixed_forms(by_form, case)
    if len(set(chosen.values())) > 1:
        files = [by_form[form][rank] for rank, form in sorted(chosen.items())]
        mode = chosen.get(case["rank"], "recorder")  # the injected rank's form says what its fault can read as
        for name, text in (("mixed", ""), ("mixed_log", log)):
            if name == "mixed" or text.strip():
                first, verdict = _diagnose(files, case["nproc"], text)
                modes[name] = {**_judge(case, first, mode), "verdict": verdict, "forms": chosen}
    return modes


def _files(dumps: Path, pattern: str) -> dict[int, Path]:
    """rank -> its dump of one form (rank_R.*), in the directory or a host-* directory under it."""
    found = {}
    for f in sorted(dumps.glob(pattern)) + sorted(dumps.glob("host-*/" + pattern)):
        m = re.match(r"rank_(\d+)\.", f.name)
        if m:
            found[int(m.group(1))] = f
    return found


def mixed_forms(by_form: dict[str, dict[int, Path]], case: dict) -> dict[int, str]:
    """Each rank's form in the mixed mode: form (rank + a draw of this run) mod 3, else the next it left."""
    names = list(FORMS)
    shift = sum(map(ord, case.get("id") or case["program"]))
    chosen = {}
    for rank in sorted({r for files in by_form.values() for r in files}):
        order = [names[(rank + shift + i) % len(names)] for i in range(len(names))]
        chosen[rank] = next(form for form in order if rank in by_form[form])
    return chosen


def _diagnose(files: list[Path], world_size: int, log: str = ""):
    """(the first finding, the verdict) of `diagnose --world-size N` on these files alone (in a directory of their
    own): the user knows the job's size, which Gloo's Flight Recorder dumps do not record. An `undecided` verdict
    (no dump holds a call) has no finding: wrong for an injected run, yet no false claim; the table counts it."""
    with tempfile.TemporaryDirectory() as tmp:
        for f in files:
            shutil.copy(f, Path(tmp) / f.name)
        if log:
            (Path(tmp) / "torchrun.log").write_text(log)
        proc = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", tmp, "--format", "json",
                               "--world-size", str(world_size)],
                              check=False, capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return ("error", []), "error"
    first = (report.get("findings") or [None])[0]
    if first is None:
        return None, report.get("verdict")
    hedged = first.get("evidence", {}).get("undecided") and first["evidence"].get("suspects")
    return (first["kind"], hedged or first["ranks"]), report.get("verdict")  # "one of" the suspects


def _judge(case: dict, first, mode: str = "") -> dict:
    if case["spec"] is None:
        return {"ok": first is None, "first": first}
    fits = FR_FITS.get(case["fault"], FAULTS[case["fault"]][1]) if mode in FR_MODES else FAULTS[case["fault"]][1]
    ok = first is not None and first[1] == [case["rank"]] and first[0] in fits
    return {"ok": ok, "first": first}


def _false_claim(r: dict, first) -> bool:
    """A claim the truth refutes: any finding on a healthy run, or a first finding naming none of the injected."""
    if first is None:
        return False
    return r["spec"] is None or r["rank"] not in first[1]


def _cell(got: list[int]) -> str:
    said = [f"{n} {what}" for n, what in ((got[2], "undecided"), (got[3], "false")) if n]
    return f"{got[0]}/{got[1]}" + (f" ({', '.join(said)})" if said else "")


def _fits_mode(mode: str, judged: dict, rank) -> str:
    """The mode whose fits judge this one: in the mixed mode, the form the injected rank's dump had."""
    forms = judged.get("forms") or {}
    return forms.get(rank, forms.get(str(rank), "recorder")) if mode in ("mixed", "mixed_log") else mode


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
    """Markdown: one row per (program, fault), right/scored per mode, and of the wrong ones how many said
    `undecided` (no claim) and how many were false claims (a finding on a healthy run, or a first finding that
    names none of the injected ranks); the totals last."""
    cells: dict = {}
    for r in results:
        if "modes" not in r or (r["spec"] and not r.get("fired")):
            continue
        for mode, judged in r["modes"].items():
            if r["spec"] is not None:  # judged again by today's table (results files outlive it)
                fits_of = _fits_mode(mode, judged, r["rank"])
                judged = {**judged, **_judge(r, tuple(judged["first"]) if judged.get("first") else None, fits_of)}
            ok = judged["ok"] and judged.get("line_names_only_it", True)
            for key in ((r["program"], r["fault"]), ("all", "injected" if r["spec"] else "healthy")):
                got = cells.setdefault(key, {}).setdefault(mode, [0, 0, 0, 0])
                got[0] += ok
                got[1] += 1
                got[2] += not ok and judged.get("verdict") == "undecided"
                got[3] += not ok and _false_claim(r, judged.get("first"))
    lines = ["| program | fault | " + " | ".join(MODES) + " |", "|---|---|" + "---|" * len(MODES)]
    for (program, fault), by_mode in sorted(cells.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        row = [_cell(by_mode[m]) if m in by_mode else "-" for m in MODES]
        lines.append(f"| {program} | {fault} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def _line(i: int, runs: int, case: dict, result: dict) -> str:
    wrong = [m for m, j in result.get("modes", {}).items() if not (j["ok"] and j.get("line_names_only_it", True))]
    said = ("error " + result["error"] if "error" in result else "wrong in " + ", ".join(wrong) if wrong
            else "right" if result.get("fired") or case["spec"] is None else "fault never fired")
    return (f"[{i}/{runs}] {case['id']} {case['program']} x{case['nproc']} {case['spec'] or 'healthy'}: {said}"
            f" ({result.get('wall_s', '?')} s, load {result.get('load', '?')})")


def campaign(args, cases: list[dict]) -> list[dict]:
    """Run the cases, `args.jobs` at a time; each result is printed and appended to `args.out` as it ends."""
    store = Path(args.store) if args.store else None
    lock = threading.Lock()
    results = []

    def one(case: dict) -> dict:
        with tempfile.TemporaryDirectory(prefix="fuzzjob") as work:
            result = run_one(case, Path(work), args.timeout, store,
                             {"suspect_floor": args.suspect_floor, "hang_timeout": args.hang_timeout})
            wrong = any(not (j["ok"] and j.get("line_names_only_it", True)) for j in result.get("modes", {}).values())
            if args.keep and (wrong or "error" in result) and (Path(work) / "dumps").exists():
                shutil.copytree(Path(work) / "dumps", Path(args.keep) / case["id"], dirs_exist_ok=True)
        with lock:
            results.append(result)
            print(_line(len(results), len(cases), case, result), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(result) + "\n")
        return result

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, cases))
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--faults", default=",".join(FAULTS), help="the fault classes to sample (FAULTS)")
    ap.add_argument("--nproc", default="4")
    ap.add_argument("--healthy", type=float, default=0.2, help="share of runs with no fault")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once")
    ap.add_argument("--suspect-floor", type=float, default=QUICK["suspect_floor"], help="run's --suspect-floor")
    ap.add_argument("--hang-timeout", type=float, default=QUICK["hang_timeout"], help="run's --hang-timeout")
    ap.add_argument("--out", default=None, help="append one JSON line per run here")
    ap.add_argument("--scoreboard", default=None, metavar="RESULTS", help="print the table of a results file")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the dumps of every run scored wrong here")
    ap.add_argument("--store", default=None, metavar="DIR", help="keep every run's dumps and output here")
    ap.add_argument("--rescore", default=None, metavar="DIR", help="judge every run stored in DIR again")
    args = ap.parse_args()
    if args.scoreboard:
        print(scoreboard([json.loads(ln) for ln in Path(args.scoreboard).read_text().splitlines() if ln.strip()]))
        return 0
    if args.rescore:
        if not Path(args.rescore).is_dir():
            print(f"run_jobs: --rescore {args.rescore}: not a directory", file=sys.stderr)
            return 2
        results = rescore(Path(args.rescore))
        if args.out:
            Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in results))
        print(scoreboard(results))
        return 0
    programs = [p for p in args.programs.split(",") if p]
    unknown = sorted(set(programs) - set(PROGRAMS))
    if unknown:
        print(f"run_jobs: unknown program(s) {', '.join(unknown)} (one of {', '.join(PROGRAMS)})", file=sys.stderr)
        return 2
    faults = [f for f in args.faults.split(",") if f]
    if sorted(set(faults) - set(FAULTS)):
        print(f"run_jobs: unknown fault(s) {', '.join(sorted(set(faults) - set(FAULTS)))} (one of {', '.join(FAULTS)})",
              file=sys.stderr)
        return 2
    programs = [p for p in programs if any(fits_program(f, p) for f in faults)]
    if not programs:
        print(f"run_jobs: no program has what {args.faults} needs", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    nprocs = [int(n) for n in args.nproc.split(",")]
    cases = [{**sample(rng, programs, nprocs, args.healthy, faults), "id": f"{args.seed}-{i + 1}"}
             for i in range(args.runs)]
    print(scoreboard(campaign(args, cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
