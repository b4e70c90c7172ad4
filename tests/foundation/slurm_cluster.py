"""A private one-node SLURM cluster for a test: munged, slurmctld and slurmd from Debian's packages (slurmd,
slurmctld, slurm-client, munge), each in the foreground on its own socket, ports and spool directory under a
temporary directory, stopped by pid afterwards. Needs root (slurmd launches tasks as the job's user)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time

BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "squeue")
KEY = "/etc/munge/munge.key"


def unavailable_reason() -> str | None:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"no {', '.join(missing)} (Debian: apt-get install slurmd slurmctld slurm-client munge)"
    if os.geteuid() != 0:
        return "a private slurmd needs root"
    if not os.path.exists(KEY):
        return f"no munge key at {KEY}"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no munge user"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def private_slurm(directory: str, cpus: int = 4, start_timeout: float = 30):
    """Yields the environment (SLURM_CONF) under which srun/sinfo talk to the private cluster."""
    host = socket.gethostname()
    # munged runs as the munge user: its directory must be reachable by it (a test's tmp_path is root-only)
    munge_dir = tempfile.mkdtemp(prefix="distdoctor-munge-")
    os.chmod(munge_dir, 0o755)
    shutil.chown(munge_dir, "munge", "munge")
    for sub in ("spool", "state"):
        os.makedirs(os.path.join(directory, sub))
    conf = os.path.join(directory, "slurm.conf")
    with open(conf, "w") as f:
        f.write(f"""ClusterName=distdoctor-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_dir}/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
MpiDefault=none
ReturnToService=2
SlurmctldPidFile={directory}/slurmctld.pid
SlurmdPidFile={directory}/slurmd.pid
SlurmdSpoolDir={directory}/spool
StateSaveLocation={directory}/state
SlurmctldLogFile={directory}/slurmctld.log
SlurmdLogFile={directory}/slurmd.log
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={host} CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
    env = dict(os.environ, SLURM_CONF=conf)
    procs: list[subprocess.Popen] = []
    try:
        munge = pwd.getpwnam("munge")

        def as_munge():  # munged refuses root; our own child (not runuser's), so we reap it
            os.setgid(munge.pw_gid)
            os.setuid(munge.pw_uid)

        procs.append(subprocess.Popen(
            ["munged", "-F", "--force", f"--socket={munge_dir}/munge.sock",
             f"--key-file={KEY}", f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log",
             f"--seed-file={munge_dir}/munged.seed"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=as_munge))
        deadline = time.monotonic() + start_timeout
        while not os.path.exists(f"{munge_dir}/munge.sock") and time.monotonic() < deadline:
            time.sleep(0.1)
        for daemon in (["slurmctld", "-D", "-f", conf], ["slurmd", "-D", "-f", conf]):
            procs.append(subprocess.Popen(daemon, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
            state = out.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.3)
        else:
            raise RuntimeError(f"the private SLURM cluster did not come up (node state {state!r})")
        yield env
    finally:
        spool = os.path.join(directory, "spool")
        end = time.monotonic() + 10
        while procs and time.monotonic() < end:  # let finished steps report before the controller goes
            out = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, timeout=10)
            if out.returncode != 0 or not out.stdout.strip():
                break
            time.sleep(0.2)
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, 9)
                p.wait()
        for pid in _step_daemons(spool):  # a slurmstepd still retrying to reach the stopped controller
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        shutil.rmtree(munge_dir, ignore_errors=True)


def _step_daemons(spool: str) -> list[int]:
    """Pids of the slurmstepd processes of this cluster: they hold files in its spool directory."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != "slurmstepd":
                    continue
            if any(os.readlink(f"/proc/{entry}/fd/{fd}").startswith(spool) for fd in os.listdir(f"/proc/{entry}/fd")):
                found.append(int(entry))
        except OSError:
            continue
    return found
