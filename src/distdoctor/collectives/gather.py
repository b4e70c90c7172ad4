"""gather: the root ends with every rank's buffer in rank order (list form). Every root is checked."""

from distdoctor.collectives.base import CollectiveSpec, GroupView, Prepared, Variant, cast


class Gather(CollectiveSpec):
    name = "gather"
    rooted = True

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def size_bytes(self, count: int, itemsize: int, n: int) -> int:
        return count * itemsize * n

    def variants(self, n: int) -> list[Variant]:
        return [Variant(root=r) for r in range(n)]

    def bench_variants(self, n, redop, root):
        return {False: Variant(root=root), True: None}

    def expected(self, variant, count, seed, members, grank):
        if grank != variant.root:
            return None
        return self.all_inputs(variant, count, seed, members).reshape(-1)

    def prepare(self, variant, count, dtype, seed, group: GroupView, device) -> Prepared:
        import torch
        import torch.distributed as dist

        src = cast(self.inputs(variant, count, seed, group.members, group.rank), dtype, device)
        is_root = group.rank == variant.root
        outs = [torch.empty_like(src) for _ in range(group.size)] if is_root else None
        dst = group.members[variant.root]
        return Prepared(call=lambda: dist.gather(src, outs, dst=dst, group=group.handle),
                        output=lambda: torch.cat(outs) if is_root else None, refill=lambda: None, count=count)
