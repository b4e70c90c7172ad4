"""Hypothesis profiles for the fuzz targets: "ci" (a few hundred cases per target, the default) and "long"
(10 000 per target, `python fuzz/run_fuzz.py`). No deadline: the machine is shared and timing is noisy.

"ci" draws the same cases every run (derandomize): the suite passes or fails on the code, not on the draw; new
cases are the long run's job (`python fuzz/run_fuzz.py --profile long`), whose finds become classes and tests
(docs/diagnose.md, "Still wrong")."""

from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                     HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=150, derandomize=True, **_common)
settings.register_profile("long", max_examples=10_000, derandomize=False, **_common)
settings.load_profile("ci")
settings.register_profile("smoke", max_examples=20, derandomize=False, **_common)
