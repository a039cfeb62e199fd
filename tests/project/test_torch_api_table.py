"""docs/torch-api.md is current: regenerated from the installed torch (2.13) against pyddp, it must
equal the committed page (run `python tests/_torch_api_table.py` after adding API to pyddp)."""
import pytest

torch = pytest.importorskip("torch")
import _torch_api_table as table  # noqa: E402


@pytest.mark.skipif(not torch.__version__.startswith(table.TORCH_VERSION),
                    reason="the table is generated from torch " + table.TORCH_VERSION)
def test_torch_api_table_is_current():
    with open(table.OUT, encoding="utf-8") as f:
        committed = f.read()
    assert table.generate() == committed, (
        "docs/torch-api.md is stale: run `python tests/_torch_api_table.py` and commit it")


def test_the_names_of_issue_36_are_present():
    text = open(table.OUT, encoding="utf-8").read()
    present = {}
    for section in text.split("\n## ")[1:]:
        title = section.split("\n", 1)[0]
        line = next(ln for ln in section.splitlines() if ln.startswith("**Present:**"))
        present[title] = set(n.strip("`., ") for n in line[len("**Present:**"):].split(","))
        # "differs" rows are present too
        present[title] |= {ln.split("`")[1] for ln in section.splitlines()
                           if ln.startswith("| `")}
    for name in ("topk", "eq", "einsum", "argsort", "gather", "diag", "diagonal", "multinomial",
                 "randperm", "norm", "prod", "cumsum"):
        assert name in present["torch.* functions"], name
    for name in ("topk", "scatter_", "gather", "fill_diagonal_", "view", "unflatten",
                 "as_strided", "diagonal", "argsort", "record_stream", "sigmoid_", "eq_"):
        assert name in present["Tensor methods and properties"], name
