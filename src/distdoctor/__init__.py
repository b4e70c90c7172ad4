"""distdoctor: validate, diagnose, simulate and monitor distributed PyTorch training."""

__version__ = "0.1.0"
