//! The clock plugins read.

/// Seconds since the epoch from the kernel's coarse real-time clock: read from the vDSO
/// without a time-stamp counter read or nanosecond arithmetic, a few ms behind at most, as
/// Kong's `ngx.time()` (cached per event-loop turn) is.
pub fn now_secs() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
        return ts.tv_sec as u64;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Nanoseconds since the epoch from the real-time clock (the vDSO, no system call), for span
/// times: `SystemTime::now()` and its checked `duration_since` cost three times as much per
/// read, twice per traced request.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) } == 0 {
        return ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
