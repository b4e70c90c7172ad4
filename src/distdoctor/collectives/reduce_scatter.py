from distdoctor.collectives.base import CollectiveSpec


class ReduceScatter(CollectiveSpec):
    name = "reduce_scatter"
    aliases = ("reducescatter", "_reduce_scatter_base", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
               "reduce_scatter_base")

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def size_bytes(self, count: int, itemsize: int, n: int) -> int:
        # nccl-tests reports reduce_scatter on the total (input) size; `count` is per-rank output.
        return count * itemsize * n

    def out_numel(self, in_numel: int, n: int) -> int:
        return in_numel // n
