"""Per-rank traces of collective calls: the normalized model (model.py) and the loaders that read every form a
job leaves (loaders/); summary.py and coded.py are the model's compact views for the analyses. The recorder that
writes these traces is distdoctor.recorder."""
