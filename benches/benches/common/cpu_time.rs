//! A criterion measurement of the calling thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`, nanoseconds), for single-threaded benches.
//!
//! Why: the machine these benches run on is shared (2 cores, several
//! builds at once), and wall time then counts the time the bench thread
//! waited for a core. CPU time counts only the time it ran, so a baseline
//! comparison is far less at the mercy of the load (ci/bench.sh records the
//! spread). Cache and memory-bandwidth contention still show. Throughput
//! is then "per CPU second", i.e. per core, which is how the targets are
//! stated. Only for code that runs on the measuring thread: work handed to
//! other threads would not be counted.

use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};

/// The calling thread's CPU time (see the module docs).
pub struct CpuTime;

/// Wall time's formatter: values are nanoseconds either way.
static WALL: WallTime = WallTime;

/// This thread's CPU time so far.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the
    // call, and CLOCK_THREAD_CPUTIME_ID is a clock Linux always provides.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl Measurement for CpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu()
    }

    fn end(&self, start: Duration) -> Duration {
        thread_cpu().saturating_sub(start)
    }

    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }

    fn zero(&self) -> Duration {
        Duration::ZERO
    }

    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        WALL.formatter()
    }
}
