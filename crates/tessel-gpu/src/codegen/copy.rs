//! Block-wide copies into shared memory: one flat loop over all the block's threads with
//! 16-byte vectors where the layout allows, and multi-stage `cp.async` pipelines over the
//! reduction.

use super::*;

impl Emitter<'_> {
    /// All threads of the block copy the nest's elements, 16 bytes at a time where the
    /// layout allows (cp.async when `async_ok`).
    pub(super) fn cooperative_copy(
        &mut self,
        loops: &[(usize, u64)],
        copy: &Stmt,
        async_ok: bool,
    ) -> Result<(), GpuError> {
        let Stmt::Copy {
            dst, src, guards, ..
        } = copy
        else {
            return Ok(());
        };
        let total: u64 = loops.iter().map(|l| l.1).product();
        let bytes = self.p.buffers[dst.buffer].dtype.bytes() as u64;
        let width = 16 / bytes.max(1);
        // Linear coefficients of the flat source and destination indices.
        let (sf, df) = (self.flat(src), self.flat(dst));
        let coeff = |e: &Expr, v: usize| e.coefficient(v, self.p.vars.len());
        // Walk the source's contiguous dimension innermost: consecutive threads then read
        // consecutive addresses (coalesced), 16 bytes each where possible.
        let mut loops = loops.to_vec();
        if let Some(i) = loops.iter().position(|&(v, _)| coeff(&sf, v) == 1) {
            let l = loops.remove(i);
            loops.push(l);
        }
        let loops = &loops[..];
        let (inner_var, inner_ext) = *loops.last().unwrap_or(&(usize::MAX, 1));
        let vec_ok = inner_var != usize::MAX
            && inner_ext % width == 0
            && affine(&sf)
            && affine(&df)
            && coeff(&sf, inner_var) == 1
            && coeff(&df, inner_var) == 1
            && self.bounds(src).is_empty()
            && guards.is_empty()
            && (0..self.p.vars.len())
                .filter(|&v| v != inner_var)
                .all(|v| coeff(&sf, v) % width as i64 == 0 && coeff(&df, v) % width as i64 == 0)
            && sf.eval(&vec![0; self.p.vars.len()]) % width as i64 == 0
            && width > 1;
        let step = if vec_ok { width } else { 1 };
        let iters = total / step;
        self.line(&format!(
            "// {} <- {}: {total} elements, {} threads{}",
            self.p.buffers[dst.buffer].name,
            self.p.buffers[src.buffer].name,
            self.nthreads,
            if vec_ok { ", 16-byte vectors" } else { "" }
        ));
        self.line(&format!(
            "for (int tsl_i = {}; tsl_i < {iters}; tsl_i += {}) {{",
            self.tid, self.nthreads
        ));
        self.depth += 1;
        // Decompose the flat index into the copy loops' variables.
        let saved: Vec<String> = loops.iter().map(|&(v, _)| self.names[v].clone()).collect();
        let mut div = 1u64;
        for &(v, e) in loops.iter().rev() {
            let e_eff = if v == inner_var { e / step } else { e };
            let name = format!("c_{}", self.names[v]);
            let scale = if v == inner_var && step > 1 {
                format!(" * {step}")
            } else {
                String::new()
            };
            self.line(&format!(
                "const int {name} = (tsl_i / {div}) % {e_eff}{scale};"
            ));
            div *= e_eff;
            self.names[v] = name;
        }
        if vec_ok {
            let d = self.element(dst);
            let s = self.element(src);
            if async_ok {
                self.uses_cp_async = true;
                self.line(&format!("tsl_cp_async16(&{d}, &{s}, 16);"));
            } else {
                self.line(&format!("*(uint4*)&{d} = *(const uint4*)&{s};"));
            }
        } else {
            self.stmt(copy)?;
        }
        for (&(v, _), n) in loops.iter().zip(saved) {
            self.names[v] = n;
        }
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    /// An S-stage pipeline over a reduction loop whose body stages inputs in shared memory.
    pub(super) fn pipelined(&mut self, l: &For) -> Result<(), GpuError> {
        let stages = l.pipeline_stages.unwrap_or(1).max(1);
        // Unwrap the allocations and split the body into copies and the rest.
        let mut body = &*l.body;
        let mut allocs = Vec::new();
        while let Stmt::Allocate { buffer, body: b } = body {
            allocs.push(*buffer);
            body = b;
        }
        let items: Vec<&Stmt> = match body {
            Stmt::Seq(v) => v.iter().collect(),
            s => vec![s],
        };
        let mut copies = Vec::new();
        let mut rest = Vec::new();
        for s in items {
            match s {
                Stmt::Barrier => {}
                Stmt::For(f)
                    if copy_nest(f).is_some_and(|(_, c)| matches!(c, Stmt::Copy { dst, .. } if allocs.contains(&dst.buffer))) =>
                {
                    copies.push(f)
                }
                Stmt::Copy { dst, .. } if allocs.contains(&dst.buffer) => {
                    return Err(GpuError::Codegen {
                        reason: "a scalar copy into a pipelined buffer".into(),
                    });
                }
                other => rest.push(other),
            }
        }
        let k = self.names[l.var].clone();
        let kext = l.extent;
        let s1 = stages - 1;
        self.line(&format!(
            "// {stages}-stage pipeline over {}: the copy for step {k} + {s1} overlaps the compute of step {k}",
            self.p.vars[l.var].name
        ));
        let issue = |me: &mut Self, step: &str| -> Result<(), GpuError> {
            let saved = me.names[l.var].clone();
            me.names[l.var] = format!("({step})");
            for &b in &allocs {
                me.stage[b] = Some(format!("({step}) % {stages}"));
            }
            for f in &copies {
                if let Some((loops, c)) = copy_nest(f) {
                    me.cooperative_copy(&loops, c, true)?;
                }
            }
            me.names[l.var] = saved;
            Ok(())
        };
        self.line(&format!("for (int tsl_s = 0; tsl_s < {s1}; ++tsl_s) {{"));
        self.depth += 1;
        self.line(&format!("if (tsl_s < {kext}) {{"));
        self.depth += 1;
        issue(self, "tsl_s")?;
        self.depth -= 1;
        self.line("}");
        self.line("tsl_cp_commit();");
        self.depth -= 1;
        self.line("}");
        self.line(&format!("for (int {k} = 0; {k} < {kext}; ++{k}) {{"));
        self.depth += 1;
        self.line(&format!("if ({k} + {s1} < {kext}) {{"));
        self.depth += 1;
        issue(self, &format!("{k} + {s1}"))?;
        self.depth -= 1;
        self.line("}");
        self.line("tsl_cp_commit();");
        self.line(&format!("tsl_cp_wait<{s1}>();"));
        self.line("__syncthreads();");
        for &b in &allocs {
            self.stage[b] = Some(format!("{k} % {stages}"));
        }
        for s in rest {
            self.stmt(s)?;
        }
        for &b in &allocs {
            self.stage[b] = None;
        }
        self.line("__syncthreads();");
        self.depth -= 1;
        self.line("}");
        self.line("tsl_cp_wait<0>();");
        Ok(())
    }
}
