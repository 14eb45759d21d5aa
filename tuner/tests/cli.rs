//! The `tune` binary: clear errors with exit code 2 and nothing written, and the shapes it
//! derives.

use std::path::Path;
use std::process::{Command, Output};

mod common;

use common::{files_in, tune};

fn assert_usage_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(stderr.contains(needle), "expected `{needle}` in: {stderr}");
}

#[test]
fn bad_inputs_exit_2_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("partial.json"),
        r#"{"hidden_size": 4096, "num_attention_heads": 32}"#,
    )
    .unwrap();
    std::fs::write(d.join("broken.json"), "{ not json").unwrap();
    let before = files_in(d);
    let cases: &[(&[&str], &str)] = &[
        (
            &["--device", "mi250", "--shapes", "llama70b"],
            "device `mi250`",
        ),
        (
            &["--device", "tpu9", "--shapes", "llama70b"],
            "unknown device `tpu9`",
        ),
        (&["--shapes", "llama999b"], "unknown --shapes `llama999b`"),
        (&["--shapes", "gemm:m=1,n=8"], "missing required key `k`"),
        (
            &["--shapes", "gemm:m=1,n=8,k=8,color=red"],
            "unknown key `color`",
        ),
        (&["--shapes", "partial.json"], "intermediate_size"),
        (&["--shapes", "broken.json"], "not valid JSON"),
        (&["--shapes", "llama70b", "--tp", "3"], "--tp 3"),
        (
            &["--shapes", "llama70b", "--tp", "8,0"],
            "--tp 0: a tensor-parallel degree",
        ),
        (
            &["--shapes", "gemm:m=1,n=8,k=8", "--tp", "8"],
            "--tp shapes a model's problems",
        ),
        (
            &[
                "shapes",
                "--shapes",
                "untuned:none.txt",
                "--dtype",
                "f16",
                "--kernels",
                "gemm",
            ],
            "--dtype, --kernels shape a model's problems",
        ),
        (
            &["--shapes", "llama70b", "--block-size", "48"],
            "--block-size: invalid paged problem: block_size = 48: must be 1, 8, 16, 32, 64 or 128",
        ),
        (
            &["--shapes", "llama70b", "--prefill-lens", "100000000"],
            "--prefill-lens: invalid gemm problem: m = 100000000",
        ),
        (
            &["--shapes", "llama70b", "--context-lens", "5000000"],
            "--context-lens: invalid paged problem: context_len = 5000000",
        ),
        (
            &["--shapes", "llama70b", "--kv-cache-dtype", "fp4"],
            "--kv-cache-dtype fp4: expected auto, fp8",
        ),
        (
            &["--shapes", "llama70b", "--dtype", "fp8_e4m3"],
            "from --kv-cache-dtype fp8_e4m3",
        ),
        (
            &[
                "--shapes",
                "llama70b",
                "--dtype",
                "f32",
                "--kv-cache-dtype",
                "fp8",
            ],
            "--kv-cache-dtype: invalid paged problem: kv_dtype = fp8_e4m3",
        ),
        (
            &[
                "--shapes",
                "paged:context_len=8,q_heads=2,head_dim=8",
                "--kv-cache-dtype",
                "fp8",
            ],
            "--kv-cache-dtype shapes a model's problems",
        ),
        (&["--shapes", "llama70b", "--budget", "soon"], "soon"),
        (
            &["--shapes", "llama70b", "--max-configs", "0"],
            "at least 1",
        ),
        (&["--bogus-flag"], "--bogus-flag"),
        (
            &["--device", "h200", "--shapes", "gemm:m=1,n=8,k=8"],
            "no sm_90 device could be used",
        ),
        (
            &[
                "--device",
                "h200",
                "--gpu",
                "3",
                "--shapes",
                "gemm:m=1,n=8,k=8",
            ],
            "no sm_90 device could be used",
        ),
        (
            &["--gpu", "1", "--shapes", "gemm:m=1,n=8,k=8"],
            "--gpu 1 chooses among GPUs",
        ),
        (
            &["--gpu", "first", "--shapes", "gemm:m=1,n=8,k=8"],
            "--gpu <N>",
        ),
    ];
    for (args, needle) in cases {
        let out = tune(args, d);
        assert_usage_error(&out, needle);
    }
    assert_eq!(files_in(d), before, "a failed command wrote files");
}

#[test]
fn unwritable_database_path_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = tune(
        &[
            "--db",
            "/nonexistent-dir/sub/k.db",
            "--shapes",
            "gemm:m=1,n=8,k=8",
        ],
        dir.path(),
    );
    assert_usage_error(
        &out,
        "cannot open tuning database /nonexistent-dir/sub/k.db",
    );
    // SQLite's reason once, not once per link of the error chain that carries it.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("unable to open database file").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn showing_a_database_that_is_not_there_names_it_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = tune(&["show", "--db", "absent.db"], dir.path());
    assert_usage_error(
        &out,
        "no tuning database at absent.db: the file does not exist (tune into it first",
    );
    assert_eq!(files_in(dir.path()), Vec::<String>::new());
}

#[test]
fn an_empty_kerntune_db_means_the_default_database() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::tune_cmd(&["show"], dir.path())
        .env("KERNTUNE_DB", "")
        .output()
        .unwrap();
    assert_usage_error(&out, "no tuning database at kerntune.db:");
    assert_eq!(files_in(dir.path()), Vec::<String>::new());
}

#[test]
fn a_cpu_knob_that_does_not_parse_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    for (var, value, needle) in [
        (
            "KERNTUNE_ISA",
            "avx52",
            "KERNTUNE_ISA=avx52: unknown ISA level `avx52` (expected portable",
        ),
        (
            "KERNTUNE_AVX512_BF16",
            "yes",
            "KERNTUNE_AVX512_BF16=yes: expected 0 (hide AVX-512-BF16) or 1",
        ),
        (
            "KERNTUNE_SPIN_US",
            "1ms",
            "KERNTUNE_SPIN_US=1ms: expected a whole number of microseconds",
        ),
    ] {
        let out = common::tune_cmd(&["--shapes", "gemm:m=1,n=8,k=8"], dir.path())
            .env(var, value)
            .output()
            .unwrap();
        assert_usage_error(&out, needle);
        assert_usage_error(&out, "correct or unset it");
    }
    assert_eq!(files_in(dir.path()), Vec::<String>::new());
    // Set to nothing, they are unset; set right, they are taken.
    let out = common::tune_cmd(&["shapes", "--shapes", "gemm:m=1,n=8,k=8"], dir.path())
        .env("KERNTUNE_ISA", "")
        .env("KERNTUNE_AVX512_BF16", "0")
        .env("KERNTUNE_SPIN_US", " 250 ")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn newer_schema_database_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("k.db");
    let ok = tune(
        &[
            "--db",
            db.to_str().unwrap(),
            "--shapes",
            "gemm:m=2,n=8,k=8",
            "--budget",
            "200ms",
        ],
        dir.path(),
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // Pretend a future kerntune migrated it: record migration 99.
    let mark = Command::new("python3")
        .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(\"INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (99, 'future', 1, x'00', 0)\"); c.commit(); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()", db.to_str().unwrap()])
        .status()
        .expect("python3 with sqlite3 is available");
    assert!(mark.success());
    let before = std::fs::read(&db).unwrap();
    let out = tune(
        &["--db", db.to_str().unwrap(), "--shapes", "gemm:m=3,n=8,k=8"],
        dir.path(),
    );
    assert_usage_error(&out, "schema version 99");
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "the newer database was modified"
    );
}

#[test]
fn llama70b_tp8_shapes_are_the_published_ones() {
    let dir = tempfile::tempdir().unwrap();
    let out = tune(
        &["shapes", "--shapes", "llama70b", "--tp", "8", "--json"],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    for (n, k) in [
        (1280, 8192),
        (8192, 1024),
        (7168, 8192),
        (8192, 3584),
        (16032, 8192),
    ] {
        for m in [1, 16, 128] {
            let key = format!("gemm:m={m},n={n},k={k},dtype=bf16,b=nk");
            assert!(keys.contains(&key.as_str()), "missing {key}");
        }
    }
    assert!(keys.contains(&"flash:batch=1,q_len=2048,kv_len=2048,q_heads=8,kv_heads=1,head_dim=128,causal=true,dtype=bf16"));
    assert!(keys.contains(&"paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,block_size=16,dtype=bf16"));
    let unique: std::collections::HashSet<_> = keys.iter().collect();
    assert_eq!(unique.len(), keys.len(), "problems are de-duplicated");
}

/// `--kv-cache-dtype` puts every decode problem of a model on that cache, and vLLM's `fp8`
/// is the device's E4M3: fnuz on MI300X, OCP elsewhere; prefill and GEMMs are unchanged.
#[test]
fn a_kv_cache_dtype_moves_decode_onto_fp8() {
    let dir = tempfile::tempdir().unwrap();
    let paged = "paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,block_size=16,dtype=bf16";
    for (device, kv, want) in [
        ("mi300x", "fp8", "fp8_e4m3fnuz"),
        ("h200", "fp8", "fp8_e4m3"),
        ("cpu", "fp8", "fp8_e4m3"),
        ("mi250", "fp8_e5m2", "fp8_e5m2"),
    ] {
        let rows = shapes_with_env(
            &[
                "--shapes",
                "llama70b",
                "--tp",
                "8",
                "--device",
                device,
                "--kv-cache-dtype",
                kv,
            ],
            &[],
            dir.path(),
        );
        let keys: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        let fp8 = format!("{paged},kv_dtype={want}");
        assert!(keys.contains(&fp8.as_str()), "{device} {kv}: {keys:?}");
        assert!(!keys.contains(&paged), "{device} {kv}");
        assert!(keys
            .iter()
            .all(|k| k.starts_with("paged:") == k.contains("kv_dtype=")));
        let auto = shapes_with_env(
            &[
                "--shapes",
                "llama70b",
                "--tp",
                "8",
                "--device",
                device,
                "--kv-cache-dtype",
                "auto",
            ],
            &[],
            dir.path(),
        );
        assert!(auto.iter().any(|r| r.0 == paged), "{device} auto");
    }
}

#[test]
fn several_tensor_parallel_degrees_derive_the_union_of_each() {
    let dir = tempfile::tempdir().unwrap();
    let keys = |tp: &str| -> Vec<(String, String)> {
        shapes_with_env(&["--shapes", "llama70b", "--tp", tp], &[], dir.path())
    };
    let (tp4, tp8, both) = (keys("4"), keys("8"), keys("4,8"));
    let mut expected: Vec<&String> = tp4.iter().chain(&tp8).map(|r| &r.0).collect();
    expected.sort();
    expected.dedup();
    let mut got: Vec<&String> = both.iter().map(|r| &r.0).collect();
    got.sort();
    assert_eq!(got, expected);
    assert!(both.iter().any(|r| r.1.starts_with("llama70b tp4 ")));
    assert!(both.iter().any(|r| r.1.starts_with("llama70b tp8 ")));
    let out = tune(
        &["shapes", "--shapes", "llama70b", "--tp", "8,3"],
        dir.path(),
    );
    assert_usage_error(&out, "--tp 3 does not divide llama70b");
}

#[test]
fn config_json_models_derive_like_presets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"hidden_size":4096,"intermediate_size":14336,"num_attention_heads":32,"num_key_value_heads":8,"num_hidden_layers":32,"vocab_size":128256,"torch_dtype":"bfloat16"}"#,
    )
    .unwrap();
    let a = tune(
        &["shapes", "--shapes", "config.json", "--tp", "2", "--json"],
        dir.path(),
    );
    let b = tune(
        &["shapes", "--shapes", "llama8b", "--tp", "2", "--json"],
        dir.path(),
    );
    assert!(a.status.success() && b.status.success());
    let keys = |o: &Output| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| r["key"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(keys(&a), keys(&b));
}

#[test]
fn a_reader_that_closes_the_pipe_early_ends_tune_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    for json in [false, true] {
        let mut args = vec!["shapes", "--shapes", "llama70b", "--shapes", "mixtral8x7b"];
        if json {
            args.push("--json");
        }
        // `tune shapes | head -1`: the reader is gone before tune writes. The read end is
        // closed before tune starts: closed after, tune could fill the pipe's buffer first
        // and exit 0, as it did once on a loaded CI machine.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = common::tune_cmd(&args, dir.path())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.is_empty(), "{stderr}");
        // What a shell reports as 141, as for `cat` or `grep` in the same place.
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}", out.status);
    }
}

/// Llama-3.1-70B-Instruct's published config.json, the fields the shapes depend on.
const LLAMA_70B_CONFIG: &str = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 8192,
    "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
    "num_hidden_layers": 80, "vocab_size": 128256, "model_type": "llama",
    "torch_dtype": "bfloat16"}"#;

/// The problem keys and origins of `tune shapes ARGS --json` run with `env`, or its stderr.
fn shapes_with_env(args: &[&str], env: &[(&str, &Path)], cwd: &Path) -> Vec<(String, String)> {
    let mut cmd = common::tune_cmd(&[&["shapes"], args, &["--json"]].concat(), cwd);
    for var in [
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HOME",
        "XDG_CACHE_HOME",
    ] {
        cmd.env_remove(var);
    }
    for (var, value) in env {
        cmd.env(var, value);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{args:?} {env:?}: {}",
        common::text(&out)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().into(),
                r["origin"].as_str().unwrap().into(),
            )
        })
        .collect()
}

#[test]
fn a_model_is_named_by_its_folder_or_its_hugging_face_id() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A server's model folder, and a hub cache laid out as `hf download` leaves it: refs/main
    // names a commit, whose snapshot links the file into blobs/.
    std::fs::create_dir(d.join("Llama-3.1-70B-Instruct")).unwrap();
    std::fs::write(
        d.join("Llama-3.1-70B-Instruct/config.json"),
        LLAMA_70B_CONFIG,
    )
    .unwrap();
    let commit = "1605565b47bb9346c5515c34102e054115b4f98b";
    let repo = d.join("home/.cache/huggingface/hub/models--meta-llama--Llama-3.1-70B-Instruct");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots").join(commit)).unwrap();
    std::fs::write(repo.join("blobs/6b4d0e7b"), LLAMA_70B_CONFIG).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    std::os::unix::fs::symlink(
        "../../blobs/6b4d0e7b",
        repo.join("snapshots").join(commit).join("config.json"),
    )
    .unwrap();

    let keys = |rows: Vec<(String, String)>| rows.into_iter().map(|r| r.0).collect::<Vec<_>>();
    let preset = keys(shapes_with_env(
        &["--shapes", "llama70b", "--tp", "8"],
        &[],
        d,
    ));
    assert_eq!(preset.len(), 73);
    let folder = shapes_with_env(&["--shapes", "Llama-3.1-70B-Instruct", "--tp", "8"], &[], d);
    assert_eq!(keys(folder), preset);

    // The cache wherever huggingface_hub would look: HF_HUB_CACHE before HF_HOME before
    // XDG_CACHE_HOME before HOME.
    let home = d.join("home");
    let hub = home.join(".cache/huggingface/hub");
    let nowhere = d.join("nowhere");
    let id = "meta-llama/Llama-3.1-70B-Instruct";
    let args = ["--shapes", id, "--tp", "8"];
    for env in [
        vec![("HOME", home.as_path())],
        vec![
            ("HOME", nowhere.as_path()),
            ("XDG_CACHE_HOME", &home.join(".cache")),
        ],
        vec![
            ("XDG_CACHE_HOME", nowhere.as_path()),
            ("HF_HOME", &home.join(".cache/huggingface")),
        ],
        vec![
            ("HF_HOME", nowhere.as_path()),
            ("HF_HUB_CACHE", hub.as_path()),
        ],
        // As an env file passes it, unexpanded.
        vec![
            ("HOME", home.as_path()),
            ("HF_HOME", Path::new("~/.cache/huggingface")),
        ],
    ] {
        let rows = shapes_with_env(&args, &env, d);
        assert!(
            rows.iter().all(|r| r.1.starts_with(&format!("{id} tp8"))),
            "{rows:?}"
        );
        assert_eq!(keys(rows), preset, "{env:?}");
    }
    // Pinned to a commit, and as huggingface_hub's URIs and a browser's address bar write it.
    for spec in [
        format!("{id}@{commit}"),
        format!("hf://{id}"),
        format!("https://huggingface.co/{id}/tree/{commit}"),
    ] {
        let rows = shapes_with_env(
            &["--shapes", &spec, "--tp", "8"],
            &[("HF_HUB_CACHE", &hub)],
            d,
        );
        assert_eq!(keys(rows), preset, "{spec}");
    }
}

#[test]
fn a_model_neither_here_nor_in_the_hub_cache_names_the_download() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("weights-only")).unwrap();
    std::fs::create_dir(d.join("hub")).unwrap();
    let before = files_in(d);
    let run = |args: &[&str]| {
        common::tune_cmd(args, d)
            .env("HF_HUB_CACHE", d.join("hub"))
            .output()
            .unwrap()
    };
    let out = run(&["--shapes", "meta-llama/Llama-3.1-8B@v2", "--db", "k.db"]);
    assert_usage_error(&out, "holds no model meta-llama/Llama-3.1-8B");
    assert_usage_error(
        &out,
        "hf download meta-llama/Llama-3.1-8B config.json --revision v2",
    );
    assert_usage_error(&out, &d.join("hub").display().to_string());
    let out = run(&[
        "--shapes",
        "https://huggingface.co/org/model/tree/v3",
        "--db",
        "k.db",
    ]);
    assert_usage_error(
        &out,
        "--shapes `https://huggingface.co/org/model/tree/v3`: the Hugging Face cache",
    );
    assert_usage_error(&out, "hf download org/model config.json --revision v3");
    let out = run(&["--shapes", "weights-only", "--db", "k.db"]);
    assert_usage_error(&out, "weights-only is a folder without a config.json");
    let out = run(&["--shapes", "llama7b", "--db", "k.db"]);
    assert_usage_error(&out, "unknown --shapes `llama7b`");
    assert_usage_error(&out, "a Hugging Face model id in the local cache");
    assert_eq!(files_in(d), before, "a failed command wrote files");
}

#[test]
fn tune_then_show_and_bench_the_winner() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("k.db");
    let db = db.to_str().unwrap();
    let spec = "paged:num_seqs=2,context_len=64,q_heads=4,kv_heads=1,head_dim=32";
    let out = tune(
        &["--db", db, "--shapes", spec, "--budget", "300ms"],
        dir.path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 tuned"), "{stdout}");
    // Standard error is a pipe here, as in a log file or a CI job: a line per problem where
    // a terminal would have bars.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[1/1] tuned paged:num_seqs=2,context_len=64,")
            && stderr.contains("the default ("),
        "{stderr}"
    );
    let show = tune(&["show", "--db", db, "--json"], dir.path());
    let rows: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    let bench = tune(
        &[
            "bench", "--db", db, "--shapes", spec, "--config", "best", "--json",
        ],
        dir.path(),
    );
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&bench.stdout).unwrap();
    assert!(v[0]["stats"]["median_ns"].as_f64().unwrap() > 0.0);
    // With --json the lines stay out of what a reader may merge into the JSON.
    let spec = "paged:num_seqs=3,context_len=64,q_heads=4,kv_heads=1,head_dim=32";
    let out = tune(
        &["--db", db, "--shapes", spec, "--budget", "300ms", "--json"],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("[1/1]"),
        "{stderr}"
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary[0]["status"], "tuned");
}

#[test]
fn searches_are_paced_to_a_total_budget_too_short_for_their_full_budget() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("k.db");
    // Two problems, 2 s for the run, 4 s per search: the first search gets the 1 s share
    // (also the floor, a quarter of 4 s) and its line and the summary say so.
    let out = tune(
        &[
            "--db",
            db.to_str().unwrap(),
            "--shapes",
            "paged:num_seqs=2,context_len=64,q_heads=4,kv_heads=1,head_dim=32",
            "--shapes",
            "paged:num_seqs=3,context_len=64,q_heads=4,kv_heads=1,head_dim=32",
            "--budget",
            "4s",
            "--total-budget",
            "2s",
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("[1/2] tuned") && l.ends_with(", search paced to 1.0 s)")),
        "{stderr}"
    );
    assert!(
        stdout
            .contains("searches paced to fit --total-budget (shortest 1.0 s of --budget's 4.0 s)"),
        "{stdout}"
    );
}

#[test]
fn a_pytorch_tunableop_file_names_the_gemms_to_tune() {
    let dir = tempfile::tempdir().unwrap();
    // What PYTORCH_TUNABLEOP_RECORD_UNTUNED=1 writes: BLAS sizes N_M_K, each GEMM once per
    // line, here with an FP8 GEMM (of MI300X's E4M3), a batched one kerntune does not take
    // and an FP8 one of two formats, which it does not take either.
    let file = dir.path().join("tunableop_untuned0.csv");
    std::fs::write(
        &file,
        "GemmTunableOp_BFloat16_TN,tn_96_3_40_ld_40_40_96\n\
         GemmTunableOp_float_NN,nn_17_5_13_ld_17_13_17\n\
         GemmTunableOp_BFloat16_TN,tn_96_3_40_ld_40_40_96\n\
         GemmStridedBatchedTunableOp_BFloat16_NN,nn_128_1_64_ld_128_64_128_stride_8192_64_128_b_8\n\
         ScaledGemmTunableOp_Float8_e4m3fnuz_Float8_e4m3fnuz_BFloat16_TN,tn_64_16_32_ld_32_32_64_rw_0_bias_None\n\
         ScaledGemmTunableOp_Float8_e4m3fn_Float8_e5m2_BFloat16_TN,tn_64_16_32_ld_32_32_64_rw_0_bias_None\n",
    )
    .unwrap();
    let spec = format!("tunableop:{}", file.display());
    let db = dir.path().join("k.db");
    let out = tune(
        &[
            "--db",
            db.to_str().unwrap(),
            "--shapes",
            &spec,
            "--budget",
            "300ms",
            "--json",
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "left out 1 GemmStridedBatchedTunableOp (batched), 1 ScaledGemmTunableOp (A in e4m3fn, B in e5m2)"
        ),
        "{stderr}"
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut tuned: Vec<&str> = summary
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            assert_eq!(row["status"], "tuned", "{row}");
            row["problem"].as_str().unwrap()
        })
        .collect();
    tuned.sort();
    assert_eq!(
        tuned,
        [
            "gemm:m=16,n=64,k=32,dtype=fp8_e4m3fnuz,b=nk",
            "gemm:m=3,n=96,k=40,dtype=bf16,b=nk",
            "gemm:m=5,n=17,k=13,dtype=f32,b=kn"
        ]
    );
    // A line that is not one is named by file and line; model flags do not apply to it.
    std::fs::write(&file, "GemmTunableOp_BFloat16_TN,tn_96_3\n").unwrap();
    let out = tune(&["shapes", "--shapes", &spec], dir.path());
    assert_usage_error(&out, "tunableop_untuned0.csv:1: `tn_96_3`");
    let out = tune(&["shapes", "--shapes", &spec, "--tp", "2"], dir.path());
    assert_usage_error(&out, "--tp shapes a model's problems");
}
