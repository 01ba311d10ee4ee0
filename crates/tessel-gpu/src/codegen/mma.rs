//! Tensor Core code: WMMA fragments (arrays per warp, loads hoisted over the warp's tile) and
//! `mma.sync` m16n8k16 through inline PTX with `ldmatrix` operand loads.

use std::fmt::Write as _;

use super::*;

impl Emitter<'_> {
    pub(super) fn fragment_array(&mut self, buffer: usize) -> Result<(), GpuError> {
        let Some(t) = &self.tc else { return Ok(()) };
        let dims = self.fragment_dims(buffer)?;
        let shape: String = dims
            .iter()
            .map(|&d| format!("[{}]", self.p.buffers[buffer].shape[d]))
            .collect();
        if t.mma_sync {
            // Lane l holds rows l/4 and l/4+8, columns 2(l%4) and 2(l%4)+1 of each tile.
            let l = format!(
                "{} {}{shape}[4];  // {}x{} accumulator tiles, 4 values per lane",
                c_type(t.acc_type),
                self.bufs[buffer],
                t.m,
                t.n
            );
            self.line(&l);
            return Ok(());
        }
        let l = format!(
            "wmma::fragment<wmma::accumulator, {}, {}, {}, {}> {}{shape};",
            t.m,
            t.n,
            t.k,
            c_type(t.acc_type),
            self.bufs[buffer],
        );
        self.line(&l);
        Ok(())
    }

    /// The accumulator dimensions that index fragments (not the instruction's m and n).
    pub(super) fn fragment_dims(&self, buffer: usize) -> Result<Vec<usize>, GpuError> {
        let Some(t) = &self.tc else {
            return Ok(Vec::new());
        };
        // Find the accumulator reference of a tensorized call to learn which dims are m, n.
        let mut acc_ref = None;
        self.p.body.walk(&mut |s| {
            if let Stmt::Tensorized(c) = s {
                acc_ref = Some(c.acc.clone());
            }
        });
        let r = acc_ref.ok_or_else(|| GpuError::Codegen {
            reason: "no tensorized call".into(),
        })?;
        if r.buffer != buffer {
            return Ok(Vec::new());
        }
        Ok((0..r.index.len())
            .filter(|&d| !r.index[d].uses(t.vm) && !r.index[d].uses(t.vn))
            .collect())
    }

    pub(super) fn fragment(&self, r: &BufferRef) -> Result<String, GpuError> {
        let dims = self.fragment_dims(r.buffer)?;
        let mut s = self.bufs[r.buffer].clone();
        for d in dims {
            let _ = write!(s, "[{}]", self.expr(&r.index[d]));
        }
        Ok(s)
    }

    /// Pointer, leading dimension and layout of a WMMA operand: `rows`/`cols` are the loop
    /// variables of the fragment's two dimensions.
    pub(super) fn operand(
        &self,
        r: &BufferRef,
        rows: usize,
        cols: usize,
    ) -> Result<(String, i64, bool), GpuError> {
        let f = self.flat(r);
        let coeff = |v: usize| f.coefficient(v, self.p.vars.len());
        let (cr, cc) = (coeff(rows), coeff(cols));
        let (ld, row_major) = match (cr, cc) {
            (_, 1) => (cr, true),
            (1, _) => (cc, false),
            _ => {
                return Err(GpuError::Codegen {
                    reason: format!(
                        "{} is not contiguous along either dimension of the fragment",
                        self.p.buffers[r.buffer].name
                    ),
                });
            }
        };
        let bytes = self.p.buffers[r.buffer].dtype.bytes() as i64;
        if (ld * bytes) % 16 != 0 {
            return Err(GpuError::Codegen {
                reason: format!(
                    "leading dimension {ld} of {} is not a multiple of 16 bytes",
                    self.p.buffers[r.buffer].name
                ),
            });
        }
        // The fragment's origin: the instruction variables at zero.
        let mut me = Emitter {
            names: self.names.clone(),
            ..self.shallow()
        };
        let t = self.tc.as_ref().ok_or_else(|| GpuError::Codegen {
            reason: "no Tensor Core instruction".into(),
        })?;
        for v in [t.vm, t.vn, t.vk] {
            me.names[v] = "0".into();
        }
        if !self.bounds(r).is_empty() {
            return Err(GpuError::Codegen {
                reason: format!(
                    "{} is read past its edges by a fragment: stage it in shared memory (zero-filled)",
                    self.p.buffers[r.buffer].name
                ),
            });
        }
        Ok((format!("&{}", me.element(r)), ld, row_major))
    }

    pub(super) fn shallow(&self) -> Emitter<'_> {
        Emitter {
            p: self.p,
            out: String::new(),
            depth: 0,
            names: Vec::new(),
            bufs: self.bufs.clone(),
            strides: self.strides.clone(),
            sizes: self.sizes.clone(),
            stage: self.stage.clone(),
            stages: self.stages.clone(),
            tc: None,
            nthreads: self.nthreads,
            tid: String::new(),
            uses_cp_async: false,
            decls: Vec::new(),
        }
    }

    /// The `ldmatrix` that fills mma.sync operand registers `dst` with this lane's part of the
    /// A (16x16, 4 registers) or B (16x8, 2 registers) tile at `r`, transposing where the
    /// shared layout is not the one the instruction reads (A row-major, B column-major).
    pub(super) fn ldmatrix(
        &self,
        r: &BufferRef,
        is_a: bool,
        dst: &str,
    ) -> Result<String, GpuError> {
        let t = self.tc.as_ref().ok_or_else(|| GpuError::Codegen {
            reason: "no Tensor Core instruction".into(),
        })?;
        if self.p.buffers[r.buffer].scope.as_str() != "shared" {
            return Err(GpuError::Codegen {
                reason: format!(
                    "mma.sync reads its operands with ldmatrix from shared memory; {} is in {}",
                    self.p.buffers[r.buffer].name, self.p.buffers[r.buffer].scope
                ),
            });
        }
        let (rows, cols) = if is_a { (t.vm, t.vk) } else { (t.vk, t.vn) };
        let (p, ld, row_major) = self.operand(r, rows, cols)?;
        Ok(match (is_a, row_major) {
            // A[m][k]: lanes 0-15 rows m of k 0-7, lanes 16-31 rows m of k 8-15.
            (true, true) => {
                format!("tsl_ldsm_x4({dst}, {p} + (lane % 16) * {ld} + (lane / 16) * 8)")
            }
            // A stored [k][m]: tile j = lane/8 is m 8(j%2).., k 8(j/2)..; its rows are k.
            (true, false) => format!(
                "tsl_ldsm_x4_trans({dst}, {p} + (lane % 8 + (lane / 16) * 8) * {ld} + ((lane / 8) % 2) * 8)"
            ),
            // B stored [k][n]: rows k 0-15, transposed into the column-major fragment.
            (false, true) => format!("tsl_ldsm_x2_trans({dst}, {p} + (lane % 16) * {ld})"),
            // B stored [n][k]: rows n, k 0-7 then 8-15.
            (false, false) => {
                format!("tsl_ldsm_x2({dst}, {p} + (lane % 8) * {ld} + ((lane / 8) % 2) * 8)")
            }
        })
    }

    pub(super) fn mma_fn(&self) -> &'static str {
        match self.tc.as_ref().map(|t| t.in_type) {
            Some(DType::BF16) => "tsl_mma_bf16",
            _ => "tsl_mma_f16",
        }
    }

    pub(super) fn frag_type(&self, which: &str, row_major: bool) -> String {
        let t = self
            .tc
            .as_ref()
            .map_or((16, 16, 16, DType::F16), |t| (t.m, t.n, t.k, t.in_type));
        let ty = match t.3 {
            DType::F16 => "half",
            DType::BF16 => "__nv_bfloat16",
            DType::F32 => "wmma::precision::tf32",
            DType::I8 => "signed char",
            DType::U8 => "unsigned char",
            DType::I32 => "int",
            DType::I16 => "short",
        };
        format!(
            "wmma::fragment<wmma::{which}, {}, {}, {}, {ty}, wmma::{}>",
            t.0,
            t.1,
            t.2,
            if row_major { "row_major" } else { "col_major" }
        )
    }

    /// One call: load both fragments and multiply-accumulate.
    pub(super) fn mma(&mut self, c: &TensorizedCall, _: Option<()>) -> Result<(), GpuError> {
        let (vm, vn, vk) = match &self.tc {
            Some(t) => (t.vm, t.vn, t.vk),
            None => {
                return Err(GpuError::Codegen {
                    reason: "no Tensor Core instruction".into(),
                });
            }
        };
        if self.tc.as_ref().is_some_and(|t| t.mma_sync) {
            let load_a = self.ldmatrix(&c.operands[0], true, "a")?;
            let load_b = self.ldmatrix(&c.operands[1], false, "b")?;
            let acc = self.fragment(&c.acc)?;
            let f = self.mma_fn();
            self.line("{");
            self.depth += 1;
            self.line("unsigned a[4], b[2];");
            self.line(&format!("{load_a}; {load_b};"));
            self.line(&format!("{f}({acc}, a, b);"));
            self.depth -= 1;
            self.line("}");
            return Ok(());
        }
        let (pa, lda, ra) = self.operand(&c.operands[0], vm, vk)?;
        let (pb, ldb, rb) = self.operand(&c.operands[1], vk, vn)?;
        let acc = self.fragment(&c.acc)?;
        self.line("{");
        self.depth += 1;
        let (ta, tb) = (
            self.frag_type("matrix_a", ra),
            self.frag_type("matrix_b", rb),
        );
        self.line(&format!("{ta} a; wmma::load_matrix_sync(a, {pa}, {lda});"));
        self.line(&format!("{tb} b; wmma::load_matrix_sync(b, {pb}, {ldb});"));
        self.line(&format!("wmma::mma_sync({acc}, a, b, {acc});"));
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    /// `for o { for i { mma } }`: loads the fragments of A and B once per (o or i) instead of
    /// once per call.
    pub(super) fn mma_block(
        &mut self,
        outer: &For,
        inner: &For,
        c: &TensorizedCall,
    ) -> Result<(), GpuError> {
        let (vm, vn, vk) = match &self.tc {
            Some(t) => (t.vm, t.vn, t.vk),
            None => {
                return Err(GpuError::Codegen {
                    reason: "no Tensor Core instruction".into(),
                });
            }
        };
        let uses = |r: &BufferRef, v: usize| r.index.iter().any(|e| e.uses(v));
        let (a, b) = (&c.operands[0], &c.operands[1]);
        let (o, i) = (outer.var, inner.var);
        // A must not depend on the loop that B depends on, and vice versa.
        let (a_loop, b_loop) = if !uses(a, i) && !uses(b, o) {
            (outer, inner)
        } else if !uses(a, o) && !uses(b, i) {
            (inner, outer)
        } else {
            // Fall back to one load per call.
            let v = self.names[o].clone();
            self.line("#pragma unroll");
            self.line(&format!(
                "for (int {v} = 0; {v} < {}; ++{v}) {{",
                outer.extent
            ));
            self.depth += 1;
            let v2 = self.names[i].clone();
            self.line("#pragma unroll");
            self.line(&format!(
                "for (int {v2} = 0; {v2} < {}; ++{v2}) {{",
                inner.extent
            ));
            self.depth += 1;
            self.mma(c, None)?;
            self.depth -= 1;
            self.line("}");
            self.depth -= 1;
            self.line("}");
            return Ok(());
        };
        let (an, bn) = (
            self.names[a_loop.var].clone(),
            self.names[b_loop.var].clone(),
        );
        let acc = self.fragment(&c.acc)?;
        // Per flavour: the operand arrays, one load of each, one multiply-accumulate.
        let (decls, load_a, load_b, mma) = if self.tc.as_ref().is_some_and(|t| t.mma_sync) {
            (
                vec![format!(
                    "unsigned a[{}][4], b[{}][2];",
                    a_loop.extent, b_loop.extent
                )],
                self.ldmatrix(a, true, &format!("a[{an}]"))?,
                self.ldmatrix(b, false, &format!("b[{bn}]"))?,
                format!("{}({acc}, a[{an}], b[{bn}]);", self.mma_fn()),
            )
        } else {
            let (pa, lda, ra) = self.operand(a, vm, vk)?;
            let (pb, ldb, rb) = self.operand(b, vk, vn)?;
            (
                vec![
                    format!("{} a[{}];", self.frag_type("matrix_a", ra), a_loop.extent),
                    format!("{} b[{}];", self.frag_type("matrix_b", rb), b_loop.extent),
                ],
                format!("wmma::load_matrix_sync(a[{an}], {pa}, {lda})"),
                format!("wmma::load_matrix_sync(b[{bn}], {pb}, {ldb})"),
                format!("wmma::mma_sync({acc}, a[{an}], b[{bn}], {acc});"),
            )
        };
        for d in &decls {
            self.line(d);
        }
        for (v, extent, load) in [(&an, a_loop.extent, &load_a), (&bn, b_loop.extent, &load_b)] {
            self.line("#pragma unroll");
            self.line(&format!("for (int {v} = 0; {v} < {extent}; ++{v}) {load};"));
        }
        let (on, inn) = (self.names[o].clone(), self.names[i].clone());
        self.line("#pragma unroll");
        self.line(&format!(
            "for (int {on} = 0; {on} < {}; ++{on})",
            outer.extent
        ));
        self.line("#pragma unroll");
        self.line(&format!(
            "  for (int {inn} = 0; {inn} < {}; ++{inn})",
            inner.extent
        ));
        self.line(&format!("    {mma}"));
        Ok(())
    }
}
