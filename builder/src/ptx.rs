//! Step 3 of the build: the edits LLVM cannot express from Rust, made in the PTX text.

use std::collections::BTreeMap;

use crate::{Arch, BuildError};

/// Launch bounds of one kernel, written into the PTX as `.maxntid` / `.minnctapersm`.
#[derive(Clone, Debug)]
pub(crate) struct Bounds {
    pub(crate) max_threads: u32,
    pub(crate) min_blocks: u32,
    /// Targets whose module holds the kernel (empty: all).
    pub(crate) archs: Vec<Arch>,
}

/// Step 3: the shared-memory declaration and the launch bounds.
pub(crate) fn edit_ptx(
    ptx: &str,
    shared: Option<&(String, u32)>,
    bounds: &BTreeMap<String, Bounds>,
) -> Result<String, BuildError> {
    let mut out = String::with_capacity(ptx.len() + 256);
    let mut pending_entry: Option<String> = None;
    let mut seen_address_size = false;
    let mut seen_bounds = 0usize;
    for line in ptx.lines() {
        let t = line.trim_start();
        // The performance directives go between the parameter list and the body's `{`.
        if t == "{"
            && let Some(name) = pending_entry.take()
            && let Some(b) = bounds.get(&name)
        {
            out.push_str(&format!(".maxntid {}, 1, 1\n", b.max_threads));
            out.push_str(&format!(".minnctapersm {}\n", b.min_blocks));
            seen_bounds += 1;
        }
        if let Some(rest) = t
            .strip_prefix(".visible .entry ")
            .or_else(|| t.strip_prefix(".entry "))
        {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            pending_entry = Some(name);
        }
        out.push_str(line);
        out.push('\n');
        if t.starts_with(".address_size") {
            seen_address_size = true;
            if let Some((sym, align)) = shared {
                out.push_str(&format!("\n// dynamic shared memory (blockscaled-builder)\n.extern .shared .align {align} .b8 {sym}[];\n"));
            }
        }
    }
    if shared.is_some() && !seen_address_size {
        return Err(BuildError::PtxEdit(
            "no .address_size line to place .extern .shared after".into(),
        ));
    }
    if seen_bounds != bounds.len() {
        let present: Vec<&String> = bounds
            .keys()
            .filter(|k| ptx.contains(&format!(".entry {k}(")))
            .collect();
        return Err(BuildError::PtxEdit(format!(
            "launch bounds were given for {:?} but only {:?} are entries of this PTX",
            bounds.keys().collect::<Vec<_>>(),
            present
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "//\n.version 8.0\n.target sm_90a\n.address_size 64\n\n\
        .visible .entry k1(\n\t.param .u64 k1_param_0\n)\n{\n\tret;\n}\n\
        .visible .entry k2(\n)\n{\n\tret;\n}\n";

    #[test]
    fn shared_declaration_follows_address_size() {
        let out = edit_ptx(PTX, Some(&("SMEM".into(), 1024)), &BTreeMap::new()).unwrap();
        let a = out.find(".address_size 64").unwrap();
        let s = out.find(".extern .shared .align 1024 .b8 SMEM[];").unwrap();
        assert!(s > a && s < out.find(".entry k1").unwrap());
    }

    #[test]
    fn launch_bounds_go_between_params_and_body_of_named_kernel_only() {
        let mut b = BTreeMap::new();
        b.insert(
            "k2".to_string(),
            Bounds {
                max_threads: 384,
                min_blocks: 1,
                archs: vec![],
            },
        );
        let out = edit_ptx(PTX, None, &b).unwrap();
        let k2 = out.find(".entry k2(").unwrap();
        let m = out.find(".maxntid 384, 1, 1\n.minnctapersm 1\n{").unwrap();
        assert!(m > k2);
        assert_eq!(out.matches(".maxntid").count(), 1);
    }

    #[test]
    fn bounds_for_a_missing_kernel_are_an_error() {
        let mut b = BTreeMap::new();
        b.insert(
            "nope".to_string(),
            Bounds {
                max_threads: 128,
                min_blocks: 1,
                archs: vec![],
            },
        );
        assert!(matches!(
            edit_ptx(PTX, None, &b),
            Err(BuildError::PtxEdit(_))
        ));
    }
}
