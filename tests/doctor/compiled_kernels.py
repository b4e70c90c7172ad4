"""Shared by the scanner tests (test_fr_json_scan.py, test_fr_pickle_scan.py): each test runs once per
compilation of the scanner, C and numba."""

from __future__ import annotations

import pytest


def compiled_kernel(request, monkeypatch, scan_module, c_module: str):
    """Body of the scanner tests' autouse fixture, parametrized over "c" and "numba": the test runs with that
    compilation only (DISTDOCTOR_SCANNER picks it), skipped where it is not there; `scan_module` is
    fr_json_scan or fr_pickle_scan, `c_module` its C kernel's module name."""
    if request.param == "c":
        pytest.importorskip(f"distdoctor.trace.loaders.{c_module}", reason="the C kernel was not built")
    else:
        pytest.importorskip("numba")  # the `fast` extra (part of the test extras)
    monkeypatch.setenv("DISTDOCTOR_SCANNER", request.param)
    scan_module.kernels.cache_clear()
    assert scan_module.kernels() is not None
    yield request.param
    monkeypatch.undo()
    scan_module.kernels.cache_clear()
    scan_module.FAILURE = None
