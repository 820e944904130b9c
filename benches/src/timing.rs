//! Timing harness based on CUDA events.
//!
//! Every timed iteration is bracketed by its own pair of events recorded on
//! the stream, so the reported numbers are device-side durations of exactly
//! the work enqueued by one call of the closure. All events are recorded
//! first and read back after the whole loop, so launches go back to back and
//! the host never waits between iterations.
//!
//! The stream is held closed (`cuStreamWaitValue32` on a host-mapped flag)
//! while the host enqueues the timed iterations and opened after the last: a
//! kernel shorter than its host-side launch path (a few µs for small shapes,
//! ours or cuBLASLt's) would otherwise be timed together with the gap in which
//! the GPU waits for the next launch, and the reading would be the host's
//! speed, noisy from run to run.
//!
//! No gate under a profiler ([`profiler_attached`]): ncu profiles each launch
//! as it is enqueued and waits for the work ahead of it, so a launch behind a
//! gate that only the host opens, after that launch returns, can never be
//! profiled (ncu 2025.3.1 reported "Failed to prepare kernel for profiling …
//! Unknown Error" and the process then hung on the closed gate). As a second
//! guard, a gate left closed for [`GATE_TIMEOUT`] is opened from another
//! thread: a serializing tool that goes undetected costs the gate's benefit,
//! never a hang.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use cudarc::driver::{CudaEvent, CudaStream, DriverError, sys, sys::CUevent_flags};

/// Summary of per-iteration device times, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
}

impl Timing {
    /// Summarises raw samples (milliseconds). Empty input gives NaN times and
    /// `samples == 0`.
    pub fn from_samples(samples: &mut [f64]) -> Timing {
        let min_ms = samples.iter().copied().fold(f64::INFINITY, f64::min);
        let max_ms = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (min_ms, max_ms) = if samples.is_empty() {
            (f64::NAN, f64::NAN)
        } else {
            (min_ms, max_ms)
        };
        Timing {
            median_ms: median(samples),
            min_ms,
            max_ms,
            samples: samples.len(),
        }
    }
}

/// Median of `xs` (sorts `xs` in place, total order on f64). Even counts
/// average the two middle values; an empty slice gives NaN.
pub fn median(xs: &mut [f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        0.5 * (xs[n / 2 - 1] + xs[n / 2])
    }
}

/// Largest number of input sets `rotation_count` will ask for.
pub const MAX_ROTATION: usize = 16;

/// How many distinct input sets of `bytes_per_set` bytes are needed so that
/// together they cover at least 4× the L2 size (so each timed iteration reads
/// its inputs from DRAM, not from L2 left warm by the previous iteration).
/// At least 1, at most [`MAX_ROTATION`].
pub fn rotation_count(bytes_per_set: usize, l2_bytes: usize) -> usize {
    if bytes_per_set == 0 {
        return 1;
    }
    let target = l2_bytes.saturating_mul(4);
    target.div_ceil(bytes_per_set).clamp(1, MAX_ROTATION)
}

/// Launches before every timing under sustained load ([`set_sustained`]).
pub const SUSTAINED_LAUNCHES: usize = 1000;

static SUSTAINED: AtomicUsize = AtomicUsize::new(0);

/// From now on, every [`time_on_stream`] in this process first runs at least `launches` untimed
/// calls (ours and the peer's alike), so that the timed ones see the clocks and power draw of a
/// GPU kept busy rather than of one starting from idle (0: the callers' warm-up alone).
pub fn set_sustained(launches: usize) {
    SUSTAINED.store(launches, Ordering::Relaxed);
}

/// The launches [`set_sustained`] asks for before every timing (0: none).
pub fn sustained() -> usize {
    SUSTAINED.load(Ordering::Relaxed)
}

/// Times `f` on `stream`.
///
/// `f` is called `warmup + iters` times with a running index `0, 1, 2, …`
/// (warm-up calls get `0..warmup`, timed calls `warmup..warmup+iters`), so a
/// caller rotating among `r` input sets can use `i % r` throughout. `f` must
/// only enqueue work on `stream` (it may enqueue several kernels; all of them
/// are timed). Warm-up calls are not timed; under sustained load ([`set_sustained`]) there are
/// at least that many. `iters == 0` is treated as 1.
///
/// Errors from `f` are returned as is; CUDA errors from the event calls are
/// converted with `E: From<DriverError>`.
pub fn time_on_stream<E: From<DriverError>>(
    stream: &Arc<CudaStream>,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut(usize) -> Result<(), E>,
) -> Result<Timing, E> {
    let (iters, warmup) = (iters.max(1), warmup.max(sustained()));
    let ctx = stream.context();
    for i in 0..warmup {
        f(i)?;
    }
    // Events are created with timing enabled (CU_EVENT_DEFAULT; cudarc's
    // default would disable timing).
    let mut pairs: Vec<(CudaEvent, CudaEvent)> = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let stop = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        pairs.push((start, stop));
    }
    // Drain the warm-up work so the timed loop starts on an idle stream.
    stream.synchronize()?;
    {
        // Held closed while the iterations are enqueued (not for long loops: the driver's
        // queue of pending launches would fill and block the host while the stream waits).
        let _gate = if iters <= MAX_GATED {
            Gate::close(stream)
        } else {
            None
        };
        for (j, (start, stop)) in pairs.iter().enumerate() {
            start.record(stream)?;
            f(warmup + j)?;
            stop.record(stream)?;
        }
    }
    let mut samples = Vec::with_capacity(iters);
    for (start, stop) in &pairs {
        // `elapsed_ms` synchronises both events first.
        samples.push(f64::from(start.elapsed_ms(stop)?));
    }
    Ok(Timing::from_samples(&mut samples))
}

/// Most timed iterations enqueued behind a closed [`Gate`]: each is two events and a few launches,
/// far below the driver's pending-launch queue (about a thousand entries).
const MAX_GATED: usize = 128;

/// A host-mapped flag the stream waits on (`cuStreamWaitValue32`, PTX-free): work enqueued after
/// [`Gate::close`] starts only when the gate is dropped (which opens it and waits for the stream
/// to pass it before freeing the flag).
struct Gate {
    host: *mut u32,
    stream: sys::CUstream,
    /// Dropping the sender wakes the watchdog, which then exits without touching the flag.
    stop: Option<mpsc::Sender<()>>,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

/// How long a [`Gate`] may stay closed before its watchdog opens it: enqueuing [`MAX_GATED`]
/// iterations takes milliseconds, so only a host blocked inside a launch (a profiler serializing
/// launches) reaches it.
pub const GATE_TIMEOUT: Duration = Duration::from_secs(2);

/// The flag's address, movable to the watchdog thread.
struct FlagPtr(*mut u32);
// SAFETY: the pointer is only written through (volatile) while the allocation lives: `Gate::drop`
// joins the watchdog before freeing it.
unsafe impl Send for FlagPtr {}

/// A reason to think a CUDA tool is injected into this process (ncu, nsys, compute-sanitizer):
/// `CUDA_INJECTION64_PATH`, an Nsight library in `LD_PRELOAD`, or one mapped into the process
/// (checked after CUDA is initialized, when the tools have loaded their libraries).
pub fn profiler_attached() -> Option<String> {
    if let Some(v) = std::env::var_os("CUDA_INJECTION64_PATH").filter(|v| !v.is_empty()) {
        return Some(format!("CUDA_INJECTION64_PATH={}", v.to_string_lossy()));
    }
    let tool = |s: &str| {
        [
            "nsight",
            "Injection",
            "TreeLauncher",
            "libcupti",
            "libnvperf",
            "sanitizer",
        ]
        .iter()
        .any(|k| s.contains(k))
    };
    if let Some(v) = std::env::var_os("LD_PRELOAD") {
        let v = v.to_string_lossy();
        if tool(&v) {
            return Some(format!("LD_PRELOAD={v}"));
        }
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| tool(path))
        .map(|path| format!("{path} is loaded"))
}

impl Gate {
    /// Closes `stream`; `None` (no gate, timing as before) if the driver refuses any step, or
    /// when a CUDA tool is injected ([`profiler_attached`]): ncu profiles each launch as it is
    /// enqueued, so it would wait forever on the closed gate.
    fn close(stream: &Arc<CudaStream>) -> Option<Gate> {
        if profiler_attached().is_some() {
            return None;
        }
        let mut host: *mut core::ffi::c_void = core::ptr::null_mut();
        // SAFETY: a 4-byte pinned, device-mapped allocation; freed in `drop` (or below on error).
        let host = unsafe {
            sys::cuMemHostAlloc(&mut host, 4, sys::CU_MEMHOSTALLOC_DEVICEMAP)
                .result()
                .ok()?;
            let host = host as *mut u32;
            core::ptr::write_volatile(host, 0);
            let mut dev: sys::CUdeviceptr = 0;
            let waited = sys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0)
                .result()
                .and_then(|_| {
                    sys::cuStreamWaitValue32_v2(
                        stream.cu_stream(),
                        dev,
                        1,
                        sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                    )
                    .result()
                });
            if waited.is_err() {
                let _ = sys::cuMemFreeHost(host.cast());
                return None;
            }
            host
        };
        let (stop, wake) = mpsc::channel::<()>();
        let flag = FlagPtr(host);
        let watchdog = std::thread::Builder::new()
            .name("gate-watchdog".into())
            .spawn(move || {
                let flag = flag;
                if let Err(mpsc::RecvTimeoutError::Timeout) = wake.recv_timeout(GATE_TIMEOUT) {
                    // SAFETY: the allocation outlives this thread (`Gate::drop` joins it before
                    // freeing); a volatile store of the value the stream waits for.
                    unsafe { core::ptr::write_volatile(flag.0, 1) };
                }
            })
            .ok();
        if watchdog.is_none() {
            // No thread, no guard: open at once and time without the gate.
            // SAFETY: the live allocation; the stream passes the wait before it is freed.
            unsafe {
                core::ptr::write_volatile(host, 1);
                let _ = sys::cuStreamSynchronize(stream.cu_stream());
                let _ = sys::cuMemFreeHost(host.cast());
            }
            return None;
        }
        Some(Gate {
            host,
            stream: stream.cu_stream(),
            stop: Some(stop),
            watchdog,
        })
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
        // SAFETY: `host` is the live mapped allocation (the watchdog has exited); the stream is
        // synchronized (it has passed the wait) before the flag is freed.
        unsafe {
            core::ptr::write_volatile(self.host, 1);
            core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
            let _ = sys::cuStreamSynchronize(self.stream);
            let _ = sys::cuMemFreeHost(self.host.cast());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&mut [7.0]), 7.0);
        assert!(median(&mut []).is_nan());
        // NaN sorts last under total_cmp and does not poison a clean median.
        assert_eq!(median(&mut [f64::NAN, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn timing_summary() {
        let t = Timing::from_samples(&mut [0.5, 0.2, 0.9, 0.4]);
        assert_eq!(t.samples, 4);
        assert_eq!(t.min_ms, 0.2);
        assert_eq!(t.max_ms, 0.9);
        assert!((t.median_ms - 0.45).abs() < 1e-12);
        let e = Timing::from_samples(&mut []);
        assert_eq!(e.samples, 0);
        assert!(e.median_ms.is_nan() && e.min_ms.is_nan() && e.max_ms.is_nan());
    }

    #[test]
    fn rotation() {
        let l2 = 50 << 20; // H100: 50 MiB
        // Big sets: one is enough.
        assert_eq!(rotation_count(1 << 30, l2), 1);
        assert_eq!(rotation_count(200 << 20, l2), 1);
        // Exactly 4x L2 / 2 -> 2 sets; just under -> 3.
        assert_eq!(rotation_count(100 << 20, l2), 2);
        assert_eq!(rotation_count((100 << 20) - 1, l2), 3);
        // Small sets are capped.
        assert_eq!(rotation_count(1 << 20, l2), MAX_ROTATION);
        assert_eq!(rotation_count(1, l2), MAX_ROTATION);
        // Degenerate inputs.
        assert_eq!(rotation_count(0, l2), 1);
        assert_eq!(rotation_count(123, 0), 1);
        // Total covers 4x L2 whenever not capped.
        for bytes in [7 << 20, 13 << 20, 33 << 20, 64 << 20] {
            let r = rotation_count(bytes, l2);
            assert!(r == MAX_ROTATION || r * bytes >= 4 * l2);
            assert!(r == 1 || (r - 1) * bytes < 4 * l2);
        }
    }
}
