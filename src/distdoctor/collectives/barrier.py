"""barrier: no data; checked once per group (it completes on every member, under the timeout)."""

from distdoctor.collectives.base import CollectiveSpec, GroupView, Prepared, Variant


class Barrier(CollectiveSpec):
    name = "barrier"
    aliases = ("monitored_barrier",)
    has_data = False

    def bus_factor(self, n: int) -> float:
        return 0.0

    def size_bytes(self, count: int, itemsize: int, n: int) -> int:
        return 0

    def variants(self, n: int) -> list[Variant]:
        return [Variant()]

    def bench_variants(self, n, redop, root):
        return {False: Variant(), True: None}

    def expected(self, variant, count, seed, members, grank):
        return None

    def prepare(self, variant, count, dtype, seed, group: GroupView, device) -> Prepared:
        import torch.distributed as dist

        return Prepared(call=lambda: dist.barrier(group=group.handle), output=lambda: None, refill=lambda: None,
                        count=0)
