//! Compiling generated C into shared objects, cached by content hash.

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::CompileError;

/// How kernels are built: for the real instructions, or on the scalar emulation of those this
/// CPU lacks (correctness checks only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    Native,
    Emulated,
}

/// A compiled shared object.
#[derive(Clone, Debug)]
pub struct Library {
    pub path: PathBuf,
    /// Wall time of the compiler (zero when it came from the cache).
    pub compile_time: Duration,
    pub cached: bool,
}

/// The system C compiler and a cache directory for what it builds.
#[derive(Clone, Debug)]
pub struct Compiler {
    cc: String,
    /// `-march=` value: `native`, or `$TESSEL_MARCH` (e.g. `znver3` to generate code for an
    /// AVX2-only machine while running on an AVX-512 one).
    march: String,
    version: String,
    cache_dir: PathBuf,
    timeout: Duration,
    /// Sources (by cache key) whose compilation ran past its timeout in this process, shared
    /// by every clone (a prefetch thread's too): asking again fails at once instead of
    /// spending the timeout a second time.
    timed_out: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, f64>>>,
}

/// How long one compilation may take before it is killed: gcc -O3 can spend many minutes on
/// a heavily unrolled kernel, and the tuner must not stall on it.
pub const DEFAULT_COMPILE_TIMEOUT: Duration = Duration::from_secs(120);

/// The `-m` flag that enables a CPU feature (as [`tessel_intrin::HostCpu`] names it).
pub(crate) fn feature_flag(feature: &str) -> Option<&'static str> {
    Some(match feature {
        "amx_tile" => "-mamx-tile",
        "amx_bf16" => "-mamx-bf16",
        "amx_int8" => "-mamx-int8",
        "avx512f" => "-mavx512f",
        "avx512_vnni" => "-mavx512vnni",
        "avx512_bf16" => "-mavx512bf16",
        "avx512_fp16" => "-mavx512fp16",
        "avx2" => "-mavx2",
        "fma" => "-mfma",
        "avx_vnni" => "-mavxvnni",
        _ => return None,
    })
}

impl Compiler {
    /// The compiler named by `$TESSEL_CC`, else `$CC`, else `cc`; artefacts go to `cache_dir`.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Result<Self, CompileError> {
        let cc = std::env::var("TESSEL_CC")
            .or_else(|_| std::env::var("CC"))
            .unwrap_or_else(|_| "cc".to_string());
        let out = Command::new(&cc)
            .arg("--version")
            .output()
            .map_err(|source| CompileError::Spawn {
                cc: cc.clone(),
                source,
            })?;
        let mut version = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("unknown")
            .trim()
            .to_string();
        let march = match std::env::var("TESSEL_MARCH") {
            Ok(m) if m.is_empty() || m == "native" => "native".to_string(),
            Ok(m) => {
                let ok = m
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                if !ok || m.starts_with('-') {
                    return Err(CompileError::BadMarch { value: m });
                }
                // Records carry the compiler line: say that code was built for another CPU.
                version.push_str(&format!(" [-march={m}]"));
                m
            }
            Err(_) => "native".to_string(),
        };
        let cache_dir = cache_dir.into();
        std::fs::create_dir_all(&cache_dir).map_err(|source| CompileError::Io {
            path: cache_dir.clone(),
            source,
        })?;
        Ok(Compiler {
            cc,
            march,
            version,
            cache_dir,
            timeout: DEFAULT_COMPILE_TIMEOUT,
            timed_out: Default::default(),
        })
    }

    /// Sets the compile timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The compile timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `$TESSEL_CACHE_DIR`, else `tessel-cpu-cache` in the system's temporary directory.
    pub fn default_cache_dir() -> PathBuf {
        std::env::var_os("TESSEL_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("tessel-cpu-cache"))
    }

    /// The compiler's own version line, e.g. `gcc (Debian 12.2.0-14) 12.2.0`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The compiler executable.
    pub fn cc(&self) -> &str {
        &self.cc
    }

    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// Flags for a module whose kernels need `features`.
    pub fn flags(&self, features: &BTreeSet<String>, mode: Mode) -> Vec<String> {
        let mut f: Vec<String> = [
            format!("-march={}", self.march).as_str(),
            "-fPIC",
            "-shared",
            "-fopenmp",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match mode {
            Mode::Native => {
                f.insert(0, "-O3".into());
                f.extend(
                    features
                        .iter()
                        .filter_map(|x| feature_flag(x))
                        .map(str::to_string),
                );
            }
            Mode::Emulated => {
                f.insert(0, "-O2".into());
                f.push("-DTESSEL_EMULATE".into());
            }
        }
        f
    }

    /// Compiles `source` (or finds it in the cache). The file is written next to the object
    /// so that a failing kernel can be read.
    pub fn compile(
        &self,
        source: &str,
        features: &BTreeSet<String>,
        mode: Mode,
    ) -> Result<Library, CompileError> {
        let flags = self.flags(features, mode);
        let key = content_key(&[source, &flags.join(" "), &self.version, &self.cc]);
        let so = self.cache_dir.join(format!("tsl-{key}.so"));
        if so.exists() {
            return Ok(Library {
                path: so,
                compile_time: Duration::ZERO,
                cached: true,
            });
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CompileError::Io { path, source }
        };
        let c = self.cache_dir.join(format!("tsl-{key}.c"));
        // Ran past a limit at least as long as this one already: fail without trying again.
        let limit = self.timeout.as_secs_f64();
        if let Some(seconds) = self
            .timed_out
            .lock()
            .ok()
            .and_then(|m| m.get(&key).copied())
            && limit <= seconds
        {
            return Err(CompileError::Timeout { path: c, seconds });
        }
        std::fs::write(&c, source).map_err(io(&c))?;
        // Build under a private name and rename: a concurrent or killed build never leaves a
        // half-written object under the final name.
        // Unique per process and call: a prefetch thread may build the same module.
        static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let nth = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let me = format!("{}-{nth}", std::process::id());
        let tmp = self.cache_dir.join(format!("tsl-{key}.{me}.tmp.so"));
        let start = Instant::now();
        let err_path = self.cache_dir.join(format!("tsl-{key}.{me}.stderr"));
        let err_file = std::fs::File::create(&err_path).map_err(io(&err_path))?;
        // The compiler runs under a small shell in its own process group, so that a timeout
        // kills cc1 and the assembler with the driver, and so that the whole group dies with
        // the tuner: the shell gets SIGTERM when its parent dies (even by SIGKILL) and kills
        // the group.
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(r#"trap 'kill -KILL 0' TERM; "$0" "$@" & wait $!"#)
            .arg(&self.cc)
            .args(&flags)
            .arg(&c)
            .arg("-o")
            .arg(&tmp)
            .arg("-lm")
            .stdout(std::process::Stdio::null())
            .stderr(err_file);
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
            let parent = std::process::id() as libc::pid_t;
            // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    #[cfg(target_os = "linux")]
                    {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                        if libc::getppid() != parent {
                            libc::_exit(1);
                        }
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().map_err(|source| CompileError::Spawn {
            cc: self.cc.clone(),
            source,
        })?;
        let status = loop {
            match child.try_wait().map_err(io(&c))? {
                Some(status) => break status,
                None if start.elapsed() > self.timeout => {
                    #[cfg(unix)]
                    // SAFETY: signalling the process group we created for this compiler.
                    unsafe {
                        libc::kill(-(child.id() as i32), libc::SIGKILL);
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = std::fs::remove_file(&tmp);
                    let _ = std::fs::remove_file(&err_path);
                    if let Ok(mut m) = self.timed_out.lock() {
                        m.insert(key.clone(), self.timeout.as_secs_f64());
                    }
                    return Err(CompileError::Timeout {
                        path: c,
                        seconds: self.timeout.as_secs_f64(),
                    });
                }
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        let compile_time = start.elapsed();
        let stderr = std::fs::read(&err_path).unwrap_or_default();
        let _ = std::fs::remove_file(&err_path);
        if !status.success() {
            let _ = std::fs::remove_file(&tmp);
            let stderr = String::from_utf8_lossy(&stderr);
            // The first errors say what is wrong; thousands of lines do not help.
            let short: String = stderr.lines().take(40).collect::<Vec<_>>().join("\n");
            return Err(CompileError::Rejected {
                path: c,
                stderr: short,
            });
        }
        std::fs::rename(&tmp, &so).map_err(io(&so))?;
        Ok(Library {
            path: so,
            compile_time,
            cached: false,
        })
    }
}

/// A 128-bit hex digest of the parts (two independently seeded SipHashes).
pub fn content_key(parts: &[&str]) -> String {
    let mut out = String::new();
    for seed in [0x7e55e1u64, 0x5eed_c0de] {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        seed.hash(&mut h);
        for p in parts {
            p.hash(&mut h);
        }
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compile_past_its_timeout_is_killed_and_reported() {
        let dir =
            std::env::temp_dir().join(format!("tessel-compile-timeout-{}", std::process::id()));
        let cc = Compiler::new(&dir)
            .unwrap()
            .with_timeout(Duration::from_millis(1));
        // A unique source, so that no cached object answers.
        let source = format!(
            "int tessel_timeout_probe_{}(void) {{ return 1; }}\n",
            std::process::id()
        );
        match cc.compile(&source, &BTreeSet::new(), Mode::Native) {
            Err(CompileError::Timeout { .. }) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
        // The same source under the same limit fails at once, without writing or compiling
        // anything (the C file of the first try is gone, and stays gone).
        let c_file = match cc.compile(&source, &BTreeSet::new(), Mode::Native) {
            Err(CompileError::Timeout { path, .. }) => path,
            other => panic!("expected the remembered timeout, got {other:?}"),
        };
        let _ = std::fs::remove_file(&c_file);
        assert!(
            cc.clone()
                .compile(&source, &BTreeSet::new(), Mode::Native)
                .is_err()
        );
        assert!(
            !c_file.exists(),
            "a remembered timeout rewrote {}",
            c_file.display()
        );
        // A longer limit tries again, and succeeds; so does a compiler of its own.
        let ok = cc.clone().with_timeout(Duration::from_secs(120)).compile(
            &source,
            &BTreeSet::new(),
            Mode::Native,
        );
        assert!(ok.is_ok(), "{ok:?}");
        let ok = Compiler::new(&dir)
            .unwrap()
            .compile(&source, &BTreeSet::new(), Mode::Native);
        assert!(ok.is_ok(), "{ok:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
