"""Start-up hook for processes launched by `distdoctor run` (this directory is first on their PYTHONPATH).

Python imports `sitecustomize` in every interpreter it starts, so the training script needs no change: when
DISTDOCTOR_TRACE is set this enables the recorder, which stays dormant (no thread, no hooks, only patched
function pointers) until the process creates a process group — the torchrun agent and data-loader workers
never do. Then it runs the sitecustomize this file shadows, if there is one. Nothing here may break start-up.
"""


def _distdoctor_start() -> None:
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        try:
            import distdoctor.recorder as recorder
        except ImportError:
            src = os.environ.get("DISTDOCTOR_HOOK_SRC")
            if not src:
                raise
            sys.path.append(src)  # last, so it never shadows the program's own packages
            import distdoctor.recorder as recorder
        recorder.enable_from_env()
    except Exception as exc:
        print(f"distdoctor.recorder: warning: recorder not enabled ({type(exc).__name__}: {exc})", file=sys.stderr)

    try:
        import importlib.machinery
        import importlib.util

        path = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except Exception as exc:
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
              file=sys.stderr)


_distdoctor_start()
del _distdoctor_start
