//! Paged attention's GPU space: a thread per cached token, or groups of lanes per token
//! reading its rows in 16-byte pieces; a block's query heads (one, or several of one KV head
//! sharing each row it reads), on CUDA cores, NVIDIA's tensor cores or AMD's matrix cores;
//! partitions of long contexts and threads per block.

use crate::config::GpuPagedConfig;
use crate::device::GpuModel;
use crate::problem::PagedProblem;
use crate::{Family, KernelError};

use super::{check_threads, has_mfma, has_mma, invalid, vec_of};

/// Dims of the query and of the P·V sums a lane of grouped paged attention holds.
const PAGED_MAX_DIMS_PER_LANE: usize = 16;

/// The most query heads a block takes: each thread keeps a score and then a P·V sum per head
/// in registers.
const PAGED_MAX_HEADS: usize = 16;

pub(super) fn validate(
    c: &GpuPagedConfig,
    p: &PagedProblem,
    g: &GpuModel,
) -> Result<(), KernelError> {
    let f = Family::Paged;
    if c.partition == 0 || !c.partition.is_multiple_of(p.block_size) || c.partition > 8192 {
        return Err(invalid(
            f,
            format!(
                "partition = {} must be a positive multiple of block_size {} up to 8192",
                c.partition, p.block_size
            ),
        ));
    }
    if c.lanes > 1 {
        let vec = vec_of(p.dtype);
        if !c.lanes.is_power_of_two()
            || c.lanes > 32
            || !p.head_dim.is_multiple_of(c.lanes * vec)
            || !p.v_head_dim.is_multiple_of(c.lanes * vec)
            || p.head_dim / c.lanes > PAGED_MAX_DIMS_PER_LANE
        {
            return Err(invalid(
                f,
                format!(
                    "lanes = {}: a power of two up to 32 whose lanes each take whole 16-byte pieces ({vec} values) of head_dim {} and of v_head_dim {}, at most {PAGED_MAX_DIMS_PER_LANE} dims a lane",
                    c.lanes, p.head_dim, p.v_head_dim
                ),
            ));
        }
    } else if c.lanes != 1 {
        return Err(invalid(f, "lanes = 0: a token takes at least one thread"));
    }
    if !c.heads.is_power_of_two() || c.heads > PAGED_MAX_HEADS || !p.group().is_multiple_of(c.heads)
    {
        return Err(invalid(
            f,
            format!(
                "heads = {}: a power of two up to {PAGED_MAX_HEADS} that divides the {} query heads of a KV head",
                c.heads,
                p.group()
            ),
        ));
    }
    if c.heads > 1 && c.lanes != 1 {
        return Err(invalid(
            f,
            format!(
                "heads = {} takes a thread a token: set lanes = 1 (not {})",
                c.heads, c.lanes
            ),
        ));
    }
    check_threads(f, c.threads, g)?;
    if c.mma {
        validate_mma(c, p, g)?;
    }
    if c.mfma {
        validate_mfma(c, p, g)?;
    }
    Ok(())
}

/// What both vendors' matrix-core forms need: the device's instructions (`whose`: whose they
/// are, for the error), a 16-bit query for their operands, and a thread a token.
fn matrix_core_inputs(
    form: &str,
    whose: &str,
    present: bool,
    c: &GpuPagedConfig,
    p: &PagedProblem,
    g: &GpuModel,
) -> Result<(), KernelError> {
    let f = Family::Paged;
    if !present {
        return Err(invalid(
            f,
            format!(
                "{form}: {whose}, not {}'s ({}); drop `{form}`",
                g.name, g.arch
            ),
        ));
    }
    if p.dtype.size() != 2 {
        return Err(invalid(
            f,
            format!(
                "{form} takes a 16-bit query (f16 or bf16), not {}; drop `{form}`",
                p.dtype
            ),
        ));
    }
    if c.lanes != 1 {
        return Err(invalid(
            f,
            format!("{form} takes lanes = 1 (not {})", c.lanes),
        ));
    }
    Ok(())
}

/// The matrix-core form on AMD: `v_mfma_f32_16x16x16` (CDNA2 and CDNA3) on 16-bit values (an
/// fp8 cache's widened in registers), key rows read 32 dims a step and value rows 128 columns
/// a step (each lane a 16-byte piece of a row).
fn validate_mfma(c: &GpuPagedConfig, p: &PagedProblem, g: &GpuModel) -> Result<(), KernelError> {
    let f = Family::Paged;
    if c.mma {
        return Err(invalid(
            f,
            "mma and mfma are NVIDIA's and AMD's matrix cores: choose one",
        ));
    }
    matrix_core_inputs(
        "mfma",
        "matrix cores by v_mfma_f32_16x16x16 are CDNA2's and CDNA3's (gfx90a, gfx942)",
        has_mfma(g),
        c,
        p,
        g,
    )?;
    if !p.head_dim.is_multiple_of(32) || !p.v_head_dim.is_multiple_of(128) {
        return Err(invalid(
            f,
            format!(
                "mfma reads key rows 32 dims a step and value rows 128 columns a step: head_dim {} must be a multiple of 32 and v_head_dim {} of 128",
                p.head_dim, p.v_head_dim
            ),
        ));
    }
    Ok(())
}

/// The tensor-core form: NVIDIA's `mma.sync` on 16-bit values (an fp8 cache's widened into
/// the query's type in shared memory), whole 16-dim steps of the key rows, each warp's value
/// columns whole pairs of 8-column tiles, and partitions of whole token tiles.
fn validate_mma(c: &GpuPagedConfig, p: &PagedProblem, g: &GpuModel) -> Result<(), KernelError> {
    let f = Family::Paged;
    matrix_core_inputs(
        "mma",
        "tensor cores by mma.sync are NVIDIA's (sm_80 and later)",
        has_mma(g),
        c,
        p,
        g,
    )?;
    let warps = c.threads / g.wave_size as usize;
    if !p.head_dim.is_multiple_of(16) || !p.v_head_dim.is_multiple_of(16 * warps) {
        return Err(invalid(
            f,
            format!(
                "mma with {warps} warps: head_dim {} must be a multiple of 16 and v_head_dim {} of 16 a warp ({})",
                p.head_dim,
                p.v_head_dim,
                16 * warps
            ),
        ));
    }
    let tile = c.mma_tile(g.wave_size as usize);
    if !c.partition.is_multiple_of(tile) {
        return Err(invalid(
            f,
            format!(
                "mma with {warps} warps multiplies tiles of {tile} tokens: partition = {} must be a multiple of {tile}",
                c.partition
            ),
        ));
    }
    Ok(())
}

/// Tensor cores first where they apply (NVIDIA's or AMD's, 16-bit queries: each row read
/// once for a KV head's group, both products at a small part of the vector units' time),
/// then groups of
/// lanes per token (16-byte loads of whole rows), a thread per token, and blocks of several
/// query heads on CUDA cores (shorter partitions: their scores are a row per head).
pub(super) fn candidates() -> Vec<GpuPagedConfig> {
    let mut out = Vec::new();
    // Tensor cores: a KV head's whole group of heads a block where it is up to 16 (4 for
    // Llama-3.1-8B, 8 for Llama-3.1-70B at TP8, 16 for a latent decode at DeepSeek's TP8),
    // short partitions for few long sequences (each block a tile or a few), long ones for
    // many.
    for heads in [16, 8, 4] {
        for partition in [64, 128, 256, 512, 1024] {
            for threads in [64, 128, 256] {
                out.push(GpuPagedConfig {
                    partition,
                    threads,
                    lanes: 1,
                    heads,
                    mma: true,
                    mfma: false,
                });
            }
        }
    }
    // AMD's matrix cores: the same groups; each wave takes its own tiles of 16 tokens, so a
    // partition of 64 is a tile a wave at 256 threads.
    for heads in [16, 8, 4] {
        for partition in [64, 128, 256, 512, 1024] {
            for threads in [64, 128, 256] {
                out.push(GpuPagedConfig {
                    partition,
                    threads,
                    lanes: 1,
                    heads,
                    mma: false,
                    mfma: true,
                });
            }
        }
    }
    for lanes in [16, 8, 4, 32, 1] {
        for partition in [256, 512, 1024] {
            for threads in [64, 128, 256, 512] {
                out.push(GpuPagedConfig {
                    partition,
                    threads,
                    lanes,
                    heads: 1,
                    mma: false,
                    mfma: false,
                });
            }
        }
    }
    for heads in [2, 4, 8, 16] {
        for partition in [128, 256, 512] {
            for threads in [64, 128, 256] {
                out.push(GpuPagedConfig {
                    partition,
                    threads,
                    lanes: 1,
                    heads,
                    mma: false,
                    mfma: false,
                });
            }
        }
    }
    out
}

/// What runs untuned, and the guess for untuned shapes alike: a thread per token, 512-token
/// partitions.
pub(super) fn default(p: &PagedProblem) -> GpuPagedConfig {
    GpuPagedConfig {
        partition: 512usize.next_multiple_of(p.block_size),
        // 256 makes ptxas spill a word on sm_90; 128 spills nowhere.
        threads: 128,
        lanes: 1,
        heads: 1,
        mma: false,
        mfma: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::launch::{launches, DevicePtrs};
    use crate::{Config, Device, Problem};

    fn on(model: &str, spec: &str) -> (&'static GpuModel, PagedProblem) {
        let Device::Gpu(g) = Device::lookup(model).unwrap() else {
            unreachable!("{model} is a GPU")
        };
        let Problem::Paged(p) = spec.parse().unwrap() else {
            unreachable!("{spec} is paged")
        };
        (g, p)
    }

    /// Blocks of several heads: stored without `heads`, a config is one head a block; with
    /// it, the field reads back, the launch's grid has a block per group of heads, and heads
    /// that do not divide a KV head's group, too many of them, or lanes beside them are
    /// refused by name.
    #[test]
    fn blocks_of_several_heads_are_stored_launched_and_checked() {
        let (g, p) = on(
            "h200",
            "paged:num_seqs=3,context_len=1000,q_heads=16,kv_heads=2,head_dim=128,dtype=bf16",
        );
        let old: GpuPagedConfig =
            serde_json::from_str(r#"{"partition":256,"threads":128}"#).unwrap();
        assert_eq!((old.lanes, old.heads), (1, 1));
        assert!(!serde_json::to_string(&old).unwrap().contains("heads"));
        let c = GpuPagedConfig { heads: 8, ..old };
        validate(&c, &p, g).unwrap();
        assert_eq!(c.to_string(), "gpu partition=256 threads=128 heads=8");
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<GpuPagedConfig>(&json).unwrap(), c);
        let l = launches(
            &Problem::Paged(p),
            &Config::GpuPaged(c),
            &DevicePtrs::default(),
        )
        .unwrap();
        assert_eq!(l[0].grid, [4, 2, 3]);
        // The reduction still takes one head a block.
        assert_eq!(l[1].grid, [16, 3, 1]);
        for (bad, named) in [
            (GpuPagedConfig { heads: 3, ..c }, "heads = 3"),
            (
                GpuPagedConfig { heads: 16, ..c },
                "divides the 8 query heads",
            ),
            (GpuPagedConfig { heads: 32, ..c }, "up to 16"),
            (GpuPagedConfig { lanes: 16, ..c }, "set lanes = 1"),
        ] {
            let e = validate(&bad, &p, g).unwrap_err().to_string();
            assert!(e.contains(named), "{bad}: {e}");
        }
        // Every candidate of several heads for this problem is valid or refused, and some are
        // offered.
        let offered = candidates()
            .into_iter()
            .filter(|c| c.heads > 1 && !c.mma && validate(c, &p, g).is_ok())
            .count();
        assert_eq!(offered, 3 * 3 * 3);
    }

    /// Tensor-core blocks: stored without `mma`, a config is on CUDA cores; with it, the
    /// field reads back, the build and launch take its shared memory (two stages of 64 of
    /// DeepSeek's rows of 584 halves, the query, weights, scores and row statistics; on an
    /// fp8 cache two stages of bytes and one widened), and what the tensor cores cannot take
    /// is refused by name: an AMD device, f32, lanes, key rows of no 16-dim steps, value
    /// columns a warp short of 16, partitions of no whole tiles, and stages past the block's
    /// shared memory.
    #[test]
    fn tensor_core_blocks_are_stored_sized_launched_and_checked() {
        use crate::gpu::KernelBuild;
        use crate::space::{dynamic_lds_bytes, GpuSpace};
        use crate::Space;
        let deepseek = "paged:num_seqs=3,context_len=1000,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=64,dtype=bf16";
        let (g, p) = on("h200", deepseek);
        let old: GpuPagedConfig =
            serde_json::from_str(r#"{"partition":256,"threads":128,"heads":16}"#).unwrap();
        assert!(!old.mma);
        let c = GpuPagedConfig { mma: true, ..old };
        validate(&c, &p, g).unwrap();
        assert_eq!(c.to_string(), "gpu partition=256 threads=128 heads=16 mma");
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<GpuPagedConfig>(&json).unwrap(), c);
        let (problem, config) = (Problem::Paged(p), Config::GpuPaged(c));
        let bytes = 2 * (2 * 64 * 584 + 16 * 584 + 16 * 72) + 4 * (16 * 64 + 3 * 16);
        assert_eq!(bytes, 174_784);
        assert_eq!(dynamic_lds_bytes(&config, &problem), bytes);
        let build = KernelBuild::new(&problem, &config).unwrap();
        for define in [
            "KT_PAGED_MMA=1",
            "KT_HEADS=16",
            "KT_DV=512",
            &format!("KT_DYN_LDS={bytes}"),
        ] {
            assert!(build.key().contains(define), "{}", build.key());
        }
        let l = launches(&problem, &config, &DevicePtrs::default()).unwrap();
        assert_eq!((l[0].grid, l[0].shared_bytes), ([4, 1, 3], bytes as u32));
        assert_eq!(l[1].shared_bytes, 0);
        let fp8: Problem = format!("{deepseek},kv_dtype=fp8_e4m3").parse().unwrap();
        assert_eq!(
            dynamic_lds_bytes(&config, &fp8),
            2 * 64 * 576 + 2 * 64 * 584 + 2 * (16 * 584 + 16 * 72) + 4 * (16 * 64 + 3 * 16)
        );
        assert!(GpuSpace.validate(&config, &fp8, &Device::Gpu(g)).is_ok());

        let (mi250, _) = on("mi250", deepseek);
        let e = validate(&GpuPagedConfig { threads: 256, ..c }, &p, mi250).unwrap_err();
        assert!(e.to_string().contains("NVIDIA's"), "{e}");
        let (_, f32_problem) = on(
            "h200",
            "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128",
        );
        let llama = GpuPagedConfig { heads: 8, ..c };
        let e = validate(&llama, &f32_problem, g).unwrap_err();
        assert!(e.to_string().contains("16-bit query"), "{e}");
        for (bad, spec, named) in [
            (
                GpuPagedConfig { heads: 1, lanes: 16, ..c },
                "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
                "mma takes lanes = 1",
            ),
            (
                GpuPagedConfig { heads: 8, ..c },
                "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=72,dtype=bf16",
                "head_dim 72 must be a multiple of 16",
            ),
            (
                GpuPagedConfig { heads: 8, threads: 256, ..c },
                "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16,block_size=32",
                "v_head_dim 64 of 16 a warp (128)",
            ),
            (
                GpuPagedConfig { partition: 96, ..c },
                "paged:num_seqs=3,context_len=1000,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=32,dtype=bf16",
                "partition = 96 must be a multiple of 64",
            ),
        ] {
            let (_, p) = on("h200", spec);
            let e = validate(&bad, &p, g).unwrap_err().to_string();
            assert!(e.contains(named), "{bad}: {e}");
        }
        // Eight warps' stages of DeepSeek's rows, 316 KiB, are more than an H200's block has.
        let e = GpuSpace
            .validate(
                &Config::GpuPaged(GpuPagedConfig { threads: 256, ..c }),
                &problem,
                &Device::Gpu(g),
            )
            .unwrap_err();
        assert!(
            e.to_string().contains("bytes of shared memory per block"),
            "{e}"
        );
    }

    /// Matrix-core blocks on AMD: stored without `mfma`, a config is on the vector units;
    /// with it, the field reads back, the build takes its macros and static LDS (DeepSeek's
    /// 16 query rows of 584 halves, or a chunk of 16 heads' 128 outputs where the rows are
    /// shorter, and each wave's maxima and sums), the launch its grid and 16-byte inputs, and
    /// what the matrix cores cannot take is refused by name: an NVIDIA device or an RDNA one,
    /// `mma` beside it, f32, lanes, key rows of no 32-dim steps, values of no 128 columns.
    #[test]
    fn matrix_core_blocks_are_stored_sized_launched_and_checked() {
        use crate::gpu::launch::input_alignment;
        use crate::gpu::KernelBuild;
        use crate::space::{dynamic_lds_bytes, lds_bytes};
        let deepseek = "paged:num_seqs=3,context_len=1000,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=64,dtype=bf16";
        let (g, p) = on("mi300x", deepseek);
        let old: GpuPagedConfig =
            serde_json::from_str(r#"{"partition":256,"threads":256,"heads":16}"#).unwrap();
        assert!(!old.mfma);
        let c = GpuPagedConfig { mfma: true, ..old };
        validate(&c, &p, g).unwrap();
        assert_eq!(c.to_string(), "gpu partition=256 threads=256 heads=16 mfma");
        let json = serde_json::to_string(&c).unwrap();
        assert!(
            json.contains(r#""mfma":true"#) && !json.contains(r#""mma""#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<GpuPagedConfig>(&json).unwrap(), c);
        let (problem, config) = (Problem::Paged(p), Config::GpuPaged(c));
        // Four waves: 16 rows of 584 halves, then 4 waves' 16 maxima and 16 sums.
        assert_eq!(
            lds_bytes(&config, &problem, g),
            2 * 16 * 584 + 2 * 4 * 4 * 16
        );
        assert_eq!(dynamic_lds_bytes(&config, &problem), 0);
        let (_, llama) = on(
            "mi250",
            "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128,dtype=f16",
        );
        let llama_config = GpuPagedConfig {
            heads: 8,
            threads: 64,
            ..c
        };
        // Rows of 136 halves are less than a chunk of 8 heads' 128 floats.
        assert_eq!(
            lds_bytes(&Config::GpuPaged(llama_config), &Problem::Paged(llama), g),
            4 * 8 * 128 + 2 * 4 * 16
        );
        let build = KernelBuild::new(&problem, &config).unwrap();
        for define in ["KT_PAGED_MFMA=1", "KT_HEADS=16", "KT_DV=512"] {
            assert!(build.key().contains(define), "{}", build.key());
        }
        assert!(!build.key().contains("KT_PAGED_MMA"), "{}", build.key());
        assert_eq!(build.dynamic_lds, 0);
        let l = launches(&problem, &config, &DevicePtrs::default()).unwrap();
        assert_eq!((l[0].grid, l[0].shared_bytes), ([4, 1, 3], 0));
        assert_eq!(input_alignment(&problem, &config), 16);

        for model in ["h200", "rx7900xtx"] {
            let (other, _) = on(model, deepseek);
            let e = validate(&GpuPagedConfig { threads: 128, ..c }, &p, other)
                .unwrap_err()
                .to_string();
            assert!(e.contains("CDNA2's and CDNA3's"), "{model}: {e}");
        }
        let (h200, _) = on("h200", deepseek);
        let both = GpuPagedConfig {
            mma: true,
            threads: 128,
            ..c
        };
        let e = validate(&both, &p, h200).unwrap_err().to_string();
        assert!(e.contains("choose one"), "{e}");
        for (bad, spec, named) in [
            (
                GpuPagedConfig { heads: 8, ..c },
                "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128",
                "16-bit query",
            ),
            (
                GpuPagedConfig {
                    heads: 1,
                    lanes: 16,
                    ..c
                },
                "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
                "mfma takes lanes = 1",
            ),
            (
                GpuPagedConfig { heads: 8, ..c },
                "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=80,dtype=bf16",
                "head_dim 80 must be a multiple of 32",
            ),
            (
                GpuPagedConfig { heads: 8, ..c },
                "paged:num_seqs=3,context_len=1000,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16",
                "v_head_dim 64 of 128",
            ),
        ] {
            let (_, p) = on("mi300x", spec);
            let e = validate(&bad, &p, g).unwrap_err().to_string();
            assert!(e.contains(named), "{bad}: {e}");
        }
        // Every matrix-core candidate of DeepSeek's decode is valid on an MI300X: 3 head
        // counts by 5 partitions by 3 block sizes.
        let offered = candidates()
            .into_iter()
            .filter(|c| c.mfma && validate(c, &p, g).is_ok())
            .count();
        assert_eq!(offered, 45);
    }
}
