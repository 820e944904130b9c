//! What every family's configuration rules share: the GPU's facts they read, the scheduler band
//! and the split-K rule.

/// What the configuration rules know of a GPU: its SMs and the peak rate of its DRAM. Rules that
/// model a GEMM waiting on its operands' bytes (the FP8 streaming model: swapped tiles and
/// their split, and 128-row tiles at M ≤ 128) scale with the DRAM rate; the others need only
/// the SMs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hardware {
    /// Its SMs.
    pub sm_count: u32,
    /// DRAM's peak rate in bytes per µs: memory clock × 2 (double data rate) × bus width.
    pub dram_bytes_per_us: f64,
}

impl Hardware {
    /// The H100 SXM (132 SMs, HBM3 at 2619 MHz on 5120 bits: 3.35 TB/s): the GPU the rules'
    /// constants were fitted on.
    pub const H100: Hardware = Hardware {
        sm_count: 132,
        dram_bytes_per_us: 3.352e6,
    };
    /// The H200 (132 SMs, HBM3e at 3134 MHz on 6144 bits as its driver reports them: 4.81 TB/s).
    pub const H200: Hardware = Hardware {
        sm_count: 132,
        dram_bytes_per_us: 4.814e6,
    };

    /// A GPU of `sm_count` SMs whose memory runs at `clock_khz` (the driver's
    /// `MEMORY_CLOCK_RATE`) on a bus of `bus_bits`; where the driver reports no clock or width
    /// (0), the H100's rate, the rules' own.
    pub fn new(sm_count: u32, clock_khz: u32, bus_bits: u32) -> Hardware {
        let rate = clock_khz as f64 * bus_bits as f64 / 4000.0;
        Hardware {
            sm_count,
            dram_bytes_per_us: if rate > 0.0 {
                rate
            } else {
                Hardware::H100.dram_bytes_per_us
            },
        }
    }

    /// An H100-like GPU of `sm_count` SMs (the rules' tests and the other architectures).
    pub fn with_sms(sm_count: u32) -> Hardware {
        Hardware {
            sm_count,
            ..Hardware::H100
        }
    }
}

/// Split-K when the tiles fill less than half the SMs: as many K ranges as keep every CTA busy
/// without a second round, each at least `MIN_SPLIT_K_BLOCKS` K blocks long, and only when the
/// shorter K loop saves more than the split costs (`cost_blocks`).
pub(crate) fn split_k(tiles: usize, k_blocks: usize, sm_count: u32, cost_blocks: usize) -> u32 {
    // (Stated for the reader: past half the SMs `sm_count / tiles` is 1 below as well, so a
    // change to this test's arithmetic that moves only tiles above half cannot change the result.)
    if 2 * tiles > sm_count as usize {
        return 1;
    }
    let split = (sm_count as usize / tiles.max(1))
        .min(k_blocks / MIN_SPLIT_K_BLOCKS)
        .max(1);
    if k_blocks.div_ceil(split) + cost_blocks < k_blocks {
        split as u32
    } else {
        1
    }
}

/// Shortest K range of a split, in blocks of 128.
pub(crate) const MIN_SPLIT_K_BLOCKS: usize = 4;

/// Rows of A in one scheduler band: a band's A tiles (2048 × K bytes) stay small next to the
/// 50 MB L2 for K up to 16k (the band sweep: docs/perf-log, the sm90 FP8 kernel).
pub(crate) const GROUP_ROWS: u32 = 2048;
