//! The reference interpreter: executes any lowered [`Program`] on real data.
//!
//! Integer arithmetic is exact (i32 accumulators wrap as the hardware's do), bf16/f16 values
//! are rounded as the formats require, floating-point accumulation rounds to f32 after every
//! addition. Tensorized calls run their instruction's own semantics on gathered tiles.

use crate::ast::{BufferRef, BufferRole, Program, Stmt, TensorizedCall};
use crate::data::TensorData;
use crate::error::ExecError;
use crate::op::advance;

/// The interpreter is for checking small programs; it refuses to allocate beyond this.
const MAX_INTERPRETED_ELEMENTS: u64 = 1 << 28;

impl Program {
    /// Runs the program. `inputs` are the operator's inputs followed by its epilogue biases
    /// (the order of [`ComputeOp::read_operands`](crate::ComputeOp::read_operands)).
    pub fn run(&self, inputs: &[TensorData]) -> Result<TensorData, ExecError> {
        self.op.check_inputs(inputs)?;
        let elements = self
            .buffers
            .iter()
            .map(|b| b.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)))
            .try_fold(0u64, |a, e| e.and_then(|e| a.checked_add(e)));
        match elements {
            Some(e) if e <= MAX_INTERPRETED_ELEMENTS => {}
            _ => {
                return Err(ExecError::Malformed {
                    reason: format!(
                        "buffers hold more than {MAX_INTERPRETED_ELEMENTS} elements: too large for the reference interpreter"
                    ),
                });
            }
        }
        let mut bufs: Vec<Option<TensorData>> = vec![None; self.buffers.len()];
        let n_inputs = self.op.inputs.len();
        let mut output = None;
        for (i, b) in self.buffers.iter().enumerate() {
            match b.role {
                BufferRole::Input(k) => bufs[i] = Some(inputs[k].clone()),
                BufferRole::Bias(k) => bufs[i] = Some(inputs[n_inputs + k].clone()),
                BufferRole::Output => {
                    bufs[i] = Some(TensorData::zeros(b.shape.clone(), b.dtype));
                    output = Some(i);
                }
                _ => {}
            }
        }
        let output = output.ok_or_else(|| ExecError::Malformed {
            reason: "no output buffer".into(),
        })?;
        let mut m = Machine {
            p: self,
            vals: vec![0; self.vars.len()],
            bufs,
        };
        m.exec(&self.body)?;
        m.bufs[output].take().ok_or_else(|| ExecError::Malformed {
            reason: "output buffer was freed".into(),
        })
    }
}

struct Machine<'p> {
    p: &'p Program,
    vals: Vec<i64>,
    bufs: Vec<Option<TensorData>>,
}

impl Machine<'_> {
    fn buffer(&self, b: usize) -> Result<&TensorData, ExecError> {
        self.bufs
            .get(b)
            .and_then(Option::as_ref)
            .ok_or_else(|| ExecError::Malformed {
                reason: format!("buffer #{b} used outside its allocation"),
            })
    }

    fn index(&self, r: &BufferRef) -> Result<Vec<i64>, ExecError> {
        if r.index.iter().any(|e| e.uses(usize::MAX)) {
            return Err(ExecError::Malformed {
                reason: "index uses an unbound loop variable".into(),
            });
        }
        Ok(r.index.iter().map(|e| e.eval(&self.vals)).collect())
    }

    fn read(&self, r: &BufferRef) -> Result<f64, ExecError> {
        let idx = self.index(r)?;
        Ok(self.buffer(r.buffer)?.get_or_zero(&idx))
    }

    fn write(&mut self, r: &BufferRef, value: f64) -> Result<(), ExecError> {
        let idx = self.index(r)?;
        let name = &self.p.buffers[r.buffer].name;
        let t = self
            .bufs
            .get_mut(r.buffer)
            .and_then(Option::as_mut)
            .ok_or_else(|| ExecError::Malformed {
                reason: format!("buffer `{name}` written outside its allocation"),
            })?;
        let at = t.offset(&idx).ok_or_else(|| ExecError::OutOfBounds {
            buffer: name.clone(),
            index: idx,
        })?;
        t.data[at] = t.dtype.round(value);
        Ok(())
    }

    fn exec(&mut self, s: &Stmt) -> Result<(), ExecError> {
        match s {
            Stmt::Seq(v) => {
                for s in v {
                    self.exec(s)?;
                }
            }
            Stmt::For(l) => {
                // A shared cache's copy re-walks the thread loops it spans: give the enclosing
                // loop its value back afterwards.
                let outer = self.vals[l.var];
                for i in 0..l.extent as i64 {
                    self.vals[l.var] = i;
                    self.exec(&l.body)?;
                }
                self.vals[l.var] = outer;
            }
            Stmt::Allocate { buffer, body } => {
                let b = &self.p.buffers[*buffer];
                self.bufs[*buffer] = Some(TensorData::zeros(b.shape.clone(), b.dtype));
                self.exec(body)?;
                self.bufs[*buffer] = None;
            }
            Stmt::Fill { dst, .. } => self.write(dst, 0.0)?,
            Stmt::Copy {
                dst, src, guards, ..
            } => {
                let v = if guards.iter().all(|g| g.holds(&self.vals)) {
                    self.read(src)?
                } else {
                    0.0
                };
                self.write(dst, v)?;
            }
            Stmt::Update {
                acc,
                operands,
                guards,
            } => {
                if guards.iter().all(|g| g.holds(&self.vals)) {
                    let mut prod = 1.0;
                    for o in operands {
                        prod *= self.read(o)?;
                    }
                    let v = self.p.op.accumulator.round(self.read(acc)? + prod);
                    self.write(acc, v)?;
                }
            }
            Stmt::Store {
                dst,
                acc,
                point,
                biases,
                guards,
                accumulate,
                ..
            } => {
                if guards.iter().all(|g| g.holds(&self.vals)) {
                    let point: Vec<i64> = point.iter().map(|e| e.eval(&self.vals)).collect();
                    let v = self.read(acc)?;
                    let bias_bufs: Vec<&TensorData> = biases
                        .iter()
                        .map(|&b| self.buffer(b))
                        .collect::<Result<_, _>>()?;
                    let v = self.p.op.apply_epilogue(v, &point, |i, idx| {
                        bias_bufs.get(i).map_or(0.0, |t| t.get_or_zero(idx))
                    });
                    let v = if *accumulate {
                        let t = self.p.buffers[dst.buffer].dtype;
                        t.round(self.read(dst)? + v)
                    } else {
                        v
                    };
                    self.write(dst, v)?;
                }
            }
            Stmt::Tensorized(call) => self.tensorized(call)?,
            Stmt::Barrier => {}
        }
        Ok(())
    }

    /// Gathers the instruction's tiles, runs its semantics, scatters the accumulator back.
    fn tensorized(&mut self, call: &TensorizedCall) -> Result<(), ExecError> {
        let sem = &call.semantics;
        let extents: Vec<u64> = sem.iter_vars.iter().map(|v| v.extent).collect();
        let mut tiles: Vec<TensorData> = sem
            .inputs
            .iter()
            .map(|o| TensorData::zeros(o.tensor.shape.clone(), o.tensor.dtype))
            .collect();
        let mut acc_tile = TensorData::zeros(sem.output.tensor.shape.clone(), sem.accumulator);
        let mut point = vec![0i64; extents.len()];
        let mut live = Vec::new();
        loop {
            for &(u, v) in &call.bindings {
                self.vals[v] = point[u];
            }
            let ok = call.guards.iter().all(|g| g.holds(&self.vals));
            // A tile element is shared by many points; padded points must not overwrite
            // what a real point gathered, so only real points write (tiles start at zero).
            if ok {
                for (i, o) in sem.inputs.iter().enumerate() {
                    let idx: Vec<i64> = o.indices.iter().map(|e| e.eval(&point)).collect();
                    if let Some(at) = tiles[i].offset(&idx) {
                        tiles[i].data[at] = self.read(&call.operands[i])?;
                    }
                }
                let idx: Vec<i64> = sem.output.indices.iter().map(|e| e.eval(&point)).collect();
                if let Some(at) = acc_tile.offset(&idx) {
                    acc_tile.data[at] = self.read(&call.acc)?;
                    live.push((point.clone(), at));
                }
            }
            if !advance(&mut point, &extents) {
                break;
            }
        }
        sem.accumulate(&tiles, &mut acc_tile)?;
        for (p, at) in live {
            for &(u, v) in &call.bindings {
                self.vals[v] = p[u];
            }
            self.write(&call.acc, acc_tile.data[at])?;
        }
        Ok(())
    }
}
