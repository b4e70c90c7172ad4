"""Per-rank traces of collective calls: the normalized model, the recorder that writes it, loaders that read it."""
