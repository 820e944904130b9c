//! Step 5, the reading: the SASS nvdisasm prints, as each function's control-flow graph, its loops,
//! and the local-memory accesses (`STL` / `LDL`) inside its K loop.
//!
//! Loops are cycles of the graph, not the address range `[target, branch]` of a backward branch:
//! ptxas moves cold paths (a barrier wait's retry, a panic) past the end of the code and branches
//! back from there, so such a range can span most of a kernel. The cycles are found as strongly
//! connected components (Tarjan), nested by cutting the edges into each loop's entries and looking
//! again inside it (Steensgaard's loop nesting forest, which takes irreducible loops too). In a
//! persistent kernel the tile loop holds everything, the MMAs included; the K loop is the innermost
//! loop that holds an MMA.
//!
//! Every `STL` / `LDL` of a spilling kernel counts, not only those of ptxas' spills: they also
//! serve stack arrays, which cost as much as a spill in the K loop. (Only spilling kernels are read:
//! without a stack frame a kernel has no local memory.) A call from the K loop (ptxas' slow paths
//! of division) is not followed into its callee, whose accesses are not counted.

use std::collections::{BTreeMap, HashMap};

use crate::LoopSpills;

/// One instruction, as far as control flow and the count go.
#[derive(Debug)]
struct Instr {
    /// The full opcode, `BRA.U` or `STL.64`.
    opcode: String,
    /// Under a predicate other than `@PT`.
    guarded: bool,
    /// May continue at the next instruction after a branch: guarded, or a `BRA` with a condition
    /// operand (`BRA.U !UP0, …`, `BRA.DIV UR8, …`).
    conditional: bool,
    /// The labels it names: branch targets (`` `(.L_x_3) ``, BRX's `BRANCH_TARGETS`), a callee.
    targets: Vec<String>,
}

impl Instr {
    /// The opcode without its modifiers: `BRA`, `STL`.
    fn base(&self) -> &str {
        self.opcode.split('.').next().unwrap_or("")
    }
}

/// One function section (`.text.<kernel>`): the kernel and the subroutines ptxas placed after it.
#[derive(Debug)]
struct Function {
    name: String,
    instrs: Vec<Instr>,
    /// Label → the index of the instruction that follows it.
    labels: HashMap<String, usize>,
}

/// The local-memory accesses inside the K loop of every function in `sass` (`nvdisasm -c`).
pub(crate) fn k_loop_spills(sass: &str) -> BTreeMap<String, LoopSpills> {
    parse(sass)
        .iter()
        .map(|f| {
            let in_k_loop = k_loop(f);
            let mut count = LoopSpills::default();
            for (ins, _) in f.instrs.iter().zip(&in_k_loop).filter(|(_, k)| **k) {
                match ins.base() {
                    "STL" => count.stores += 1,
                    "LDL" => count.loads += 1,
                    _ => {}
                }
            }
            (f.name.clone(), count)
        })
        .collect()
}

fn parse(sass: &str) -> Vec<Function> {
    let mut funcs: Vec<Function> = Vec::new();
    let mut inside = false;
    let mut pending: Vec<String> = Vec::new();
    for line in sass.lines() {
        let t = line.trim();
        // `//------ .text.<name> ------` opens a function; any other such header closes it.
        if let Some(header) = t.strip_prefix("//-") {
            let title = header.trim_matches('-').trim();
            inside = false;
            pending.clear();
            if let Some(name) = title.strip_prefix(".text.") {
                funcs.push(Function {
                    name: name.to_string(),
                    instrs: Vec::new(),
                    labels: HashMap::new(),
                });
                inside = true;
            }
            continue;
        }
        let Some(f) = funcs.last_mut().filter(|_| inside) else {
            continue;
        };
        if let Some(label) = t.strip_suffix(':')
            && !label.is_empty()
            && !label.contains(char::is_whitespace)
        {
            pending.push(label.to_string());
        } else if let Some(ins) = parse_instr(t) {
            for label in pending.drain(..) {
                f.labels.insert(label, f.instrs.len());
            }
            f.instrs.push(ins);
        }
    }
    funcs
}

/// `/*0170*/  @!P0 BRA `(.L_x_3) ;` → the instruction; `None` for any other line.
fn parse_instr(line: &str) -> Option<Instr> {
    let rest = line.strip_prefix("/*")?;
    let (address, rest) = rest.split_once("*/")?;
    if address.is_empty() || !address.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let body = rest[..rest.rfind(';')?].trim();
    let (guarded, body) = match body.strip_prefix('@') {
        Some(p) => {
            let (pred, rest) = p.split_once(char::is_whitespace)?;
            (pred != "PT", rest.trim_start())
        }
        None => (false, body),
    };
    let (opcode, operands) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
    let operands = operands.trim();
    let mut targets = Vec::new();
    let mut s = operands;
    while let Some(i) = s.find("`(") {
        let Some((name, after)) = s[i + 2..].split_once(')') else {
            break;
        };
        targets.push(name.to_string());
        s = after;
    }
    if let Some((_, list)) = operands.split_once("BRANCH_TARGETS ") {
        let list = list.split('"').next().unwrap_or("");
        targets.extend(
            list.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string),
        );
    }
    let is_bra = opcode.split('.').next() == Some("BRA");
    Some(Instr {
        opcode: opcode.to_string(),
        guarded,
        conditional: guarded || (is_bra && !operands.starts_with('`')),
        targets,
    })
}

/// Which instructions of `f` lie in its K loop.
fn k_loop(f: &Function) -> Vec<bool> {
    let n = f.instrs.len();
    let mut succ = successors(f);
    // Only what runs: code after a call that never returns would join unrelated paths.
    let mut reachable = vec![false; n];
    let mut todo: Vec<usize> = (n > 0).then_some(0).into_iter().collect();
    while let Some(v) = todo.pop() {
        if !std::mem::replace(&mut reachable[v], true) {
            todo.extend(succ[v].iter().copied());
        }
    }
    let mut pred = vec![Vec::new(); n];
    for v in 0..n {
        if !reachable[v] {
            succ[v].clear();
        }
        for &w in &succ[v] {
            pred[w].push(v);
        }
    }
    let nodes: Vec<usize> = (0..n).filter(|&v| reachable[v]).collect();
    let mut loops = Loops {
        succ: &succ,
        pred,
        mma: f.instrs.iter().map(|i| i.base().ends_with("MMA")).collect(),
        region: (0..n)
            .map(|v| if reachable[v] { 0 } else { usize::MAX })
            .collect(),
        cut: vec![false; n],
        regions: 0,
        k_loop: vec![false; n],
    };
    loops.visit(&nodes, 0);
    loops.k_loop
}

/// The graph's edges, each instruction's successors. A call continues after itself only when its
/// callee can return (the panics cannot), which takes a fixed point: a callee returns if a `RET`
/// is reachable from it through calls that return.
fn successors(f: &Function) -> Vec<Vec<usize>> {
    let mut callees: Vec<usize> = f
        .instrs
        .iter()
        .filter(|i| i.base() == "CALL")
        .flat_map(|i| i.targets.iter().filter_map(|t| f.labels.get(t).copied()))
        .collect();
    callees.sort_unstable();
    callees.dedup();
    let mut returning = vec![false; f.instrs.len()];
    loop {
        let succ = edges(f, &returning);
        let newly: Vec<usize> = callees
            .iter()
            .copied()
            .filter(|&c| !returning[c] && reaches_ret(f, &succ, c))
            .collect();
        if newly.is_empty() {
            return succ;
        }
        for c in newly {
            returning[c] = true;
        }
    }
}

fn edges(f: &Function, returning: &[bool]) -> Vec<Vec<usize>> {
    let n = f.instrs.len();
    f.instrs
        .iter()
        .enumerate()
        .map(|(i, ins)| {
            let next = (i + 1 < n).then_some(i + 1);
            let labels = || ins.targets.iter().filter_map(|t| f.labels.get(t).copied());
            let continues = match ins.base() {
                "BRA" | "BRX" | "JMP" | "JMX" => ins.conditional,
                // A callee that is no label here (an absolute call) is taken to return.
                "CALL" => labels().all(|c| returning[c]),
                "EXIT" | "RET" | "KILL" => ins.guarded,
                _ if ins.opcode == "BPT.TRAP" => ins.guarded,
                _ => true,
            };
            let taken = matches!(ins.base(), "BRA" | "BRX" | "JMP" | "JMX" | "CALL");
            labels()
                .filter(|_| taken)
                .chain(next.filter(|_| continues))
                .collect()
        })
        .collect()
}

/// Whether a `RET` is reachable from `entry` without entering the callees of its calls.
fn reaches_ret(f: &Function, succ: &[Vec<usize>], entry: usize) -> bool {
    let mut seen = vec![false; succ.len()];
    let mut todo = vec![entry];
    while let Some(v) = todo.pop() {
        if std::mem::replace(&mut seen[v], true) {
            continue;
        }
        match f.instrs[v].base() {
            "RET" => return true,
            "CALL" => todo.extend(succ[v].iter().copied().filter(|&w| w == v + 1)),
            _ => todo.extend(succ[v].iter().copied()),
        }
    }
    false
}

/// The loop nesting forest's walk, marking the innermost loops that hold an MMA.
struct Loops<'a> {
    succ: &'a [Vec<usize>],
    pred: Vec<Vec<usize>>,
    mma: Vec<bool>,
    /// The region (the loop being looked into) each instruction belongs to now.
    region: Vec<usize>,
    /// The entries of the loops being looked into, whose incoming edges are cut.
    cut: Vec<bool>,
    regions: usize,
    k_loop: Vec<bool>,
}

impl Loops<'_> {
    /// Looks for loops among `nodes` (region `id`); returns whether one of them holds an MMA.
    fn visit(&mut self, nodes: &[usize], id: usize) -> bool {
        let comps = sccs(nodes, self.succ, |w| self.region[w] == id && !self.cut[w]);
        let mut any_mma = false;
        for comp in comps {
            let v = comp[0];
            if comp.len() == 1 && (self.cut[v] || !self.succ[v].contains(&v)) {
                continue;
            }
            self.regions += 1;
            let inner = self.regions;
            for &w in &comp {
                self.region[w] = inner;
            }
            let mut entries: Vec<usize> = comp
                .iter()
                .copied()
                .filter(|&w| w == 0 || self.pred[w].iter().any(|&p| self.region[p] != inner))
                .collect();
            if entries.is_empty() {
                entries.push(v);
            }
            for &e in &entries {
                self.cut[e] = true;
            }
            let nested = self.visit(&comp, inner);
            for &e in &entries {
                self.cut[e] = false;
            }
            if comp.iter().any(|&w| self.mma[w]) {
                any_mma = true;
                if !nested {
                    for &w in &comp {
                        self.k_loop[w] = true;
                    }
                }
            }
        }
        any_mma
    }
}

/// The strongly connected components of `nodes` over the edges into `allowed` nodes (Tarjan's
/// algorithm, with an explicit stack: a kernel has tens of thousands of instructions).
fn sccs(nodes: &[usize], succ: &[Vec<usize>], allowed: impl Fn(usize) -> bool) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = succ.len();
    let (mut index, mut low, mut on_stack) = (vec![UNSEEN; n], vec![0; n], vec![false; n]);
    let (mut next, mut stack, mut out) = (0, Vec::new(), Vec::new());
    let mut calls: Vec<(usize, usize)> = Vec::new();
    for &root in nodes {
        if index[root] != UNSEEN {
            continue;
        }
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        calls.push((root, 0));
        while let Some((v, e)) = calls.pop() {
            if let Some(&w) = succ[v].get(e) {
                calls.push((v, e + 1));
                if !allowed(w) {
                    continue;
                }
                if index[w] == UNSEEN {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    calls.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            if let Some(&(u, _)) = calls.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(comp);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A persistent kernel in nvdisasm's format: a tile loop around a K loop whose barrier wait
    /// retries out of line, past the end (its branch back to 0x50 spans the epilogue's store at
    /// 0x90); the epilogue's division check calls a panic that never returns, placed just before
    /// that retry code (falling through it would put the epilogue in the K loop). The K loop is
    /// 0x30..0x80 and 0xe0..0x100: one store and one load.
    const KERNEL: &str = r#"
	.target	sm_90a

//--------------------- .text.k --------------------------
	.section	.text.k,"ax",@progbits
        .global         k
        .type           k,@function
k:
.text.k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R2 ;
.L_x_0:
        /*0020*/                   LDL R3, [R1] ;
.L_x_1:
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R4+URZ], R5 ;
        /*0040*/              @!P0 BRA `(.L_x_5) ;
.L_x_2:
        /*0050*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24 ;
        /*0060*/                   STL [R1+0x4], R24 ;
        /*0070*/                   LDL.LU R6, [R1+0x4] ;
        /*0080*/               @P1 BRA `(.L_x_1) ;
        /*0090*/                   STL.64 [R1+0x8], R6 ;
        /*00a0*/              @!P2 BRA `(.L_x_6) ;
        /*00b0*/               @P3 BRA `(.L_x_0) ;
        /*00c0*/                   EXIT ;
.L_x_6:
        /*00d0*/                   CALL.REL.NOINC `($k$panic) ;
.L_x_5:
        /*00e0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R4+URZ], R5 ;
        /*00f0*/              @!P0 BRA `(.L_x_5) ;
        /*0100*/                   BRA `(.L_x_2) ;
        .type           $k$panic,@function
$k$panic:
        /*0110*/                   BPT.TRAP 0x1 ;
.L_x_9:
        /*0120*/                   BRA `(.L_x_9);
//--------------------- .text.q --------------------------
q:
.text.q:
        /*0000*/                   MOV R2, RZ ;
.L_x_10:
        /*0010*/                   STL [R1], R2 ;
        /*0020*/                   BRA.U !UP0, `(.L_x_10) ;
        /*0030*/                   EXIT ;
//--------------------- SYMBOLS --------------------------
	.type		k,@function
"#;

    #[test]
    fn k_loop_is_the_innermost_loop_around_the_mma() {
        let counts = k_loop_spills(KERNEL);
        assert_eq!(
            counts.get("k"),
            Some(&LoopSpills {
                stores: 1,
                loads: 1
            })
        );
        // A loop without an MMA is no K loop.
        assert_eq!(counts.get("q"), Some(&LoopSpills::default()));
        assert_eq!(counts.len(), 2);
    }

    #[test]
    fn functions_labels_and_instructions_are_parsed() {
        let funcs = parse(KERNEL);
        let k = &funcs[0];
        assert_eq!(k.name, "k");
        assert_eq!(k.instrs.len(), 19);
        assert_eq!(k.labels["k"], 0);
        assert_eq!(k.labels[".L_x_5"], 14);
        assert_eq!(k.labels["$k$panic"], 17);
        let call = &k.instrs[13];
        assert_eq!(
            (call.opcode.as_str(), call.guarded),
            ("CALL.REL.NOINC", false)
        );
        assert_eq!(call.targets, ["$k$panic"]);
        assert_eq!(funcs[1].instrs.len(), 4);
    }

    #[test]
    fn branches_know_whether_they_may_fall_through() {
        let i = |l: &str| parse_instr(l).unwrap();
        let plain = i("/*0100*/  BRA `(.L_x_2) ;");
        assert!(!plain.conditional && plain.targets == [".L_x_2"]);
        assert!(i("/*0040*/  @!P0 BRA `(.L_x_5) ;").conditional);
        assert!(i("/*0020*/  BRA.U !UP0, `(.L_x_10) ;").conditional);
        assert!(i("/*3790*/  BRA.DIV UR8, `(.L_x_21) ;").conditional);
        assert!(!i("/*0010*/  @PT BRA `(.L_x_1) ;").guarded);
        let brx = i("/*47a0*/  BRX R2 -0x47b0   (*\"BRANCH_TARGETS .L_x_1,.L_x_2,.L_x_3\"*);");
        assert_eq!(brx.targets, [".L_x_1", ".L_x_2", ".L_x_3"]);
        assert!(!brx.conditional);
        // A BSSY names its reconvergence point but branches nowhere.
        let f =
            parse("//---- .text.b ----\n/*0000*/ BSSY B0, `(.L_x_0) ;\n.L_x_0:\n/*0010*/ EXIT ;\n");
        assert_eq!(edges(&f[0], &[false, false]), [vec![1], vec![]]);
        assert!(parse_instr("/* 0x000fe20000000f00 */").is_none());
        assert!(parse_instr(".L_x_0:").is_none());
    }
}
