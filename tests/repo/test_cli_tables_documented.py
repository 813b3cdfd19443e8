"""Every column header the command line prints is explained in docs/cli-tables.md (issue 37).

The headers are read from the code that prints them: the diagnosis table's ``COLUMNS``, and every
string literal given to a rich ``add_column`` or iterated into one (``for col in (...)``)."""

import ast

from repo_root import ROOT

DOC = ROOT / "docs" / "cli-tables.md"


def _printed_headers() -> dict[str, str]:
    headers = {}
    for path in sorted((ROOT / "src" / "rla").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_column" and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    headers[arg.value] = str(path)
            if isinstance(node, ast.For) and isinstance(node.iter, (ast.Tuple, ast.List)):
                body = ast.dump(ast.Module(body=node.body, type_ignores=[]))
                if "add_column" in body:
                    for elt in node.iter.elts:
                        if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                            headers[elt.value] = str(path)
    from rla.diagnosis.report import COLUMNS

    headers.update({name: "rla.diagnosis.report.COLUMNS" for name, _, _ in COLUMNS})
    return headers


def test_every_printed_column_is_explained():
    headers = _printed_headers()
    assert {"clip.2", "seq std", "d==0", "k3 removed", "logits bit-equal", "differs from hf"} <= set(headers)
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    explained = {line.split("`")[1].replace("\\|", "|") for line in rows}  # a pipe in a table cell is \|
    missing = {h: where for h, where in headers.items() if h not in explained}
    assert not missing, f"columns printed but not explained in {DOC.name}: {missing}"
