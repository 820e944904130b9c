//! Step 5 of the build: the spilling kernels' SASS read back from the cubin by nvdisasm, for `sass`
//! to find the local-memory accesses inside their K loops.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::ptxas::{on_path, pinned_tools};
use crate::{LoopSpills, PINNED_NVDISASM_VERSION, sass};

/// `NVDISASM`, then the pinned install of `scripts/setup.sh`
/// (`cuda-nvdisasm-<PINNED_NVDISASM_VERSION>/` beside the pinned ptxas), then the one in the
/// folder of `ptxas` (a CUDA toolkit's `bin/`), then the `PATH`.
pub(crate) fn find_nvdisasm(ptxas: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVDISASM") {
        let p = PathBuf::from(p);
        if p.exists() {
            return Some(p);
        }
    }
    let pinned = pinned_tools().map(|t| {
        t.join(format!("cuda-nvdisasm-{PINNED_NVDISASM_VERSION}"))
            .join("nvidia/cu13/bin/nvdisasm")
    });
    let beside = ptxas.parent().map(|d| d.join("nvdisasm"));
    [pinned, beside]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .or_else(|| on_path("nvdisasm"))
}

/// The local-memory accesses inside the K loops of `kernels` in `cubin`, or why they could not be
/// read. Only those kernels are disassembled (`-fun`): the whole sm_90a cubin takes three times as
/// long.
pub(crate) fn k_loop_spills(
    nvdisasm: &Path,
    cubin: &Path,
    kernels: &[&str],
) -> Result<BTreeMap<String, LoopSpills>, String> {
    let elf = std::fs::read(cubin).map_err(|e| format!("{}: {e}", cubin.display()))?;
    let symbols = function_symbols(&elf)
        .ok_or_else(|| format!("{}: no ELF64 symbol table", cubin.display()))?;
    let mut indices = Vec::new();
    for k in kernels {
        let i = symbols
            .get(*k)
            .ok_or_else(|| format!("{}: no function symbol {k}", cubin.display()))?;
        indices.push(i.to_string());
    }
    let out = Command::new(nvdisasm)
        .arg("-c")
        .arg("-fun")
        .arg(indices.join(","))
        .arg(cubin)
        .output()
        .map_err(|e| format!("running {}: {e}", nvdisasm.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{} failed: {}",
            nvdisasm.display(),
            err.lines().next().unwrap_or("")
        ));
    }
    let found = sass::k_loop_spills(&String::from_utf8_lossy(&out.stdout));
    match kernels.iter().find(|k| !found.contains_key(**k)) {
        Some(k) => Err(format!("{} printed no SASS for {k}", nvdisasm.display())),
        None => Ok(found),
    }
}

/// The index of each function symbol in the symbol table of an ELF64 little-endian file (a cubin),
/// by name: `nvdisasm -fun` selects functions by these indices.
fn function_symbols(elf: &[u8]) -> Option<HashMap<String, usize>> {
    const SHT_SYMTAB: u32 = 2;
    const STT_FUNC: u8 = 2;
    let at = |o: usize, len: usize| elf.get(o..o.checked_add(len)?);
    let u16_at = |o| Some(u16::from_le_bytes(at(o, 2)?.try_into().ok()?) as usize);
    let u32_at = |o| Some(u32::from_le_bytes(at(o, 4)?.try_into().ok()?));
    let u64_at = |o| usize::try_from(u64::from_le_bytes(at(o, 8)?.try_into().ok()?)).ok();
    // Magic, 64-bit class, little-endian.
    if at(0, 6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let (shoff, shentsize, shnum) = (u64_at(0x28)?, u16_at(0x3a)?, u16_at(0x3c)?);
    let section = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    let symtab = (0..shnum)
        .filter_map(section)
        .find(|&s| u32_at(s + 4) == Some(SHT_SYMTAB))?;
    let (offset, size, entsize) = (
        u64_at(symtab + 24)?,
        u64_at(symtab + 32)?,
        u64_at(symtab + 56)?,
    );
    let strtab = section(u32_at(symtab + 40)? as usize)?;
    let strings = at(u64_at(strtab + 24)?, u64_at(strtab + 32)?)?;
    if entsize < 24 {
        return None;
    }
    let mut out = HashMap::new();
    for i in 0..size / entsize {
        let s = offset + i * entsize;
        if at(s + 4, 1)?[0] & 0xf != STT_FUNC {
            continue;
        }
        let name = strings.get(u32_at(s)? as usize..)?;
        let name = &name[..name.iter().position(|&b| b == 0)?];
        out.insert(String::from_utf8_lossy(name).into_owned(), i);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF64 file with a null section, a symbol table of a null symbol, an object `d` and a
    /// function `k`, and its string table.
    fn tiny_elf() -> Vec<u8> {
        let strings = b"\0d\0k\0";
        let mut symbols = vec![0u8; 24];
        for (name, kind) in [(1u32, 1u8), (3, 2)] {
            let mut s = vec![0u8; 24];
            s[..4].copy_from_slice(&name.to_le_bytes());
            s[4] = 0x10 | kind;
            symbols.extend(s);
        }
        let (sym_at, str_at) = (64, 64 + symbols.len());
        let shoff = str_at + strings.len();
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf.extend(&symbols);
        elf.extend(strings);
        elf.extend([0u8; 64]);
        for (kind, at, len, link, entsize) in [
            (2u32, sym_at, symbols.len(), 2u32, 24u64),
            (3, str_at, strings.len(), 0, 0),
        ] {
            let mut h = vec![0u8; 64];
            h[4..8].copy_from_slice(&kind.to_le_bytes());
            h[24..32].copy_from_slice(&(at as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(len as u64).to_le_bytes());
            h[40..44].copy_from_slice(&link.to_le_bytes());
            h[56..64].copy_from_slice(&entsize.to_le_bytes());
            elf.extend(h);
        }
        elf
    }

    #[test]
    fn function_symbols_are_indexed_by_name() {
        let symbols = function_symbols(&tiny_elf()).unwrap();
        assert_eq!(symbols.get("k"), Some(&2));
        assert_eq!(symbols.len(), 1, "{symbols:?}");
        assert!(function_symbols(b"\x7fELF\x01\x01").is_none());
        assert!(function_symbols(&tiny_elf()[..100]).is_none());
    }
}
