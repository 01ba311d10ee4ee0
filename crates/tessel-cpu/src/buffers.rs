//! Tensors as the raw, 64-byte aligned bytes that kernels read and write.

use std::alloc::{Layout, alloc_zeroed, dealloc};

use tessel_ir::{DType, TensorData};

/// A zeroed, 64-byte aligned byte buffer.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// The buffer owns its memory outright.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> Self {
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (at least 64 bytes).
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        // Never zero-sized, always 64-byte aligned; sizes come from validated shapes.
        Layout::from_size_align(len.max(64), 64).unwrap_or(Layout::new::<[u8; 64]>())
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// The same bytes in a buffer of its own (other addresses, other pages).
    pub fn copy(&self) -> Self {
        let mut c = AlignedBuf::zeroed(self.len);
        c.as_mut_slice().copy_from_slice(self.as_slice());
        c
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with the same layout.
        unsafe { dealloc(self.ptr, Self::layout(self.len)) }
    }
}

/// The bytes of `t` in its dtype's machine format (little endian; bf16 and f16 as bits).
pub fn encode(t: &TensorData) -> AlignedBuf {
    let mut b = AlignedBuf::zeroed(t.data.len() * t.dtype.bytes());
    t.write_le_bytes(b.as_mut_slice());
    b
}

/// The tensor held by `bytes` (the inverse of [`encode`]); missing bytes read as zeros.
pub fn decode(bytes: &[u8], shape: Vec<u64>, dtype: DType) -> TensorData {
    let n = shape.iter().product::<u64>() as usize * dtype.bytes();
    if bytes.len() >= n {
        // The common case: no copy.
        return TensorData::from_le_bytes(&bytes[..n], shape, dtype).expect("exactly n bytes");
    }
    let mut padded = bytes.to_vec();
    padded.resize(n, 0);
    TensorData::from_le_bytes(&padded, shape, dtype).expect("padded to n bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips() {
        for t in DType::ALL {
            let x = TensorData::random(vec![3, 5], t, 7);
            let b = encode(&x);
            assert_eq!(b.as_slice().len(), 15 * t.bytes());
            assert_eq!(b.ptr as usize % 64, 0);
            assert_eq!(decode(b.as_slice(), vec![3, 5], t), x);
        }
    }
}
