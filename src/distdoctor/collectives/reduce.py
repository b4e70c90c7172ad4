from distdoctor.collectives.base import CollectiveSpec


class Reduce(CollectiveSpec):
    name = "reduce"
    rooted = True

    def bus_factor(self, n: int) -> float:
        return 1.0
