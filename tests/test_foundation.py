"""The house: package import, configuration, threads, exceptions, the `maleki` command."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import maleki_rs
from maleki_rs import cli, exceptions
from maleki_rs._util import validate
from maleki_rs._util.progress import reporter
from maleki_rs._util.rng import generator, resolve_seed


def test_version_matches_the_compiled_core():
    assert maleki_rs.__version__ == maleki_rs._core.__version__
    assert maleki_rs.__version__.count(".") == 2


def test_importing_does_not_import_cupy_or_scipy():
    code = "import sys, maleki_rs; maleki_rs.show_config(); print('cupy' in sys.modules, 'scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False False"


def test_show_config_lists_subsystems(capsys):
    info = maleki_rs.show_config()
    assert set(info["subsystems"]) == set(maleki_rs.SUBSYSTEMS)
    assert info["num_threads"] == maleki_rs.get_num_threads() >= 1
    assert "maleki_rs" in capsys.readouterr().out


def test_set_num_threads_round_trip_and_validation():
    old = maleki_rs.get_num_threads()
    try:
        maleki_rs.set_num_threads(1)
        assert maleki_rs.get_num_threads() == 1
        maleki_rs.set_num_threads(2)
        assert maleki_rs.get_num_threads() == 2
    finally:
        maleki_rs.set_num_threads(old)
    with pytest.raises(ValueError, match="n: must be >= 1"):
        maleki_rs.set_num_threads(0)
    with pytest.raises(TypeError, match="expected an integer"):
        maleki_rs.set_num_threads(1.5)
    with pytest.raises(ValueError, match="at least 1"):
        maleki_rs._core.set_num_threads(-3)


def test_thread_count_from_environment():
    code = "import maleki_rs; print(maleki_rs.get_num_threads())"
    env = {"MALEKI_RS_NUM_THREADS": "3", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "3"


def test_exceptions_subclass_the_expected_builtins():
    assert issubclass(exceptions.DegenerateGeometryError, ValueError)
    assert issubclass(exceptions.ConvergenceError, RuntimeError)
    assert issubclass(exceptions.InfeasibleError, ValueError)
    assert issubclass(exceptions.GPUUnavailableError, RuntimeError)
    for name in exceptions.__all__:
        assert issubclass(getattr(exceptions, name), exceptions.MalekiError)


_OUT_OF_MEMORY = """
import resource, sys
import numpy as np
import maleki_rs.msgemm as mg

def vm_bytes():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))

m, k = 16384, 16384  # 128 MiB of int4 weights; their unpacked codes and caches are larger
codes = np.full((m, k), 9, np.uint8)
pw = mg.PackedWeights.from_arrays(codes, np.ones((m, k // 128), np.float32), format="int4")
del codes
x = np.ones(k, np.float32)
small = mg.quantize(np.ones((64, 128), np.float32), format="int4")  # starts the thread pool
mg.msgemm(small, x[:128]); mg.msgemm(small, np.ones((128, 16), np.float32))
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + int(sys.argv[1]) * 2**20, hard))
for name, call in [("gemv", lambda: mg.msgemm(pw, x, depth=3)),
                   ("batch", lambda: mg.msgemm(pw, np.ones((k, 16), np.float32))),
                   ("codes", lambda: pw.codes)]:
    try:
        call()
        print(name, "ran")
    except MemoryError as e:
        print(name, "MemoryError:", e)
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
print("after", mg.msgemm(pw, x)[0])  # the caches that failed are built now
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
def test_running_out_of_memory_raises_memory_error():
    # Rust aborts the process when an allocation fails; the caches and copies that grow with
    # the data are allocated fallibly instead, so a process short of memory gets MemoryError
    # (the address-space limit makes their allocations fail) and can go on once memory is back.
    # 48 MiB to spare: the 256 MiB of unpacked codes the caches are built from do not fit;
    # 320 MiB: they do, but not with the 128 MiB tile or dense layout built from them.
    for spare, fails in [(48, {"gemv": "codes", "batch": "codes", "codes": "codes"}),
                         (320, {"gemv": "tile layout", "batch": "layout", "codes": None})]:
        out = subprocess.run([sys.executable, "-c", _OUT_OF_MEMORY, str(spare)], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        lines = out.stdout.splitlines()
        for name, what in fails.items():
            line = next(l for l in lines if l.startswith(name + " "))
            if what is None:
                assert line == name + " ran", line
            else:
                assert line.startswith(name + " MemoryError: out of memory: could not allocate"), line
                assert line.endswith(what + " of the weights" if "layout" in what else "unpacked codes"), line
        # Every code is 9 (int4 value 1, scale 1): each output is K.
        assert lines[-1] == "after 16384.0", lines


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError):
        maleki_rs.not_a_subsystem  # noqa: B018


class TestValidate:
    def test_float_array_accepts_views_and_fortran_order(self):
        base = np.arange(24.0).reshape(4, 6)
        for x in (base[:, ::2], np.asfortranarray(base[:, :3]), base[:, :3].astype(np.float32), [[1, 2, 3]] * 4):
            out = validate.as_float_array(x, "x", shape=(None, 3))
            assert out.flags.c_contiguous and out.dtype == np.float64
            np.testing.assert_array_equal(out, np.asarray(x, dtype=np.float64))

    def test_no_copy_when_already_matching(self):
        x = np.zeros((5, 3))
        assert validate.as_float_array(x, "x", shape=(None, 3)) is x

    @pytest.mark.parametrize(
        "x, exc, msg",
        [
            (np.zeros((4, 2)), ValueError, r"x: expected shape \(\*, 3\), got \(4, 2\)"),
            (np.zeros((0, 3)), ValueError, "non-empty"),
            (np.array([[1, np.nan, 0]]), ValueError, r"non-finite value at index \(0, 1\)"),
            (np.array([["a", "b", "c"]]), TypeError, "real numeric"),
            (np.array([[1j, 0, 0]]), TypeError, "real numeric"),
            (np.array([[True, False, True]]), TypeError, "real numeric"),
            (None, TypeError, "got None"),
        ],
    )
    def test_float_array_rejects(self, x, exc, msg):
        with pytest.raises(exc, match=msg):
            validate.as_float_array(x, "x", shape=(None, 3))

    def test_scalars(self):
        assert validate.check_int(np.int32(4), "k", min=1) == 4
        with pytest.raises(TypeError):
            validate.check_int(True, "k")
        with pytest.raises(ValueError, match="k: must be <= 3"):
            validate.check_int(4, "k", max=3)
        # Without bounds, the 64-bit range the core takes (not a bare OverflowError later).
        assert validate.check_int(2**63 - 1, "k") == 2**63 - 1
        assert validate.check_int(-(2**63), "k") == -(2**63)
        with pytest.raises(ValueError, match=r"k: must be below 2\*\*63"):
            validate.check_int(2**63, "k")
        with pytest.raises(ValueError, match=r"k: must be >= -2\*\*63"):
            validate.check_int(-(2**63) - 1, "k")
        assert validate.check_int(2**64, "k", max=2**65) == 2**64  # explicit bounds rule
        assert validate.check_float(1e300, "x") == 1e300
        assert validate.check_float(2, "tol", min=0, min_exclusive=True) == 2.0
        with pytest.raises(ValueError, match="must be > 0"):
            validate.check_float(0.0, "tol", min=0, min_exclusive=True)
        with pytest.raises(ValueError, match="finite"):
            validate.check_float(float("nan"), "tol")
        with pytest.raises(ValueError, match="one of 'a', 'b'"):
            validate.check_choice("c", "mode", ("a", "b"))

    def test_int_array(self):
        np.testing.assert_array_equal(validate.as_int_array([1.0, 2.0], "o"), [1, 2])
        with pytest.raises(ValueError, match="integer values"):
            validate.as_int_array([1.5], "o")
        with pytest.raises(ValueError, match="values must lie"):
            validate.as_int_array([300], "o", dtype=np.uint8)


def test_seeds_are_resolved_and_streams_independent():
    s = resolve_seed(None)
    assert 0 <= s < 2**64
    assert resolve_seed(7) == 7
    with pytest.raises(ValueError):
        resolve_seed(-1)
    a = generator(7, 0).standard_normal(4)
    np.testing.assert_array_equal(a, generator(7, 0).standard_normal(4))
    assert not np.array_equal(a, generator(7, 1).standard_normal(4))


def test_progress_argument_resolution():
    seen = []
    with reporter(lambda d, t: seen.append((d, t)), "x") as rep:
        rep.callback(1, 2)
    assert seen == [(1, 2)]
    assert reporter(False, "x").callback is None
    with pytest.raises(TypeError, match="progress"):
        reporter("yes", "x")


class TestCommand:
    def run(self, *args):
        return subprocess.run([sys.executable, "-m", "maleki_rs", *args], capture_output=True, text=True)

    def test_version(self):
        out = self.run("--version")
        assert out.returncode == 0 and maleki_rs.__version__ in out.stdout

    def test_no_command_prints_help(self):
        out = self.run()
        assert out.returncode == 2 and "tour" in out.stdout

    def test_bad_thread_count_is_an_error(self):
        out = self.run("--threads", "0", "tour")
        assert out.returncode == 2 and "argument --threads: must be >= 1, got 0" in out.stderr

    @pytest.mark.parametrize("message, shown", [
        ("Unable to allocate 95.4 GiB for an array", "out of memory: Unable to allocate 95.4 GiB for an array"),
        ("out of memory: could not allocate 2 GiB", "out of memory: could not allocate 2 GiB"),  # the core's
    ])
    def test_memory_error_is_one_line(self, message, shown, monkeypatch, capsys):
        from maleki_rs.msgemm import _cli as msgemm_cli

        def bench(*args, **kwargs):
            raise MemoryError(message)

        monkeypatch.setattr(msgemm_cli, "bench", bench)
        assert cli.main(["msgemm", "bench"]) == 1
        assert capsys.readouterr().err == f"maleki: error: {shown}\n"

    @pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
    def test_running_out_of_memory_is_one_line(self):
        # 2 GiB of address space beyond what the started command holds (as in
        # test_running_out_of_memory_raises_memory_error): the 95 GiB of activations do not fit.
        code = _OUT_OF_MEMORY.split("m, k =")[0] + (
            "from maleki_rs import cli\n"
            "cli.build_parser()  # imports the subsystems first\n"
            "hard = resource.getrlimit(resource.RLIMIT_AS)[1]\n"
            "resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + (2 << 30), hard))\n"
            "sys.exit(cli.main(['msgemm', 'bench', '--m', '256', '--k', '256', '--n', '100000000']))\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert out.returncode == 1
        assert out.stderr.startswith("maleki: error: out of memory: ") and out.stderr.count("\n") == 1, out.stderr

    @pytest.mark.skipif(sys.platform == "win32", reason="POSIX pipes")
    def test_closed_stdout_exits_quietly_after_writing_the_files(self, tmp_path):
        from maleki_rs import tessel

        out_file = tmp_path / "s.csv"
        for args in (["tessel", "premises"],
                     ["tessel", "baseline", "1f1b", "--premise", "vshape", "--nmicros", "4", "--out", str(out_file)]):
            r, w = os.pipe()
            os.close(r)  # the reader is gone before the first line (| head -1 after its line)
            try:
                # Unbuffered: the first print meets the closed pipe, before the files.
                proc = subprocess.run([sys.executable, "-m", "maleki_rs", *args], stdout=w, stderr=subprocess.PIPE,
                                      text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=300)
            finally:
                os.close(w)
            assert (proc.returncode, proc.stderr) == (141, "")
        assert out_file.read_text() == tessel.baseline("1f1b", tessel.premise("vshape", 4), 4).to_csv()

    def test_ctrl_c_while_starting_is_not_a_traceback(self, monkeypatch, capsys):
        def build_parser():
            raise KeyboardInterrupt  # as if pressed while the subsystems are imported

        monkeypatch.setattr(cli, "build_parser", build_parser)
        assert cli.main(["tour"]) == 130
        assert capsys.readouterr().err == "interrupted\n"

    def test_tour_rejects_unknown_subsystem(self, capsys):
        assert cli.main(["tour", "--only", "nope"]) == 2
        assert "not available: nope" in capsys.readouterr().err


@pytest.mark.parametrize("name, value, warns", [
    ("MALEKI_RS_NUM_THREADS", v, w) for v, w in
    [("abc", True), ("0", True), ("1.5", True), ("99999", True), ("+1", False), (" 1 ", False), ("", False)]
] + [
    ("MALEKI_RS_SPIN_US", v, w) for v, w in
    [("abc", True), ("-1", True), ("1.5", True), ("100001", True), ("0", False), ("+250", False),
     (" 100000 ", False), ("", False)]
])
def test_a_bad_thread_setting_in_the_environment_warns_at_import(name, value, warns):
    code = "import warnings; warnings.simplefilter('error'); import maleki_rs; print(maleki_rs.get_num_threads())"
    env = {k: v for k, v in os.environ.items() if k not in ("MALEKI_RS_NUM_THREADS", "MALEKI_RS_SPIN_US")}
    env[name] = value
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if warns:
        assert r.returncode != 0 and f"RuntimeWarning: {name}=" in r.stderr
    else:
        assert r.returncode == 0, r.stderr
        if name == "MALEKI_RS_NUM_THREADS" and value.strip():
            assert r.stdout.strip() == "1"
