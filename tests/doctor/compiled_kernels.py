"""Shared by the scanner tests (test_fr_json_scan.py, test_fr_pickle_scan.py): each test runs with the C reader
built at install, skipped where it was not built."""

from __future__ import annotations

import pytest


def compiled_kernel(monkeypatch, scan_module, c_module: str):
    """Body of the scanner tests' autouse fixture: the C reader started afresh for the test (the Python reader
    is the oracle each test compares it with); `scan_module` is fr_json_scan or fr_pickle_scan, `c_module` its C
    kernel's module name."""
    pytest.importorskip(f"distdoctor.trace.loaders.{c_module}", reason="the C kernel was not built")
    monkeypatch.delenv("DISTDOCTOR_SCANNER", raising=False)
    scan_module.kernels.cache_clear()
    assert scan_module.kernels() is not None
    yield "c"
    monkeypatch.undo()
    scan_module.kernels.cache_clear()
    scan_module.FAILURE = None
