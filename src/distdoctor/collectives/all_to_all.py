"""all_to_all (`all_to_all_single`): rank r sends segment d of its buffer to rank d; rank g's output is the
segments addressed to it, in sender order.

Even splits: count is rounded down to a multiple of n (as nccl-tests does) and cut in n equal chunks.
Uneven splits: rank r sends split(r, d) = count//n + ((r + 2d) mod 3) - 1 elements (>= 0) to rank d, so
sizes differ per pair and per direction and the split bookkeeping itself is checked.
"""

from distdoctor.collectives.base import CollectiveSpec, GroupView, Prepared, Variant, cast


def uneven_split(count: int, n: int, src: int, dst: int) -> int:
    if count == 0:
        return 0
    return max(0, count // n + (src + 2 * dst) % 3 - 1)


class AllToAll(CollectiveSpec):
    name = "all_to_all"
    aliases = ("alltoall", "alltoall_base", "all_to_all_single", "all_to_all_base")

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def variants(self, n: int) -> list[Variant]:
        return [Variant(form="even"), Variant(form="uneven")]

    def bench_variants(self, n, redop, root):
        return {False: Variant(form="even"), True: None}

    def effective_count(self, count, n, variant):
        return count // n * n if variant.form == "even" else count

    def splits(self, variant, count, n, src):
        """(what `src` sends to each rank, what `src` receives from each rank)."""
        if variant.form == "even":
            return [count // n] * n, [count // n] * n
        return [uneven_split(count, n, src, d) for d in range(n)], [uneven_split(count, n, r, src) for r in range(n)]

    def inputs(self, variant, count, seed, members, grank):
        count = self.effective_count(count, len(members), variant)
        numel = sum(self.splits(variant, count, len(members), grank)[0])
        return super().inputs(variant, numel, seed, members, grank)

    def expected(self, variant, count, seed, members, grank):
        import torch

        n = len(members)
        count = self.effective_count(count, n, variant)
        parts = []
        for r in range(n):
            send = self.splits(variant, count, n, r)[0]
            start = sum(send[:grank])
            parts.append(self.inputs(variant, count, seed, members, r)[start:start + send[grank]])
        return torch.cat(parts)

    def prepare(self, variant, count, dtype, seed, group: GroupView, device) -> Prepared:
        import torch
        import torch.distributed as dist

        n, g = group.size, group.rank
        count = self.effective_count(count, n, variant)
        send, recv = self.splits(variant, count, n, g)
        src = cast(self.inputs(variant, count, seed, group.members, g), dtype, device)
        out = torch.empty(sum(recv), dtype=src.dtype, device=device)
        if variant.form == "even":
            call = lambda: dist.all_to_all_single(out, src, group=group.handle)  # noqa: E731
        else:
            call = lambda: dist.all_to_all_single(out, src, recv, send, group=group.handle)  # noqa: E731
        return Prepared(call=call, output=lambda: out, refill=lambda: None, count=count)
