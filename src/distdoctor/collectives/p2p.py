"""send/recv in a ring: group rank g sends its buffer to g+1 and receives from g-1 (one batch_isend_irecv)."""

from distdoctor.collectives.base import CollectiveSpec, GroupView, Prepared, Variant, cast


class SendRecv(CollectiveSpec):
    """send/recv in a ring: rank r sends to r+1 and receives from r-1."""

    name = "sendrecv"
    aliases = ("send", "recv", "isend", "irecv", "batch_isend_irecv")

    def bus_factor(self, n: int) -> float:
        return 1.0

    def variants(self, n: int) -> list[Variant]:
        return [Variant(form="ring")]

    def bench_variants(self, n, redop, root):
        return {False: Variant(form="ring"), True: None}

    def expected(self, variant, count, seed, members, grank):
        return self.inputs(variant, count, seed, members, (grank - 1) % len(members))

    def prepare(self, variant, count, dtype, seed, group: GroupView, device) -> Prepared:
        import torch
        import torch.distributed as dist

        n, g = group.size, group.rank
        src = cast(self.inputs(variant, count, seed, group.members, g), dtype, device)
        out = torch.empty_like(src)
        to, frm = group.members[(g + 1) % n], group.members[(g - 1) % n]

        def call():
            ops = [dist.P2POp(dist.isend, src, to, group.handle), dist.P2POp(dist.irecv, out, frm, group.handle)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return Prepared(call=call, output=lambda: out, refill=lambda: None, count=count)
