"""validate's pure parts: --inject and --sizes parsing, the call plan, and the bad-input CLI errors."""

import pytest

from distdoctor.errors import InputError
from distdoctor.world.faults import Fault, parse_fault
from distdoctor.validate.sweep import ValidateOptions
from distdoctor.validate.execute import mesh_groups, parse_sizes, plan_cases
from vb_helpers import run_cli


def test_parse_fault_kinds():
    assert parse_fault("corrupt:1") == Fault("corrupt", 1, None)
    assert parse_fault("corrupt:1:3") == Fault("corrupt", 1, 3)
    assert parse_fault("delay:2:0.5") == Fault("delay", 2, 0.5)
    assert parse_fault("crash:3") == Fault("crash", 3, 1)
    assert parse_fault("skip:0:4") == Fault("skip", 0, 4)


@pytest.mark.parametrize("text,why", [("explode:1", "unknown kind"), ("corrupt", "expected KIND:RANK"),
                                      ("crash:x", "not an integer"), ("delay:1", "needs SECONDS"),
                                      ("delay:1:-2", "> 0"), ("skip:1:0", ">= 1"), ("crash:-1", ">= 0"),
                                      ("corrupt:1:2:3", "expected KIND:RANK")])
def test_parse_fault_errors_are_one_line(text, why):
    with pytest.raises(InputError) as exc:
        parse_fault(text)
    assert why in str(exc.value) and text in str(exc.value) and "\n" not in str(exc.value)


def test_sizes():
    sizes = parse_sizes("0,1,1023,1M,1MiB,4KB")
    assert [s.count("float32") for s in sizes] == [0, 1, 1023, 1 << 20, 1 << 18, 1024]
    assert [s.count("float64") for s in sizes][-2:] == [1 << 17, 512]
    for bad in ("-1", "1,-5", "abc", "1.5", ""):
        with pytest.raises(InputError):
            parse_sizes(bad)


def test_mesh_groups_like_hsdp():
    assert mesh_groups(2) == {"world": [[0, 1]]}
    g = mesh_groups(4)
    assert g["shard"] == [[0, 1], [2, 3]] and g["replicate"] == [[0, 2], [1, 3]]
    g = mesh_groups(8)
    assert g["shard"] == [[0, 1], [2, 3], [4, 5], [6, 7]] and g["replicate"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert "shard" not in mesh_groups(5)


def test_plan_covers_every_root_on_every_group():
    cases = plan_cases(["broadcast", "barrier"], ["float32"], "1", ["sum"], True, 4)
    roots = {(c.group, c.variant.root) for c in cases if c.op == "broadcast"}
    assert roots == {("world", r) for r in range(4)} | {(g, r) for g in ("shard", "replicate") for r in range(2)}
    assert sum(c.op == "barrier" for c in cases) == 3  # once per group kind, not per dtype/size
    assert [c.index for c in cases] == list(range(len(cases)))


@pytest.mark.parametrize("kw,flag", [({"ops": ("all_reduce", "nope")}, "--ops"), ({"dtypes": ("float8",)}, "--dtypes"),
                                     ({"sizes": "1,-3"}, "--sizes"), ({"inject": ("boom:1",)}, "--inject")])
def test_options_check(kw, flag):
    with pytest.raises(InputError) as exc:
        ValidateOptions(**kw).check()
    assert flag in str(exc.value)


@pytest.mark.parametrize("args,needle", [
    (["--ops", "all_reduce,frobnicate"], "frobnicate"),
    (["--sizes", "0,-4"], "negative"),
    (["--nproc", "1"], "--nproc"),
    (["--inject", "melt:1"], "unknown kind"),
    (["--nproc", "2", "--inject", "crash:5"], "does not exist"),
])
def test_bad_input_is_one_line_and_starts_no_world(args, needle):
    code, out, err = run_cli("validate", *args, timeout=120)
    assert code == 2, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert err.startswith("distdoctor validate: error:") and needle in err


def test_bench_bad_input_is_one_line():
    code, out, err = run_cli("bench", "--nproc", "2", "-b", "-8", timeout=120)
    assert code == 2 and err.strip().count("\n") == 0 and "negative" in err
    code, out, err = run_cli("bench", "--nproc", "2", "-b", "0", timeout=120)
    assert code == 2 and err.strip().count("\n") == 0 and "size 0" in err
    code, out, err = run_cli("bench", "--nproc", "2", "--op", "warp", timeout=120)
    assert code == 2 and err.strip().count("\n") == 0 and "warp" in err


def test_sequence_gaps_name_the_rank_that_skipped():
    from distdoctor.validate.sweep import _sequence_gaps

    # rank 1 skipped call 2 and went on
    assert _sequence_gaps({0: [0, 1, 2], 1: [0, 1, 3]}, set()) == {1: (2, [0])}
    # rank 0 skipped the first call
    assert _sequence_gaps({0: [1, 2], 1: [0, 1], 2: [0, 1]}, set()) == {0: (0, [1, 2])}
    # rank 2 skipped the LAST call and finished; the others wait in it
    assert _sequence_gaps({0: [0, 1], 1: [0, 1], 2: [0]}, {2}) == {2: (1, [0, 1])}
    # a rank that died in call 1 did not skip anything
    assert _sequence_gaps({0: [0, 1, 2], 1: [0, 1]}, {0}) == {}


def test_text_report_prints_backend_errors_verbatim():
    """Reasons quote gloo errors like '[/x/pair.cc:553]': printed as text, never parsed as rich markup."""
    import io

    from distdoctor.report.validate_text import print_validate

    reason = "RuntimeError: [/__w/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"
    row = {"op": "all_reduce", "dtype": "float32", "count": 1, "group": "world", "inplace": True,
           "max_abs_err": None, "ranks_agree": None, "status": "fail", "reason": reason, "form": None,
           "redop": "sum", "root": None, "culprit_ranks": [1]}
    report = {"passed": False, "world_size": 2, "backend": "gloo", "results": [row], "culprit_ranks": [1],
              "culprits": [{"rank": 1, "why": [f"lost ({reason})"]}], "stragglers": [],
              "lost": [{"rank": 1, "host": "h", "reason": reason, "in_op": "#1 [bracketed]"}],
              "straggler_threshold_s": 0.1, "injected": []}
    out = io.StringIO()
    print_validate(report, file=out)
    text = out.getvalue()
    assert "[/__w/gloo/transport/tcp/pair.cc:553]" in text and "#1 [bracketed]" in text
    assert text.rstrip().splitlines()[-1].startswith("FAIL on 2 ranks")
