"""The ``maleki msgemm`` command and its part of ``maleki tour``."""

from __future__ import annotations

from maleki_rs import cli
from maleki_rs.msgemm import _cli


def test_bench_prints_counts_and_speed(capsys):
    assert cli.main(["msgemm", "bench", "--m", "130", "--k", "256", "--n", "3", "--format", "int2",
                     "--group-size", "64", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "equals the closed form" in out
    assert "numpy fp32" in out and "GB/s" in out and "read floor" in out


def test_bench_returns_figures():
    lines = []
    r = _cli.bench(200, 128, 1, "fp4", 32, "f32", "auto", repeat=2, out=lines.append)
    assert r["rel_l1"] < 1e-6
    assert r["counted"]["mac_ratio"] > 0
    assert len(lines) == 7
    # The floor is the packed bytes at numpy's read rate: numpy's time scaled by the byte ratio.
    pw_bytes, f32_bytes = r["packed_bytes"], 200 * 128 * 4
    assert abs(r["read_floor_s"] - r["numpy_s"] * pw_bytes / f32_bytes) <= 1e-9 * r["numpy_s"]


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
    assert ("dense int8 dot products" in lines[0]) == dense
