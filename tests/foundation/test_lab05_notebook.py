"""examples/lab05_distributed_validation.ipynb runs end to end with nbclient on real gloo ranks, and every exercise
shows what it claims: a check that passes, the same check failing on a planted fault and naming the rank."""

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "lab05_distributed_validation.ipynb"
nbformat = pytest.importorskip("nbformat", reason="the notebook runners are in the test extra: pip install -e .[test]")
nbclient = pytest.importorskip("nbclient", reason="the notebook runners are in the test extra: pip install -e .[test]")
pytest.importorskip("ipykernel", reason="the notebook kernel is in the test extra: pip install -e .[test]")


def text_of(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        out.append(o.get("text") or o.get("data", {}).get("text/plain", ""))
    return "".join(out)


def outputs_by_exercise(nb) -> dict[str, str]:
    """The text every code cell printed, grouped under the exercise heading above it."""
    groups, current = {}, "setup"
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.startswith("## "):
            current = cell.source.splitlines()[0][3:].split(":")[0]
        elif cell.cell_type == "code":
            groups[current] = groups.get(current, "") + text_of(cell)
    return groups


def check_outputs(nb) -> None:
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == [], errors[0].get("evalue") if errors else None
    out = outputs_by_exercise(nb)
    assert "PASS" in out["Exercise 5.1"] and "Culprit: rank 2: wrong result" in out["Exercise 5.1"]
    assert "Rank 3: expected=10.0, got=10.0, PASS" in out["Exercise 5.2"]
    assert "lost: rank 3 on" in out["Exercise 5.2"] and "exited with code 9" in out["Exercise 5.2"]
    assert "# Avg bus bandwidth" in out["Exercise 5.3"] and "4194304" in out["Exercise 5.3"]
    assert "measured" in out["Exercise 5.4"] and "projected" in out["Exercise 5.4"]
    assert "no problems seen" in out["Exercise 5.5"] and "step 3 forward fc2" in out["Exercise 5.5"]
    hang = out["Exercise 5.6"]
    assert "missing_ranks: ranks [1] at all_reduce #2" in hang and "load_batch" in hang
    assert "crash (" in hang and "rank 3 exited with code 17" in hang
    assert "rank 1: skipped #2 all_reduce" in hang and "stragglers: [(1," in hang and "failed checks: 0" in hang
    assert "parity PASSED" in out["Exercise 5.7"] and "with drift:1 -> FAIL" in out["Exercise 5.7"]


def test_the_committed_notebook_has_its_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    check_outputs(nb)  # saved outputs: what a reader sees without running anything
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.slow
def test_the_notebook_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    check_outputs(nb)
