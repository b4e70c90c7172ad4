"""reduce_scatter: rank g ends with the reduction over ranks of chunk g of their (count * n) input.

`reduce_scatter_tensor(out, in)` with every reduction op; in-place (output = this rank's chunk of the
input, as nccl-tests and FSDP use it) with SUM.
"""

from distdoctor.collectives.base import (REDOPS, CollectiveSpec, GroupView, Prepared, Variant, cast, reduce_ranks,
                                         torch_redop)


class ReduceScatter(CollectiveSpec):
    name = "reduce_scatter"
    reduces = True
    aliases = ("reducescatter", "_reduce_scatter_base", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
               "reduce_scatter_base", "reduce_scatter_single", "reduce_scatter_coalesced")

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def size_bytes(self, count: int, itemsize: int, n: int) -> int:
        # nccl-tests reports reduce_scatter on the total (input) size; `count` is per-rank output.
        return count * itemsize * n

    def out_numel(self, in_numel: int, n: int) -> int:
        return in_numel // n

    def variants(self, n: int) -> list[Variant]:
        return [Variant(form="tensor", redop=op) for op in REDOPS] + [Variant(form="tensor", inplace=True,
                                                                               redop="sum")]

    def bench_variants(self, n, redop, root):
        return {False: Variant(form="tensor", redop=redop), True: Variant(form="tensor", inplace=True, redop=redop)}

    def inputs(self, variant, count, seed, members, grank):
        return super().inputs(variant, count * len(members), seed, members, grank)

    def expected(self, variant, count, seed, members, grank):
        chunk = slice(grank * count, (grank + 1) * count)
        return reduce_ranks(lambda g: self.inputs(variant, count, seed, members, g)[chunk], len(members),
                            variant.redop)

    def prepare(self, variant, count, dtype, seed, group: GroupView, device) -> Prepared:
        import torch
        import torch.distributed as dist

        g = group.rank
        src = cast(self.inputs(variant, count, seed, group.members, g), dtype, device)
        op = torch_redop(variant.redop)
        if variant.inplace:
            buf = src.clone()
            mine = buf[g * count:(g + 1) * count]
            return Prepared(call=lambda: dist.reduce_scatter_tensor(mine, buf, op=op, group=group.handle),
                            output=lambda: mine, refill=lambda: buf.copy_(src), count=count)
        out = torch.empty(count, dtype=src.dtype, device=device)
        return Prepared(call=lambda: dist.reduce_scatter_tensor(out, src, op=op, group=group.handle),
                        output=lambda: out, refill=lambda: None, count=count)
