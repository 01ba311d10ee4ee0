//! The C side of an export: symbol names, the translation unit (kernels, typed wrappers, the
//! CPU check) and the header that documents every operand.

use std::collections::HashSet;
use std::fmt::Write as _;

use tessel_cpu::codegen::Prepacked;
use tessel_cpu::{Kernel, module_source};
use tessel_ir::{ComputeOp, DType, Workload};

/// Compiler macros for the instruction-set extensions `-march` and `-m` flags can enable,
/// with the name `__builtin_cpu_supports` knows each by. The check is compiled with the
/// kernels' own flags, so it tests exactly what the compiler was allowed to use.
const CPU_FEATURES: &[(&str, &str)] = &[
    ("__SSE3__", "sse3"),
    ("__SSSE3__", "ssse3"),
    ("__SSE4_1__", "sse4.1"),
    ("__SSE4_2__", "sse4.2"),
    ("__SSE4A__", "sse4a"),
    ("__POPCNT__", "popcnt"),
    ("__AES__", "aes"),
    ("__PCLMUL__", "pclmul"),
    ("__AVX__", "avx"),
    ("__AVX2__", "avx2"),
    ("__FMA__", "fma"),
    ("__F16C__", "f16c"),
    ("__BMI__", "bmi"),
    ("__BMI2__", "bmi2"),
    ("__LZCNT__", "lzcnt"),
    ("__MOVBE__", "movbe"),
    ("__ADX__", "adx"),
    ("__SHA__", "sha"),
    ("__GFNI__", "gfni"),
    ("__VAES__", "vaes"),
    ("__VPCLMULQDQ__", "vpclmulqdq"),
    ("__AVXVNNI__", "avxvnni"),
    ("__AVX512F__", "avx512f"),
    ("__AVX512CD__", "avx512cd"),
    ("__AVX512BW__", "avx512bw"),
    ("__AVX512DQ__", "avx512dq"),
    ("__AVX512VL__", "avx512vl"),
    ("__AVX512IFMA__", "avx512ifma"),
    ("__AVX512VBMI__", "avx512vbmi"),
    ("__AVX512VBMI2__", "avx512vbmi2"),
    ("__AVX512VNNI__", "avx512vnni"),
    ("__AVX512BITALG__", "avx512bitalg"),
    ("__AVX512VPOPCNTDQ__", "avx512vpopcntdq"),
    ("__AVX512BF16__", "avx512bf16"),
    ("__AVX512FP16__", "avx512fp16"),
    ("__AMX_TILE__", "amx-tile"),
    ("__AMX_INT8__", "amx-int8"),
    ("__AMX_BF16__", "amx-bf16"),
];

/// The public C type of an element: 16-bit floats travel as their bits.
pub fn public_c_type(t: DType) -> &'static str {
    match t {
        DType::BF16 | DType::F16 => "uint16_t",
        other => tessel_cpu::codegen::c_type(other),
    }
}

/// `gemm:m=64,n=64,k=64,dtype=u8,wdtype=i8` -> `tsl_gemm_m64_n64_k64_u8_i8`, unique among
/// `used`.
pub fn symbol_for(workload: &Workload, used: &mut HashSet<String>) -> String {
    let spec = workload.to_string();
    let (kind, rest) = spec.split_once(':').unwrap_or((spec.as_str(), ""));
    let mut parts = vec!["tsl".to_string(), kind.to_string()];
    for kv in rest.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        let v = v.replace('+', "_");
        parts.push(match k {
            "dtype" | "wdtype" | "layout" | "epilogue" => v,
            "out" => format!("out_{v}"),
            _ => format!("{k}{v}"),
        });
    }
    let base: String = parts
        .join("_")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let mut s = base.clone();
    let mut i = 2;
    while !used.insert(s.clone()) {
        s = format!("{base}_v{i}");
        i += 1;
    }
    s
}

/// One operand of a kernel's C signature.
#[derive(Clone, Debug)]
pub struct Param {
    /// The C identifier.
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Storage order of the dimensions, one letter each (`mk`, `nhwc`).
    pub layout: String,
    /// `input`, `bias` or `output`.
    pub role: &'static str,
}

impl Param {
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

const RESERVED: &[&str] = &[
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef",
    "union", "unsigned", "void", "volatile", "while", "args", "packed", "fn", "mut", "ref", "type",
    "in", "out", "self", "use", "match", "move", "impl", "loop", "mod", "pub", "crate",
];

/// The parameters of an operator's kernel, in its argument order: inputs, biases, output.
pub fn params(op: &ComputeOp) -> Vec<Param> {
    let mut used = HashSet::new();
    let mut name = |raw: &str| {
        let mut s: String = raw
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) || RESERVED.contains(&&*s) {
            s.insert_str(0, "x_");
        }
        let base = s.clone();
        let mut i = 2;
        while !used.insert(s.clone()) {
            s = format!("{base}{i}");
            i += 1;
        }
        s
    };
    let n_inputs = op.inputs.len();
    let mut v: Vec<Param> = op
        .read_operands()
        .into_iter()
        .enumerate()
        .map(|(i, o)| Param {
            name: name(&o.tensor.name),
            dtype: o.tensor.dtype,
            shape: o.tensor.shape.clone(),
            layout: o.tensor.layout.clone(),
            role: if i < n_inputs { "input" } else { "bias" },
        })
        .collect();
    let o = &op.output.tensor;
    v.push(Param {
        name: name(&o.name),
        dtype: o.dtype,
        shape: o.shape.clone(),
        layout: o.layout.clone(),
        role: "output",
    });
    v
}

/// What the export knows of one kernel when writing C.
#[derive(Clone)]
pub struct CKernel<'a> {
    pub workload: &'a Workload,
    pub symbol: &'a str,
    pub params: &'a [Param],
    pub kernel: &'a Kernel,
    pub prepacked: Option<&'a Prepacked>,
    /// One line for the header: latency, throughput, instruction, threads.
    pub tuned: String,
}

impl CKernel<'_> {
    pub fn pack_symbol(&self) -> Option<String> {
        let p = self.prepacked?;
        Some(format!(
            "{}_pack_{}",
            self.symbol, self.params[p.operand].name
        ))
    }
    pub fn prepacked_symbol(&self) -> Option<String> {
        self.prepacked.map(|_| format!("{}_prepacked", self.symbol))
    }
    pub fn packed_elems_macro(&self) -> Option<String> {
        let p = self.prepacked?;
        Some(format!(
            "{}_{}_PACKED_ELEMS",
            self.symbol.to_ascii_uppercase(),
            self.params[p.operand].name.to_ascii_uppercase()
        ))
    }

    /// The C parameter list, with input `packed` replaced by its packed copy.
    fn signature(&self, packed: Option<&Prepacked>) -> String {
        let v: Vec<String> = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| match packed {
                Some(pk) if pk.operand == i => format!(
                    "const {} *{}_packed",
                    public_c_type(pk.packed_dtype),
                    p.name
                ),
                _ if p.role == "output" => format!("{} *{}", public_c_type(p.dtype), p.name),
                _ => format!("const {} *{}", public_c_type(p.dtype), p.name),
            })
            .collect();
        v.join(", ")
    }

    fn args_array(&self, packed: Option<&Prepacked>) -> String {
        let v: Vec<String> = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| match packed {
                Some(pk) if pk.operand == i => format!("(void *){}_packed", p.name),
                _ => format!("(void *){}", p.name),
            })
            .collect();
        v.join(", ")
    }
}

/// Makes a generated kernel's function private to the translation unit.
fn private(k: &Kernel) -> String {
    let decl = format!("void {}(void *const *args)", k.name);
    let at = k
        .source
        .lines()
        .scan(0, |off, l| {
            let here = *off;
            *off += l.len() + 1;
            Some((here, l))
        })
        .find(|(_, l)| l.starts_with(&decl))
        .map(|(at, _)| at);
    match at {
        Some(at) => format!("{}static {}", &k.source[..at], &k.source[at..]),
        None => k.source.clone(),
    }
}

/// The translation unit: the prelude, every kernel (private), the typed entry points and the
/// CPU check.
pub fn source(kernels: &[CKernel], built_for: &str) -> String {
    let mut privates: Vec<Kernel> = Vec::new();
    for k in kernels {
        let mut all = vec![k.kernel.clone()];
        if let Some(p) = k.prepacked {
            all.push(p.pack.clone());
            all.push(p.kernel.clone());
        }
        for mut x in all {
            x.source = private(&x);
            privates.push(x);
        }
    }
    let refs: Vec<&Kernel> = privates.iter().collect();
    let mut s = String::from(
        "/* Generated by tessel export: the tuned kernels and their C entry points. */\n",
    );
    s.push_str("#include <stdio.h>\n#include <stdlib.h>\n#include <omp.h>\n");
    s.push_str("#include <unistd.h>\n#include <sys/syscall.h>\n");
    s.push_str(&module_source(&refs));
    s.push_str("\n#define TSL_API __attribute__((visibility(\"default\")))\n");
    s.push_str(&support_check(built_for));
    for k in kernels {
        let n = k.params.len();
        let _ = writeln!(s, "\nTSL_API void {}({}) {{", k.symbol, k.signature(None));
        let _ = writeln!(s, "    tsl_require_supported();");
        let _ = writeln!(s, "    void *args[{n}] = {{{}}};", k.args_array(None));
        let _ = writeln!(s, "    {}(args);\n}}", k.kernel.name);
        if let (Some(p), Some(pack), Some(pre)) =
            (k.prepacked, k.pack_symbol(), k.prepacked_symbol())
        {
            let w = &k.params[p.operand];
            let _ = writeln!(
                s,
                "\nTSL_API void {pack}(const {} *{}, {} *{}_packed) {{",
                public_c_type(w.dtype),
                w.name,
                public_c_type(p.packed_dtype),
                w.name
            );
            let _ = writeln!(s, "    tsl_require_supported();");
            let _ = writeln!(
                s,
                "    void *args[2] = {{(void *){}, (void *){}_packed}};",
                w.name, w.name
            );
            let _ = writeln!(s, "    {}(args);\n}}", p.pack.name);
            let _ = writeln!(s, "\nTSL_API void {pre}({}) {{", k.signature(Some(p)));
            let _ = writeln!(s, "    tsl_require_supported();");
            let _ = writeln!(s, "    void *args[{n}] = {{{}}};", k.args_array(Some(p)));
            let _ = writeln!(s, "    {}(args);\n}}", p.kernel.name);
        }
    }
    s
}

/// `tessel_kernels_missing`, `tessel_kernels_supported`, `tessel_kernels_set_threads` and the
/// guard every entry point calls.
fn support_check(built_for: &str) -> String {
    let mut s = String::new();
    s.push_str("\nTSL_API const char *tessel_kernels_missing(void) {\n    __builtin_cpu_init();\n");
    for (mac, name) in CPU_FEATURES {
        let _ = writeln!(
            s,
            "#ifdef {mac}\n    if (!__builtin_cpu_supports(\"{name}\")) return \"{name}\";\n#endif"
        );
    }
    s.push_str(
        r#"#ifdef __AMX_TILE__
    /* Linux hands out the AMX tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA). */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) return "amx-tile (the OS refused AMX permission)";
#endif
    return NULL;
}

static int tsl_support_state; /* 0 unknown, 1 supported, -1 not */

TSL_API int tessel_kernels_supported(void) {
    int s = __atomic_load_n(&tsl_support_state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = tessel_kernels_missing() == NULL ? 1 : -1;
        __atomic_store_n(&tsl_support_state, s, __ATOMIC_RELEASE);
    }
    return s == 1;
}

TSL_API void tessel_kernels_set_threads(int threads) {
    omp_set_num_threads(threads > 0 ? threads : 1);
}

static void tsl_require_supported(void) {
    if (__builtin_expect(__atomic_load_n(&tsl_support_state, __ATOMIC_ACQUIRE) == 1, 1)) return;
    if (!tessel_kernels_supported()) {
        fprintf(stderr, "tessel_kernels: this CPU lacks %s; these kernels were built for "#,
    );
    let _ = write!(s, "{}", c_string_body(built_for));
    s.push_str(
        r#" (check tessel_kernels_supported() before calling a kernel)\n", tessel_kernels_missing());
        abort();
    }
}
"#,
    );
    s
}

/// `text` escaped for use inside a C string literal.
fn c_string_body(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '"' => "\\\"".chars().collect::<Vec<_>>(),
            '\\' => "\\\\".chars().collect(),
            '%' => "%%".chars().collect(),
            c if c.is_ascii_graphic() || c == ' ' => vec![c],
            _ => vec!['?'],
        })
        .collect()
}

/// `tessel_kernels.h`.
pub fn header(kernels: &[CKernel], preamble: &[String]) -> String {
    let mut s = String::from("/* tessel_kernels.h: generated by tessel export. */\n");
    for line in preamble {
        let _ = writeln!(s, "/* {} */", line.replace("*/", "* /"));
    }
    s.push_str(
        r#"#ifndef TESSEL_KERNELS_H
#define TESSEL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every tensor is dense and row-major over the shape shown, its dimensions in the order the
 * layout letters name (e.g. nhwc). bf16 and f16 elements travel as their 16-bit patterns.
 * Any alignment works; the kernels were measured on 64-byte aligned buffers (aligned_alloc(64,
 * ...)), which is fastest, packed weights included.
 * Kernels are not reentrant: each keeps its scratch buffers in static storage, so call one
 * kernel from one thread at a time (each call uses OpenMP threads itself). */

/* 1 if this CPU (and OS) supports every instruction the kernels were built for, else 0.
 * Requests AMX permission from Linux when the kernels use AMX. A kernel called on a CPU
 * that lacks one prints what is missing and aborts instead of faulting. */
int tessel_kernels_supported(void);
/* The first missing feature, or NULL when tessel_kernels_supported() would return 1. */
const char *tessel_kernels_missing(void);
/* OpenMP threads for the kernels (as OMP_NUM_THREADS does). */
void tessel_kernels_set_threads(int threads);
"#,
    );
    for k in kernels {
        let _ = writeln!(s, "\n/* {}", k.workload);
        let _ = writeln!(s, " *   {}", k.tuned);
        for p in k.params {
            let _ = writeln!(
                s,
                " *   {}: {} {}, shape {:?} ({} elements), layout {}",
                p.name,
                p.role,
                p.dtype,
                p.shape,
                p.elements(),
                p.layout
            );
        }
        let _ = writeln!(s, " */");
        let _ = writeln!(s, "void {}({});", k.symbol, k.signature(None));
        if let (Some(p), Some(pack), Some(pre), Some(mac)) = (
            k.prepacked,
            k.pack_symbol(),
            k.prepacked_symbol(),
            k.packed_elems_macro(),
        ) {
            let w = &k.params[p.operand];
            let _ = writeln!(
                s,
                "/* {w} pre-packed (pack the weights once, then call {pre} with the packed copy):\n * {pack} writes {mac} elements of {} ({:?}) into {w}_packed. */",
                p.packed_dtype,
                p.packed_shape,
                w = w.name
            );
            let _ = writeln!(s, "#define {mac} {}", p.packed_elements());
            let _ = writeln!(
                s,
                "void {pack}(const {} *{}, {} *{}_packed);",
                public_c_type(w.dtype),
                w.name,
                public_c_type(p.packed_dtype),
                w.name
            );
            let _ = writeln!(s, "void {pre}({});", k.signature(Some(p)));
        }
    }
    s.push_str("\n#ifdef __cplusplus\n}\n#endif\n\n#endif /* TESSEL_KERNELS_H */\n");
    s
}
