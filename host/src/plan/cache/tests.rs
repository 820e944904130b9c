use super::*;
use crate::families::test_util::desc;
use crate::format::{Fp4Weights, Fp8, Recipe};
use crate::plan::{GpuArch, Hardware, choose};

/// Plans of every family, as `choose` makes them, and their variants with other fields.
fn plans() -> Vec<Plan> {
    let mut all = vec![Plan::Reference];
    let recipes = [
        Recipe::DeepSeekFp8,
        Recipe::Mxfp8(Fp8::E4M3),
        Recipe::Mxfp4,
        Recipe::Nvfp4,
        Recipe::W4A16(Fp4Weights::Mxfp4),
        Recipe::W4A8(Fp4Weights::Mxfp4),
    ];
    for r in recipes {
        for m in [1, 64, 128, 300, 4096] {
            let (a, b) = (desc(r, m, 1024, false), desc(r, 512, 1024, true));
            all.push(choose(GpuArch::Hopper, Hardware::H100, &a, &b).unwrap());
        }
    }
    let more: Vec<Plan> = all
        .iter()
        .filter_map(|p| match *p {
            Plan::Sm90W4(c) => Some(Plan::Sm90W4(c.with_stream(!c.stream).with_split_k(3))),
            Plan::Sm90Fp8(c) => Some(Plan::Sm90MxFp8(c.with_group_m(5))),
            _ => None,
        })
        .collect();
    all.extend(more);
    all
}

#[test]
fn every_plan_reads_back_from_its_text_and_other_text_reads_as_none() {
    let all = plans();
    for family in ["reference", "fp8", "mx", "w4", "fold"] {
        assert!(
            all.iter().any(|p| p.to_text().starts_with(family)),
            "no {family} plan among the samples"
        );
    }
    for p in &all {
        let t = p.to_text();
        assert_eq!(Plan::from_text(&t), Some(*p), "{t}");
        // A word short, a word more, a word that is no number: none.
        let short = t.rsplit_once(' ').map(|(head, _)| head.to_string());
        if let Some(short) = short {
            assert_eq!(Plan::from_text(&short), None, "{short}");
        }
        assert_eq!(Plan::from_text(&format!("{t} 1")), None, "{t} 1");
        assert_eq!(Plan::from_text(&format!("{t} x")), None, "{t} x");
    }
    for bad in [
        "",
        "sm100 1 2",
        "w4 1 2 3 4 5 6",
        "fp8 -1 1 128 0 1 1 8 132 1",
    ] {
        assert_eq!(Plan::from_text(bad), None, "{bad:?}");
    }
    // A bool field out of range.
    let w4 = all.iter().find(|p| matches!(p, Plan::Sm90W4(_))).unwrap();
    let t = w4.to_text();
    let (head, _) = t.rsplit_once(' ').unwrap();
    assert_eq!(Plan::from_text(&format!("{head} 2")), None);
}

#[test]
fn m_shares_entries_in_powers_of_two_then_in_256_rows() {
    let got: Vec<usize> = [0, 1, 2, 3, 16, 17, 128, 129, 256, 257, 4000]
        .map(m_bucket)
        .into();
    assert_eq!(got, [1, 1, 2, 4, 16, 32, 128, 256, 256, 512, 4096]);
}

/// An H200 as the cache names it.
fn h200() -> Machine {
    Machine {
        gpu: "NVIDIA H200".into(),
        sm_count: 132,
        driver: 13000,
    }
}

/// A DeepSeek FP8 call's A (100 rows) and B (512 rows) at K = 1024, and its shape at a given M.
fn fp8_call() -> (MatrixDesc, MatrixDesc, impl Fn(usize) -> GemmShape) {
    let r = Recipe::DeepSeekFp8;
    let shape = |m| GemmShape {
        m,
        n: 512,
        k: 1024,
        l: 1,
    };
    (desc(r, 100, 1024, false), desc(r, 512, 1024, true), shape)
}

#[test]
fn keys_tell_apart_machines_formats_layouts_shapes_and_groups() {
    let h200 = h200();
    let (a, b, s) = fp8_call();
    let k0 = key(&h200, (&a, &b), &s(100), None);
    assert_eq!(k0, key(&h200, (&a, &b), &s(128), None), "one bucket");
    assert!(k0.contains(env!("CARGO_PKG_VERSION")), "{k0}");
    let others = [
        key(
            &Machine {
                sm_count: 114,
                ..h200.clone()
            },
            (&a, &b),
            &s(100),
            None,
        ),
        key(
            &Machine {
                driver: 12080,
                ..h200.clone()
            },
            (&a, &b),
            &s(100),
            None,
        ),
        key(&h200, (&a, &b), &s(129), None),
        key(&h200, (&a, &b), &s(100), Some(8)),
        key(
            &h200,
            (&desc(Recipe::Mxfp4, 100, 1024, false), &b),
            &s(100),
            None,
        ),
    ];
    for k in others {
        assert_ne!(k, k0);
    }
}

#[test]
fn the_path_is_the_variables_or_the_users_cache_directory_and_off_is_none() {
    let os = |s: &str| Some(OsString::from(s));
    assert_eq!(path_from(os("off"), os("/x"), os("/h")), None);
    assert_eq!(path_from(os(""), None, os("/h")), None);
    assert_eq!(
        path_from(os("/tmp/p.json"), os("/x"), os("/h")),
        Some(PathBuf::from("/tmp/p.json"))
    );
    assert_eq!(
        path_from(None, os("/x"), os("/h")),
        Some(PathBuf::from("/x/blockscaled/plans.json"))
    );
    assert_eq!(
        path_from(None, os(""), os("/h")),
        Some(PathBuf::from("/h/.cache/blockscaled/plans.json"))
    );
    assert_eq!(path_from(None, None, None), None);
}

/// A fresh directory under the system's temporary one.
fn scratch(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir =
        std::env::temp_dir().join(format!("blockscaled-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_saved_cache_reads_back_and_saves_merge_what_others_saved() {
    let dir = scratch("cache");
    let path = dir.join("sub").join("plans.json");
    let all = plans();
    let mut first = PlanCache::open(&path);
    assert!(
        first.is_empty() && first.warnings().is_empty(),
        "no file: empty, no warning"
    );
    // A second process's cache, opened before the first saves.
    let mut second = PlanCache::open(&path);
    for (i, p) in all.iter().enumerate() {
        first.insert(
            format!("k{i}"),
            Entry {
                plan: *p,
                us: 1.5 + i as f64,
            },
        );
    }
    first.save().unwrap();
    second.insert(
        "other".into(),
        Entry {
            plan: all[1],
            us: 9.0,
        },
    );
    second.save().unwrap();
    let read = PlanCache::open(&path);
    assert!(read.warnings().is_empty(), "{:?}", read.warnings());
    assert_eq!(read.len(), all.len() + 1, "both savers' entries");
    for (i, p) in all.iter().enumerate() {
        assert_eq!(
            read.get(&format!("k{i}")),
            Some(&Entry {
                plan: *p,
                us: 1.5 + i as f64
            })
        );
    }
    assert_eq!(read.get("other").map(|e| e.plan), Some(all[1]));
    let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
    assert_eq!(left.len(), 1, "no temporary file left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unreadable_foreign_or_partly_bad_files_are_warnings_never_errors() {
    let dir = scratch("bad");
    let path = dir.join("plans.json");
    let cases = [
        ("{not json", "not a plan cache"),
        ("[1, 2]", "format None"),
        (r#"{"format": 7, "entries": {}}"#, "format Some(7)"),
        (r#"{"format": 1}"#, "no entries"),
    ];
    for (text, want) in cases {
        std::fs::write(&path, text).unwrap();
        let c = PlanCache::open(&path);
        assert!(c.is_empty(), "{text}");
        assert_eq!(c.warnings().len(), 1, "{text}");
        assert!(c.warnings()[0].contains(want), "{text}: {:?}", c.warnings());
    }
    // Entries another version wrote are skipped; the rest are kept.
    let good = Plan::Reference.to_text();
    let text = format!(
        r#"{{"format": 1, "entries": {{"a": {{"plan": "{good}", "us": 3.0}}, "b": {{"plan": "fp8 1", "us": 2.0}}, "c": {{"plan": "{good}", "us": "fast"}}}}}}"#
    );
    std::fs::write(&path, text).unwrap();
    let c = PlanCache::open(&path);
    assert_eq!(c.len(), 1);
    assert_eq!(c.get("a").map(|e| e.us), Some(3.0));
    assert!(
        c.warnings()[0].contains("2 entries not read"),
        "{:?}",
        c.warnings()
    );
    // A directory where the file should be: a warning too.
    let c = PlanCache::open(&dir);
    assert!(
        c.is_empty() && c.warnings().len() == 1,
        "{:?}",
        c.warnings()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn savers_at_once_each_leave_a_whole_file() {
    let dir = scratch("race");
    let path = dir.join("plans.json");
    let plan = plans()[3];
    std::thread::scope(|s| {
        for t in 0..8 {
            let path = &path;
            s.spawn(move || {
                for i in 0..20 {
                    let mut c = PlanCache::open(path);
                    assert!(
                        c.warnings().is_empty(),
                        "a half-written file: {:?}",
                        c.warnings()
                    );
                    c.insert(format!("t{t}-{i}"), Entry { plan, us: i as f64 });
                    c.save().unwrap();
                }
            });
        }
    });
    // A whole file, every entry of it one a thread wrote (savers at once may drop each other's
    // newest entries: the last rename wins; never a torn file).
    let c = PlanCache::open(&path);
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    assert!(!c.is_empty());
    for (k, e) in &c.contents.entries {
        assert!(k.starts_with('t') && e.plan == plan, "{k}");
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(left.len(), 1, "no temporary file left behind");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ceilings_are_kept_per_machine_beside_the_plans_and_bad_ones_are_left_out() {
    let dir = scratch("ceilings");
    let path = dir.join("plans.json");
    let h200 = h200();
    let h100 = Machine {
        gpu: "NVIDIA H100 80GB HBM3".into(),
        ..h200.clone()
    };
    let newer_driver = Machine {
        driver: 13010,
        ..h200.clone()
    };
    let c200 = Ceilings {
        tflops: 1453.5,
        gbs: 4120.25,
    };
    let mut first = PlanCache::open(&path);
    let mut second = PlanCache::open(&path);
    first.set_ceilings(&h200, c200);
    first.insert(
        "k".into(),
        Entry {
            plan: Plan::Reference,
            us: 2.0,
        },
    );
    first.save().unwrap();
    // Another process stores another GPU's ceilings: both are kept, and the plans.
    let c100 = Ceilings {
        tflops: 1200.0,
        gbs: 3000.0,
    };
    second.set_ceilings(&h100, c100);
    second.save().unwrap();
    let read = PlanCache::open(&path);
    assert!(read.warnings().is_empty(), "{:?}", read.warnings());
    assert_eq!(read.ceilings(&h200), Some(c200));
    assert_eq!(read.ceilings(&h100), Some(c100));
    assert_eq!(
        read.ceilings(&newer_driver),
        None,
        "a new driver measures again"
    );
    assert_eq!(read.len(), 1);
    // A file of plans alone (no ceilings) reads without a warning; a bad ceiling is a warning
    // and left out, the rest kept.
    let good = Plan::Reference.to_text();
    let text = format!(
        r#"{{"format": 1, "entries": {{"a": {{"plan": "{good}", "us": 3.0}}}}, "ceilings": {{"x|1|1": {{"tflops": -1, "gbs": 5}}, "{}": {{"tflops": 9.5, "gbs": 7.5}}}}}}"#,
        machine_key(&h200)
    );
    std::fs::write(&path, text).unwrap();
    let c = PlanCache::open(&path);
    assert_eq!(c.len(), 1);
    assert_eq!(
        c.ceilings(&h200),
        Some(Ceilings {
            tflops: 9.5,
            gbs: 7.5
        })
    );
    assert_eq!(c.warnings().len(), 1, "{:?}", c.warnings());
    assert!(c.warnings()[0].contains("x|1|1"), "{:?}", c.warnings());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tuned_plans_answer_from_the_cache_and_keep_each_keys_answer() {
    let h200 = h200();
    let (a, b, s) = fp8_call();
    let plan = plans()[2];
    let mut cache = PlanCache::default();
    cache.insert(key(&h200, (&a, &b), &s(100), None), Entry { plan, us: 4.0 });
    let tuned = TunedPlans::new(h200.clone(), cache);
    for _ in 0..2 {
        // The first lookup reads the cache, the second the kept answer: the same.
        assert_eq!(tuned.get(&CallKey::of((&a, &b), &s(100), None)), Some(plan));
        assert_eq!(tuned.get(&CallKey::of((&a, &b), &s(128), None)), Some(plan));
        assert_eq!(tuned.get(&CallKey::of((&a, &b), &s(129), None)), None);
        assert_eq!(tuned.get(&CallKey::of((&a, &b), &s(100), Some(8))), None);
    }
    // The text key is the one the file holds.
    let k = CallKey::of((&a, &b), &s(100), None);
    assert_eq!(k.text(&h200), key(&h200, (&a, &b), &s(100), None));
    assert_ne!(k, CallKey::of((&a, &b), &s(129), None));
}
