from distdoctor.collectives.base import CollectiveSpec


class AllReduce(CollectiveSpec):
    name = "all_reduce"
    aliases = ("allreduce", "all_reduce_coalesced", "allreduce_coalesced")

    def bus_factor(self, n: int) -> float:
        # nccl-tests: a ring all-reduce moves 2(n-1)/n of the buffer over each link.
        return 2.0 * (n - 1) / n
