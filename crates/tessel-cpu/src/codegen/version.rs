//! Loop versioning for padding: a tile whose reads all fall inside their tensors runs a copy
//! of its body without the bounds checks.
//!
//! A padded convolution reads `I[p + r - 1, q + s - 1, ...]`, and every such read carries its
//! checks (`p + r - 1 >= 0 && ...`) into the innermost loop, where they cost a compare and a
//! blend per load and keep gcc from holding a register tile (a 112x112 depthwise loop nest ran
//! 1.38x slower with them). Most tiles never touch the border. So, as TVM's loop partitioning
//! does, the body of one loop per nest is emitted twice:
//!
//! ```c
//! if (q_0 * 4 + 0 + 0 - 1 >= 0 && q_0 * 4 + 3 + 2 - 1 < 112 ...) {
//!     ...the body, every check proven by the condition left out...
//! } else {
//!     ...the body as before...
//! }
//! ```
//!
//! The condition bounds each checked index over the loops inside the versioned one (each at
//! the end of its range that makes the index smallest, then largest), with the loops outside
//! at their current values. It is exact for indices affine in the inner loops; a body with a
//! check whose index divides an inner loop (a fused pixel index) is not versioned at all, and
//! a non-dividing split's guards stay in both copies: both ran slower versioned.
//!
//! Which loop: the innermost serial or parallel loop (never one inside an unrolled or
//! vectorized loop) whose body holds unproven checks, one of them a read below zero (padding:
//! a tile that only overruns a non-dividing split's end is left alone), and at least
//! [`MIN_VERSION_WORK`] statement instances, so that one test is spread over a tile's work.
//! Tensorized calls keep their own handling (they choose staging by the index ranges alone);
//! their bounds checks drop out of the fast copy where the same condition is proven.

use std::collections::HashSet;

use tessel_ir::{BufferRef, Expr, For, LoopKind, Stmt};

use super::{Check, CodegenError, Gen};

/// A versioned body must run at least this many statement instances per test.
pub(super) const MIN_VERSION_WORK: u64 = 128;

impl<'p> Gen<'p> {
    /// Emits `l`'s body, versioned where [`Gen::version_plan`] finds a condition. `l`'s
    /// variable counts as bound (fixed) inside.
    pub(super) fn loop_body(&mut self, l: &For) -> Result<(), CodegenError> {
        let special = matches!(l.kind, LoopKind::Vectorized | LoopKind::Unrolled);
        self.bound.push(l.var);
        if special {
            self.special_depth += 1;
        }
        let plan = if self.special_depth > 0 || self.versioned {
            None
        } else {
            self.version_plan(l)
        };
        let result = match plan {
            None => self.stmt(&l.body),
            Some((fast, proven)) => self.versioned_body(&l.body, &fast, proven),
        };
        if special {
            self.special_depth -= 1;
        }
        self.bound.pop();
        result
    }

    fn versioned_body(
        &mut self,
        body: &Stmt,
        fast: &[String],
        proven: Vec<String>,
    ) -> Result<(), CodegenError> {
        self.line(&format!(
            "if ({}) {{  /* every read of this tile is inside its tensor: no bounds checks */",
            fast.join(" && ")
        ));
        self.depth += 1;
        self.versioned = true;
        let before = self.proven.clone();
        self.proven.extend(proven);
        let fast_copy = self.stmt(body);
        self.proven = before;
        self.depth -= 1;
        fast_copy?;
        self.line("} else {");
        self.depth += 1;
        let slow_copy = self.stmt(body);
        self.versioned = false;
        self.depth -= 1;
        slow_copy?;
        self.line("}");
        Ok(())
    }

    /// The fast copy's condition and the checks it proves, where `l` (its variable already
    /// bound) is the loop to version.
    fn version_plan(&self, l: &For) -> Option<(Vec<String>, Vec<String>)> {
        let checks = self.candidate_checks(l)?;
        if self.candidate_inside(&l.body) {
            return None;
        }
        // Padding reads below zero somewhere; a tile that only overruns a non-dividing split's
        // end is not versioned (a dense layer's k split by 190 ran 1.25x slower versioned).
        if !checks.iter().any(|c| c.below.is_none()) {
            return None;
        }
        let bound: HashSet<usize> = self.bound.iter().copied().collect();
        let mut fast = Vec::new();
        let mut proven = Vec::new();
        for c in checks {
            // A fast copy that keeps checks saves little and costs the test and the code:
            // timed on a depthwise tile whose fused pixel index divides its inner loops, it
            // ran 1.3x slower than unversioned.
            let (lo, hi) = self.extremes(c.expr, &bound)?;
            let extreme = if c.below.is_none() { lo } else { hi };
            let test = self.check_c(&Check {
                expr: &extreme,
                below: c.below,
            });
            let check = self.check_c(&c);
            if !proven.contains(&check) {
                proven.push(check);
                if !fast.contains(&test) {
                    fast.push(test);
                }
            }
        }
        (!proven.is_empty()).then_some((fast, proven))
    }

    /// Where `l` could be versioned (serial or parallel, enough work), the checks in its body
    /// that the index ranges alone do not prove; `None` where it could not or there are none.
    fn candidate_checks<'l>(&self, l: &'l For) -> Option<Vec<Check<'l>>> {
        if !matches!(l.kind, LoopKind::Serial | LoopKind::Parallel)
            || work(&l.body) < MIN_VERSION_WORK
        {
            return None;
        }
        let mut checks = Vec::new();
        self.collect_checks(&l.body, &mut checks);
        (!checks.is_empty()).then_some(checks)
    }

    /// Whether a loop inside `s` (not inside an unrolled or vectorized one) is a candidate:
    /// the innermost candidate is the one versioned.
    fn candidate_inside(&self, s: &Stmt) -> bool {
        match s {
            Stmt::Seq(v) => v.iter().any(|s| self.candidate_inside(s)),
            Stmt::Allocate { body, .. } => self.candidate_inside(body),
            Stmt::For(l) => {
                !matches!(l.kind, LoopKind::Vectorized | LoopKind::Unrolled)
                    && (self.candidate_checks(l).is_some() || self.candidate_inside(&l.body))
            }
            _ => false,
        }
    }

    /// Every bounds check the statements of `s` would emit that the index ranges do not prove
    /// (tensorized calls apart). A non-dividing split's guards are not versioned: they stay in
    /// both copies (a dense layer's versioned split ran 1.2x slower), but where one is the very
    /// condition of a proven bounds check, the fast copy drops it too.
    fn collect_checks<'s>(&self, s: &'s Stmt, out: &mut Vec<Check<'s>>) {
        let refs = |r: &'s BufferRef, out: &mut Vec<Check<'s>>| out.extend(self.index_checks(r));
        match s {
            Stmt::Seq(v) => v.iter().for_each(|s| self.collect_checks(s, out)),
            Stmt::For(l) => self.collect_checks(&l.body, out),
            Stmt::Allocate { body, .. } => self.collect_checks(body, out),
            Stmt::Fill { dst, .. } => refs(dst, out),
            Stmt::Copy { dst, src, .. } => {
                refs(src, out);
                refs(dst, out);
            }
            Stmt::Update { acc, operands, .. } => {
                operands.iter().for_each(|o| refs(o, out));
                refs(acc, out);
            }
            Stmt::Store { dst, acc, .. } => {
                refs(dst, out);
                refs(acc, out);
            }
            Stmt::Tensorized(_) | Stmt::Barrier => {}
        }
    }

    /// `e` with every unbound variable at the end of its range that makes `e` smallest, and
    /// at the end that makes it largest; `None` where an unbound variable sits under a
    /// division or modulo (not affine in it).
    fn extremes(&self, e: &Expr, bound: &HashSet<usize>) -> Option<(Expr, Expr)> {
        let nvars = self.p.vars.len();
        let free: Vec<usize> = (0..nvars)
            .filter(|v| !bound.contains(v) && e.uses(*v))
            .collect();
        if free.iter().any(|&v| divides(e, v)) {
            return None;
        }
        let zero = vec![0i64; nvars];
        let (mut lo, mut hi) = (e.clone(), e.clone());
        for v in free {
            let mut unit = zero.clone();
            unit[v] = 1;
            let slope = e.eval(&unit) - e.eval(&zero);
            let last = self.p.vars[v].extent as i64 - 1;
            let (at_lo, at_hi) = if slope >= 0 { (0, last) } else { (last, 0) };
            lo = super::subst(&lo, v, at_lo);
            hi = super::subst(&hi, v, at_hi);
        }
        Some((lo, hi))
    }
}

/// Whether `v` appears under a division or modulo in `e`.
fn divides(e: &Expr, v: usize) -> bool {
    match e {
        Expr::Const(_) | Expr::Var(_) => false,
        Expr::Add(a, b) => divides(a, v) || divides(b, v),
        Expr::Mul(a, _) => divides(a, v),
        Expr::Div(a, _) | Expr::Mod(a, _) => a.uses(v),
    }
}

/// Statement instances `s` runs (a tensorized call counts once).
fn work(s: &Stmt) -> u64 {
    match s {
        Stmt::Seq(v) => v.iter().map(work).fold(0u64, u64::saturating_add),
        Stmt::For(l) => l.extent.saturating_mul(work(&l.body)),
        Stmt::Allocate { body, .. } => work(body),
        _ => 1,
    }
}
