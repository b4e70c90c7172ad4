from distdoctor.collectives.base import CollectiveSpec


class Gather(CollectiveSpec):
    name = "gather"
    rooted = True

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def size_bytes(self, count: int, itemsize: int, n: int) -> int:
        return count * itemsize * n
