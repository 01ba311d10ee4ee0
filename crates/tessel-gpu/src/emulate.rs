//! Runs generated kernels on the CPU, to check what they compute where there is no GPU: the
//! kernel's CUDA C++ is compiled by the host C++ compiler against `emulate.h`, where every CUDA
//! thread is a `std::thread`, `__syncthreads` a barrier, and `ldmatrix`, `mma.sync` and the
//! WMMA API are emulated from the PTX ISA's description of what each lane holds. Blocks run
//! one after another. Correctness only: the emulation says nothing about speed.
//!
//! It checks the code generator's index arithmetic, guards, shared-memory layouts, pipelines,
//! fragment lane mappings and epilogues against the reference, independently of the IR
//! interpreter (which checks the schedule, not the generated text).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tessel_ir::{Program, TensorData};

use crate::codegen::{Kernel, c_type, param_operands};
use crate::error::GpuError;

const HEADER: &str = include_str!("emulate.h");

/// A host C++ compiler (C++20, threads) to build emulations with.
#[derive(Clone, Debug)]
pub struct Emulator {
    pub cxx: PathBuf,
    /// Longest an emulation may run (a kernel whose threads disagree on a barrier hangs).
    pub timeout: Duration,
}

static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn toolchain(e: impl std::fmt::Display) -> GpuError {
    GpuError::Toolchain(e.to_string())
}

impl Emulator {
    /// `$CXX` (a path, or a name looked up on `PATH` when run), else `g++` or `c++` on `PATH`.
    pub fn find() -> Result<Emulator, GpuError> {
        let timeout = Duration::from_secs(120);
        if let Some(cxx) = std::env::var_os("CXX") {
            return Ok(Emulator {
                cxx: PathBuf::from(cxx),
                timeout,
            });
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .flat_map(|dir| [dir.join("g++"), dir.join("c++")])
            .find(|c| c.is_file())
            .map(|cxx| Emulator { cxx, timeout })
            .ok_or_else(|| {
                toolchain("no C++ compiler for the GPU emulation (set CXX, or install g++)")
            })
    }

    /// Runs `kernel` (generated from `program`) on `inputs` (the operator's read operands, in
    /// order) and returns its output. The output starts as 0xff bytes (NaN for floats), so
    /// elements the kernel never writes show; as zeros for split-K kernels, which add into it.
    pub fn run(
        &self,
        kernel: &Kernel,
        program: &Program,
        inputs: &[TensorData],
    ) -> Result<TensorData, GpuError> {
        let args = param_operands(program, &kernel.params)?;
        let dir = std::env::temp_dir().join(format!(
            "tessel-emulate-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(toolchain)?;
        let result = self.run_in(&dir, kernel, program, inputs, &args);
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    fn run_in(
        &self,
        dir: &Path,
        kernel: &Kernel,
        program: &Program,
        inputs: &[TensorData],
        args: &[Option<usize>],
    ) -> Result<TensorData, GpuError> {
        let write =
            |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).map_err(toolchain);
        write("emulate.h", HEADER.as_bytes())?;
        for shim in ["cuda_fp16.h", "cuda_bf16.h", "mma.h"] {
            write(shim, b"// (emulate.h defines what the kernel uses)\n")?;
        }
        write("kernel.cu", kernel.source.as_bytes())?;
        let out = &program.op.output.tensor;
        let mut main = String::from(
            "#include \"emulate.h\"\n#include \"kernel.cu\"\n#include <cstdio>\n#include <cstdlib>\n\n\
             static void* tsl_alloc(size_t n) { return std::aligned_alloc(64, (n + 63) / 64 * 64); }\n\
             static void* tsl_read(const char* path, size_t n) {\n\
             \x20 void* p = tsl_alloc(n);\n\
             \x20 FILE* f = std::fopen(path, \"rb\");\n\
             \x20 if (!f || std::fread(p, 1, n, f) != n) { std::perror(path); std::exit(2); }\n\
             \x20 std::fclose(f);\n\
             \x20 return p;\n}\n\nint main() {\n",
        );
        let mut call = Vec::new();
        for (i, a) in args.iter().enumerate() {
            match a {
                Some(k) => {
                    let t = inputs.get(*k).ok_or_else(|| {
                        toolchain(format!(
                            "the kernel reads operand {k}; {} given",
                            inputs.len()
                        ))
                    })?;
                    write(&format!("in{i}.bin"), &t.to_le_bytes())?;
                    main.push_str(&format!(
                        "  void* a{i} = tsl_read(\"in{i}.bin\", {});\n",
                        t.data.len() * t.dtype.bytes()
                    ));
                    call.push(format!("(const {}*)a{i}", c_type(t.dtype)));
                }
                None => {
                    // NaN bytes show unwritten elements; split-K kernels add into zeros.
                    let fill = if kernel.zero_output { 0 } else { 0xff };
                    main.push_str(&format!(
                        "  void* a{i} = tsl_alloc({0});\n  std::memset(a{i}, {fill}, {0});\n",
                        out.bytes()
                    ));
                    call.push(format!("({}*)a{i}", c_type(out.dtype)));
                }
            }
        }
        let out_arg = args
            .iter()
            .position(|a| a.is_none())
            .ok_or_else(|| toolchain("the kernel has no output parameter"))?;
        let [gx, gy, gz] = kernel.grid;
        let [bx, by, bz] = kernel.block;
        main.push_str(&format!(
            "  tsl_launch(dim3{{{gx}, {gy}, {gz}}}, dim3{{{bx}, {by}, {bz}}}, {}, {});\n\
             \x20 FILE* f = std::fopen(\"out.bin\", \"wb\");\n\
             \x20 std::fwrite(a{out_arg}, 1, {}, f);\n\
             \x20 std::fclose(f);\n  return 0;\n}}\n",
            kernel.name,
            call.join(", "),
            out.bytes()
        ));
        write("main.cpp", main.as_bytes())?;
        let built = Command::new(&self.cxx)
            .current_dir(dir)
            .args(["-std=c++20", "-O1", "-pthread", "-w", "-I."])
            .args(["main.cpp", "-o", "emulation"])
            .output()
            .map_err(|e| toolchain(format!("{}: {e}", self.cxx.display())))?;
        if !built.status.success() {
            return Err(GpuError::Toolchain(format!(
                "the emulation of `{}` did not compile:\n{}",
                kernel.name,
                String::from_utf8_lossy(&built.stderr)
            )));
        }
        let mut child = Command::new(dir.join("emulation"))
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(toolchain)?;
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().map_err(toolchain)? {
                break s;
            }
            if start.elapsed() > self.timeout {
                let _ = child.kill();
                let _ = child.wait();
                return Err(toolchain(format!(
                    "the emulation of `{}` ran past {:?} (threads waiting at different barriers?)",
                    kernel.name, self.timeout
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if !status.success() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return Err(toolchain(format!(
                "the emulation of `{}` failed ({status}): {err}",
                kernel.name
            )));
        }
        let bytes = std::fs::read(dir.join("out.bin")).map_err(toolchain)?;
        TensorData::from_le_bytes(&bytes, out.shape.clone(), out.dtype)
            .ok_or_else(|| toolchain("the emulation wrote an output of the wrong size"))
    }
}
