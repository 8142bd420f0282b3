"""Every Python example in the README's quick start runs as written (one namespace per
subsystem, in a scratch directory since some examples write files)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _sections() -> dict[str, list[str]]:
    text = README.read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    out = {}
    for part in re.split(r"^### ", quick, flags=re.M)[1:]:
        name = part.split(":", 1)[0].strip()
        out[name] = re.findall(r"```python\n(.*?)```", part, re.S)
    return out


SECTIONS = _sections()


def test_quick_start_covers_every_available_subsystem():
    import maleki_rs

    assert set(SECTIONS) == set(maleki_rs.AVAILABLE)
    assert all(SECTIONS.values())


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_quick_start_runs(name, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib") if name == "tessel" else None
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, block in enumerate(SECTIONS[name]):
        exec(compile(block, f"README.md ({name}, block {i})", "exec"), namespace)
