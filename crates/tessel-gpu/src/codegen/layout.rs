//! The physical layout of every buffer, which the generator, the analytical model and the
//! measurers must all use.

use super::*;

/// The physical layout the code generator gives a buffer: element strides per dimension and
/// the elements one copy occupies. Shared buffers keep the dimension their source is
/// contiguous along innermost (so the copy from global memory is 16-byte vectors), and rows
/// that are a multiple of 32 bytes get 16 bytes of padding (so the 8 rows a fragment load
/// touches at once fall in different banks).
pub fn physical_layouts(p: &Program) -> Vec<(Vec<i64>, u64)> {
    let plain = |shape: &[u64], order: &[usize], pad: bool, bytes: u64| {
        let mut strides = vec![1i64; shape.len()];
        let mut size = 1u64;
        for (i, &d) in order.iter().enumerate().rev() {
            strides[d] = size as i64;
            let mut extent = shape[d];
            let row = i + 1 == order.len() && order.len() > 1;
            if pad && row && (extent * bytes).is_multiple_of(32) {
                extent += 16 / bytes.max(1);
            }
            size *= extent;
        }
        (strides, size.max(1))
    };
    let mut out: Vec<(Vec<i64>, u64)> = p
        .buffers
        .iter()
        .map(|b| {
            let order: Vec<usize> = (0..b.shape.len()).collect();
            plain(&b.shape, &order, false, b.dtype.bytes() as u64)
        })
        .collect();
    // Buffers in the order their copies appear: a cache's source is laid out before it.
    let mut copies = Vec::new();
    p.body.walk(&mut |s| {
        if let Stmt::Copy { dst, src, .. } = s {
            copies.push((dst.clone(), src.clone()));
        }
    });
    for (dst, src) in copies {
        let b = &p.buffers[dst.buffer];
        if b.scope.as_str() != "shared" {
            continue;
        }
        let flat = flat_index(&src, &out[src.buffer].0);
        let contiguous = dst.index.iter().rposition(|e| match e {
            Expr::Var(v) => flat.coefficient(*v, p.vars.len()) == 1,
            _ => false,
        });
        let mut order: Vec<usize> = (0..b.shape.len()).collect();
        if let Some(d) = contiguous {
            order.retain(|&x| x != d);
            order.push(d);
        }
        out[dst.buffer] = plain(&b.shape, &order, true, b.dtype.bytes() as u64);
    }
    out
}
