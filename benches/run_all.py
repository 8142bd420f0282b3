"""Runs every side-by-side Python benchmark (``benches/*_bench.py``); each rewrites its own
section of BENCHMARKS.md. Usage: ``python benches/run_all.py [name ...]``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    scripts = sorted(HERE.glob("*_bench.py"))
    if names:
        scripts = [s for s in scripts if s.name.removesuffix("_bench.py") in names]
    if not scripts:
        print("no benchmark scripts matched", file=sys.stderr)
        return 2
    failed = []
    for script in scripts:
        print(f"== {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script)]).returncode != 0:
            failed.append(script.name)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
