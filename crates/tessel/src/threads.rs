//! How many threads the model's tensor library should run: the CPUs this process may use.
//!
//! candle 0.11 sizes its pool by the machine's physical cores, not by the process's CPU
//! affinity, and its workers spin while they wait. Pinned to one core (`taskset -c 1`, as
//! measurements are), two of them spin on that core: a tune's time outside measurement
//! more than doubles (5.6 s against 2.2 s for 64 trials of a small bmm) and training runs at
//! an eighth of its speed. Setting `RAYON_NUM_THREADS`, which candle and rayon both read,
//! to the affinity's CPU count before the first tensor operation avoids it.

/// The variable candle and rayon read for their pool sizes.
pub const THREADS_ENV: &str = "RAYON_NUM_THREADS";

/// The value `RAYON_NUM_THREADS` should take, when neither it nor `CANDLE_NUM_THREADS` is
/// set: the number of CPUs this process may run on. [`fit_threads_to_affinity`] sets it.
pub fn threads_for_affinity() -> Option<usize> {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    if set(THREADS_ENV) || set("CANDLE_NUM_THREADS") {
        return None;
    }
    // The standard library counts the affinity mask (and cgroup quotas).
    std::thread::available_parallelism().ok().map(|n| n.get())
}

/// Sets `RAYON_NUM_THREADS` to [`threads_for_affinity`], when that says to. Call it first
/// thing in `main`:
///
/// ```no_run
/// // SAFETY: no other thread runs yet.
/// unsafe { tessel::fit_threads_to_affinity() };
/// ```
///
/// # Safety
///
/// It sets an environment variable, which is sound only while no other thread may read or
/// write the environment: call it before any thread starts.
pub unsafe fn fit_threads_to_affinity() {
    if let Some(n) = threads_for_affinity() {
        // SAFETY: the caller promises that no other thread runs.
        unsafe { std::env::set_var(THREADS_ENV, n.to_string()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_thread_count_is_left_alone() {
        // The test harness may run with the variable set (CI pins nothing): either way the
        // answer follows the environment.
        let explicit = [THREADS_ENV, "CANDLE_NUM_THREADS"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()));
        match threads_for_affinity() {
            None => assert!(explicit),
            Some(n) => {
                assert!(!explicit);
                assert!(n >= 1);
                assert_eq!(
                    Some(n),
                    std::thread::available_parallelism().ok().map(|n| n.get())
                );
            }
        }
    }
}
