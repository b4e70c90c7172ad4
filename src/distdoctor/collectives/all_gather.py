from distdoctor.collectives.base import CollectiveSpec


class AllGather(CollectiveSpec):
    name = "all_gather"
    aliases = ("allgather", "_allgather_base", "all_gather_into_tensor", "all_gather_into_tensor_coalesced",
               "allgather_into_tensor_coalesced", "all_gather_base", "allgather_coalesced")

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def size_bytes(self, count: int, itemsize: int, n: int) -> int:
        # nccl-tests reports all_gather on the total (gathered) size; `count` is per-rank input.
        return count * itemsize * n

    def out_numel(self, in_numel: int, n: int) -> int:
        return in_numel * n
