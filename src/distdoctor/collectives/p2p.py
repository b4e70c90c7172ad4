from distdoctor.collectives.base import CollectiveSpec


class SendRecv(CollectiveSpec):
    """send/recv in a ring: rank r sends to r+1 and receives from r-1."""

    name = "sendrecv"
    aliases = ("send", "recv", "isend", "irecv", "batch_isend_irecv")

    def bus_factor(self, n: int) -> float:
        return 1.0
