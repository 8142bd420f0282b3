"""The examples in the pose docstrings and in the README's pose section run as written."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

import maleki_rs.pose._estimate as estimate_module

README = Path(__file__).resolve().parents[2] / "README.md"


def test_docstring_examples():
    result = doctest.testmod(estimate_module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_readme_pose_quick_start(capsys):
    text = README.read_text()
    section = text.split("## pose:", 1)
    if len(section) < 2:
        pytest.fail("README has no pose section")
    code = re.search(r"```python\n(.*?)```", section[1], re.S)
    assert code is not None
    exec(compile(code.group(1), "README.md (pose)", "exec"), {})
    assert "True" in capsys.readouterr().out
