"""Answer parsing and prompt rendering, without a server."""

from __future__ import annotations

import pytest

from operators import OperatorError
from operators.llm import EditBlock, apply_blocks, extract_code, extract_params, load_template, parse_blocks, render

SRC = "int a = 1;\nint b = 2;\n  x(a,  b);\nint b = 2;\n"


def test_parse_blocks_several_and_marker_variants() -> None:
    text = ("intro\n<<<<<<< SEARCH\nint a = 1;\n=======\nint a = 3;\n>>>>>>> REPLACE\nmid\n"
            "<<<<<<<< SEARCH\n  x(a,  b);\n========\n  y(a);\n>>>>>>>> REPLACE\n")
    assert parse_blocks(text) == [EditBlock("int a = 1;", "int a = 3;"), EditBlock("  x(a,  b);", "  y(a);")]
    assert apply_blocks(SRC, parse_blocks(text)) == "int a = 3;\nint b = 2;\n  y(a);\nint b = 2;\n"


def test_apply_exact_then_whitespace_tolerant() -> None:
    out = apply_blocks(SRC, [EditBlock("x(a, b);", "z();")])  # inner spacing differs -> line match
    assert out == "int a = 1;\nint b = 2;\nz();\nint b = 2;\n"


@pytest.mark.parametrize(("block", "match"), [
    (EditBlock("int b = 2;", "int b = 5;"), r"block 1: SEARCH text is ambiguous: it matches 2 places"),
    (EditBlock("int  b =  2;", "int b = 5;"), r"block 1: SEARCH text is ambiguous: it matches 2 places in the parent "
                                               r"\(whitespace-insensitive\)"),
    (EditBlock("int c = 3;", ""), r"block 1: SEARCH text not found in the parent \(first line: 'int c = 3;'\)"),
    (EditBlock("  \n", "x"), r"block 1: SEARCH is empty"),
])
def test_apply_errors(block: EditBlock, match: str) -> None:
    with pytest.raises(OperatorError, match=match):
        apply_blocks(SRC, [block])


def test_parse_errors() -> None:
    with pytest.raises(OperatorError, match=r"block 1: SEARCH is not followed by '======='"):
        parse_blocks("<<<<<<< SEARCH\nint a;\n")
    with pytest.raises(OperatorError, match="block 1: no '=======' divider"):
        parse_blocks("<<<<<<< SEARCH\nint a;\n>>>>>>> REPLACE\n")
    with pytest.raises(OperatorError, match="no SEARCH/REPLACE edit blocks"):
        apply_blocks(SRC, [])


def test_extract_code_prefers_cuda_and_ignores_json() -> None:
    text = "```json\n{\"params\": {}}\n```\n```cpp\nint host();\n```\n```cuda\n__global__ void k() {}\n```\n"
    assert extract_code(text) == "__global__ void k() {}\n"
    assert extract_code("```\nvoid f();\n```") == "void f();\n"
    with pytest.raises(OperatorError, match="^no code block in the response$"):
        extract_code("```json\n{}\n```")
    with pytest.raises(OperatorError, match="truncated"):
        extract_code("```cuda\n__global__ void k() {")


def test_extract_params() -> None:
    assert extract_params("no json here") is None
    assert extract_params('```json\n{"params": {"T": 2}}\n```') == {"T": 2}
    with pytest.raises(OperatorError, match="not valid JSON"):
        extract_params('```json\n{"params": {T: 2}}\n```')


def test_render_truncates_longest_first() -> None:
    tmpl = "A:$a\nB:$b\nP:$parent\n$$5"
    out = render(tmpl, {"a": "x" * 5000, "b": "y" * 900, "parent": "p" * 1000}, max_chars=3000)
    assert len(out) <= 3000 and out.endswith("$5")
    assert "[... truncated " in out.split("B:")[0]  # the longest section was cut
    assert "y" * 900 in out and "p" * 1000 in out  # the others fit once it was
    assert render(tmpl, {"a": "1", "b": "2", "parent": "3"}, max_chars=None) == "A:1\nB:2\nP:3\n$5"
    with pytest.raises(ValueError, match="line 1: invalid placeholder"):
        render("costs $ 5", {})


def test_load_template_forms(tmp_path: pytest.TempPathFactory) -> None:
    assert "<<<<<<< SEARCH" in load_template("diff.txt")
    assert load_template("inline $parent") == "inline $parent"
    p = tmp_path / "t.txt"  # type: ignore[operator]
    p.write_text("from file $parent")
    assert load_template(str(p)) == load_template(p) == "from file $parent"
