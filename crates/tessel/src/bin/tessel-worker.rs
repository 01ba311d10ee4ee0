//! A measurement worker for programs that cannot call `tessel::serve_if_worker` in their own
//! `main` (test harnesses): point `worker_exe` at this binary.

fn main() {
    if std::env::var_os(tessel::WORKER_ENV).is_none() {
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var(tessel::WORKER_ENV, "cpu") };
    }
    tessel::serve_if_worker();
}
