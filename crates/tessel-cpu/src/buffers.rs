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
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with the same layout.
        unsafe { dealloc(self.ptr, Self::layout(self.len)) }
    }
}

/// The bytes of `t` in its dtype's machine format (little endian; bf16 and f16 as bits).
pub fn encode(t: &TensorData) -> AlignedBuf {
    let w = t.dtype.bytes();
    let mut b = AlignedBuf::zeroed(t.data.len() * w);
    let s = b.as_mut_slice();
    for (i, &v) in t.data.iter().enumerate() {
        let at = &mut s[i * w..(i + 1) * w];
        match t.dtype {
            DType::BF16 => at.copy_from_slice(&half::bf16::from_f64(v).to_bits().to_le_bytes()),
            DType::F16 => at.copy_from_slice(&half::f16::from_f64(v).to_bits().to_le_bytes()),
            DType::F32 => at.copy_from_slice(&(v as f32).to_le_bytes()),
            DType::I8 => at[0] = (v as i8) as u8,
            DType::U8 => at[0] = v as u8,
            DType::I32 => at.copy_from_slice(&(v as i32).to_le_bytes()),
        }
    }
    b
}

/// The tensor held by `bytes` (the inverse of [`encode`]).
pub fn decode(bytes: &[u8], shape: Vec<u64>, dtype: DType) -> TensorData {
    let w = dtype.bytes();
    let n = shape.iter().product::<u64>() as usize;
    let data = (0..n)
        .map(|i| {
            let at = &bytes[i * w..(i + 1) * w];
            let two = || u16::from_le_bytes([at[0], at[1]]);
            let four = || [at[0], at[1], at[2], at[3]];
            match dtype {
                DType::BF16 => half::bf16::from_bits(two()).to_f64(),
                DType::F16 => half::f16::from_bits(two()).to_f64(),
                DType::F32 => f32::from_le_bytes(four()) as f64,
                DType::I8 => at[0] as i8 as f64,
                DType::U8 => at[0] as f64,
                DType::I32 => i32::from_le_bytes(four()) as f64,
            }
        })
        .collect();
    TensorData { shape, dtype, data }
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
