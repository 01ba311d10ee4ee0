//! Pre-packed weights: a kernel split into a pack function and a kernel that takes the packed
//! copy, as oneDNN's pre-packed matmul does.
//!
//! A schedule that packs an input at its root (a `pack` or `cast` trace step) copies it into a
//! whole-tensor buffer before any compute. For weights that copy is the same on every call, so
//! an application packs them once: `NAME_pack` runs only the root copy, and `NAME` (the
//! pre-packed variant) binds its argument to the packed buffer and skips the copy. Both come
//! from the same program, so the arithmetic is the measured kernel's.

use tessel_intrin::Catalog;
use tessel_ir::{BufferRole, DType, Program, Stmt};

use super::{Gen, Kernel, c_type};
use crate::error::CodegenError;

/// Where the root copy of one input lives in a program.
#[derive(Clone, Copy)]
pub(super) struct Plan<'p> {
    pub operand: usize,
    /// The packed buffer (role `Packed { operand }`), allocated outside every loop.
    pub buffer: usize,
    /// The statement that fills it from the input, the only one that writes it.
    pub pack: &'p Stmt,
}

/// The two halves of a kernel whose input `operand` can come pre-packed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepacked {
    pub operand: usize,
    /// `void PACK(void *const *args)`: args[0] the input in its own layout, args[1] the packed
    /// buffer, which it fills entirely (zeros in padding).
    pub pack: Kernel,
    /// The kernel with the packed buffer in the input's argument slot.
    pub kernel: Kernel,
    pub packed_dtype: DType,
    pub packed_shape: Vec<u64>,
}

impl Prepacked {
    /// Elements of the packed buffer.
    pub fn packed_elements(&self) -> u64 {
        self.packed_shape.iter().product()
    }
}

/// Generates `NAME` taking input `operand` pre-packed and `PACK_NAME` that packs it, or `None`
/// when the schedule does not pack that input once at its root (it reads it in place, or
/// packs it block by block inside loops).
pub fn generate_prepacked(
    program: &Program,
    name: &str,
    pack_name: &str,
    operand: usize,
    catalog: &Catalog,
) -> Result<Option<Prepacked>, CodegenError> {
    let Some(plan) = plan(program, operand) else {
        return Ok(None);
    };
    let packed = &program.buffers[plan.buffer];
    let (packed_dtype, packed_shape) = (packed.dtype, packed.shape.clone());

    let mut g = Gen::new(program, catalog)?;
    g.prepacked = Some(plan);
    g.kernel(name)?;
    let kernel = Kernel {
        name: name.to_string(),
        source: g.out,
        features: g.features,
        intrinsics: g.intrinsics,
    };

    let mut g = Gen::new(program, catalog)?;
    let input = program
        .buffers
        .iter()
        .position(|b| b.role == BufferRole::Input(operand))
        .ok_or_else(|| CodegenError::Malformed {
            reason: format!("no buffer for input {operand}"),
        })?;
    let (it, pt) = (c_type(program.buffers[input].dtype), c_type(packed_dtype));
    g.line(&format!(
        "/* packs input {operand} of {} into {:?} {packed_dtype} */",
        program.op.name, packed_shape
    ));
    g.line(&format!("void {pack_name}(void *const *args) {{"));
    g.depth += 1;
    let (iname, pname) = (g.bufs[input].clone(), g.bufs[plan.buffer].clone());
    g.line(&format!(
        "const {it} *restrict {iname} = (const {it} *)args[0];"
    ));
    g.line(&format!("{pt} *restrict {pname} = ({pt} *)args[1];"));
    // The kernel's buffer starts zeroed (static storage); so does the packed copy.
    g.line(&format!(
        "memset({pname}, 0, sizeof({pt}) * {});",
        packed_shape.iter().product::<u64>()
    ));
    g.stmt(plan.pack)?;
    g.depth -= 1;
    g.line("}");
    let pack = Kernel {
        name: pack_name.to_string(),
        source: g.out,
        features: g.features,
        intrinsics: g.intrinsics,
    };
    Ok(Some(Prepacked {
        operand,
        pack,
        kernel,
        packed_dtype,
        packed_shape,
    }))
}

/// Finds the root allocation of input `operand`'s packed copy and the one statement that fills
/// it, both outside every loop; `None` if the program does not have that shape.
fn plan(program: &Program, operand: usize) -> Option<Plan<'_>> {
    let packed = program
        .buffers
        .iter()
        .position(|b| b.role == (BufferRole::Packed { operand }))?;
    let input = program
        .buffers
        .iter()
        .position(|b| b.role == BufferRole::Input(operand))?;
    // Walk the statements outside every loop for the packed buffer's allocation.
    let mut roots = vec![&program.body];
    let mut alloc_body = None;
    while let Some(s) = roots.pop() {
        match s {
            Stmt::Seq(v) => roots.extend(v.iter()),
            Stmt::Allocate { buffer, body } if *buffer == packed => alloc_body = Some(&**body),
            Stmt::Allocate { body, .. } => roots.push(body),
            _ => {}
        }
    }
    // Within it, the top-level statements: exactly one of them writes the packed buffer.
    let mut tops = Vec::new();
    let mut stack = vec![alloc_body?];
    while let Some(s) = stack.pop() {
        match s {
            Stmt::Seq(v) => stack.extend(v.iter()),
            Stmt::Allocate { body, .. } => stack.push(body),
            other => tops.push(other),
        }
    }
    let writes = |s: &Stmt| {
        let mut w = false;
        s.walk(&mut |x| w |= writes_buffer(x, packed));
        w
    };
    let mut writers = tops.into_iter().filter(|s| writes(s));
    let pack = writers.next()?;
    if writers.next().is_some() {
        return None;
    }
    // The pack statement copies the input into the packed buffer and nothing else; nothing
    // else in the program reads the input (it is not passed to the pre-packed kernel).
    let mut only_copies = true;
    pack.walk(&mut |x| match x {
        Stmt::Copy { dst, src, .. } => {
            only_copies &= dst.buffer == packed && src.buffer == input;
        }
        Stmt::Seq(_) | Stmt::For(_) => {}
        _ => only_copies = false,
    });
    let mut inside = std::collections::HashSet::new();
    pack.walk(&mut |x| {
        inside.insert(x as *const Stmt);
    });
    let mut reads_elsewhere = false;
    program.body.walk(&mut |x| {
        reads_elsewhere |= !inside.contains(&(x as *const Stmt)) && reads_buffer(x, input);
    });
    (only_copies && !reads_elsewhere).then_some(Plan {
        operand,
        buffer: packed,
        pack,
    })
}

fn writes_buffer(s: &Stmt, buffer: usize) -> bool {
    match s {
        Stmt::Fill { dst, .. } | Stmt::Copy { dst, .. } | Stmt::Store { dst, .. } => {
            dst.buffer == buffer
        }
        Stmt::Update { acc, .. } => acc.buffer == buffer,
        Stmt::Tensorized(c) => c.acc.buffer == buffer,
        _ => false,
    }
}

fn reads_buffer(s: &Stmt, buffer: usize) -> bool {
    match s {
        Stmt::Copy { src, .. } => src.buffer == buffer,
        Stmt::Update { operands, .. } => operands.iter().any(|o| o.buffer == buffer),
        Stmt::Store { acc, biases, .. } => acc.buffer == buffer || biases.contains(&buffer),
        Stmt::Tensorized(c) => c.operands.iter().any(|o| o.buffer == buffer),
        _ => false,
    }
}
