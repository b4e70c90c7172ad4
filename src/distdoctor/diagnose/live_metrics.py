"""The watcher's state in Prometheus' text exposition format (version 0.0.4), labelled as cluster tools label
targets: `job` (the job's name), `rank`, `host`.

    distdoctor_hang_state{job}                         0 ok, 1 hang suspected, 2 hang confirmed (the watcher's verdict)
    distdoctor_rank_hang_state{job,rank,host}          the same, as each rank's own watchdog sees it
    distdoctor_rank_up{job,rank,host}                  1: its state answered; 0: it did not (GIL held, gone)
    distdoctor_rank_blocked_seconds{job,rank,host}     how long its oldest call has been in flight (0: none)
    distdoctor_rank_idle_seconds{job,rank,host}        seconds since it last issued or completed a collective
    distdoctor_rank_collectives_completed{job,rank,host,group}  its completed frontier per group
    distdoctor_health_events_total{job,kind}           health monitor events so far (recorder/live.py serves them)
    distdoctor_rank_straggler_score{job,rank,host}     the health monitor's straggler score
    distdoctor_rank_step{job,rank,host}                the health monitor's last gathered training step
    distdoctor_watch_poll_seconds{job}                 how long the last poll of every rank took
"""

from __future__ import annotations

import os
import time

from distdoctor.diagnose.live_watch import LEVEL


def _esc(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**kv) -> str:
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in kv.items()) + "}"


METRICS = {
    "distdoctor_hang_state": "0 ok, 1 hang suspected, 2 hang confirmed (the watcher's verdict)",
    "distdoctor_rank_hang_state": "0 ok, 1 suspected, 2 confirmed, as the rank's own watchdog sees it",
    "distdoctor_rank_up": "1 when the rank's state answered the last poll",
    "distdoctor_rank_blocked_seconds": "how long the rank's oldest call has been in flight",
    "distdoctor_rank_idle_seconds": "seconds since the rank last issued or completed a collective",
    "distdoctor_rank_collectives_completed": "the rank's completed collective frontier per group",
    "distdoctor_health_events_total": "health monitor events so far, by kind",
    "distdoctor_rank_straggler_score": "the health monitor's straggler score",
    "distdoctor_rank_step": "the health monitor's last gathered training step",
    "distdoctor_watch_poll_seconds": "how long the last poll of every rank took",
}


def exposition(watch, job_name: str) -> str:
    rows: dict[str, list[str]] = {name: [] for name in METRICS}
    rows["distdoctor_hang_state"].append(f"{_labels(job=job_name)} {LEVEL[watch.state]}")
    rows["distdoctor_watch_poll_seconds"].append(f"{_labels(job=job_name)} {watch.last_poll_s:.3f}")
    now = time.time()
    health = None
    for rank, a in sorted(watch.answers.items()):
        r = watch.job.ranks.get(rank)
        lab = dict(job=job_name, rank=rank, host=(r.host if r else None) or "")
        st = a.state or {}
        rows["distdoctor_rank_up"].append(f"{_labels(**lab)} {int(a.state is not None)}")
        if a.state is None:
            continue
        hang = st.get("hang") or {}
        rows["distdoctor_rank_hang_state"].append(f"{_labels(**lab)} {LEVEL.get(hang.get('status'), 0)}")
        mine = hang.get("this_rank") or {}
        rows["distdoctor_rank_blocked_seconds"].append(f"{_labels(**lab)} {float(mine.get('blocked_for_s') or 0):.3f}")
        rows["distdoctor_rank_idle_seconds"].append(
            f"{_labels(**lab)} {max(0.0, now - float(st.get('last_progress') or now)):.3f}")
        for group, p in sorted((st.get("progress") or {}).items()):
            if p.get("completed") is not None:
                rows["distdoctor_rank_collectives_completed"].append(
                    f"{_labels(**lab, group=group)} {int(p['completed'])}")
        health = health or st.get("health")
    _health_rows(rows, health, job_name, watch)
    out = []
    for name, help_text in METRICS.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"] + [name + row for row in rows[name]]
    return "\n".join(out) + "\n"


def _health_rows(rows: dict, health: dict | None, job_name: str, watch) -> None:
    """The health monitor's summary (served by the ranks that run one; every rank holds the same gathered data)."""
    if not isinstance(health, dict):
        return
    kinds: dict[str, int] = {}
    for event in health.get("events") or []:
        kinds[str(event.get("kind"))] = kinds.get(str(event.get("kind")), 0) + 1
    for kind, n in sorted(kinds.items()):
        rows["distdoctor_health_events_total"].append(f"{_labels(job=job_name, kind=kind)} {n}")
    for view in health.get("ranks") or []:
        rank = view.get("rank")
        r = watch.job.ranks.get(rank)
        lab = _labels(job=job_name, rank=rank, host=(r.host if r else None) or "")
        if view.get("straggler_score") is not None:
            rows["distdoctor_rank_straggler_score"].append(f"{lab} {float(view['straggler_score']):.4f}")
        if view.get("step") is not None:
            rows["distdoctor_rank_step"].append(f"{lab} {int(view['step'])}")


def write_file(path: str, text: str) -> None:
    """Atomically (node_exporter's textfile collector reads the file whenever it likes)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
