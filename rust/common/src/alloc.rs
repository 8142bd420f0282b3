//! Allocation that reports failure as an error instead of aborting.
//!
//! Rust aborts the process when an allocation fails (`vec![0; n]`, `Vec::resize`); from
//! Python that kills the interpreter. Buffers whose size grows with the user's data (caches
//! of weights, copies of activations, outputs) are allocated here instead, so that running out
//! of memory becomes [`Error::OutOfMemory`] (`MemoryError` in Python).

use bytemuck::Zeroable;

use crate::{Error, Result};

/// `len` zero values of `T`, or [`Error::OutOfMemory`] naming `what`. Like `vec![0; len]` it
/// asks the allocator for zeroed memory, which large sizes get as untouched pages (no pass
/// over the buffer to zero it).
pub fn zeroed_vec<T: Zeroable>(len: usize, what: &str) -> Result<Vec<T>> {
    let too_big = || Error::OutOfMemory {
        what: what.to_string(),
        bytes: len.saturating_mul(std::mem::size_of::<T>()),
    };
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| too_big())?;
    if layout.size() == 0 {
        // No allocation for zero-sized requests (as `Vec` does).
        let mut v = Vec::new();
        v.resize_with(len, T::zeroed);
        return Ok(v);
    }
    // SAFETY: `layout` has a non-zero size. On success the memory is `len` zeroed values of
    // `T` (valid: `T: Zeroable`), allocated by the global allocator with exactly the layout
    // `Vec<T>` of capacity `len` uses, so `from_raw_parts` takes ownership of it.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut T;
        if p.is_null() {
            return Err(too_big());
        }
        Ok(Vec::from_raw_parts(p, len, len))
    }
}

/// A copy of `values`, or [`Error::OutOfMemory`] naming `what`.
pub fn copied_vec<T: Copy>(values: &[T], what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(values.len())
        .map_err(|_| Error::OutOfMemory {
            what: what.to_string(),
            bytes: std::mem::size_of_val(values),
        })?;
    v.extend_from_slice(values);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_vec_is_zeros_of_the_asked_length() {
        for len in [0usize, 1, 7, 4096, 1 << 20] {
            let v: Vec<f32> = zeroed_vec(len, "test").unwrap();
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&x| x == 0.0));
        }
        let v: Vec<()> = zeroed_vec(5, "test").unwrap();
        assert_eq!(v.len(), 5);
        assert_eq!(copied_vec(&[1u16, 2, 3], "test").unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn impossible_sizes_are_errors_that_name_the_buffer() {
        // Past isize::MAX bytes: the layout itself is refused.
        let e = zeroed_vec::<u64>(usize::MAX / 4, "the cache").unwrap_err();
        assert!(
            matches!(&e, Error::OutOfMemory { what, .. } if what == "the cache"),
            "{e}"
        );
        // A layout the allocator cannot give (2**62 bytes is beyond any machine's memory).
        let e = zeroed_vec::<u8>(1 << 62, "the copy").unwrap_err();
        assert!(e.to_string().contains("the copy"), "{e}");
        assert!(e.to_string().contains(&(1u64 << 62).to_string()), "{e}");
    }
}
