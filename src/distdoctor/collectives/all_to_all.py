from distdoctor.collectives.base import CollectiveSpec


class AllToAll(CollectiveSpec):
    name = "all_to_all"
    aliases = ("alltoall", "alltoall_base", "all_to_all_single")

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n
