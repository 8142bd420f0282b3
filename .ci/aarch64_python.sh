#!/usr/bin/env bash
# The msgemm Python tests on Arm64, under qemu-user: Debian's aarch64 CPython (packages unpacked
# into a sysroot, nothing installed system-wide but the arm64 package architecture), the
# aarch64 wheels of the test dependencies from PyPI, and our aarch64 wheel (`ci` profile). The
# Rust tests cover the Arm64 kernels; this covers the bindings, the Python checks and the
# Python oracles (the i16 replica, the exact tests) on the NEON and `sdot` paths.
#
# Best effort, as the rest of the Arm64 checks: without qemu-aarch64-static, the aarch64
# linker, or a way to fetch the packages (root and apt), it says so and skips.
# Usage: .ci/aarch64_python.sh PYTHON MATURIN (the venv's python and maturin).
set -euo pipefail
PY=$1
MATURIN=$2
ROOT=target/aarch64-python
SYSROOT=$ROOT/sysroot
SITE=$ROOT/site
PYVER=3.11
skip() { echo "aarch64-python: $1: the Python tests on Arm64 are skipped"; exit 0; }

command -v qemu-aarch64-static >/dev/null || skip "no qemu-aarch64-static"
command -v aarch64-linux-gnu-gcc >/dev/null || skip "no aarch64-linux-gnu-gcc"
if [ ! -x "$SYSROOT/usr/bin/python$PYVER" ]; then
    command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] || skip "no apt-get as root to fetch Debian's aarch64 CPython"
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        dpkg --add-architecture arm64
        apt-get update -q >/dev/null 2>&1 || skip "apt-get update failed"
    fi
    rm -rf "$ROOT/debs" "$SYSROOT"
    mkdir -p "$ROOT/debs" "$SYSROOT"
    # The interpreter, its standard library and the shared libraries they load.
    (cd "$ROOT/debs" && apt-get download -q \
        "python$PYVER-minimal:arm64" "libpython$PYVER-minimal:arm64" "libpython$PYVER-stdlib:arm64" \
        libc6:arm64 libgcc-s1:arm64 libstdc++6:arm64 libexpat1:arm64 zlib1g:arm64 libffi8:arm64 \
        libssl3:arm64 libsqlite3-0:arm64 libbz2-1.0:arm64 liblzma5:arm64 libncursesw6:arm64 \
        libtinfo6:arm64 libreadline8:arm64 libuuid1:arm64 libcrypt1:arm64 >/dev/null 2>&1) \
        || skip "apt-get download of the arm64 packages failed"
    for deb in "$ROOT"/debs/*.deb; do dpkg -x "$deb" "$SYSROOT"; done
fi
rm -rf "$SITE" "$ROOT/wheel" "$ROOT/run"
"$PY" -m pip install -q --target "$SITE" --only-binary=:all: --implementation cp \
    --python-version "$PYVER" --platform manylinux_2_17_aarch64 --platform manylinux_2_28_aarch64 \
    --platform manylinux2014_aarch64 \
    "numpy>=2.0,<2.6" "pytest>=8" "hypothesis>=6" "scipy>=1.11" "tqdm>=4.60" "ml_dtypes>=0.4" \
    || skip "pip could not fetch the aarch64 wheels"
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    "$MATURIN" build --locked --profile ci --target aarch64-unknown-linux-gnu --compatibility linux \
    -o "$ROOT/wheel"
"$PY" -m zipfile -e "$ROOT"/wheel/*.whl "$SITE"

# A copy of the tests away from python/ (so that the aarch64 package is the one imported).
mkdir -p "$ROOT/run"
cp -r tests pyproject.toml README.md "$ROOT/run/"
SITE_ABS=$(cd "$SITE" && pwd)
SYSROOT_ABS=$(cd "$SYSROOT" && pwd)
cd "$ROOT/run"
export PYTHONPATH=$SITE_ABS
qemu-aarch64-static -L "$SYSROOT_ABS" "$SYSROOT_ABS/usr/bin/python$PYVER" -c \
    "import platform, maleki_rs.msgemm as mg; print('aarch64-python:', platform.machine(), mg.available_backends())"
qemu-aarch64-static -L "$SYSROOT_ABS" "$SYSROOT_ABS/usr/bin/python$PYVER" \
    -m pytest -q -p no:cacheprovider tests/msgemm
