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

/// The symbol that stands, in the kernels' asm, for the entry point's parameter
/// (`blockscaled_kernels::ptx::tma::map_address`: TMA reads the launch's tensor maps there).
const PARAMS_SYMBOL: &str = "blockscaled_entry_params";

/// Step 3: the entry points' parameters where their code names them, the shared-memory
/// declaration and the launch bounds.
pub(crate) fn edit_ptx(
    ptx: &str,
    shared: Option<&(String, u32)>,
    bounds: &BTreeMap<String, Bounds>,
) -> Result<String, BuildError> {
    let placed = place_entry_params(ptx)?;
    let ptx = placed.as_str();
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

/// In each entry point whose code names [`PARAMS_SYMBOL`], the symbol becomes the entry
/// point's first parameter (`NAME_param_0`), declared 64-byte aligned: TMA reads tensor maps
/// in the parameter space only at that alignment, and rustc declares a by-value parameter at
/// most 16-byte aligned. The symbol anywhere else (a function that is not an entry point, whose
/// code cannot name the kernel's parameter) or an entry point whose first parameter is not a
/// byte array is an error.
fn place_entry_params(ptx: &str) -> Result<String, BuildError> {
    if !ptx.contains(PARAMS_SYMBOL) {
        return Ok(ptx.to_string());
    }
    // The text in units: what precedes the first function, then each function (entry or not)
    // up to the next.
    let mut units: Vec<(Option<String>, String)> = vec![(None, String::new())];
    for line in ptx.lines() {
        let t = line.trim_start();
        let entry = t
            .strip_prefix(".visible .entry ")
            .or_else(|| t.strip_prefix(".entry "));
        let func = [
            ".func ",
            ".visible .func ",
            ".weak .func ",
            ".extern .func ",
        ]
        .iter()
        .any(|p| t.starts_with(p));
        if let Some(rest) = entry {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            units.push((Some(name), String::new()));
        } else if func {
            units.push((None, String::new()));
        }
        let unit = &mut units.last_mut().expect("one unit at least").1;
        unit.push_str(line);
        unit.push('\n');
    }
    let mut out = String::with_capacity(ptx.len() + 1024);
    for (name, text) in units {
        if !text.contains(PARAMS_SYMBOL) {
            out.push_str(&text);
            continue;
        }
        let Some(name) = name else {
            return Err(BuildError::PtxEdit(format!(
                "{PARAMS_SYMBOL} is named outside an entry point (in code the kernels did not \
                 inline into one): {}",
                text.lines().next().unwrap_or("")
            )));
        };
        let param = format!("{name}_param_0");
        let mut declared = false;
        let mut edited = String::with_capacity(text.len());
        for line in text.lines() {
            let t = line.trim_start();
            if !declared && t.starts_with(".param .align ") && t.contains(&format!(" .b8 {param}["))
            {
                let rest = &t[t.find(" .b8 ").expect("checked above")..];
                edited.push_str(&format!("\t.param .align 64{rest}\n"));
                declared = true;
                continue;
            }
            edited.push_str(&line.replace(PARAMS_SYMBOL, &param));
            edited.push('\n');
        }
        if !declared {
            return Err(BuildError::PtxEdit(format!(
                "entry point {name} names {PARAMS_SYMBOL} but its first parameter is not a byte \
                 array (a kernel of `Mapped` parameters)"
            )));
        }
        out.push_str(&edited);
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
    fn entry_params_are_named_and_aligned_where_the_code_names_them() {
        let ptx = ".version 8.0\n.target sm_90a\n.address_size 64\n\n\
            .visible .entry k1(\n\t.param .align 8 .b8 k1_param_0[560]\n)\n{\n\t\
            mov.b64 %rd1, blockscaled_entry_params;\n\tcvta.param.u64 %rd1, %rd1;\n\tret;\n}\n\
            .visible .entry k2(\n\t.param .align 8 .b8 k2_param_0[16]\n)\n{\n\tret;\n}\n";
        let out = edit_ptx(ptx, None, &BTreeMap::new()).unwrap();
        assert!(out.contains(".param .align 64 .b8 k1_param_0[560]"));
        assert!(out.contains("mov.b64 %rd1, k1_param_0;"));
        assert!(!out.contains("blockscaled_entry_params"));
        // An entry that does not name it keeps its declaration.
        assert!(out.contains(".param .align 8 .b8 k2_param_0[16]"));
    }

    #[test]
    fn entry_params_named_outside_an_entry_or_without_a_byte_array_are_errors() {
        let in_func = ".version 8.0\n.address_size 64\n.func f()\n{\n\t\
            mov.b64 %rd1, blockscaled_entry_params;\n\tret;\n}\n";
        assert!(matches!(
            edit_ptx(in_func, None, &BTreeMap::new()),
            Err(BuildError::PtxEdit(_))
        ));
        let scalar = ".version 8.0\n.address_size 64\n.visible .entry k(\n\t\
            .param .u64 k_param_0\n)\n{\n\tmov.b64 %rd1, blockscaled_entry_params;\n\tret;\n}\n";
        assert!(matches!(
            edit_ptx(scalar, None, &BTreeMap::new()),
            Err(BuildError::PtxEdit(_))
        ));
    }

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
