//! Command-line flags, parsed by clap and then turned into validated settings in one place.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use kerntune_kernels::{DType, Device, Family, Fp8};

use kerntune_tuner::search::Strategy;
use kerntune_tuner::shapes::{mla_backend, Buckets};

#[derive(Debug, Parser)]
#[command(
    name = "tune",
    version,
    about = "Tune GEMM, flash-attention and paged-attention kernels for a model on a device"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub tune: TuneArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the problems --shapes expands to, without running anything.
    Shapes(ShapesArgs),
    /// Run one problem with one config and print timing statistics.
    Bench(BenchArgs),
    /// Print the stored winners.
    Show(ShowArgs),
    /// Offline GPU plan: compile every candidate for the device's target, read registers,
    /// shared memory (LDS) and spills, prune, estimate the device time. Needs the HIP compiler
    /// (AMD) or NVRTC (NVIDIA), not a GPU.
    Plan(PlanArgs),
    /// Share tuning databases: export, import, merge, diff, verify, gc, migrate.
    #[command(subcommand)]
    Db(DbCommand),
}

#[derive(Debug, Subcommand)]
pub enum DbCommand {
    /// Write winners (or every measurement) with full provenance to a file.
    Export {
        /// Every measurement, not only winners and their defaults.
        #[arg(long)]
        all: bool,
        /// jsonl (importable) or csv (for spreadsheets).
        #[arg(long, value_enum, default_value = "jsonl")]
        format: kerntune_tuner::share::format::Format,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Check and file the rows of an export into --db.
    Import {
        /// An export written by `tune db export`.
        file: PathBuf,
        /// Which winner stays when both have one: the faster (best), the one measured into
        /// --db (local), or the incoming one (imported).
        #[arg(long, value_enum, default_value = "best")]
        prefer: PreferArg,
        /// Import nothing when any row is rejected.
        #[arg(long)]
        strict: bool,
    },
    /// Merge databases into a new one: every measurement, the fastest verified winner.
    Merge {
        /// Input databases.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// The new database.
        #[arg(short, long)]
        output: PathBuf,
        /// Report a config whose medians on two hosts differ by more than this factor.
        #[arg(long, default_value_t = 1.5)]
        conflict_ratio: f64,
    },
    /// Compare the winners of two databases.
    Diff { a: PathBuf, b: PathBuf },
    /// Check a database: SQLite integrity, foreign keys, schema, every winner's config.
    Verify { file: PathBuf },
    /// Drop stale rows: measurements of other kernel sources and/or other tool versions.
    Gc {
        /// Drop measurements of kernel sources other than this build's.
        #[arg(long)]
        stale_kernels: bool,
        /// Drop measurements made by other kerntune versions.
        #[arg(long)]
        old_tools: bool,
        /// Only count what would be dropped.
        #[arg(long)]
        dry_run: bool,
    },
    /// Migrate --db to this kerntune's schema.
    Migrate,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PreferArg {
    Best,
    Local,
    Imported,
}

#[derive(Debug, Args, Clone)]
pub struct ShapeArgs {
    /// A preset (llama70b, llama2-70b, llama8b, mistral7b, mixtral8x7b), a config.json (or
    /// Mistral's params.json) or the model's folder, a Hugging Face model id in the local cache (`org/name[@revision]`,
    /// `hf://...`, the model page's address), a problem (`gemm:m=1,n=1280,k=8192,dtype=bf16`),
    /// untuned:PATH (what the runtime saw untuned) or tunableop:PATH (PyTorch TunableOp's
    /// untuned or results file). Repeatable.
    #[arg(long = "shapes")]
    pub shapes: Vec<String>,
    /// Tensor-parallel degrees, e.g. 4,8 for a model served both ways (default: the smallest
    /// power of two whose shard fits the device).
    #[arg(long, value_delimiter = ',')]
    pub tp: Option<Vec<usize>>,
    /// Decode batch sizes (tokens M of decode GEMMs, sequences of paged attention).
    #[arg(long, value_delimiter = ',')]
    pub batch_sizes: Option<Vec<usize>>,
    /// Prefill chunk lengths (tokens M of prefill GEMMs, flash attention lengths).
    #[arg(long, value_delimiter = ',')]
    pub prefill_lens: Option<Vec<usize>>,
    /// Context lengths of paged attention decode.
    #[arg(long, value_delimiter = ',')]
    pub context_lens: Option<Vec<usize>>,
    /// Tokens per block of the paged KV cache (default 16, vLLM's; a latent attention cache
    /// on sm_90 and sm_100 64, as vLLM's MLA backends there, FlashMLA and FlashInfer's, take
    /// it).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// Mixtures of experts: each shard holds whole experts (vLLM's --enable-expert-parallel)
    /// rather than a slice of every expert.
    #[arg(long)]
    pub expert_parallel: bool,
    /// Input dtype (default: the model's, from config.json's `dtype` or `torch_dtype`; bf16
    /// for presets).
    #[arg(long)]
    pub dtype: Option<String>,
    /// Kernel families to derive.
    #[arg(long, value_delimiter = ',')]
    pub kernels: Option<Vec<String>>,
    /// What paged attention's KV cache holds, as vLLM's --kv-cache-dtype names it: auto (the
    /// model's dtype), fp8 (the device's E4M3: fnuz on MI300X, OCP elsewhere), fp8_e4m3,
    /// fp8_e4m3fnuz or fp8_e5m2.
    #[arg(long, value_name = "DTYPE")]
    pub kv_cache_dtype: Option<String>,
}

impl ShapeArgs {
    /// The flags given that shape a model's problems; an explicit problem is one shard's
    /// shape as written, which none of them changes.
    pub fn model_flags(&self) -> Vec<&'static str> {
        [
            ("--tp", self.tp.is_some()),
            ("--batch-sizes", self.batch_sizes.is_some()),
            ("--prefill-lens", self.prefill_lens.is_some()),
            ("--context-lens", self.context_lens.is_some()),
            ("--block-size", self.block_size.is_some()),
            ("--expert-parallel", self.expert_parallel),
            ("--dtype", self.dtype.is_some()),
            ("--kernels", self.kernels.is_some()),
            ("--kv-cache-dtype", self.kv_cache_dtype.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }

    /// The buckets of these flags for `device` (which `--kv-cache-dtype fp8` depends on).
    pub fn buckets(&self, device: &Device) -> Result<Buckets, String> {
        let mut b = Buckets::default();
        let nonzero = |name: &str, v: &Vec<usize>| {
            if v.is_empty() || v.contains(&0) {
                Err(format!("--{name} needs positive sizes, got {v:?}"))
            } else {
                Ok(v.clone())
            }
        };
        if let Some(v) = &self.batch_sizes {
            b.batch_sizes = nonzero("batch-sizes", v)?;
        }
        if let Some(v) = &self.prefill_lens {
            b.prefill_lens = nonzero("prefill-lens", v)?;
        }
        if let Some(v) = &self.context_lens {
            b.context_lens = nonzero("context-lens", v)?;
        }
        b.expert_parallel = self.expert_parallel;
        match self.block_size {
            Some(0) => return Err("--block-size needs a positive number of tokens".into()),
            Some(size) => {
                b.block_size = size;
                b.latent_block_size = size;
            }
            None => b.latent_block_size = mla_backend(device).block_size,
        }
        b.mla = mla_backend(device);
        // vLLM's `fp8`: the E4M3 of the device's hardware, for caches and checkpoints alike.
        let e4m3 = match device {
            Device::Gpu(g) if g.arch == "gfx942" => Fp8::E4m3Fnuz,
            _ => Fp8::E4m3,
        };
        b.e4m3 = e4m3;
        if let Some(d) = &self.dtype {
            let d = d.parse::<DType>()?;
            if d.fp8().is_some() {
                return Err(format!(
                    "--dtype {d}: a model's fp8 GEMMs come from its config.json's \
                     quantization_config (an FP8 checkpoint's), and an fp8 KV cache from \
                     --kv-cache-dtype {d}; pass --dtype f16 or bf16 (or the model's own), or \
                     fp8 GEMMs as problems (--shapes gemm:m=...,n=...,k=...,dtype={d})"
                ));
            }
            b.dtype = Some(d);
        }
        if let Some(kv) = &self.kv_cache_dtype {
            b.kv_cache = match kv.to_ascii_lowercase().as_str() {
                "auto" => None,
                "fp8" => Some(DType::Fp8(e4m3)),
                name => match name.parse::<DType>() {
                    Ok(d @ DType::Fp8(_)) => Some(d),
                    _ => {
                        return Err(format!(
                            "--kv-cache-dtype {kv}: expected auto, fp8, fp8_e4m3, fp8_e4m3fnuz \
                             or fp8_e5m2"
                        ))
                    }
                },
            };
        }
        if let Some(k) = &self.kernels {
            b.kernels = k
                .iter()
                .map(|f| f.parse::<Family>().map_err(|e| format!("--kernels: {e}")))
                .collect::<Result<_, _>>()?;
        }
        Ok(b)
    }
}

#[derive(Debug, Args)]
pub struct TuneArgs {
    /// Device to tune on (default: the best device present; the CPU without a GPU backend).
    #[arg(long, global = true)]
    pub device: Option<String>,
    /// Tuning database (default: $KERNTUNE_DB, else kerntune.db here).
    #[arg(long, global = true)]
    pub db: Option<PathBuf>,
    #[command(flatten)]
    pub shapes: ShapeArgs,
    /// Search strategy.
    #[arg(long, value_enum, default_value = "local")]
    pub strategy: Strategy,
    /// Time budget of each problem's search (e.g. 2s, 500ms, 1m).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub budget: Duration,
    /// Time budget for the whole run. Searches share it when it is too short for each to
    /// have --budget (down to a quarter of --budget); problems not reached are left for the
    /// next run.
    #[arg(long, default_value = "4m", value_parser = parse_duration)]
    pub total_budget: Duration,
    /// Most configs measured per problem, the default among them.
    #[arg(long, default_value_t = 64, value_parser = parse_count)]
    pub max_configs: usize,
    /// Re-tune problems that already have a winner for this device and kernel version.
    #[arg(long)]
    pub retune: bool,
    /// Which GPU of those this process sees to tune on (default 0). One `tune` per GPU of a
    /// node, on one database and the same shapes, divide the problems among them.
    #[arg(long, value_name = "N")]
    pub gpu: Option<usize>,
    /// Print the summary as JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShapesArgs {
    #[command(flatten)]
    pub shapes: ShapeArgs,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub shapes: ShapeArgs,
    /// `default`, `heuristic`, `best` (the database's winner) or a config as JSON.
    #[arg(long, default_value = "default")]
    pub config: String,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub shapes: ShapeArgs,
    /// Least average waves per SIMD (AMD) or warps per scheduler (NVIDIA) worth timing;
    /// candidates below are pruned.
    #[arg(long, default_value_t = 1.0)]
    pub min_occupancy: f64,
    /// Plan at most this many candidates per problem (evenly spaced, plus the default).
    #[arg(long)]
    pub max_candidates: Option<usize>,
    /// Also run each kept build on this CPU through the host emulator, against the reference
    /// on a reduced problem, and prune the wrong ones (needs a C++ compiler).
    #[arg(long)]
    pub emulate: bool,
    /// Compiles run at once (default: one per core).
    #[arg(long, short = 'j', value_parser = parse_jobs)]
    pub jobs: Option<usize>,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub shapes: ShapeArgs,
}

/// A count of configs: at least one, since the default is always measured.
pub fn parse_count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("`0`: at least 1, the default config, is measured per problem".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a whole number of configs")),
    }
}

/// How many compiles run at once: at least one.
fn parse_jobs(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("`0`: at least one compile runs at a time".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a whole number of compiles")),
    }
}

/// `30s`, `500ms`, `5m`, `1h`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| s.split_at(i))
        .unwrap_or((s, "s"));
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration such as 30s, 500ms or 5m"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s, m or h)")),
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("`{s}` must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}
