"""all_gather: every rank ends with all ranks' buffers concatenated in rank order.

Forms: the list form `all_gather(list, t)`, `all_gather_into_tensor(out, t)`, and its in-place variant where
the input is this rank's slice of the output (as FSDP uses it).
"""

from distdoctor.collectives.base import CollectiveSpec, GroupView, Prepared, Variant, cast


class AllGather(CollectiveSpec):
    name = "all_gather"
    aliases = ("allgather", "_allgather_base", "all_gather_into_tensor", "all_gather_into_tensor_coalesced",
               "allgather_into_tensor_coalesced", "all_gather_base", "allgather_coalesced", "_all_gather_base",
               "all_gather_single", "all_gather_coalesced")
    replicated = True

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def size_bytes(self, count: int, itemsize: int, n: int) -> int:
        # nccl-tests reports all_gather on the total (gathered) size; `count` is per-rank input.
        return count * itemsize * n

    def out_numel(self, in_numel: int, n: int) -> int:
        return in_numel * n

    def variants(self, n: int) -> list[Variant]:
        return [Variant(form="list"), Variant(form="tensor"), Variant(form="tensor", inplace=True)]

    def bench_variants(self, n, redop, root):
        return {False: Variant(form="tensor"), True: Variant(form="tensor", inplace=True)}

    def expected(self, variant, count, seed, members, grank):
        return self.all_inputs(variant, count, seed, members).reshape(-1)

    def prepare(self, variant, count, dtype, seed, group: GroupView, device) -> Prepared:
        import torch
        import torch.distributed as dist

        n, g = group.size, group.rank
        src = cast(self.inputs(variant, count, seed, group.members, g), dtype, device)
        if variant.form == "list":
            outs = [torch.empty_like(src) for _ in range(n)]
            return Prepared(call=lambda: dist.all_gather(outs, src, group=group.handle),
                            output=lambda: torch.cat(outs), refill=lambda: None, count=count)
        out = torch.empty(count * n, dtype=src.dtype, device=device)
        if variant.inplace:
            mine = out[g * count:(g + 1) * count]

            def refill():
                mine.copy_(src)

            refill()
            return Prepared(call=lambda: dist.all_gather_into_tensor(out, mine, group=group.handle),
                            output=lambda: out, refill=refill, count=count)
        return Prepared(call=lambda: dist.all_gather_into_tensor(out, src, group=group.handle),
                        output=lambda: out, refill=lambda: None, count=count)
