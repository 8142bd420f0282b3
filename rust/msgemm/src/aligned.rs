//! Cache-line aligned buffers of plain values.
//!
//! The kernels read indices, tables and tiled scales in 64-byte vectors at offsets that are
//! multiples of 64 from the start of each buffer. A `Vec<u8>` of that size starts 16 bytes past
//! a line (the allocator's header), so every such load spans two cache lines; measured on the
//! int4 GEMV (4096 x 4096, one thread) that cost about a third of the lookup time. These
//! buffers start on a line boundary.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use bytemuck::{Pod, Zeroable};

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

// SAFETY: 64 bytes of `u8` with alignment 64: no padding, every bit pattern valid.
unsafe impl Zeroable for Line {}
// SAFETY: as above; `Line` is `Copy` and `repr(C)`.
unsafe impl Pod for Line {}

/// A growable buffer of `T` whose first element starts a cache line (`T` of 1, 2 or 4 bytes).
pub struct AlignedVec<T> {
    lines: Vec<Line>,
    len: usize,
    _values: PhantomData<T>,
}

impl<T: Pod> AlignedVec<T> {
    const PER_LINE: usize = 64 / std::mem::size_of::<T>();

    /// `len` zero values.
    pub fn zeroed(len: usize) -> Self {
        AlignedVec {
            lines: vec![Line::zeroed(); len.div_ceil(Self::PER_LINE)],
            len,
            _values: PhantomData,
        }
    }

    /// `len` zero values, or [`maleki_common::Error::OutOfMemory`] naming `what`: for the
    /// buffers that grow with the weights or the activations.
    pub fn try_zeroed(len: usize, what: &str) -> maleki_common::Result<Self> {
        Ok(AlignedVec {
            lines: maleki_common::alloc::zeroed_vec(len.div_ceil(Self::PER_LINE), what)?,
            len,
            _values: PhantomData,
        })
    }

    /// A copy of `values`.
    pub fn from_slice(values: &[T]) -> Self {
        let mut v = Self::zeroed(values.len());
        v.copy_from_slice(values);
        v
    }

    /// Sets the length to 0, keeping the allocation.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Sets the length to `len`; values past the old length are zero (as `Vec::resize`
    /// with zero), values before it are kept.
    pub fn resize_zeroed(&mut self, len: usize) {
        if len > self.len {
            let need = len.div_ceil(Self::PER_LINE);
            if need > self.lines.len() {
                self.lines.resize(need, Line::zeroed());
            }
            let old = self.len;
            self.len = len;
            self[old..].fill(T::zeroed());
        } else {
            self.len = len;
        }
    }

    /// Bytes allocated.
    pub fn capacity_bytes(&self) -> usize {
        self.lines.capacity() * 64
    }
}

impl<T: Pod> Deref for AlignedVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice::<Line, T>(&self.lines)[..self.len]
    }
}

impl<T: Pod> DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut::<Line, T>(&mut self.lines)[..self.len]
    }
}

impl<'a, T: Pod> IntoIterator for &'a AlignedVec<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: Pod> Clone for AlignedVec<T> {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl<T: Pod + PartialEq> PartialEq for AlignedVec<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Pod + Eq> Eq for AlignedVec<T> {}

impl<T: Pod + fmt::Debug> fmt::Debug for AlignedVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_a_line_and_behaves_like_a_zeroed_vec() {
        for len in [0usize, 1, 15, 16, 17, 63, 64, 65, 1000] {
            let v = AlignedVec::<f32>::zeroed(len);
            assert_eq!(v.as_ptr() as usize % 64, 0);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&x| x == 0.0));
        }
        let mut v = AlignedVec::<u16>::from_slice(&[1, 2, 3, 4, 5]);
        let mut w: Vec<u16> = vec![1, 2, 3, 4, 5];
        // Shrinking then growing zeroes the regrown values, as Vec::resize does.
        for len in [3usize, 40, 2, 70, 70, 0, 33] {
            v.resize_zeroed(len);
            w.resize(len, 0);
            assert_eq!(&*v, &w[..]);
            v.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = i as u16 + 7);
            w.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = i as u16 + 7);
            assert_eq!(v.as_ptr() as usize % 64, 0);
        }
        v.clear();
        assert!(v.is_empty());
        assert_eq!(AlignedVec::from_slice(&[3i8; 5]).to_vec(), vec![3i8; 5]);
        assert_eq!(v.clone(), v);
    }
}
