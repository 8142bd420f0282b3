"""The ``maleki msgemm`` command and its part of ``maleki tour``."""

from __future__ import annotations

import numpy as np
import pytest

from maleki_rs import cli
from maleki_rs.msgemm import _cli


def test_bench_prints_counts_and_speed(capsys):
    assert cli.main(["msgemm", "bench", "--m", "130", "--k", "256", "--n", "3", "--format", "int2",
                     "--group-size", "64", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "equals the closed form" in out
    assert "numpy fp32" in out and "GB/s" in out and "at numpy's read rate" in out
    # An estimate from numpy's timing, which the measured msgemm may beat: no bound claimed.
    assert "an estimate, not a bound" in out and "at most" not in out


def test_bench_returns_figures():
    lines = []
    r = _cli.bench(200, 128, 1, "fp4", 32, "f32", "auto", repeat=2, out=lines.append)
    assert r["rel_l1"] < 1e-6
    assert r["counted"]["mac_ratio"] > 0
    assert len(lines) == 8
    assert "rel. L1 error" in lines[4] and "against the float64 product of the dequantized weights" in lines[4]
    # The floor is the bytes read at numpy's read rate: numpy's time scaled by the byte ratio.
    read, f32_bytes = r["read_bytes"], 200 * 128 * 4
    assert abs(r["read_floor_s"] - r["numpy_s"] * read / f32_bytes) <= 1e-9 * r["numpy_s"]


def test_bench_float16_scales(capsys):
    assert cli.main(["msgemm", "bench", "--m", "70", "--k", "128", "--format", "int4", "--group-size", "32",
                     "--repeat", "2", "--scale-dtype", "float16"]) == 0
    assert "float16 scales" in capsys.readouterr().out


def test_bench_i16_batches_say_which_path_runs(capsys):
    from maleki_rs import msgemm as mg

    lines = []
    r = _cli.bench(130, 256, 5, "int4", 64, "i16", "auto", repeat=2, out=lines.append)
    # int8 activations per (column, group): the i16 mode's error on Gaussian data (~7e-3).
    assert r["rel_l1"] < 3e-2
    pw = mg.quantize(__import__("numpy").ones((130, 256)), "int4", 64)
    dense = mg.plan_info(pw, n=5, table="i16")["dense_int8"]
    assert ("the dense int8 path (int8 dot products, no tables)" in lines[0]) == dense
    assert ("depth=" in lines[0]) != dense  # no depth where no tables run
    # The instruction ratio is the table method's, and the line says what ran instead.
    assert lines[1].startswith("  table method's count (int4")
    assert ("; the run below used the dense int8 path, not tables" in lines[1]) == dense


def test_bench_fp8_says_which_path_runs():
    from maleki_rs import msgemm as mg

    lines = []
    r = _cli.bench(70, 256, 1, "fp8_e4m3", 64, None, "auto", repeat=2, out=lines.append)
    # The fp8 path's float32 sums (where it runs), else the default i8 tables.
    pw = mg.quantize(__import__("numpy").ones((70, 256)), "fp8_e4m3", 64)
    fp8 = mg.plan_info(pw)["fp8_kernel"] is not None
    assert ("the fp8 path (codes decoded in registers" in lines[0]) == fp8
    assert r["rel_l1"] < (1e-6 if fp8 else 3e-2)
    # Depth 1: no "1.00x fewer", the tables save nothing.
    assert "at depth 1 the tables do not reduce the work" in lines[1] and "1.00x" not in lines[1]
    assert "-> no fewer" in lines[2]
    if fp8:  # the fp8 path reads the packed codes and float32 scales
        assert r["read_bytes"] == pw.packed.nbytes + 4 * pw.scales.size


def test_bench_counts_the_scale_bytes_it_reads():
    # float16 scales: 2 bytes per scale read, not the canonical 4 of nbytes.
    r32 = _cli.bench(64, 256, 1, "int4", 32, "i8", 2, repeat=1, out=lambda _: None)
    r16 = _cli.bench(64, 256, 1, "int4", 32, "i8", 2, repeat=1, out=lambda _: None, scale_dtype="float16")
    assert r16["packed_bytes"] == r32["packed_bytes"]
    assert r32["read_bytes"] - r16["read_bytes"] == 2 * 64 * 256 // 32


def _parse_error(argv, capsys) -> str:
    """The one-line argparse error of ``maleki argv`` (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("flag, value, why", [
    ("--repeat", "0", "must be >= 1, got 0"),
    ("--repeat", "-1", "must be >= 1, got -1"),
    ("--m", "0", "must be >= 1, got 0"),
    ("--m", "-1", "must be >= 1, got -1"),
    ("--n", "-2", "must be >= 1, got -2"),
    ("--depth", "abc", "expected an integer, got 'abc'"),
    ("--group-size", "0", "must be >= 1, got 0"),
])
def test_bad_flags_are_named_before_running(flag, value, why, monkeypatch, capsys):
    monkeypatch.setattr(_cli, "bench", lambda *a, **k: pytest.fail("ran before checking the flags"))
    line = _parse_error(["msgemm", "bench", "--m", "64", "--k", "128", flag, value], capsys)
    assert line == f"maleki msgemm bench: error: argument {flag}: {why}"


def test_bench_refuses_no_repeats():
    with pytest.raises(ValueError, match="repeat: must be >= 1"):
        _cli.bench(64, 128, repeat=0, out=lambda _: None)


def test_small_shapes_report_sizes_and_more_instructions(capsys):
    from maleki_rs import msgemm as mg

    assert cli.main(["msgemm", "bench", "--m", "64", "--k", "128", "--depth", "2", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    # 64 x 128 int4 weights: 4096 bytes of codes and 64 float32 scales.
    assert (64 * 128 // 2 + 64 * 4) == mg.quantize(np.ones((64, 128), np.float32), "int4", 128).nbytes
    assert "packed 4.35 kB" in out and "pre-dequantized: 32.8 kB" in out
    # At M = 64 the tables cost more than they save: dense / msGeMM instructions < 1.
    ratio = mg.op_counts(64, 128, format="int4", depth=2)["mac_ratio"]
    assert ratio < 1 and f"-> {1 / ratio:.2f}x more instructions" in out
    assert "fewer" not in out and " 0.000 " not in out and "0.00 MB" not in out


def test_number_formats():
    assert [_cli._sig(x) for x in (0.0123456, 1.23456, 12.3456, 123.456, 12345.6, 0.0)] == \
        ["0.0123", "1.23", "12.3", "123", "12346", "0"]
    assert [_cli._bytes(n) for n in (999, 4352, 33_554_432, 2.5e9)] == ["999 B", "4.35 kB", "33.6 MB", "2.50 GB"]
    assert [_cli._time(t) for t in (2.5e-7, 4.77e-4, 7.268e-3)] == ["0.250 us", "477 us", "7.27 ms"]
    assert _cli._fewer(2.2) == "2.20x fewer" and _cli._fewer(0.4) == "2.50x more"
