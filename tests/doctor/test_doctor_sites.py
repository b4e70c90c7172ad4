"""The user's call sites: torch's frames, distdoctor's own recorder wrappers and Python's standard library are never
named as the user's code."""

import pytest

from distdoctor.diagnose.progress import where_now
from distdoctor.diagnose.sites import fmt_chain, stack_site, user_chain
from distdoctor.lint.hazard import user_frames
from distdoctor.trace.model import Entry, Frame, RankTrace

STACK = [  # innermost last, as traces keep frames
    Frame("<module>", "/job/train.py", 90),
    Frame("train", "/job/train.py", 71),
    Frame("traced", "/venv/lib/python3.11/site-packages/distdoctor/recorder/patch.py", 75),
    Frame("all_reduce", "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2500),
]


def test_the_recorders_wrapper_is_not_the_users_code():
    chain = user_chain(STACK)
    assert [f.name for f in chain] == ["train", "<module>"]
    assert fmt_chain(chain) == "train (/job/train.py:71) <- <module> (train.py:90)"


def test_lint_reads_sites_by_the_same_rule():
    e = Entry(index=0, group="0", op="all_reduce", seq=1, frames=STACK)
    assert user_frames(e) == user_chain(STACK)


@pytest.mark.parametrize("lib", ["/root/.pyenv/versions/3.11.7/lib/python3.11", "/usr/lib/python3.10",
                                 "/usr/lib64/python3.9", "/opt/conda/lib/python3.12"])
def test_a_rank_caught_inside_the_standard_library_is_at_its_callers_line(lib):
    """A data loader polling pathlib's exists() (or waiting in queue.get) is where the user called it; a package
    installed beside the standard library (site-packages, dist-packages) is the user's own code."""
    stack = [Frame("<module>", "/job/train.py", 90), Frame("fetch_batch", "/job/data.py", 33),
             Frame("exists", f"{lib}/pathlib.py", 1235), Frame("stat", f"{lib}/pathlib.py", 1013)]
    trace = RankTrace(rank=1, source="native", stacks={"MainThread": stack})
    assert where_now(trace) == "fetch_batch (/job/data.py:33)"
    assert stack_site(trace) == "fetch_batch (/job/data.py:33) <- <module> (train.py:90)"
    own = Frame("get_batch", f"{lib}/site-packages/myjob/data.py", 12)
    trace.stacks["MainThread"] = [*stack[:2], own, Frame("get", f"{lib}/queue.py", 171)]
    assert where_now(trace) == str(own)
