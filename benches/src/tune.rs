//! Ahead-of-time tuning (`blockscaled-tune`): for each GEMM of a model's layers at each M, every
//! candidate plan (`plan::candidates`) timed on this GPU with the bench harness's method
//! (warm-up, operand sets rotated past L2, CUDA events, medians), its result checked against
//! the heuristic plan's, and the fastest stored in the tuner's cache (`plan::cache`), which
//! `Gpu::plan` consults before the heuristic in every later process.

use std::path::Path;

use blockscaled::plan::cache::{Entry, PlanCache, key};
use blockscaled::{Call, DeviceMatrix, GemmShape, Gpu, OutType, Plan, Recipe};
use blockscaled_tests::random_matrix;

use crate::cases::L2_BYTES;
use crate::timing::{rotation_count, time_on_stream};

/// A model's dense GEMMs: (layer, N, K), B being the layer's weight (N × K).
pub type Layers = &'static [(&'static str, usize, usize)];

/// The presets: each model's projections.
pub const PRESETS: [(&str, Layers); 4] = [
    (
        // DeepGEMM's benchmark shapes of DeepSeek-V3's dense layers.
        "deepseek-v3",
        &[
            ("q_a+kv_a", 2112, 7168),
            ("kv_a", 576, 7168),
            ("q_b", 24576, 1536),
            ("kv_b", 32768, 512),
            ("o", 7168, 16384),
            ("gate_up", 4096, 7168),
            ("down", 7168, 2048),
        ],
    ),
    (
        "llama3-70b",
        &[
            ("qkv", 10240, 8192),
            ("o", 8192, 8192),
            ("gate_up", 57344, 8192),
            ("down", 8192, 28672),
        ],
    ),
    (
        // An expert's projections as dense GEMMs (w1 and w3 together, then w2).
        "mixtral-8x7b",
        &[
            ("qkv", 6144, 4096),
            ("o", 4096, 4096),
            ("expert w1+w3", 28672, 4096),
            ("expert w2", 4096, 14336),
        ],
    ),
    (
        "qwen2.5-72b",
        &[
            ("qkv", 10240, 8192),
            ("o", 8192, 8192),
            ("gate_up", 59136, 8192),
            ("down", 8192, 29568),
        ],
    ),
];

/// The rows tuned by default: decode, small and large prefill.
pub const DEFAULT_MS: [usize; 6] = [16, 64, 128, 512, 2048, 4096];

/// One GEMM to tune.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub model: String,
    pub layer: String,
    pub recipe: Recipe,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl std::fmt::Display for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Job {
            model,
            layer,
            recipe,
            m,
            n,
            k,
        } = self;
        write!(f, "{model} {layer} {recipe} {m}x{n}x{k}")
    }
}

/// The jobs of `presets` (names; "all" for every preset) at each of `ms`, for each recipe,
/// plus the shapes of `extra` ((label, M, N, K)); [`Err`] names an unknown preset.
pub fn jobs(
    presets: &[String],
    ms: &[usize],
    recipes: &[Recipe],
    extra: &[(String, usize, usize, usize)],
) -> Result<Vec<Job>, String> {
    let mut out = Vec::new();
    for name in presets {
        let chosen: Vec<_> = PRESETS
            .iter()
            .filter(|(p, _)| name == "all" || p == name)
            .collect();
        if chosen.is_empty() {
            let known: Vec<_> = PRESETS.iter().map(|p| p.0).collect();
            return Err(format!(
                "preset {name:?}: one of {} or all",
                known.join(", ")
            ));
        }
        for (model, layers) in chosen {
            for &(layer, n, k) in layers.iter() {
                for &m in ms {
                    for &recipe in recipes {
                        out.push(Job {
                            model: model.to_string(),
                            layer: layer.to_string(),
                            recipe,
                            m,
                            n,
                            k,
                        });
                    }
                }
            }
        }
    }
    for (label, m, n, k) in extra {
        for &recipe in recipes {
            out.push(Job {
                model: "shapes".into(),
                layer: label.clone(),
                recipe,
                m: *m,
                n: *n,
                k: *k,
            });
        }
    }
    Ok(out)
}

/// Shapes from a file: one `M N K` (or `label M N K`) a line, `#` comments.
pub fn read_shapes(path: &Path) -> Result<Vec<(String, usize, usize, usize)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let (label, nums) = match words.len() {
            3 => (format!("line {}", i + 1), &words[..]),
            4 => (words[0].to_string(), &words[1..]),
            _ => {
                return Err(format!(
                    "{}:{}: `M N K` or `label M N K`",
                    path.display(),
                    i + 1
                ));
            }
        };
        let v: Vec<usize> = nums
            .iter()
            .map(|w| {
                w.parse::<usize>()
                    .map_err(|e| format!("{}:{}: {w}: {e}", path.display(), i + 1))
            })
            .collect::<Result<_, _>>()?;
        out.push((label, v[0], v[1], v[2]));
    }
    Ok(out)
}

/// What tuning one job found.
#[derive(Clone, Debug)]
pub struct Tuned {
    pub job: Job,
    /// Candidates timed, and those refused at launch or giving another result than the
    /// heuristic's.
    pub timed: usize,
    pub refused: usize,
    pub heuristic: (Plan, f64),
    pub best: (Plan, f64),
    /// The tuner's cache key of the job's call on this GPU (the operands' formats and layouts
    /// as the recipe gives them, the shape).
    pub key: String,
}

/// Tunes `job` on `g`: every candidate timed (`iters` medians after a warm-up, operand sets
/// rotated past L2; a candidate refused at launch is skipped), then the fastest checked against
/// the heuristic's output (relative Frobenius error at most 1e-2, no NaN; one that differs is
/// dropped and the next fastest checked).
pub fn tune(g: &Gpu, job: &Job, iters: usize, seed: u64) -> Result<Tuned, String> {
    let e = |x: blockscaled::Error| x.to_string();
    let (m, n, k) = (job.m, job.n, job.k);
    let (_, a0) = random_matrix(seed, m, k, 1, job.recipe.a());
    let (_, b0) = random_matrix(seed + 1, n, k, 1, job.recipe.b());
    let plans =
        blockscaled::plan::candidates(g.arch(), g.sm_count(), a0.desc(), b0.desc()).map_err(e)?;
    let bytes = a0.data().len() + a0.scales().len() + b0.data().len() + b0.scales().len();
    let sets = rotation_count(bytes + 2 * m * n, L2_BYTES);
    // (Copies of one pair: the rotation is for L2, not for the values.)
    let mats: Vec<(DeviceMatrix<'static>, DeviceMatrix<'static>)> = (0..sets)
        .map(|_| {
            let (a, b) = (g.upload(&a0).map_err(e)?, g.upload(&b0).map_err(e)?);
            g.prepare_weights(&b).map_err(e)?;
            Ok((a, b))
        })
        .collect::<Result<_, String>>()?;
    let mut outs: Vec<_> = (0..sets)
        .map(|_| g.output(m, n, 1, OutType::Bf16).map_err(e))
        .collect::<Result<_, _>>()?;
    let mut results: Vec<(Plan, f64)> = Vec::new();
    let mut refused = 0;
    for &p in &plans {
        let t = time_on_stream(g.stream(), 3, iters, |i| {
            let (a, b) = &mats[i % sets];
            g.run(&Call::new(a, b).with_plan(p), &mut outs[i % sets])
        });
        match t {
            Ok(t) => results.push((p, t.median_ms * 1e3)),
            Err(_) => refused += 1,
        }
    }
    let heuristic = *results
        .iter()
        .find(|(p, _)| *p == plans[0])
        .ok_or("the heuristic's plan did not run")?;
    let result = |p: Plan| -> Result<Vec<f32>, blockscaled::Error> {
        let mut c = g.output(m, n, 1, OutType::F32)?;
        c.poison()?;
        g.run(&Call::new(&mats[0].0, &mats[0].1).with_plan(p), &mut c)?;
        Ok(c.to_host()?.values)
    };
    let want = result(heuristic.0).map_err(e)?;
    let norm: f64 = want.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    results.sort_by(|x, y| x.1.total_cmp(&y.1));
    let mut best = heuristic;
    for &(p, us) in &results {
        if p == heuristic.0 || us >= heuristic.1 {
            break;
        }
        let agrees = result(p).is_ok_and(|got| {
            let err = got
                .iter()
                .zip(&want)
                .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
                .sum::<f64>()
                .sqrt();
            got.iter().all(|x| x.is_finite()) && err <= 1e-2 * norm
        });
        if agrees {
            best = (p, us);
            break;
        }
        refused += 1;
    }
    let shape = GemmShape::of(a0.desc(), b0.desc()).map_err(e)?;
    Ok(Tuned {
        job: job.clone(),
        timed: results.len(),
        refused,
        heuristic,
        best,
        key: key(&g.machine(), (a0.desc(), b0.desc()), &shape, None),
    })
}

/// Stores `t`'s fastest plan in `cache`.
pub fn remember(cache: &mut PlanCache, t: &Tuned) {
    let entry = Entry {
        plan: t.best.0,
        us: t.best.1,
    };
    cache.insert(t.key.clone(), entry);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_expand_to_every_layer_m_and_recipe_and_unknown_ones_are_errors() {
        let recipes = [Recipe::DeepSeekFp8, Recipe::Mxfp4];
        let j = jobs(&["deepseek-v3".into()], &[16, 4096], &recipes, &[]).unwrap();
        assert_eq!(j.len(), 7 * 2 * 2);
        assert!(j.iter().all(|x| x.model == "deepseek-v3"));
        let all = jobs(&["all".into()], &[16], &recipes[..1], &[]).unwrap();
        assert_eq!(all.len(), 7 + 4 + 4 + 4);
        assert!(jobs(&["gpt-5".into()], &[16], &recipes, &[]).is_err());
        let extra = [("x".to_string(), 8, 256, 512)];
        let j = jobs(&[], &[16], &recipes[..1], &extra).unwrap();
        assert_eq!((j[0].m, j[0].n, j[0].k), (8, 256, 512));
    }

    #[test]
    fn shape_files_take_three_or_four_words_and_comments() {
        let dir = std::env::temp_dir().join(format!("bs-tune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("shapes.txt");
        std::fs::write(
            &p,
            "# a model\n16 7168 2048\nqkv 128 10240 8192 # trailing\n\n",
        )
        .unwrap();
        let s = read_shapes(&p).unwrap();
        assert_eq!(
            s,
            vec![
                ("line 2".into(), 16, 7168, 2048),
                ("qkv".into(), 128, 10240, 8192)
            ]
        );
        std::fs::write(&p, "16 7168\n").unwrap();
        assert!(read_shapes(&p).is_err());
        std::fs::write(&p, "16 x 2048\n").unwrap();
        assert!(read_shapes(&p).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
