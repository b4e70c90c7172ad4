"""scatter: rank g ends with chunk g of the root's (count * n) buffer (list form). Every root is checked."""

from distdoctor.collectives.base import CollectiveSpec, GroupView, Prepared, Variant, cast


class Scatter(CollectiveSpec):
    name = "scatter"
    rooted = True

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def size_bytes(self, count: int, itemsize: int, n: int) -> int:
        return count * itemsize * n

    def variants(self, n: int) -> list[Variant]:
        return [Variant(root=r) for r in range(n)]

    def bench_variants(self, n, redop, root):
        return {False: Variant(root=root), True: None}

    def inputs(self, variant, count, seed, members, grank):
        # Only the root's buffer is sent; every rank has one so the call shape is the same everywhere.
        return super().inputs(variant, count * len(members), seed, members, grank)

    def expected(self, variant, count, seed, members, grank):
        root_buf = self.inputs(variant, count, seed, members, variant.root)
        return root_buf[grank * count:(grank + 1) * count]

    def prepare(self, variant, count, dtype, seed, group: GroupView, device) -> Prepared:
        import torch
        import torch.distributed as dist

        src = cast(self.inputs(variant, count, seed, group.members, group.rank), dtype, device)
        is_root = group.rank == variant.root
        chunks = list(src.split(count)) if is_root and count else (
            [src[:0]] * group.size if is_root else None)
        out = torch.empty(count, dtype=src.dtype, device=device)
        srank = group.members[variant.root]
        return Prepared(call=lambda: dist.scatter(out, chunks, src=srank, group=group.handle),
                        output=lambda: out, refill=lambda: None, count=count)
