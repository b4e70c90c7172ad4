"""reduce: the root ends with the reduction of all buffers; other ranks' buffers are undefined afterwards.

Checked: SUM at every root, and every reduction op at root 0. torch's call is in-place only.
"""

from distdoctor.collectives.base import (REDOPS, CollectiveSpec, GroupView, Prepared, Variant, cast, reduce_ranks,
                                         torch_redop)


class Reduce(CollectiveSpec):
    name = "reduce"
    reduces = True
    rooted = True

    def bus_factor(self, n: int) -> float:
        return 1.0

    def variants(self, n: int) -> list[Variant]:
        out = [Variant(inplace=True, redop="sum", root=r) for r in range(n)]
        return out + [Variant(inplace=True, redop=op, root=0) for op in REDOPS if op != "sum"]

    def bench_variants(self, n, redop, root):
        return {False: None, True: Variant(inplace=True, redop=redop, root=root)}

    def expected(self, variant, count, seed, members, grank):
        if grank != variant.root:
            return None
        return reduce_ranks(lambda g: self.inputs(variant, count, seed, members, g), len(members), variant.redop)

    def prepare(self, variant, count, dtype, seed, group: GroupView, device) -> Prepared:
        import torch.distributed as dist

        buf = cast(self.inputs(variant, count, seed, group.members, group.rank), dtype, device)
        pristine = buf.clone()
        dst, op = group.members[variant.root], torch_redop(variant.redop)
        is_root = group.rank == variant.root
        return Prepared(call=lambda: dist.reduce(buf, dst=dst, op=op, group=group.handle),
                        output=lambda: buf if is_root else None, refill=lambda: buf.copy_(pristine), count=count)
