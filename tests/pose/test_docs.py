"""The examples in the pose docstrings run as written (the README's are run by tests/test_readme.py)."""

from __future__ import annotations

import doctest

import maleki_rs.pose._estimate as estimate_module



def test_docstring_examples():
    result = doctest.testmod(estimate_module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
