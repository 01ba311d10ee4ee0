//! Compiled references kept on disk between worker processes.
//!
//! A worker that runs past a check deadline is killed, and the next one must prepare the
//! task's reference again. For LLaMA prefill's GEMMs the naive reference takes 7-18 s, so
//! each killed kernel would cost that much again. The worker keeps such references in a file
//! named after everything they depend on (the operator, the reference kernel and a hash of
//! the very input bytes), so a stale file can never stand in for a different reference.
//!
//! Format: the magic `TSLREF01`, the element count (u64, little endian), then the output's
//! bytes in its dtype's machine format. A file that does not match is ignored (and
//! overwritten by the next store); stores go through a temporary file and a rename.

use std::io::Write;
use std::path::{Path, PathBuf};

use tessel_ir::{ComputeOp, TensorData};

use crate::buffers::{AlignedBuf, decode, encode};
use crate::compile::content_key;

const MAGIC: &str = "TSLREF01";

/// References that took less than this to compute are not worth a file.
pub const MIN_SECONDS: f64 = 0.5;

/// The file of `op`'s reference computed by the kernel `symbol` on `inputs`, under `dir`.
pub fn path(dir: &Path, op: &ComputeOp, symbol: &str, inputs: &[AlignedBuf]) -> PathBuf {
    let op_json = serde_json::to_string(op).unwrap_or_default();
    let input_hash = format!("{:016x}", hash_inputs(inputs));
    let key = content_key(&[MAGIC, &op_json, symbol, &input_hash]);
    dir.join(format!("ref-{key}.bin"))
}

/// The reference in `file`, if it exists and holds exactly `op`'s output.
pub fn load(file: &Path, op: &ComputeOp) -> Option<TensorData> {
    let bytes = std::fs::read(file).ok()?;
    let out = &op.output.tensor;
    let elements = out.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
    let body = bytes.strip_prefix(MAGIC.as_bytes())?;
    let (count, data) = body.split_first_chunk::<8>()?;
    if u64::from_le_bytes(*count) != elements
        || u64::try_from(data.len()).ok()? != elements.checked_mul(out.dtype.bytes() as u64)?
    {
        return None;
    }
    Some(decode(data, out.shape.clone(), out.dtype))
}

/// Writes `reference` to `file` (through a temporary file, so a reader never sees half).
pub fn store(file: &Path, reference: &TensorData) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(MAGIC.as_bytes())?;
        f.write_all(&(reference.data.len() as u64).to_le_bytes())?;
        f.write_all(encode(reference).as_slice())?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A 64-bit hash of the input bytes (FNV-1a over 8-byte words: fast on hundreds of MB).
fn hash_inputs(inputs: &[AlignedBuf]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut mix = |w: u64| {
        h ^= w;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    for b in inputs {
        let bytes = b.as_slice();
        mix(bytes.len() as u64);
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            mix(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        for &r in words.remainder() {
            mix(u64::from(r));
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op() -> ComputeOp {
        let w: tessel_ir::Workload = "gemm:m=3,n=5,k=4,dtype=f32".parse().expect("spec");
        w.to_op()
    }

    #[test]
    fn a_stored_reference_loads_back_and_a_bad_file_is_ignored() {
        let dir = std::env::temp_dir().join(format!("tessel-refcache-{}", std::process::id()));
        let op = op();
        let inputs: Vec<AlignedBuf> = op.random_inputs(7).iter().map(encode).collect();
        let file = path(&dir, &op, "tsl_ref_x", &inputs);
        assert!(load(&file, &op).is_none(), "nothing stored yet");

        let out = &op.output.tensor;
        let n = out.shape.iter().product::<u64>() as usize;
        let reference = TensorData {
            shape: out.shape.clone(),
            dtype: out.dtype,
            data: (0..n).map(|i| i as f64 * 0.5).collect(),
        };
        store(&file, &reference).expect("store");
        assert_eq!(load(&file, &op), Some(reference));

        // Other inputs, another kernel: another file.
        let other: Vec<AlignedBuf> = op.random_inputs(8).iter().map(encode).collect();
        assert_ne!(path(&dir, &op, "tsl_ref_x", &other), file);
        assert_ne!(path(&dir, &op, "tsl_ref_y", &inputs), file);

        // A truncated file is not a reference.
        let bytes = std::fs::read(&file).expect("read");
        std::fs::write(&file, &bytes[..bytes.len() - 4]).expect("truncate");
        assert!(load(&file, &op).is_none());
        std::fs::write(&file, b"garbage").expect("garbage");
        assert!(load(&file, &op).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
