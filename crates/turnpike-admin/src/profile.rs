//! `GET /debug/profile?seconds=N` on `debug_listen` (off by default): samples the running
//! gateway's threads in-process (pprof, 99 Hz, SIGPROF) for N seconds (1–60, default 10) and
//! answers a CPU flame graph as SVG. One profile at a time; a second one gets 409.

use std::sync::atomic::{AtomicBool, Ordering};

use http::{header, HeaderValue, Response, StatusCode};

use crate::{message, Resp};

static RUNNING: AtomicBool = AtomicBool::new(false);

struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::Release);
    }
}

pub(crate) async fn profile(query: &str) -> Resp {
    let seconds = match query
        .split('&')
        .find_map(|p| p.strip_prefix("seconds="))
        .map(|s| s.parse::<u64>())
    {
        None => 10,
        Some(Ok(s)) if (1..=60).contains(&s) => s,
        _ => {
            return message(
                StatusCode::BAD_REQUEST,
                "seconds must be a number between 1 and 60",
            )
        }
    };
    if RUNNING.swap(true, Ordering::AcqRel) {
        return message(StatusCode::CONFLICT, "a profile is already being taken");
    }
    let _running = Running;
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(99)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
    {
        Ok(g) => g,
        Err(e) => {
            return message(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot start the profiler: {e}"),
            )
        }
    };
    tokio::time::sleep(std::time::Duration::from_secs(seconds)).await;
    let mut svg = Vec::new();
    let built = guard
        .report()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|r| r.flamegraph(&mut svg).map_err(|e| e.to_string()));
    if let Err(e) = built {
        return message(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot build the flame graph: {e}"),
        );
    }
    let mut r = Response::new(crate::full(svg));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("image/svg+xml"),
    );
    *r.status_mut() = StatusCode::OK;
    r
}
