"""Build (and run) examples/lab05_distributed_validation.ipynb from the cells below.

The notebook is the distributed-validation lab (shared/seeds/lab05-distributed-training-validation.txt) done
with distdoctor on real processes: every exercise that the lab simulated on one device runs here on 2-4 local
ranks over gloo (NCCL with one GPU per rank where there are enough GPUs). Edit the cells here, then

    python examples/lab05_build.py            # writes the notebook and executes it in place (outputs saved)
    python examples/lab05_build.py --no-run   # writes it without outputs

The test suite executes the committed notebook with nbclient (tests/foundation/test_lab05_notebook.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "lab05_distributed_validation.ipynb"

CELLS: list[tuple[str, str]] = [
    ("md", """# Lab 05, done for real: distributed training validation with distdoctor

The original lab (*Distributed Training Validation: NCCL/RCCL, multi-GPU communication, scaling, hang
detection*) runs most exercises in **simulation mode**: a loop that adds tensors stands in for AllReduce, a
formula stands in for bandwidth, `time.sleep(0.001)` stands in for a collective. Here every exercise runs on
**real worker processes** with `torch.distributed` (gloo on CPU, NCCL on GPUs) through distdoctor, so each
check can actually fail, and when it does it names the rank.

| exercise | the lab | here |
|---|---|---|
| 5.1 AllReduce correctness | sums a Python list | `validate`: every rank's result against an exact float64 reference, on 4 ranks |
| 5.2 real AllReduce | shows the code pattern | the lab's worker on 4 ranks; a rank that dies is named, nothing hangs |
| 5.3 bandwidth table | a formula with 600 GB/s NVLink | `bench`: measured algbw/busbw, nccl-tests' table and JSON |
| 5.4 scaling efficiency | an `O(log N)` model | `scaling`: DDP measured on 1 and 2 ranks, then projected |
| 5.5 health checker | lists of tensors | `HealthMonitor` on a real DDP run; a NaN planted on rank 1 |
| 5.6 debugging playbook | a text | a real hang recorded and explained; a lost rank; a straggler |
| 5.7 DP vs DDP | a comparison table | `parity`: DDP (plain, accumulated, no_sync) against one process |

Runs in about a minute on a 2-core CPU machine (4 gloo ranks, oversubscribed)."""),
    ("code", """import json, os, subprocess, sys, tempfile, textwrap, time

import torch

from distdoctor.world.env import collect_env, format_env
from distdoctor.world import WorldConfig, run_job

T0 = time.time()
env = collect_env()
print(format_env(env))
N = 4  # ranks for the collective exercises: local processes, gloo on CPU (NCCL where >= 4 GPUs)
world = WorldConfig(nproc=N, timeout_s=30)  # every collective under a 30 s timeout: nothing can hang"""),

    ("md", """## Exercise 5.1: AllReduce correctness, on real ranks

The lab averages four random tensors in one process and compares with `torch.stack(...).mean()`: both sides
are the same arithmetic, so it cannot fail. `distdoctor validate` runs the real `dist.all_reduce` (sum and
avg, the gradient-averaging case) on 4 processes, 1 Mi float32 elements (4 MiB) per rank, regenerates every
rank's input on every rank and checks each output against an exact float64 reference, and compares the
output bytes across ranks (*all GPUs get the same result*)."""),
    ("code", """from distdoctor.validate import ValidateOptions, run_validate
from distdoctor.report.validate_text import print_validate

# straggler_s: on a busy 2-core machine a rank can arrive 0.1 s late by chance; stragglers are 5.6's topic
opts = ValidateOptions(ops=("all_reduce",), dtypes=("float32",), sizes="1M", redops=("sum", "avg"), subgroups=False,
                       straggler_s=1.0)
report = run_validate(world, opts)
for r in report["results"]:
    print(f"all_reduce {r['redop']:<3} {r['dtype']} count={r['count']}: max |err| {r['max_abs_err']:.2g} "
          f"(tolerance {r['tolerance']:.2g}), ranks agree: {r['ranks_agree']} -> {r['status'].upper()}")
print(report["passed"] and "PASS" or "FAIL")"""),
    ("md", """A check that cannot fail proves nothing. Plant a fault: rank 2 perturbs one element of its output after
every call. The result check and the cross-rank hash both catch it, and the verdict names rank 2."""),
    ("code", """bad = run_validate(world, ValidateOptions(ops=("all_reduce",), dtypes=("float32",), sizes="1M",
                                          redops=("sum", "avg"), subgroups=False, straggler_s=1.0,
                                          inject=("corrupt:2",)))
print_validate(bad)
assert not bad["passed"] and [c["rank"] for c in bad["culprits"] if "wrong result" in c["why"][0]] == [2]"""),

    ("md", """## Exercise 5.2: the lab's real AllReduce worker, on 4 processes

The lab only prints this code when there is one GPU. distdoctor's `run_job` starts the ranks (torch's own
elastic launcher), runs the function in each, and brings back what each returned: no `MASTER_PORT` to pick,
no queue to drain."""),
    ("code", """def allreduce_worker(ctx):
    import torch.distributed as dist
    tensor = torch.ones(1024, device=ctx.device) * (ctx.rank + 1)
    expected = ctx.world_size * (ctx.world_size + 1) / 2
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return {"expected": expected, "actual": tensor[0].item()}

res = run_job("__main__:allreduce_worker", {}, world)
for rank, r in sorted(res.results.items()):
    print(f"Rank {rank}: expected={r['expected']}, got={r['actual']}, {'PASS' if r['expected'] == r['actual'] else 'FAIL'}")"""),
    ("md", """What the lab cannot show: a rank that dies mid-job. With a plain `mp.spawn` the others wait in
`all_reduce` forever. Under `run_job` every collective runs under the timeout, and the report names the lost
rank, how it ended and the collective it was in."""),
    ("code", """def dying_worker(ctx):
    import torch.distributed as dist
    t = torch.ones(8)
    with ctx.phase("warm-up all_reduce"):
        dist.all_reduce(t)
    if ctx.rank == 3:
        os._exit(9)  # the rank dies: a segfault, an OOM kill, a lost node
    with ctx.phase("gradient all_reduce of step 1"):
        dist.all_reduce(t)
    return "done"

t = time.time()
res = run_job("__main__:dying_worker", {}, WorldConfig(nproc=N, timeout_s=5))
for lost in res.lost:
    print("lost:", lost.describe())
print(f"ok={res.ok}; the survivors stopped after {time.time() - t:.0f} s")"""),

    ("md", """## Exercise 5.3: the bandwidth table, measured

The lab computes bandwidth from an assumed 600 GB/s. `distdoctor bench` times the real call with nccl-tests'
semantics: algbw = size / time, busbw = algbw x 2(n-1)/n for all_reduce, the time of the slowest rank, and
`#wrong` elements checked after timing. On CPU processes over gloo the numbers are small; on a GPU node they
are the ones to compare with nccl-tests (the output diffs against it; `-J` writes its JSON)."""),
    ("code", """from distdoctor.bench import BenchOptions, format_table, run_bench

bopts = BenchOptions(op="all_reduce", minbytes=1 << 10, maxbytes=4 << 20, stepfactor=4, iters=10, warmup=2)
bench = run_bench(world, bopts)
print(format_table(bench, bopts))
for row in bench["rows"]:  # the bus factor, checked on the measured rows
    assert abs(row["busbw_gbps"] - row["algbw_gbps"] * 2 * (N - 1) / N) < 1e-12"""),
    ("code", """import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from IPython.display import Image, display

sizes = [r["size_bytes"] for r in bench["rows"]]
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(sizes, [r["busbw_gbps"] for r in bench["rows"]], "o-", label="busbw")
ax.plot(sizes, [r["algbw_gbps"] for r in bench["rows"]], "s--", label="algbw")
ax.set_xscale("log", base=2); ax.set_yscale("log"); ax.set_xlabel("message size (B)"); ax.set_ylabel("GB/s")
ax.set_title(f"all_reduce on {N} {bench['backend']} ranks (measured)"); ax.legend(); fig.tight_layout()
png = os.path.join(tempfile.mkdtemp(), "bw.png"); fig.savefig(png, dpi=80); plt.close(fig)
display(Image(filename=png))"""),

    ("md", """## Exercise 5.4: scaling efficiency, measured

The lab models communication as `log2(n)/n` of the compute. `distdoctor scaling` trains a small MLP with DDP
on 1 and 2 ranks, weak (fixed batch per rank) and strong (fixed global batch), and measures samples/s,
the all-reduce time not hidden behind backward, and efficiency = samples/s at n / (n x one process). It then
fits an alpha-beta all-reduce model to bench rows measured in the same job and projects to 1024 ranks
(marked projected, never mixed with the measured points). On 2 CPU cores efficiency is low by
construction (gloo over loopback, ranks sharing the cores): the point is the method; `max_ranks` is the
number of GPUs on a GPU node."""),
    ("code", """from distdoctor.health.scaling import render_text, run_scaling

scaling = run_scaling(WorldConfig(timeout_s=60), max_ranks=2, batch=16, global_batch=64, layers=2, hidden=128,
                      steps=3, warmup=1)
print(render_text(scaling))"""),

    ("md", """## Exercise 5.5: the health checker, on a real DDP run

The lab's `DistributedHealthChecker` compares tensors in one list. distdoctor's `HealthMonitor` runs inside
each rank of a DDP job: every few steps it compares replica fingerprints across ranks (gradient and parameter
consistency), follows the loss trend, times every rank (stragglers) and watches memory; on a NaN it finds the
first module, rank and step where it appeared. The demo trains a tiny MLP on 2 ranks; at step 3 rank 1's
`fc2` output becomes NaN."""),
    ("code", """healthy = run_job("distdoctor.health.demo:run_demo", {"steps": 10, "every": 5}, WorldConfig(nproc=2, timeout_s=60))
summary = healthy.results[0]
print(summary["table"])"""),
    ("code", """nan = run_job("distdoctor.health.demo:run_demo", {"steps": 12, "every": 4, "inject": ["nan:1:fc2"]},
              WorldConfig(nproc=2, timeout_s=60))
print(nan.results[0]["table"])"""),

    ("md", """## Exercise 5.6: the debugging playbook, run

**Training hangs: are all ranks stuck, or just some?** (the playbook's step 1). A real two-rank job under
`distdoctor run`: rank 1 is stuck in its data loader while rank 0 waits in `all_reduce`. The recorder sees
that no collective completes for 2 s, every rank dumps what it was doing with the Python stacks of all its
threads, and `diagnose` names the rank that never arrived, the collective the other waits in, and the line.
(`init_process_group(timeout=...)`, the playbook's step 3, ends the job a few seconds later.)"""),
    ("code", """import signal

job = tempfile.mkdtemp()
TRAIN = '''
import time
from datetime import timedelta
import torch, torch.distributed as dist

def load_batch(rank):
    if rank == 1:
        time.sleep(12)                  # a stuck data loader (a dead NFS mount, a hung worker)
    return torch.ones(4)

dist.init_process_group("gloo", timeout=timedelta(seconds=5))
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)                      # step 0: both ranks
grads = load_batch(rank)
dist.all_reduce(grads)                  # step 1: rank 0 waits here for rank 1
'''
with open(os.path.join(job, "train.py"), "w") as f:
    f.write(TRAIN)
from distdoctor.world import free_port

cmd = [sys.executable, "-m", "distdoctor", "run", "--dump-dir", os.path.join(job, "dumps"), "--hang-timeout", "2",
       "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
       "--master-port", str(free_port()), os.path.join(job, "train.py")]
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=job, start_new_session=True)
try:
    out, err = proc.communicate(timeout=90)
finally:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # never leave the job behind
# run prints its verdicts on stdout (the first one while the job still runs) and its own notes on stderr,
# after torchrun's report
text = out.strip()
second = text.find("verdict: ", text.find("verdict: ") + 1)  # the closing report repeats the first's findings
print(text[:second if second > 0 else None].strip()[:2500])
print("\\n".join(line for line in err.splitlines() if line.startswith("distdoctor run:")))"""),
    ("md", """**A rank fails, skips a collective, or straggles.** `validate` shows what these look like across ranks, each
within the timeout: a rank planted to crash before its 3rd collective is named with that collective; a rank
that skips its 2nd collective (the playbook's step 4, `if rank == 0: dist.all_reduce(x)`) is named by the gap
in its sequence of calls; a rank planted to arrive 0.3 s late is named as a straggler while every result
stays correct."""),
    ("code", """small = dict(ops=("all_reduce",), dtypes=("float32",), sizes="1", subgroups=False)
t = time.time()
crash = run_validate(WorldConfig(nproc=N, timeout_s=5), ValidateOptions(**small, inject=("crash:3:3",)))
print(f"crash ({time.time() - t:.0f} s):", *[f"rank {l['rank']} {l['reason']} in {l['in_op']}" for l in crash["lost"]])
t = time.time()
skip = run_validate(WorldConfig(nproc=2, timeout_s=3), ValidateOptions(**small, inject=("skip:1:2",)))
print(f"skip ({time.time() - t:.0f} s):", *[f"rank {c['rank']}: {c['why'][0]}" for c in skip["culprits"]])
slow = run_validate(world, ValidateOptions(**{**small, "ops": ("all_reduce", "broadcast")}, inject=("delay:1:0.3",)))
print("stragglers:", [(s["rank"], s["median_late_s"]) for s in slow["stragglers"]], "| failed checks:",
      slow["counts"]["fail"])"""),
    ("md", """**Loss diverges (NaN/Inf)**: exercise 5.5 names the module, rank and step. **Scaling efficiency < 70%**:
exercise 5.3 isolates the communication bandwidth, 5.4 the all-reduce time that backward does not hide;
`bench --links` (across hosts) names the host with a slow link."""),

    ("md", """## Exercise 5.7: DataParallel vs DistributedDataParallel

"DDP tests verify gradient consistency across ranks and loss convergence parity": `distdoctor parity` trains
the same model K steps as one process on the whole batch and as DDP on 2 ranks (plain, with gradient
accumulation, with `no_sync`), in float64, and compares every parameter on every rank. `nn.DataParallel` is
compared too where there are >= 2 GPUs; on a CPU machine it is reported as skipped, not passed. A planted
drift on rank 1 shows the check failing."""),
    ("code", """from distdoctor.health.parity import render_text as parity_text, run_parity

two = WorldConfig(nproc=2, timeout_s=60)
print(parity_text(run_parity(two, steps=4, batch=None, accum=2, seed=0, lr=0.1, rtol=1e-10, atol=1e-12, inject=None)))
drift = run_parity(two, steps=4, batch=None, accum=2, seed=0, lr=0.1, rtol=1e-10, atol=1e-12, inject="drift:1")
print("with drift:1 ->", "PASS" if drift["passed"] else "FAIL", [r["failing_ranks"] for r in drift["runs"]][:3])"""),

    ("md", """## Summary

| question | answer, with the command that checks it |
|---|---|
| How do you validate AllReduce? | every rank against an exact reference, outputs compared across ranks: `distdoctor validate` |
| How do you detect a comm bottleneck? | busbw per size against a baseline: `distdoctor bench --baseline FILE`; the slow host: `--links` |
| How do you debug a multi-node hang? | record and explain it: `distdoctor run -- torchrun ...`, then `distdoctor diagnose` |
| What defines good scaling? | measured weak/strong efficiency and exposed all-reduce: `distdoctor scaling` |
| DDP vs DP? | parameters equal to one process, on every rank: `distdoctor parity` |
| All of it on a new machine? | `distdoctor check` (add `--html report.html` for a page to share) |"""),
    ("code", """print(f"lab done in {time.time() - T0:.0f} s")"""),
]


def build() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in CELLS]
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 600) -> float:
    from nbclient import NotebookClient

    start = time.time()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return time.time() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-run", action="store_true")
    args = ap.parse_args()
    nb = build()
    if not args.no_run:
        print(f"executed in {execute(nb, HERE):.0f} s", file=sys.stderr)
    nbformat.write(nb, NOTEBOOK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
