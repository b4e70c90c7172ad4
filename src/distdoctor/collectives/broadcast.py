from distdoctor.collectives.base import CollectiveSpec


class Broadcast(CollectiveSpec):
    name = "broadcast"
    rooted = True
    aliases = ("bcast",)

    def bus_factor(self, n: int) -> float:
        return 1.0
