"""
The core scripts read like nanoGPT's (the style the project follows): one statement per line and plain
control flow — no string or list multiplied by a condition, no conditional expression inside another or
used as an `if` test — and functions a reader can hold in mind (at most 60 lines). dev/style_report.py
prints the counts behind this.
"""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "dev"))
import style_report  # noqa: E402


@pytest.mark.parametrize("name", style_report.CORE_FILES)
def test_core_file_has_no_packed_constructs_or_long_functions(name):
    report = style_report.report((ROOT / name).read_text())
    assert report["packed"] == [], report["packed"]
    assert report["long_functions"] == [], report["long_functions"]


def test_the_checker_sees_what_it_forbids():
    packed = ("x = 'a' * (n > 8)\n"
              "y = a if b else c if d else e\n"
              "if (p if q else r):\n    pass\n")
    found = [what for _, what in style_report.report(packed)["packed"]]
    assert found == ["a string or list multiplied by a condition", "a conditional expression inside another",
                     "a conditional expression as an if test"]
    long_function = "def f():\n" + "    x = 1\n" * 60
    assert style_report.report(long_function)["long_functions"] == [("f", 1, 61)]
