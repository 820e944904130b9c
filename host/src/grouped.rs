//! Grouped GEMM (mixture of experts): each group's rows of A times that group's expert B, all
//! groups in one persistent launch of an ordinary GEMM kernel, whose scheduler walks the groups'
//! tiles ([`blockscaled_kernels::gemm::scheduler::Groups`]).
//!
//! - **Contiguous** ([`GroupLayout::Contiguous`], as torch's `_grouped_mm` with `offs`): A is all
//!   groups' rows stacked, `R × K` (batch 1); B is `G × N × K` (batch G: expert g); C is `R × N`.
//!   The device holds each group's end row (int32, non-decreasing): group g is rows
//!   `end[g−1]..end[g]` (`end[−1] = 0`). Rows after the last end are not written.
//! - **Masked** ([`GroupLayout::Masked`], as DeepGEMM's masked layout in decode): A is
//!   `G × capacity × K`, C is `G × capacity × N`, and the device holds each group's row count;
//!   rows at or past the count are not written.
//!
//! The values live on the GPU ([`DeviceGroups`]) and the kernels read them there, so a call needs
//! no host synchronization and can be captured in a CUDA graph; the caller's own kernels may
//! write them ([`DeviceGroups::values_mut`]). The host checks what it can see when they come
//! from the host ([`Gpu::group_ends`](crate::Gpu::group_ends),
//! [`Gpu::group_counts`](crate::Gpu::group_counts)); values written on the device are clamped by
//! the kernels instead: an end below the previous end or a count below 0 is an empty group, an
//! end or count past the rows (capacity) stops there. No row outside A or C is read or written.

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DeviceSlice, SyncOnDrop, sys,
};

use crate::buffers::{GpuId, Mem};
use crate::error::{Result, shape};
use crate::launch::Launch;
use crate::matrix::{GemmShape, MatrixDesc};
use blockscaled_kernels::params::{GroupMode, GroupParams};

/// How a grouped GEMM's groups are laid out (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupLayout {
    /// Groups stacked in A and C; the device holds each group's end row.
    Contiguous,
    /// Group g is batch entry g of A and C (capacity rows); the device holds its row count.
    Masked,
}

impl GroupLayout {
    pub(crate) fn mode(self) -> GroupMode {
        match self {
            GroupLayout::Contiguous => GroupMode::Contiguous,
            GroupLayout::Masked => GroupMode::Masked,
        }
    }
}

/// A grouped GEMM's groups on one GPU: G ≥ 1 int32 values (ends or counts, per `layout`), in a
/// buffer this crate allocated ([`Gpu::group_ends`](crate::Gpu::group_ends),
/// [`Gpu::group_counts`](crate::Gpu::group_counts), [`Gpu::device_groups`](crate::Gpu::device_groups))
/// or in the caller's memory for `'a` ([`Gpu::groups_view`](crate::Gpu::groups_view): a router's
/// counts where its kernel wrote them; [`Gpu::groups_from_raw`](crate::Gpu::groups_from_raw): by
/// address, as a framework's tensor gives it).
pub struct DeviceGroups<'a> {
    pub(crate) gpu: GpuId,
    pub(crate) layout: GroupLayout,
    pub(crate) values: GroupValues<'a>,
    /// The largest value, while the values are the host's (checked against A's rows per call);
    /// `None` once the device may have written them.
    pub(crate) host_top: Option<usize>,
}

/// Where a grouped GEMM's values live.
pub(crate) enum GroupValues<'a> {
    Owned(CudaSlice<i32>),
    View(CudaView<'a, i32>),
    /// The caller's memory by address (a [`Mem::Raw`], whose contract it carries).
    Raw(Mem<'static>),
}

impl std::fmt::Debug for DeviceGroups<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceGroups")
            .field("layout", &self.layout)
            .field("count", &self.count())
            .field("host_top", &self.host_top)
            .finish()
    }
}

impl DeviceGroups<'_> {
    /// Ends or counts.
    pub fn layout(&self) -> GroupLayout {
        self.layout
    }
    /// The number of groups, G.
    pub fn count(&self) -> usize {
        self.values.len()
    }
    /// The values on the device (ends or counts); `None` for groups over the caller's memory by
    /// address ([`Gpu::groups_from_raw`](crate::Gpu::groups_from_raw)), which it reads itself.
    pub fn values(&self) -> Option<CudaView<'_, i32>> {
        match &self.values {
            GroupValues::Owned(s) => Some(s.slice(..)),
            GroupValues::View(v) => Some(v.slice(..)),
            GroupValues::Raw(_) => None,
        }
    }
    /// The values on the device, for the caller's kernels to write (a router's counts, say)
    /// between calls without a host round trip: a view of this crate's buffer (`None` for the
    /// caller's own memory, which it writes directly). Whatever they write is clamped by the
    /// GEMM kernels as the module doc says; nothing outside A or C is ever touched.
    pub fn values_mut(&mut self) -> Option<CudaViewMut<'_, i32>> {
        self.host_top = None;
        match &mut self.values {
            GroupValues::Owned(s) => Some(s.slice_mut(..)),
            GroupValues::View(_) | GroupValues::Raw(_) => None,
        }
    }
}

impl DevicePtr<i32> for GroupValues<'_> {
    fn device_ptr<'b>(&'b self, stream: &'b CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        match self {
            GroupValues::Owned(s) => s.device_ptr(stream),
            GroupValues::View(v) => v.device_ptr(stream),
            GroupValues::Raw(m) => m.device_ptr(stream),
        }
    }
}

impl DeviceSlice<i32> for GroupValues<'_> {
    fn len(&self) -> usize {
        match self {
            GroupValues::Owned(s) => s.len(),
            GroupValues::View(v) => v.len(),
            GroupValues::Raw(m) => m.len() / 4,
        }
    }
    fn stream(&self) -> &Arc<CudaStream> {
        match self {
            GroupValues::Owned(s) => s.stream(),
            GroupValues::View(v) => v.stream(),
            GroupValues::Raw(m) => m.stream(),
        }
    }
}

/// Checks host-side group values before upload: at least one group, ends non-decreasing and
/// within `0..=i32::MAX`, counts non-negative. (The rows they must fit are checked per call.)
pub(crate) fn check_values(layout: GroupLayout, values: &[i32]) -> Result<()> {
    if values.is_empty() {
        return Err(shape("G = 0: a grouped GEMM needs at least one group"));
    }
    if let Some((g, v)) = values.iter().enumerate().find(|(_, v)| **v < 0) {
        return Err(shape(format!("group {g}: {v} is negative")));
    }
    if layout == GroupLayout::Contiguous
        && let Some(g) = (1..values.len()).find(|&g| values[g] < values[g - 1])
    {
        return Err(shape(format!(
            "group ends must not decrease: group {g} ends at {} after {}",
            values[g],
            values[g - 1]
        )));
    }
    Ok(())
}

/// Host-side values that the rows of A must hold: the last end (contiguous) or every count
/// (masked), whose largest is `top`, at most `rows`.
pub(crate) fn check_rows(layout: GroupLayout, top: usize, rows: usize) -> Result<()> {
    if top > rows {
        return Err(shape(match layout {
            GroupLayout::Contiguous => {
                format!("the groups end at row {top} but A has {rows} rows")
            }
            GroupLayout::Masked => format!("a group counts {top} rows but the capacity is {rows}"),
        }));
    }
    Ok(())
}

/// The shape of a grouped GEMM (C's rows, N, K, C's batch) of A, B (G experts) and `groups`
/// ([`Error::Shape`](crate::Error::Shape) when they do not fit together).
pub(crate) fn grouped_shape(
    a: &MatrixDesc,
    b: &MatrixDesc,
    groups: GroupsDesc,
) -> Result<GemmShape> {
    let (layout, count) = (groups.layout, groups.count);
    if a.k != b.k {
        return Err(shape(format!(
            "A is {}×{} but B is {}×{}: K differs",
            a.rows, a.k, b.rows, b.k
        )));
    }
    if b.batch != count {
        return Err(shape(format!(
            "B has {} experts (batch entries) but there are {count} groups",
            b.batch
        )));
    }
    let a_batch = match layout {
        GroupLayout::Contiguous => 1,
        GroupLayout::Masked => count,
    };
    if a.batch != a_batch {
        return Err(shape(format!(
            "{layout:?} groups need A with batch {a_batch} (G = {count}), not {}",
            a.batch
        )));
    }
    // The rows are int32 on the device and TMA coordinates.
    if a.rows > i32::MAX as usize || b.rows > i32::MAX as usize {
        return Err(shape("A's rows and N must fit int32"));
    }
    if let Some(top) = groups.host_top {
        check_rows(groups.layout, top, a.rows)?;
    }
    Ok(GemmShape {
        m: a.rows,
        n: b.rows,
        k: a.k,
        l: a_batch,
    })
}

/// What the host knows of a [`DeviceGroups`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupsDesc {
    pub layout: GroupLayout,
    pub count: usize,
    pub host_top: Option<usize>,
}

impl DeviceGroups<'_> {
    pub(crate) fn desc(&self) -> GroupsDesc {
        GroupsDesc {
            layout: self.layout,
            count: self.count(),
            host_top: self.host_top,
        }
    }
}

impl DeviceGroups<'_> {
    /// The kernel parameters of `groups` (all zero for a dense GEMM), the values' buffer held by
    /// `launch`.
    pub(crate) fn params<'a>(groups: Option<&'a Self>, launch: &mut Launch<'a>) -> GroupParams {
        match groups {
            None => GroupParams::default(),
            Some(g) => GroupParams {
                ptr: launch.ptr(&g.values),
                ..g.unplaced()
            },
        }
    }

    /// The groups' parameters without the values' address, or a dense GEMM's (`None`): what
    /// the families' schedule functions read on the host (grid and workspace sizing). (Read as
    /// a dense GEMM's instead, a grouped call would size its grid from every row of A or every
    /// capacity row, no fewer units than its groups have, and still run the groups' units: the
    /// results would not change, which is why the GPU tests cannot tell.)
    pub(crate) fn unplaced_or_dense(groups: Option<&Self>) -> GroupParams {
        groups.map_or_else(GroupParams::default, Self::unplaced)
    }

    /// The parameters without the values' address.
    pub(crate) fn unplaced(&self) -> GroupParams {
        GroupParams {
            ptr: 0,
            count: self.count() as u32,
            mode: self.layout.mode() as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::format::Recipe;

    #[test]
    fn host_values_that_cannot_be_groups_are_shape_errors() {
        use GroupLayout::*;
        for (layout, v) in [
            (Contiguous, &[][..]),
            (Masked, &[][..]),
            (Contiguous, &[5, 4][..]),
            (Contiguous, &[-1, 4][..]),
            (Masked, &[3, -2][..]),
        ] {
            assert!(
                matches!(check_values(layout, v), Err(Error::Shape(_))),
                "{layout:?} {v:?}"
            );
        }
        assert!(check_values(Contiguous, &[0, 0, 7, 7]).is_ok());
        assert!(check_values(Masked, &[9, 0, 3]).is_ok());
        assert!(check_rows(Contiguous, 7, 7).is_ok());
        assert!(matches!(check_rows(Contiguous, 8, 7), Err(Error::Shape(_))));
        assert!(matches!(check_rows(Masked, 9, 8), Err(Error::Shape(_))));
    }

    #[test]
    fn operands_that_do_not_match_the_groups_are_shape_errors() {
        let desc = |rows, k, batch| MatrixDesc {
            batch,
            ..MatrixDesc::of_recipe(Recipe::DeepSeekFp8, rows, k, false)
        };
        let (a, b) = (desc(300, 256, 1), desc(512, 256, 4));
        let gd = |layout, count, host_top| GroupsDesc {
            layout,
            count,
            host_top,
        };
        let s = grouped_shape(&a, &b, gd(GroupLayout::Contiguous, 4, Some(300))).unwrap();
        assert_eq!((s.m, s.n, s.k, s.l), (300, 512, 256, 1));
        let am = desc(64, 256, 4);
        let s = grouped_shape(&am, &b, gd(GroupLayout::Masked, 4, None)).unwrap();
        assert_eq!((s.m, s.l), (64, 4));
        for (a, b, groups) in [
            (a, b, gd(GroupLayout::Contiguous, 3, None)),
            (am, b, gd(GroupLayout::Contiguous, 4, None)),
            (a, b, gd(GroupLayout::Masked, 4, None)),
            (a, desc(512, 384, 4), gd(GroupLayout::Contiguous, 4, None)),
            // Host ends past A's rows, host counts past the capacity.
            (a, b, gd(GroupLayout::Contiguous, 4, Some(301))),
            (am, b, gd(GroupLayout::Masked, 4, Some(65))),
        ] {
            assert!(
                matches!(grouped_shape(&a, &b, groups), Err(Error::Shape(_))),
                "{groups:?}"
            );
        }
        // The kernels' group mode of each layout.
        assert!(matches!(GroupLayout::Masked.mode(), GroupMode::Masked));
        assert!(matches!(
            GroupLayout::Contiguous.mode(),
            GroupMode::Contiguous
        ));
        // A's rows and N are int32 on the device: 2³¹ − 1 of either fits, 2³¹ does not.
        let top = i32::MAX as usize;
        let contiguous = gd(GroupLayout::Contiguous, 4, None);
        for (ra, rb, fits) in [
            (top, 512, true),
            (top + 1, 512, false),
            (300, top, true),
            (300, top + 1, false),
        ] {
            let r = grouped_shape(&desc(ra, 256, 1), &desc(rb, 256, 4), contiguous);
            assert_eq!(r.is_ok(), fits, "{ra} × {rb}: {r:?}");
        }
    }
}
