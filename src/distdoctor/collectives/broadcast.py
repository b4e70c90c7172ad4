"""broadcast: every rank ends with the root's buffer. torch's call is in-place only; every root is checked."""

from distdoctor.collectives.base import CollectiveSpec, GroupView, Prepared, Variant, cast


class Broadcast(CollectiveSpec):
    name = "broadcast"
    rooted = True
    aliases = ("bcast",)
    replicated = True

    def bus_factor(self, n: int) -> float:
        return 1.0

    def variants(self, n: int) -> list[Variant]:
        return [Variant(inplace=True, root=r) for r in range(n)]

    def bench_variants(self, n, redop, root):
        return {False: None, True: Variant(inplace=True, root=root)}

    def expected(self, variant, count, seed, members, grank):
        return self.inputs(variant, count, seed, members, variant.root)

    def prepare(self, variant, count, dtype, seed, group: GroupView, device) -> Prepared:
        import torch.distributed as dist

        buf = cast(self.inputs(variant, count, seed, group.members, group.rank), dtype, device)
        pristine = buf.clone()
        src = group.members[variant.root]
        return Prepared(call=lambda: dist.broadcast(buf, src=src, group=group.handle), output=lambda: buf,
                        refill=lambda: buf.copy_(pristine), count=count)
