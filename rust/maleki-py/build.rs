//! Copies the CUDA sources (`cuda/**/*.cu|*.cuh|*.md`) into `$OUT_DIR/_cuda`, from where maturin
//! ships them in the wheel as `maleki_rs/_cuda/` (pyproject `include`, `from = "out-dir"`).
//! The old copy is deleted first so that removed kernels never survive in the wheel.

use std::fs;
use std::path::{Path, PathBuf};

fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    fs::create_dir_all(dst)?;
    let mut entries: Vec<_> = fs::read_dir(src)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let target = dst.join(entry.file_name());
        if path.is_dir() {
            copy_tree(&path, &target)?;
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("cu" | "cuh" | "md")
        ) {
            fs::copy(&path, &target)?;
        }
    }
    Ok(())
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let cuda = manifest.join("../../cuda");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("_cuda");
    println!("cargo:rerun-if-changed={}", cuda.display());
    if out.exists() {
        fs::remove_dir_all(&out).expect("removing the old _cuda copy");
    }
    if cuda.is_dir() {
        copy_tree(&cuda, &out).expect("copying cuda/ into OUT_DIR/_cuda");
    } else {
        // An sdist without cuda/ still builds; the GPU paths then report missing sources.
        fs::create_dir_all(&out).unwrap();
    }
}
