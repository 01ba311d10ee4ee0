//! The versioned column schema: every column of a token has a name, a unit and a meaning.
//!
//! All tokens share one width. A token's kind is one-hot in the first three columns; the
//! columns of the other kinds are zero. Magnitudes are stored as `log2(1 + x)` (units `log2(1+...)`),
//! products of loop extents (at least 1) as plain `log2`, ratios and flags as they are.

use serde::Serialize;

/// Bumped whenever a column is added, removed, reordered or changes meaning. A model stores
/// the version it was trained with and refuses features of another. Version 2 (2026-12-07):
/// a CPU update whose innermost loop gcc vectorizes by itself is vector code, that loop
/// counted among the vectorized ones, and loops of one iteration no longer hide the
/// innermost loop that does the work (`extract::vector_loop`). Version 3 (2026-12-07): a
/// tensorized call's compute token says how the backend emits it (register block, direct or
/// staged call) and how many elements staging copies, where the target knows its backend
/// ([`crate::Target::with_code_paths`]). Version 4 (2026-12-07): data the loop just outside
/// a level's fitting block does not index stays at that level across it, one of its
/// iterations fitting there (an accumulator across the reduction loop around its block,
/// weights across a spatial loop); the data tokens' traffic and reuse change, no column does.
pub const SCHEMA_VERSION: u32 = 4;

/// One column of the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Column {
    pub name: &'static str,
    pub unit: &'static str,
    pub doc: &'static str,
}

macro_rules! schema {
    ($($id:ident => $name:literal, $unit:literal, $doc:literal;)*) => {
        /// Column indices, in schema order.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum Col { $($id),* }

        /// Every column, in order; `COLUMNS[Col::X as usize]` describes `Col::X`.
        pub const COLUMNS: &[Column] = &[$(Column { name: $name, unit: $unit, doc: $doc }),*];
    };
}

schema! {
    KindCompute => "kind.compute", "flag", "a compute allocation: a tensorized call site, a vector or scalar compute statement, a copy or a store";
    KindData => "kind.data", "flag", "a data allocation: one buffer at one memory level";
    KindHardware => "kind.hardware", "flag", "the target's description";

    ComputeTensorized => "compute.tensorized", "flag", "a call of a tensorized instruction";
    ComputeVector => "compute.vector", "flag", "a compute statement inside a vectorized loop";
    ComputeScalar => "compute.scalar", "flag", "a scalar compute statement";
    ComputeCopy => "compute.copy", "flag", "a packing or caching copy";
    ComputeStore => "compute.store", "flag", "the epilogue writing the output";
    ComputeInstrM => "compute.instr_m", "log2(1+elements)", "the instruction's m extent (1 for scalar code)";
    ComputeInstrN => "compute.instr_n", "log2(1+elements)", "the instruction's n extent (the vector width for vector code)";
    ComputeInstrK => "compute.instr_k", "log2(1+elements)", "the instruction's k extent";
    ComputeInputBytes => "compute.input_bytes", "bytes", "bytes of one input element";
    ComputeAccBytes => "compute.acc_bytes", "bytes", "bytes of one accumulator element";
    ComputePeak => "compute.peak", "log2(1+MAC/cycle/core)", "the instruction's published peak";
    ComputeUtilM => "compute.util_m", "ratio", "useful / padded extent of the instruction's m";
    ComputeUtilN => "compute.util_n", "ratio", "useful / padded extent of the instruction's n";
    ComputeUtilK => "compute.util_k", "ratio", "useful / padded extent of the instruction's k";
    ComputeInvocations => "compute.invocations", "log2(1+count)", "how many times the statement runs";
    ComputeFlops => "compute.flops", "log2(1+flop)", "floating-point (or integer) operations it performs, padding included; bytes for copies";
    ComputeFlopShare => "compute.flop_share", "ratio", "the operator's useful work / this statement's work";
    ComputeParallel => "compute.parallel", "log2 iterations", "product of enclosing parallel loop extents";
    ComputeSerial => "compute.serial", "log2 iterations", "product of enclosing serial loop extents";
    ComputeUnrolled => "compute.unrolled", "log2 iterations", "product of enclosing unrolled loop extents";
    ComputeVectorized => "compute.vectorized", "log2 iterations", "product of enclosing vectorized loop extents";
    ComputeGpuBlocks => "compute.gpu_blocks", "log2 iterations", "product of enclosing loops bound to blockIdx";
    ComputeGpuThreads => "compute.gpu_threads", "log2 iterations", "product of enclosing loops bound to threads or warps";
    ComputeReduction => "compute.reduction", "log2 iterations", "product of enclosing reduction loop extents";
    ComputeInnermost => "compute.innermost", "log2 iterations", "extent of the innermost enclosing loop";
    ComputeDepth => "compute.depth", "count", "number of enclosing loops";
    ComputePipeline => "compute.pipeline", "stages", "software pipeline stages of the enclosing loops (0: none)";
    ComputePathRegisterBlock => "compute.path_register_block", "flag", "the backend emits the call in a register block: accumulators held in registers across the reduction loop (0 where the backend does not say)";
    ComputePathDirect => "compute.path_direct", "flag", "the backend emits the call on its operands in place, one call at a time";
    ComputePathStaged => "compute.path_staged", "flag", "the backend gathers the call's operands into the instruction's layout (and scatters the accumulator back) at every call";
    ComputeStagedCopies => "compute.staged_copies", "log2(1+elements)", "elements a staged call gathers and scatters, over all its invocations";

    DataLevelMemory => "data.level_memory", "flag", "main memory (CPU DRAM, GPU global)";
    DataLevelL2 => "data.level_l2", "flag", "the L2 cache";
    DataLevelL1 => "data.level_l1", "flag", "the L1 data cache";
    DataLevelShared => "data.level_shared", "flag", "GPU shared memory";
    DataLevelRegister => "data.level_register", "flag", "registers: AMX tiles, vector registers, GPU fragments";
    DataRoleInput => "data.role_input", "flag", "an operator input";
    DataRoleOutput => "data.role_output", "flag", "the operator output";
    DataRoleAccumulator => "data.role_accumulator", "flag", "the accumulator";
    DataRoleStaged => "data.role_staged", "flag", "a packed or cached copy of an input";
    DataDtypeBytes => "data.dtype_bytes", "bytes", "bytes of one element";
    DataBytesIn => "data.bytes_in", "log2(1+bytes)", "bytes moved into this level from the one above";
    DataBytesOut => "data.bytes_out", "log2(1+bytes)", "bytes written back out of this level";
    DataFootprint => "data.footprint", "log2(1+bytes)", "bytes of the buffer resident at this level between reloads";
    DataCapacity => "data.capacity", "log2(1+ratio)", "working set of the statements there / the level's capacity";
    DataReuse => "data.reuse", "log2(1+ratio)", "bytes the statements access / bytes moved in";
    DataContiguous => "data.contiguous", "flag", "the innermost varying access has unit stride";
    DataStride => "data.stride", "log2(1+elements)", "stride of the innermost varying access";
    DataContigRun => "data.contig_run", "log2(1+bytes)", "bytes of the longest contiguous run of the resident block";
    DataVectorWidth => "data.vector_width", "log2(1+elements)", "elements one access moves";
    DataTransformPad => "data.transform_pad", "flag", "needs zero padding";
    DataTransformTranspose => "data.transform_transpose", "flag", "needs a transpose for the instruction";
    DataTransformVnni => "data.transform_vnni", "flag", "needs VNNI interleaving of k";
    DataTransformIm2col => "data.transform_im2col", "flag", "unfolds overlapping windows (im2col)";
    DataTransformBytes => "data.transform_bytes", "log2(1+bytes)", "bytes the transform writes";
    DataBankConflict => "data.bank_conflict", "ways", "GPU shared-memory bank-conflict degree (0 where none applies)";

    HardwareGpu => "hardware.gpu", "flag", "a GPU (else a CPU)";
    HardwareCores => "hardware.cores", "log2(1+count)", "cores (CPU) or SMs (GPU) in use";
    HardwareClock => "hardware.clock", "GHz", "nominal clock";
    HardwareL1 => "hardware.l1", "log2(1+bytes)", "L1 data cache per core (per SM)";
    HardwareL2 => "hardware.l2", "log2(1+bytes)", "L2 cache per core on CPU, in all on GPU";
    HardwareL3 => "hardware.l3", "log2(1+bytes)", "last-level cache shared by the cores (0 on GPU)";
    HardwareShared => "hardware.shared", "log2(1+bytes)", "shared memory per SM (0 on CPU)";
    HardwareRegisters => "hardware.registers", "log2(1+bytes)", "operand register file per core (tiles + vector registers) or per SM";
    HardwareMemoryBandwidth => "hardware.memory_bw", "log2(1+GB/s)", "main-memory bandwidth available to the cores in use";
    HardwareL2Bandwidth => "hardware.l2_bw", "log2(1+GB/s)", "L2 bandwidth available to the cores in use";
    HardwarePeakF32 => "hardware.peak_f32", "log2(1+MAC/cycle/core)", "best f32-input instruction";
    HardwarePeakBf16 => "hardware.peak_bf16", "log2(1+MAC/cycle/core)", "best bf16-input instruction";
    HardwarePeakF16 => "hardware.peak_f16", "log2(1+MAC/cycle/core)", "best f16-input instruction";
    HardwarePeakInt8 => "hardware.peak_int8", "log2(1+MAC/cycle/core)", "best int8-input instruction";
    HardwarePeakMatrix => "hardware.peak_matrix", "log2(1+MAC/cycle/core)", "best matrix (AMX, Tensor Core) instruction";
}

/// Width of every token.
pub const WIDTH: usize = COLUMNS.len();

/// `log2(1 + x)`: the transform of every magnitude column.
#[inline]
pub fn lg(x: f64) -> f32 {
    (x.max(0.0) + 1.0).log2() as f32
}

/// Looks a column up by name.
pub fn column(name: &str) -> Option<(usize, &'static Column)> {
    COLUMNS.iter().enumerate().find(|(_, c)| c.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_prefixed_by_kind() {
        let mut names: Vec<&str> = COLUMNS.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), WIDTH);
        for c in COLUMNS {
            let prefix = c.name.split('.').next().unwrap_or("");
            assert!(
                ["kind", "compute", "data", "hardware"].contains(&prefix),
                "{}",
                c.name
            );
            assert!(!c.unit.is_empty() && !c.doc.is_empty());
        }
        assert_eq!(COLUMNS[Col::DataBytesIn as usize].name, "data.bytes_in");
        assert_eq!(
            column("hardware.l2").map(|c| c.0),
            Some(Col::HardwareL2 as usize)
        );
    }
}
