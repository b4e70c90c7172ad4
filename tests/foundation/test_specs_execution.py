"""Collective specs' execution parts, in one process: inputs, float64 references, sizes, tolerances."""

import pytest
import torch

from distdoctor.collectives import SPECS, get_spec
from distdoctor.collectives.all_to_all import uneven_split
from distdoctor.collectives.base import DTYPES, REDOPS, Variant, rank_values, tolerance

MEMBERS4 = (0, 1, 2, 3)


def test_inputs_are_deterministic_and_differ_per_rank_and_group():
    v = Variant(redop="sum", inplace=True)
    a = rank_values(0, "all_reduce", v, MEMBERS4, 1, 64, "sum")
    assert torch.equal(a, rank_values(0, "all_reduce", v, MEMBERS4, 1, 64, "sum"))
    assert not torch.equal(a, rank_values(0, "all_reduce", v, MEMBERS4, 2, 64, "sum"))
    assert not torch.equal(a, rank_values(1, "all_reduce", v, MEMBERS4, 1, 64, "sum"))
    # two shard groups must not share data, or cross-talk between them would go unseen
    assert not torch.equal(rank_values(0, "all_reduce", v, (0, 1), 0, 64, "sum"),
                           rank_values(0, "all_reduce", v, (2, 3), 0, 64, "sum"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("redop", ["sum", "max", "min", "prod"])
def test_exact_redops_are_representable_in_every_dtype(dtype, redop):
    """Small-integer inputs keep SUM/MAX/MIN/PROD exact even in bf16, so those checks are bit-exact."""
    spec = get_spec("all_reduce")
    v = Variant(inplace=True, redop=redop)
    expected = spec.expected(v, 4096, 0, tuple(range(16)), 0)
    assert torch.equal(expected.to(getattr(torch, dtype)).to(torch.float64), expected)


def test_all_reduce_reference_by_hand():
    spec = get_spec("all_reduce")
    for redop, fn in (("sum", lambda s: s.sum(0)), ("max", lambda s: s.amax(0)), ("min", lambda s: s.amin(0)),
                      ("prod", lambda s: s.prod(0)), ("avg", lambda s: s.sum(0) / 4)):
        v = Variant(inplace=True, redop=redop)
        stack = torch.stack([spec.inputs(v, 9, 3, MEMBERS4, g) for g in range(4)])
        assert torch.equal(spec.expected(v, 9, 3, MEMBERS4, 2), fn(stack))


def test_broadcast_gather_scatter_references():
    b = get_spec("broadcast")
    for root in range(4):
        v = Variant(inplace=True, root=root)
        assert torch.equal(b.expected(v, 5, 0, MEMBERS4, 3), b.inputs(v, 5, 0, MEMBERS4, root))
    g = get_spec("gather")
    v = Variant(root=2)
    assert g.expected(v, 5, 0, MEMBERS4, 1) is None
    assert torch.equal(g.expected(v, 5, 0, MEMBERS4, 2), torch.cat([g.inputs(v, 5, 0, MEMBERS4, r) for r in range(4)]))
    s = get_spec("scatter")
    v = Variant(root=1)
    root_buf = s.inputs(v, 5, 0, MEMBERS4, 1)
    assert root_buf.numel() == 20
    assert torch.equal(s.expected(v, 5, 0, MEMBERS4, 3), root_buf[15:20])


def test_reduce_scatter_reference_is_the_reduced_chunk():
    rs = get_spec("reduce_scatter")
    v = Variant(form="tensor", redop="sum")
    inputs = [rs.inputs(v, 3, 0, MEMBERS4, r) for r in range(4)]
    assert all(x.numel() == 12 for x in inputs)
    assert torch.equal(rs.expected(v, 3, 0, MEMBERS4, 2), sum(x[6:9] for x in inputs))


def test_all_to_all_uneven_splits_are_consistent_and_uneven():
    n, count = 4, 1023
    sends = [[uneven_split(count, n, r, d) for d in range(n)] for r in range(n)]
    assert len({s for row in sends for s in row}) > 1  # really uneven
    a2a = get_spec("all_to_all")
    v = Variant(form="uneven")
    for g in range(n):
        assert a2a.inputs(v, count, 0, MEMBERS4, g).numel() == sum(sends[g])
        expected = a2a.expected(v, count, 0, MEMBERS4, g)
        assert expected.numel() == sum(sends[r][g] for r in range(n))
        # the first segment is what rank 0 sends to g
        start = sum(sends[0][:g])
        assert torch.equal(expected[:sends[0][g]], a2a.inputs(v, count, 0, MEMBERS4, 0)[start:start + sends[0][g]])
    even = Variant(form="even")
    assert a2a.effective_count(1023, 4, even) == 1020
    assert a2a.expected(even, 1023, 0, MEMBERS4, 1).numel() == 1020


def test_sendrecv_ring_reference():
    p2p = get_spec("sendrecv")
    v = Variant(form="ring")
    assert torch.equal(p2p.expected(v, 7, 0, MEMBERS4, 0), p2p.inputs(v, 7, 0, MEMBERS4, 3))


def test_every_spec_covers_roots_and_redops():
    for name in ("broadcast", "gather", "scatter", "reduce"):
        roots = {v.root for v in get_spec(name).variants(4)}
        assert roots == {0, 1, 2, 3}, name
    for name in ("all_reduce", "reduce", "reduce_scatter"):
        assert {v.redop for v in get_spec(name).variants(4)} == set(REDOPS), name
    forms = {(v.form, v.inplace) for v in get_spec("all_gather").variants(4)}
    assert forms == {("list", False), ("tensor", False), ("tensor", True)}
    assert {v.form for v in get_spec("all_to_all").variants(4)} == {"even", "uneven"}
    assert all(spec.variants(4) for spec in SPECS.values())


def test_tolerance_per_dtype():
    assert tolerance("int32", 100, 4) == 0 and tolerance("int64", 1e9, 64) == 0
    assert 0 < tolerance("float64", 1, 4) < tolerance("float32", 1, 4) < tolerance("float16", 1, 4) \
        < tolerance("bfloat16", 1, 4)
    assert tolerance("bfloat16", 4, 4) < 1  # a one-unit corruption of a small integer is always caught
    assert set(DTYPES) == {"float32", "float64", "float16", "bfloat16", "int32", "int64"}
