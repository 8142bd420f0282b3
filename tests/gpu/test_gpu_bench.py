"""``benches/gpu_msgemm.py`` runs end to end on the CPU simulator (small shapes, timings faked),
so that a broken script fails here and not in a device session's few minutes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from maleki_rs import _gpu

BENCH = Path(__file__).resolve().parents[2] / "benches" / "gpu_msgemm.py"


@pytest.fixture
def bench(sim_cp, monkeypatch):
    monkeypatch.setattr(_gpu, "require", lambda: sim_cp)
    monkeypatch.syspath_prepend(str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("gpu_msgemm_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    calls = []

    def fake_timed(cp_, fn, flush=None, **kw):
        if flush is not None:
            flush()
        fn()
        calls.append(fn)
        return 0.1

    monkeypatch.setattr(mod, "timed", fake_timed)
    monkeypatch.setattr(mod, "run_oracles", lambda: ("not run (simulator)", True))
    mod.calls = calls
    return mod


def test_bench_runs_on_the_simulator(bench, monkeypatch, capsys):
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(sys, "argv", ["gpu_msgemm.py", "--no-write", "--shapes", "600x512,300x1024",
                                      "--sweep-shapes", "520x256"])
    bench.main()
    out = capsys.readouterr().out
    lines = out.splitlines()

    def rows(first: str) -> int:
        return sum(line.startswith(f"| {first} |") for line in lines)

    # Every table row: 2 timed shapes x 4 N; sweep: 1 shape x 3 N x 2 depths x 2 stagings;
    # other formats: int2 and ternary x 2 N; tensor-core splits: 1 shape x 4 N x prefetch on, off.
    assert rows("(600, 512)") == 4 and rows("(300, 1024)") == 4
    assert rows("(520, 256)") == 12 + 8
    assert rows("int2 g64") == 2 + 1 and rows("ternary g80") == 2  # int2: also on tensor cores
    assert rows("nf4 g64") == 1 and rows("fp4 g32") == 1
    assert "a batch at a time" in out and "d = 2 (8-bit indices)" in out
    assert len(bench.calls) > 100


def test_bench_times_the_lut_kernels_when_the_tensor_core_oracles_fail(bench, monkeypatch, capsys):
    """A failing (or crashing) tensor-core kernel must not cost a device session the LUT
    figures: its oracles run apart, and the script then leaves it out."""
    from maleki_rs.msgemm import cuda as mgc

    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(bench, "run_oracles", lambda: ("tensor cores failed", False))
    monkeypatch.setattr(mgc, "dequant_mma_cuda", lambda *a, **k: pytest.fail("the tensor-core kernel ran"))
    monkeypatch.setattr(sys, "argv", ["gpu_msgemm.py", "--no-write", "--shapes", "200x256", "--sweep-shapes",
                                      "130x128"])
    bench.main()
    out = capsys.readouterr().out
    assert "not timed: its device oracles failed" in out
    assert sum(line.startswith("| (200, 256) |") for line in out.splitlines()) == 4


def test_the_full_size_tensor_core_check_runs(bench, capsys):
    bench.mma_smoke(40, 256)  # the device run's shapes scaled down
    out = capsys.readouterr().out
    assert out.count("mma smoke ") == 7 and "mma smoke passed" in out


def test_child_processes_report_their_end_and_are_stopped_when_they_hang(bench):
    assert bench._run(["-c", "print('first'); print('last')"], timeout=60)[:2] == (0, "last")
    assert bench._run(["-c", "import sys; sys.exit(3)"], timeout=60)[0] == 3
    rc, tail, _ = bench._run(["-c", "import time; print('started', flush=True); time.sleep(60)"], timeout=2)
    assert (rc, tail) == (124, "timed out after 2 s")


def test_bench_rejects_bad_shapes(bench, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_msgemm.py", "--no-write", "--shapes", "600x500"])
    with pytest.raises(SystemExit):
        bench.main()
