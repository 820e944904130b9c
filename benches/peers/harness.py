"""The peers' timing harness: the method blockscaled's own harness (benches/src/timing.rs) times
its kernels with, for Python callers (DeepGEMM, torch, blockscaled's Python package), so that
every side of a comparison is timed alike:

- CUDA events around each launch, warm-up launches first, the median of the timed ones;
- the timed launches enqueued behind a closed stream (a spin kernel long enough to cover the
  host's enqueueing, checked after the fact), so a launch path slower than the kernel is not
  timed as GPU time; the host's time per call in the warm-up is reported beside it;
- operand sets rotated so that together they cover at least 4 × L2 (at most 16 sets).
"""
import statistics
import time

# Rotation: enough sets to cover 4 × L2 (the harness's rule), at most 16; L2 is the device's
# (60 MiB on H200), never taken below the 50 MiB the harness assumes.
L2_FLOOR = 50 << 20
MAX_ROTATION = 16
# Longest run enqueued behind the gate (the harness's MAX_GATED): far below the driver's queue of
# pending launches, which would block the host while the stream is held.
MAX_GATED = 128


class Timer:
    """torch and the device's L2, set up once per process; `warmup` and `iters` per timing."""

    def __init__(self, warmup=10, iters=50):
        import torch

        self.torch = torch
        self.warmup, self.iters = warmup, iters
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        props = torch.cuda.get_device_properties(0)
        self.gpu = props.name
        self.l2 = max(int(getattr(props, "L2_cache_size", 0) or 0), L2_FLOOR)
        self._rate = None

    def sleep_rate(self):
        """Cycles of torch.cuda._sleep per millisecond on this GPU (measured once)."""
        if self._rate is None:
            t = self.torch
            s, e = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            t.cuda._sleep(1000)
            s.record()
            t.cuda._sleep(5_000_000)
            e.record()
            e.synchronize()
            self._rate = 5_000_000 / max(s.elapsed_time(e), 1e-3)
        return self._rate

    def time_launches(self, launch, sets):
        """Median device time (µs) of `launch(i % sets)`: warm-up, then the timed launches, each
        between its own pair of events, enqueued behind the gate. The gate is a spin kernel sized
        from the host's time per launch in the warm-up; if it opened before the host had enqueued
        the last launch (the event after it had completed by then), the run is repeated with a
        longer one, twice at most, and the outcome is reported."""
        t = self.torch
        warmup, iters = self.warmup, max(self.iters, 1)
        t.cuda.synchronize()
        for i in range(warmup):
            launch(i % sets)
        t.cuda.synchronize()
        # The host's time per launch, over `iters` launches enqueued without waiting after the
        # warm-up (first-use costs excluded; far fewer than a stream's queue holds).
        t0 = time.perf_counter()
        for i in range(iters):
            launch(i % sets)
        host_ms = (time.perf_counter() - t0) * 1e3 / iters
        t.cuda.synchronize()
        pairs = [(t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)) for _ in range(iters)]
        gated = iters <= MAX_GATED
        held = False
        for attempt in range(3):
            if gated:
                gate_ms = (2.0 * iters * (host_ms + 0.02) + 1.0) * 4**attempt
                t.cuda._sleep(int(gate_ms * self.sleep_rate()))
                opened = t.cuda.Event()
                opened.record()
            for j, (s, e) in enumerate(pairs):
                s.record()
                launch((warmup + j) % sets)
                e.record()
            held = gated and not opened.query()
            t.cuda.synchronize()
            if not gated or held:
                break
        us = sorted(s.elapsed_time(e) * 1e3 for s, e in pairs)
        return {
            "us": statistics.median(us),
            "us_min": us[0],
            "us_max": us[-1],
            "samples": len(us),
            "gate": "held" if held else ("opened early" if gated else "none (over %d launches)" % MAX_GATED),
            "host_us_per_call": host_ms * 1e3,
        }

    def rotation(self, bytes_per_set):
        if bytes_per_set <= 0:
            return 1
        return max(1, min(MAX_ROTATION, -(-4 * self.l2 // bytes_per_set)))
