"""validate/bench/check join worlds started by SLURM's srun and by OpenMPI / MPICH mpirun, not only torchrun.

The launcher detection and the node-list grammar are checked on the variables each launcher sets (srun's were
read from a real slurmd 22.05 step: SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_ID,
SLURM_STEP_NUM_TASKS, SLURM_STEP_NUM_NODES, SLURM_STEP_TASKS_PER_NODE, SLURM_STEP_NODELIST; its batch script
has SLURM_PROCID=0 and SLURM_NTASKS but no step). Real worlds: `mpirun` from Debian's openmpi-bin, Hydra's
`mpiexec` from mpich, and processes started here with exactly the variables srun gives its tasks.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from distdoctor.errors import InputError
from distdoctor.world.launchers import (Launch, derived_port, detect, expand_nodelist, expand_tasks_per_node,
                                  rendezvous)
from distdoctor.world import free_port

from world_helpers import job_env, run

# ---------------------------------------------------------------------------------------------- node lists


@pytest.mark.parametrize("text,hosts", [
    ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
    ("node7", ["node7"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),  # the lower bound's padding is kept
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("dgx-a100-[001-002].cluster", ["dgx-a100-001.cluster", "dgx-a100-002.cluster"]),
    ("x[3],y[5,1]", ["x3", "y5", "y1"]),  # order as written, nothing sorted
    (" n[1-2] ", ["n1", "n2"]),
])
def test_nodelist_grammar(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text,why", [
    ("gpu[04-01]", "runs backwards"),
    ("gpu[01-04", "unclosed"),
    ("gpu01-04]", "without '['"),
    ("gpu[a-b]", "not a number or a range"),
    ("gpu[[1-2]]", "nested"),
    ("", "empty node list"),
    ("gpu[1-99999999]", "too long"),
    ("gpu 01", "characters a host name cannot have"),
])
def test_nodelist_grammar_errors(text, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        expand_nodelist(text)


def test_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("8") == [8]
    with pytest.raises(ValueError):
        expand_tasks_per_node("2(3)")


# ---------------------------------------------------------------------------------------------- detection

def srun_env(rank: int, ntasks: int = 4, nodes: str = "gpu[01-02]", per_node: str = "2(x2)", job: str = "4242",
             step: str = "0") -> dict:
    """The variables srun sets in task `rank` (block distribution: tasks fill a node before the next)."""
    counts = expand_tasks_per_node(per_node)
    node, first = 0, 0
    while rank >= first + counts[node]:
        first += counts[node]
        node += 1
    return {"SLURM_JOB_ID": job, "SLURM_STEP_ID": step, "SLURM_STEPID": step, "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank - first), "SLURM_NODEID": str(node), "SLURM_NTASKS": str(ntasks),
            "SLURM_NPROCS": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_STEP_NUM_NODES": str(len(counts)),
            "SLURM_NNODES": str(len(counts)), "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_TASKS_PER_NODE": per_node,
            "SLURM_STEP_NODELIST": nodes, "SLURM_JOB_NODELIST": nodes, "SLURM_NODELIST": nodes}


def test_detect_srun():
    launch = detect(srun_env(3))
    assert (launch.kind, launch.rank, launch.world_size, launch.local_rank, launch.local_world_size,
            launch.node_rank, launch.nnodes) == ("slurm", 3, 4, 1, 2, 1, 2)
    assert launch.nodelist == ("gpu01", "gpu02") and launch.job_id == "4242.0" and not launch.single_node


def test_the_batch_script_and_a_one_task_step_are_not_worlds():
    batch = {k: v for k, v in srun_env(0).items() if k not in ("SLURM_STEP_ID", "SLURM_STEPID")}
    assert detect(batch) is None  # SLURM_PROCID=0 and SLURM_NTASKS=4, but no srun step
    assert detect(srun_env(0, step="4294967294")) is None  # the batch step's id
    assert detect(srun_env(0, ntasks=1, per_node="1", nodes="gpu01")) is None


def test_detect_openmpi_and_mpich_even_inside_a_slurm_allocation():
    inside = {k: v for k, v in srun_env(0).items() if k not in ("SLURM_STEP_ID", "SLURM_STEPID")}
    ompi = {**inside, "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "77"}
    launch = detect(ompi)
    assert (launch.kind, launch.rank, launch.world_size, launch.local_rank, launch.job_id) == ("openmpi", 2, 4, 0, "77")
    assert launch.nodelist[0] == "gpu01"  # the allocation's node list still names rank 0's host
    hydra = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    launch = detect(hydra)
    assert (launch.kind, launch.rank, launch.world_size, launch.local_rank, launch.single_node) == \
        ("mpich", 1, 2, 1, True)


def test_detect_torchrun_first():
    env = {**srun_env(1), "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"}
    assert detect(env).kind == "torchrun" and detect(env).rank == 5  # torchrun inside srun: torchrun's world
    assert detect({"RANK": "0", "WORLD_SIZE": "2"}).kind == "env"
    assert detect({}) is None


def test_bad_launcher_values_are_one_line_errors():
    with pytest.raises(InputError, match="SLURM_PROCID"):
        detect({**srun_env(0), "SLURM_PROCID": "zero"})
    with pytest.raises(InputError, match="SLURM_STEP_NODELIST"):
        detect({**srun_env(0), "SLURM_STEP_NODELIST": "gpu[02-01]"})
    with pytest.raises(InputError, match="outside a world of 4"):
        detect({**srun_env(0), "SLURM_PROCID": "9"})


# ---------------------------------------------------------------------------------------------- rendezvous

def test_rendezvous_rules():
    multi = detect(srun_env(1))
    r = rendezvous(multi, None, None, env={})
    assert (r.master_addr, r.master_port, r.store_path) == ("gpu01", derived_port("4242.0"), None)
    assert 20000 <= r.master_port < 30000 and "first host of SLURM_STEP_NODELIST" in r.source
    assert rendezvous(multi, None, None, env={}) == r  # the same on every rank, every time
    assert rendezvous(detect(srun_env(1, job="4243")), None, None, env={}).master_port != r.master_port
    r = rendezvous(multi, "10.0.0.9", 12345, env={"MASTER_ADDR": "ignored", "MASTER_PORT": "1"})
    assert (r.master_addr, r.master_port) == ("10.0.0.9", 12345)  # the flags override everything
    r = rendezvous(multi, None, None, env={"MASTER_ADDR": "head", "MASTER_PORT": "2222"})
    assert (r.master_addr, r.master_port) == ("head", 2222)
    one_node = detect(srun_env(1, per_node="4", nodes="gpu01"))
    r = rendezvous(one_node, None, None, env={})
    assert r.store_path and r.master_addr is None  # nothing listens on the network
    assert oct(os.stat(os.path.dirname(r.store_path)).st_mode & 0o777) == "0o700"
    nowhere = Launch("openmpi", 1, 4, 1, 2, None, 2, None)
    with pytest.raises(InputError, match="--master-addr: 4 ranks on several nodes"):
        rendezvous(nowhere, None, None, env={})
    with pytest.raises(InputError, match="--master-port: no job id"):
        rendezvous(nowhere, "head", None, env={})


# ---------------------------------------------------------------------------------------------- real worlds

SMALL = ["validate", "--ops", "all_reduce,broadcast", "--dtypes", "float32", "--sizes", "1,1K", "--timeout", "20",
         "--format", "json"]


def one_report(stdout: str) -> dict:
    docs = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(docs) == 1, f"expected one report (rank 0 only):\n{stdout[-3000:]}"
    return json.loads(docs[0])


def launch_tasks(envs: list[dict], args: list[str], timeout: float = 120):
    """Start one `python -m distdoctor ...` per env, as a launcher would; never leave one behind."""
    procs = [subprocess.Popen([sys.executable, "-m", "distdoctor", *args], env={**job_env(), **e},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for e in envs]
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1, deadline - time.monotonic())))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [p.returncode for p in procs], outs


@pytest.mark.slow
def test_srun_tasks_across_two_nodes_meet_at_the_first_host():
    # Two tasks as srun starts them on two nodes, one each; `localhost` is the first node, so rank 0's TCP
    # rendezvous is reached through the node list and a port derived from the job id.
    job = str(os.getpid())
    envs = [srun_env(r, ntasks=2, nodes="localhost,gpu[02]", per_node="1(x2)", job=job) for r in range(2)]
    codes, outs = launch_tasks(envs, SMALL)
    assert codes == [0, 0], [o[1][-1500:] for o in outs]
    doc = one_report("".join(o[0] for o in outs))
    assert doc["passed"] and doc["world_size"] == 2 and doc["counts"]["fail"] == 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpirun.openmpi") is None and shutil.which("mpirun") is None,
                    reason="no OpenMPI mpirun on this machine (Debian: apt-get install openmpi-bin)")
def test_validate_under_openmpi_mpirun():
    mpirun = shutil.which("mpirun.openmpi") or shutil.which("mpirun")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True)
    if not re.search(r"Open MPI|OpenRTE", version.stdout + version.stderr):
        pytest.skip(f"{mpirun} is not OpenMPI's")
    out = run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4", sys.executable, "-m", "distdoctor",
               *SMALL], timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = one_report(out.stdout)
    assert doc["passed"] and doc["world_size"] == 4 and doc["counts"]["pass"] == 46
    assert out.leftover == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpiexec.hydra") is None, reason="no MPICH Hydra mpiexec (apt-get install mpich)")
def test_bench_under_mpich_hydra():
    out = run(["mpiexec.hydra", "-n", "2", sys.executable, "-m", "distdoctor", "bench", "-b", "1K", "-e", "4K",
               "-n", "2", "-w", "1", "--format", "json"], timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = one_report(out.stdout)
    assert doc["passed"] and doc["world_size"] == 2 and [r["size_bytes"] for r in doc["rows"]] == [1024, 4096]


def test_env_names_the_launcher(monkeypatch):
    from distdoctor.world.env import collect_env, format_env

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DISTDOCTOR_LAUNCHER"):
        monkeypatch.delenv(key, raising=False)
    for key, value in srun_env(1, per_node="4", nodes="gpu01").items():
        monkeypatch.setenv(key, value)
    env = collect_env()
    assert env["launcher"] == "external" and env["launcher_kind"] == "slurm"
    assert (env["rank"], env["world_size"], env["local_rank"], env["local_world_size"]) == (1, 4, 1, 4)
    assert env["launch"]["first_host"] == "gpu01" and "file store on this node" in env["rendezvous"]
    assert "SLURM srun (rank 1 of 4, local rank 1); rendezvous: a file store" in format_env(env)
    monkeypatch.setenv("SLURM_STEP_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "gpu[07-08]")
    assert collect_env()["rendezvous"].startswith("rank 0 at gpu07:")


def test_master_addr_under_torchrun_is_refused():
    env = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "10.1.1.1"}
    out = run([sys.executable, "-m", "distdoctor", "validate", "--master-addr", "10.1.1.2"], timeout=60,
              env={**job_env(), **env})
    assert out.returncode == 2 and "give it to the launcher" in out.stderr and out.stderr.count("\n") == 1


def test_multi_node_mpirun_without_an_address_is_one_line():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "5"}
    out = run([sys.executable, "-m", "distdoctor", "validate"], timeout=60, env={**job_env(), **env})
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "--master-addr: 4 ranks on several nodes under openmpi" in out.stderr


def test_unreachable_rank0_is_one_line_within_the_timeout():
    # Rank 1 of a two-node srun world whose first host is this machine, where nobody serves the port.
    env = srun_env(2, nodes="localhost,gpu02", job=str(free_port()))
    start = time.monotonic()
    out = run([sys.executable, "-m", "distdoctor", "validate", "--timeout", "2", "--master-port",
               str(free_port())], timeout=60, env={**job_env(), **env})
    assert time.monotonic() - start < 20
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "frame #" not in out.stderr
    assert "cannot reach rank 0's rendezvous at localhost:" in out.stderr and "within 2 s" in out.stderr


@pytest.mark.slow
def test_validate_under_a_real_srun(tmp_path):
    import slurm_cluster

    reason = slurm_cluster.unavailable_reason()
    if reason:
        pytest.skip(f"no private SLURM cluster: {reason}")
    with slurm_cluster.private_slurm(str(tmp_path)) as env:
        out = run(["srun", "-n", "4", "--overcommit", "--kill-on-bad-exit=0", sys.executable, "-m", "distdoctor",
                   *SMALL], timeout=180, env={**job_env(), **env})
    assert out.returncode == 0, out.stderr[-3000:]
    doc = one_report(out.stdout)
    assert doc["passed"] and doc["world_size"] == 4 and doc["counts"]["pass"] == 46
