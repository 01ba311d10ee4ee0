//! The measurement worker process of tessel-gpu (see `tessel_gpu::cuda`).

fn main() {
    std::process::exit(tessel_gpu::cuda::serve());
}
