"""The one language of findings: the `Finding` type and its kinds (kinds.py), and the wait-for graph over
(rank, stream) with its cycle finder and sentences (waitfor.py). The simulator and the doctor both speak it,
so a simulated deadlock and a real one read alike."""
