"""all_reduce: every rank ends with the reduction of all ranks' buffers. torch's call is in-place only."""

from distdoctor.collectives.base import (REDOPS, CollectiveSpec, GroupView, Prepared, Variant, cast, reduce_ranks,
                                         torch_redop)


class AllReduce(CollectiveSpec):
    name = "all_reduce"
    reduces = True
    aliases = ("allreduce", "all_reduce_coalesced", "allreduce_coalesced", "allreduce_sparse")
    replicated = True

    def bus_factor(self, n: int) -> float:
        # nccl-tests: a ring all-reduce moves 2(n-1)/n of the buffer over each link.
        return 2.0 * (n - 1) / n

    def variants(self, n: int) -> list[Variant]:
        return [Variant(inplace=True, redop=op) for op in REDOPS]

    def bench_variants(self, n, redop, root):
        return {False: None, True: Variant(inplace=True, redop=redop)}

    def expected(self, variant, count, seed, members, grank):
        return reduce_ranks(lambda g: self.inputs(variant, count, seed, members, g), len(members), variant.redop)

    def prepare(self, variant, count, dtype, seed, group: GroupView, device) -> Prepared:
        import torch.distributed as dist

        src = self.inputs(variant, count, seed, group.members, group.rank)
        buf = cast(src, dtype, device)
        op = torch_redop(variant.redop)
        pristine = buf.clone()
        return Prepared(call=lambda: dist.all_reduce(buf, op=op, group=group.handle), output=lambda: buf,
                        refill=lambda: buf.copy_(pristine), count=count)
