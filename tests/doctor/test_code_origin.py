"""Library code is told from the user's by where modules were loaded from (trace.code_origin), never by a folder's
name: a user's script in a checkout named `distdoctor`, or in a folder named `torch`, keeps its call sites."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch.distributed.distributed_c10d as c10d

import distdoctor.recorder.patch as patch
from distdoctor.diagnose.progress import user_frame
from distdoctor.diagnose.sites import user_chain
from distdoctor.sim.plans.from_trace import call_site
from distdoctor.trace.code_origin import is_library, is_torch, is_user_code, locate, package_dir
from distdoctor.trace.model import Entry, Frame

TORCH = package_dir("torch")
OURS = package_dir("distdoctor")


def test_the_installed_packages_are_library_code_wherever_they_live():
    assert is_library(c10d.__file__) and is_torch(c10d.__file__)
    assert is_library(patch.__file__) and locate(patch.__file__) == ("distdoctor", ("recorder", "patch.py"))
    assert is_library(os.__file__)  # the standard library
    assert is_library("<frozen importlib._bootstrap>")


def test_a_folder_named_like_a_package_holds_the_users_code():
    for path in ("/tmp/distdoctor/tests/sim/latent.py", "/home/u/distdoctor/train.py", "/home/u/torch/train.py",
                 "/data/torch/distdoctor/model/forward.py", "/work/src/distdoctor_jobs/x.py"):
        assert is_user_code(path), path
        assert locate(path) is None, path


def test_paths_recorded_on_another_machine_are_recognised_by_what_they_name():
    foreign = ("/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py",
               "/home/dev/pytorch/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py",
               "/usr/local/lib/python3.12/dist-packages/torch/some_module_this_version_lacks.py",
               "/srv/ci/distdoctor/src/distdoctor/recorder/patch.py",
               "/old/install/distdoctor/trace/recorder.py")  # where the wrappers lived before the recorder package
    for path in foreign:
        assert is_library(path), path
    assert is_torch(foreign[0]) and is_torch(foreign[1]) and not is_torch(foreign[3])
    assert is_library("/usr/lib/python3.11/threading.py") and is_library("/opt/py/lib/python3.9/contextlib.py")
    assert is_user_code("/opt/conda/lib/python3.10/site-packages/megatron/core/parallel_state.py")


def test_distdoctors_own_stages_are_a_program_when_they_issue_collectives():
    """validate's checks issue collectives themselves: their lines are the ones a finding names."""
    execute = os.path.join(OURS, "validate", "execute.py")
    assert is_user_code(execute)
    assert is_user_code("/opt/conda/lib/python3.10/site-packages/distdoctor/validate/execute.py")


def test_diagnose_sim_and_lint_name_the_same_user_line(tmp_path):
    user = str(tmp_path / "distdoctor" / "latent.py")
    frames = [Frame("<module>", user, 8), Frame("all_reduce", c10d.__file__, 2900),
              Frame("wrapper", os.path.join(TORCH, "distributed", "c10d_logger.py"), 80)]
    e = Entry(index=0, group="0", seq=1, op="all_reduce", frames=frames)
    assert call_site(e) == "latent.py:8"
    assert user_frame(frames).filename == user
    assert [f.filename for f in user_chain(frames)] == [user]


def test_the_recorder_keeps_a_callers_frames_in_a_checkout_named_distdoctor(tmp_path):
    """A real call through the recorder's frame walk, from a script in a folder named `distdoctor`."""
    folder = tmp_path / "distdoctor"
    folder.mkdir()
    script = folder / "job.py"
    script.write_text(textwrap.dedent("""
        import sys
        import distdoctor.recorder.patch as patch

        def issue():
            return patch.caller_frames(sys._getframe(), 3)

        frames = issue()
        print(";".join(f"{c.co_filename}:{c.co_name}" for c, _ in frames))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True)
    names = out.stdout.strip().split(";")
    assert names[:2] == [f"{script}:issue", f"{script}:<module>"], names
