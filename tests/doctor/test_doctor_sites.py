"""The user's call sites: torch's frames and distdoctor's own recorder wrappers are never named as the user's code."""

from distdoctor.diagnose.sites import fmt_chain, user_chain
from distdoctor.lint.hazard import user_frames
from distdoctor.trace.model import Entry, Frame

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
