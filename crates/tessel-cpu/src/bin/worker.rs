//! The measurement worker process of tessel-cpu (see `tessel_cpu::worker`).

fn main() {
    std::process::exit(tessel_cpu::worker::serve());
}
