//! Every GPU config of the space, run by the host emulator (kernels/emulator/simt.h) and
//! checked against the reference on awkward sizes: the GPU kernels' numerics, fragment
//! layouts of NVIDIA's mma.sync and AMD's MFMA included, verified without a GPU.
//!
//! Three emulated models cover the kernels' paths: an H200 (32-wide warps, mma.sync), an
//! MI250 (64-wide waves, MFMA) and a Radeon RX 7900 XTX (32-wide waves, neither). The A100,
//! H100, MI300X and MI325X emulate as the model of their kind: same wave width, same
//! instructions; their spaces differ only in limits.
//!
//! Needs a C++ compiler (`c++`, `g++` or `clang++`, or `$KERNTUNE_HOST_CXX`); without one the
//! tests fail, saying so.

use kerntune_kernels::config::{
    GpuFlashConfig, GpuFlashVariant, GpuGemmConfig, GpuGemmVariant, GpuPagedConfig,
};
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::gpu::emulator::Emulator;
use kerntune_kernels::reference::relative_error;
use kerntune_kernels::{Config, Device, GpuSpace, KernelError, Problem, Space};

fn emulator(model: &str) -> (Device, Emulator) {
    let device = Device::lookup(model).unwrap();
    let Device::Gpu(g) = device else {
        unreachable!("{model} is a GPU of the catalog")
    };
    let emu = Emulator::new(g).unwrap_or_else(|e| panic!("the GPU emulator tests need it: {e}"));
    (device, emu)
}

/// Runs every candidate of the space for `spec` (with sequences of `context_lens`, for paged
/// attention) and asserts each matches the reference; returns how many ran. The paged forms
/// on matrix cores, a build for each partition and each of forty-odd of them a problem, have
/// tests of their own ([`paged_tensor_core_candidates_match_the_reference`] for NVIDIA's,
/// [`paged_matrix_core_candidates_match_the_reference`] for AMD's).
fn every_candidate(model: &str, spec: &str, context_lens: Option<Vec<u32>>) -> usize {
    candidates_where(model, spec, context_lens, |c| !tensor_cores(c))
}

/// A paged config on tensor cores (NVIDIA's or AMD's).
fn tensor_cores(c: &Config) -> bool {
    matches!(c, Config::GpuPaged(p) if p.mma || p.mfma)
}

/// As [`every_candidate`], for the candidates of one GEMM variant only: shapes that add a
/// variant's sizes to what the other shapes cover.
fn every_candidate_of(model: &str, spec: &str, variant: GpuGemmVariant) -> usize {
    candidates_where(
        model,
        spec,
        None,
        |c| matches!(c, Config::GpuGemm(g) if g.variant == variant),
    )
}

fn candidates_where(
    model: &str,
    spec: &str,
    context_lens: Option<Vec<u32>>,
    keep: impl Fn(&Config) -> bool,
) -> usize {
    let (device, emu) = emulator(model);
    let problem: Problem = spec.parse().unwrap();
    let mut data = ProblemData::random(&problem, 11);
    if let Some(lens) = context_lens {
        data = data.with_context_lens(lens);
    }
    let reference = data.reference();
    let tol = problem.tolerance();
    let mut configs = GpuSpace.candidates(&problem, &device);
    configs.push(GpuSpace.default_config(&problem, &device));
    configs.push(GpuSpace.heuristic(&problem, &device));
    configs.retain(|c| keep(c));
    assert!(!configs.is_empty(), "{model} {spec}: no candidates");
    emu.prepare(configs.iter().map(|c| (&problem, c)));
    for config in &configs {
        let out = emu
            .run(&data, config)
            .unwrap_or_else(|e| panic!("{model} {spec} {config}: {e}"));
        let err = relative_error(&out, &reference);
        assert!(
            err <= tol,
            "{model} {spec} {config}: relative error {err:e} exceeds {tol:e}"
        );
    }
    configs.len()
}

/// Asserts that an edited source's run (its relative error, or the emulator's error) shows
/// `what` as a wrong result (an error over `tol`, or NaN: a poisoned read) or a fault the
/// emulator names.
fn caught(what: &str, run: Result<f64, KernelError>, tol: f64) {
    match run {
        Ok(err) => assert!(
            err.is_nan() || err > tol,
            "{what} went unnoticed: error {err:e}"
        ),
        // An edit that does not compile shows nothing about the kernel: the test's mistake.
        Err(e) if e.to_string().contains("does not compile") => {
            panic!("{what}: the edited source does not compile: {e}")
        }
        // The emulator stopped the launch: a fault a device would turn into garbage or a hang.
        Err(KernelError::EmulatorFault { .. }) => {}
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Asserts that an edited source's run stopped with the emulator's error naming `says`.
fn faults(run: Result<f64, KernelError>, says: &str) {
    match run {
        Err(e @ KernelError::EmulatorFault { .. }) => {
            assert!(e.to_string().contains(says), "expected `{says}` in: {e}")
        }
        other => panic!("expected the emulator to name `{says}`, got {other:?}"),
    }
}

fn variants(model: &str, spec: &str) -> Vec<String> {
    let (device, _) = emulator(model);
    let problem: Problem = spec.parse().unwrap();
    let mut v: Vec<String> = GpuSpace
        .candidates(&problem, &device)
        .iter()
        .filter_map(|c| match c {
            Config::GpuGemm(g) => Some(format!("{:?}", g.variant)),
            _ => None,
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

// GEMM: primes and sizes no tile divides, M = 1, K shorter than a k tile; both B layouts and
// the three input types. The 16-bit problems run the matrix-core variants too.
const GEMM_BF16_NK: &str = "gemm:m=67,n=130,k=40,dtype=bf16,b=nk";
const GEMM_F16_KN: &str = "gemm:m=1,n=97,k=7,dtype=f16,b=kn";
const GEMM_F32: &str = "gemm:m=37,n=100,k=61,dtype=f32,b=nk";
// Decode: a few rows, k a multiple of 8 (the pipelined mma variant's 16-byte copies) but of
// no k tile, so split-K leaves some splits a partial tile and others none; n of no n tile.
const GEMM_F16_KN_DECODE: &str = "gemm:m=5,n=136,k=72,dtype=f16,b=kn";
const GEMM_BF16_NK_DECODE: &str = "gemm:m=3,n=200,k=264,dtype=bf16,b=nk";
// The skinny variant's 16-byte pieces: 4 f32 or 8 f16 values, k of no tile (a partial last
// tile), n prime.
const GEMM_F32_NK_DECODE: &str = "gemm:m=2,n=61,k=132,dtype=f32,b=nk";
const GEMM_F16_NK_GEMV: &str = "gemm:m=1,n=37,k=1000,dtype=f16,b=nk";
// fp8 (W8A8) GEMMs, each row of A and column of C its own scale: odd sizes in both layouts
// (tiled, and the one-stage mma or MFMA tiles widening the bytes as they stage them), and
// decode of k a multiple of the skinny variant's 16 bytes but of no tile of it.
const GEMM_E4M3_NK: &str = "gemm:m=37,n=100,k=61,dtype=fp8_e4m3,b=nk";
const GEMM_E5M2_KN: &str = "gemm:m=1,n=97,k=7,dtype=fp8_e5m2,b=kn";
const GEMM_E4M3_NK_DECODE: &str = "gemm:m=5,n=61,k=1040,dtype=fp8_e4m3,b=nk";
const GEMM_FNUZ_NK: &str = "gemm:m=37,n=100,k=61,dtype=fp8_e4m3fnuz,b=nk";
// The pipelined mma tiles on the bytes themselves (m16n8k32): k of whole 16-byte copies but of
// no k tile, rows and columns of no tile.
const GEMM_E5M2_NK_PIPELINED: &str = "gemm:m=67,n=130,k=80,dtype=fp8_e5m2,b=nk";
// CDNA3's pipelined MFMA tiles on the bytes themselves (its fp8 MFMA reads FNUZ).
const GEMM_FNUZ_NK_PIPELINED: &str = "gemm:m=67,n=130,k=80,dtype=fp8_e4m3fnuz,b=nk";
const GEMM_FNUZ_NK_DECODE: &str = "gemm:m=3,n=40,k=528,dtype=fp8_e4m3fnuz,b=nk";
// Flash: causal with fewer queries than keys (aligned to the end), GQA, a batch of two, a
// head size that is not a power of two, one query row.
const FLASH_BF16: &str =
    "flash:batch=2,q_len=17,kv_len=37,q_heads=4,kv_heads=2,head_dim=64,dtype=bf16";
const FLASH_F16: &str =
    "flash:q_len=1,kv_len=45,q_heads=3,kv_heads=1,head_dim=80,dtype=f16,causal=false";
// Head size 128 in f16: the MFMA variant's (it needs multiples of 32), causal over two tiles.
const FLASH_F16_128: &str = "flash:q_len=40,kv_len=100,q_heads=2,kv_heads=1,head_dim=128,dtype=f16";
// Paged: sequences of 1 token, a whole partition and a ragged one.
const PAGED_BF16: &str =
    "paged:num_seqs=3,context_len=600,q_heads=8,kv_heads=2,head_dim=64,block_size=16,dtype=bf16";
const PAGED_BF16_128: &str =
    "paged:num_seqs=2,context_len=300,q_heads=4,kv_heads=1,head_dim=128,block_size=16,dtype=bf16";
const PAGED_F16_256: &str =
    "paged:num_seqs=1,context_len=40,q_heads=2,kv_heads=2,head_dim=256,block_size=16,dtype=f16";
const PAGED_F32: &str =
    "paged:num_seqs=2,context_len=77,q_heads=4,kv_heads=4,head_dim=96,block_size=32,dtype=f32";

#[test]
fn nvidia_gemm_candidates_match_the_reference() {
    assert!(variants("h200", GEMM_BF16_NK).contains(&"Mma".to_string()));
    assert!(variants("h200", GEMM_BF16_NK).contains(&"Wgmma".to_string()));
    assert!(variants("h200", GEMM_BF16_NK_DECODE).contains(&"Wgmma".to_string()));
    assert!(variants("h200", GEMM_BF16_NK_DECODE).contains(&"Skinny".to_string()));
    for spec in [
        GEMM_BF16_NK,
        GEMM_F16_KN,
        GEMM_F32,
        GEMM_F16_KN_DECODE,
        GEMM_BF16_NK_DECODE,
    ] {
        every_candidate("h200", spec, None);
    }
    for spec in [GEMM_F32_NK_DECODE, GEMM_F16_NK_GEMV] {
        every_candidate_of("h200", spec, GpuGemmVariant::Skinny);
    }
}

#[test]
fn fp8_gemm_candidates_match_the_reference() {
    assert_eq!(variants("h200", GEMM_E4M3_NK), ["Mma", "Tiled"]);
    assert_eq!(
        variants("h200", GEMM_E4M3_NK_DECODE),
        ["Mma", "Skinny", "Tiled", "Wgmma"]
    );
    assert_eq!(variants("mi300x", GEMM_FNUZ_NK), ["Mfma", "Tiled"]);
    // The bytes themselves into m16n8k32 and Hopper's m64nNk32, where k is of 16-byte rows.
    assert_eq!(
        variants("h200", GEMM_E5M2_NK_PIPELINED),
        ["Mma", "Tiled", "Wgmma"]
    );
    for spec in [
        GEMM_E4M3_NK,
        GEMM_E5M2_KN,
        GEMM_E4M3_NK_DECODE,
        GEMM_E5M2_NK_PIPELINED,
    ] {
        every_candidate("h200", spec, None);
    }
    for spec in [GEMM_FNUZ_NK, GEMM_FNUZ_NK_DECODE, GEMM_FNUZ_NK_PIPELINED] {
        every_candidate("mi300x", spec, None);
    }
}

// Block-scaled fp8 (DeepSeek-V3's FP8 checkpoints): k of a partial last group, n crossing
// weight blocks and of no tile, prompts and decode sharing their tiled builds; blocks of 32
// and 64 (a skinny piece of 16 bytes still in one group). k of 16-byte rows takes the
// pipelined mma and MFMA tiles on the bytes, each k tile inside a group.
const GEMM_E4M3_BLOCKS: &str = "gemm:m=37,n=100,k=300,dtype=fp8_e4m3,b=nk,block=128";
const GEMM_E5M2_BLOCKS_PIPELINED: &str = "gemm:m=67,n=130,k=400,dtype=fp8_e5m2,b=nk,block=128";
const GEMM_FNUZ_BLOCKS_PIPELINED: &str = "gemm:m=67,n=130,k=400,dtype=fp8_e4m3fnuz,b=nk,block=128";
const GEMM_E4M3_BLOCKS_DECODE: &str = "gemm:m=5,n=161,k=1040,dtype=fp8_e4m3,b=nk,block=128";
const GEMM_E5M2_BLOCKS_GEMV: &str = "gemm:m=1,n=67,k=96,dtype=fp8_e5m2,b=nk,block=32";
const GEMM_FNUZ_BLOCKS_DECODE: &str = "gemm:m=3,n=40,k=528,dtype=fp8_e4m3fnuz,b=nk,block=64";

#[test]
fn block_scaled_fp8_candidates_match_the_reference() {
    assert_eq!(variants("h200", GEMM_E4M3_BLOCKS), ["Mma", "Tiled"]);
    assert_eq!(
        variants("h200", GEMM_E4M3_BLOCKS_DECODE),
        ["Mma", "Skinny", "Tiled", "Wgmma"]
    );
    assert_eq!(
        variants("h200", GEMM_E5M2_BLOCKS_PIPELINED),
        ["Mma", "Tiled", "Wgmma"]
    );
    assert_eq!(
        variants("mi300x", GEMM_FNUZ_BLOCKS_DECODE),
        ["Mfma", "Skinny", "Tiled"]
    );
    for spec in [
        GEMM_E4M3_BLOCKS,
        GEMM_E4M3_BLOCKS_DECODE,
        GEMM_E5M2_BLOCKS_PIPELINED,
    ] {
        every_candidate("h200", spec, None);
    }
    every_candidate_of("h200", GEMM_E5M2_BLOCKS_GEMV, GpuGemmVariant::Skinny);
    every_candidate_of("mi300x", GEMM_FNUZ_BLOCKS_DECODE, GpuGemmVariant::Skinny);
    every_candidate_of("mi300x", GEMM_FNUZ_BLOCKS_PIPELINED, GpuGemmVariant::Mfma);
}

// Int4 weights (GPTQ's words, W4A16): n of no tile size; k of several groups and a partial k
// tile; groups of one word (8), of 16 and 32, and the whole of k (per channel); A in f32, f16
// and bf16; prompt rows and decode.
const GEMM_INT4_BF16: &str = "gemm:m=37,n=67,k=96,dtype=bf16,b=kn,int4=32";
const GEMM_INT4_F16_DECODE: &str = "gemm:m=5,n=33,k=1040,dtype=f16,b=kn,int4=16";
const GEMM_INT4_F32_GEMV: &str = "gemm:m=1,n=13,k=264,dtype=f32,b=kn,int4=8";
const GEMM_INT4_BF16_CHANNEL: &str = "gemm:m=3,n=40,k=520,dtype=bf16,b=kn,int4=520";

#[test]
fn int4_gemm_candidates_match_the_reference() {
    // The words are unpacked as staged (tiled, one-stage mma and MFMA) or read in place
    // (skinny, decode); the wgmma and pipelined tiles take none.
    assert_eq!(variants("h200", GEMM_INT4_BF16), ["Mma", "Tiled"]);
    assert_eq!(
        variants("h200", GEMM_INT4_F16_DECODE),
        ["Mma", "Skinny", "Tiled"]
    );
    assert_eq!(
        variants("mi300x", GEMM_INT4_BF16_CHANNEL),
        ["Mfma", "Skinny", "Tiled"]
    );
    assert_eq!(
        variants("rx7900xtx", GEMM_INT4_F32_GEMV),
        ["Skinny", "Tiled"]
    );
    every_candidate("h200", GEMM_INT4_BF16, None);
    every_candidate_of("h200", GEMM_INT4_F16_DECODE, GpuGemmVariant::Skinny);
    every_candidate_of("rx7900xtx", GEMM_INT4_F32_GEMV, GpuGemmVariant::Skinny);
    // One word of k, one column.
    every_candidate("h200", "gemm:m=1,n=1,k=8,dtype=f16,b=kn,int4=8", None);
    every_candidate("mi300x", GEMM_INT4_BF16_CHANNEL, None);
}

/// Each int4 kernel unpacks value `e` of a word from its own bits and takes its group's scale
/// and zero point (8 where the checkpoint has none); the skinny variant's correction for the
/// zero point counts. Each mistake shows on k of three groups, n of no tile size.
#[test]
fn int4_kernels_take_each_values_bits_group_and_zero_point() {
    let (device, emu) = emulator("h200");
    let problem: Problem = "gemm:m=3,n=70,k=96,dtype=bf16,b=kn,int4=32"
        .parse()
        .unwrap();
    let with_zeros = ProblemData::random(&problem, 5);
    let mut symmetric = with_zeros.clone();
    symmetric.zeros.clear();
    let source = include_str!("../hip/gemm.hip");
    let tile = |variant, bmnk, t| Config::GpuGemm(GpuGemmConfig::tile(variant, bmnk, t, 1, 1));
    let tiled = tile(GpuGemmVariant::Tiled, (32, 32, 16), (2, 2));
    let mma = tile(GpuGemmVariant::Mma, (64, 64, 32), (2, 4));
    let skinny = tile(GpuGemmVariant::Skinny, (4, 32, 256), (1, 8));
    let common = [
        // Value e from value 7 − e's bits; every group's scale and zero point group 0's.
        ("((w >> (4 * e)) & 15u)", "((w >> (4 * (7 - e))) & 15u)"),
        ("((long)((k) / KT_INT4) * n + (col))", "((long)(col))"),
    ];
    for config in [tiled, mma, skinny] {
        assert!(GpuSpace.validate(&config, &problem, &device).is_ok());
        let mut edits = common.to_vec();
        if config == skinny {
            edits.push(("t - z[j] * sa", "t - 8.0f * sa"));
        }
        source_edits_show(&emu, &with_zeros, &config, source, &edits);
        // No zero points: 8 throughout.
        source_edits_show(
            &emu,
            &symmetric,
            &config,
            source,
            &[("b_zeros[at] : 8.0f)", "b_zeros[at] : 0.0f)")],
        );
    }
}

/// Each variant's scales are its group's and block's: a mistake in either shows on a problem
/// whose scales differ by group and block (k of three groups, n of three blocks).
#[test]
fn block_scaled_fp8_kernels_take_each_groups_scales() {
    let (device, emu) = emulator("h200");
    let problem: Problem = "gemm:m=3,n=70,k=96,dtype=fp8_e4m3,b=nk,block=32"
        .parse()
        .unwrap();
    let data = ProblemData::random(&problem, 5);
    let source = include_str!("../hip/gemm.hip");
    let tiled = Config::GpuGemm(GpuGemmConfig::tile(
        GpuGemmVariant::Tiled,
        (32, 32, 16),
        (2, 2),
        1,
        1,
    ));
    let skinny = Config::GpuGemm(GpuGemmConfig::tile(
        GpuGemmVariant::Skinny,
        (4, 8, 512),
        (1, 2),
        1,
        1,
    ));
    for config in [tiled, skinny] {
        assert!(GpuSpace.validate(&config, &problem, &device).is_ok());
        source_edits_show(
            &emu,
            &data,
            &config,
            source,
            &[
                // A's group scale of the wrong group, B's of the wrong block.
                (
                    "(a_scales[(long)(row) * a_step + (g)])",
                    "(a_scales[(long)(row) * a_step])",
                ),
                (
                    "(b_scales[(long)((col) / KT_BLOCK) * b_step + (g)])",
                    "(b_scales[(long)(col) / KT_BLOCK])",
                ),
                // The readings' factor left out of C.
                (
                    "#define KT_ROW_SCALE(row) factor",
                    "#define KT_ROW_SCALE(row) 1.0f",
                ),
            ],
        );
    }
}

/// The mma and MFMA tiles' promotion: a group's products added once its last k tile is
/// multiplied, with that group's scales. Each mistake shows on k of one group and a partial
/// second ending inside a k tile's reach, split in two (the second split starting at group
/// 1), n of two weight blocks, on the pipelined tiles that
/// multiply the bytes (NVIDIA's m16n8k32 and m64nNk32, CDNA3's fp8 MFMA) and the one-stage
/// ones that widen them.
#[test]
fn block_scaled_matrix_core_tiles_promote_each_group() {
    let tile = |variant, bmnk, t, stages| {
        Config::GpuGemm(GpuGemmConfig::tile(variant, bmnk, t, stages, 2))
    };
    for (model, spec, configs) in [
        (
            "h200",
            "gemm:m=20,n=150,k=176,dtype=fp8_e4m3,b=nk,block=128",
            vec![
                tile(GpuGemmVariant::Mma, (16, 64, 64), (1, 2), 3),
                tile(GpuGemmVariant::Mma, (32, 32, 32), (1, 2), 1),
            ],
        ),
        (
            "mi300x",
            "gemm:m=20,n=150,k=176,dtype=fp8_e4m3fnuz,b=nk,block=128",
            vec![
                tile(GpuGemmVariant::Mfma, (32, 64, 64), (1, 1), 2),
                tile(GpuGemmVariant::Mfma, (32, 64, 32), (1, 1), 1),
            ],
        ),
        // wgmma's k tiles are a group of 128 bytes each: blocks of 256 for a group of two.
        (
            "h200",
            "gemm:m=20,n=300,k=304,dtype=fp8_e4m3,b=nk,block=256",
            vec![tile(GpuGemmVariant::Wgmma, (64, 64, 128), (1, 64), 3)],
        ),
    ] {
        let (device, emu) = emulator(model);
        let problem: Problem = spec.parse().unwrap();
        let data = ProblemData::random(&problem, 9);
        let source = include_str!("../hip/gemm.hip");
        for config in configs {
            GpuSpace
                .validate(&config, &problem, &device)
                .unwrap_or_else(|e| panic!("{config}: {e}"));
            let Config::GpuGemm(g) = config else {
                unreachable!()
            };
            let edits: Vec<(&str, &str)> = match (g.variant, g.stages) {
                (GpuGemmVariant::Mma, 1) => vec![
                    (
                        "if ((k0 + KT_BK) % KT_BLOCK == 0 || k0 + KT_BK >= ke) promote",
                        "if ((k0 + KT_BK) % KT_BLOCK == 0) promote",
                    ),
                    (
                        "kt_mma(KT_MMA_ACC[i][j], af[i], bf[j])",
                        "kt_mma(acc[i][j], af[i], bf[j])",
                    ),
                    (
                        "sa[e / 2] * sb, acc[i][j][e]",
                        "sa[e % 2] * sb, acc[i][j][e]",
                    ),
                ],
                (GpuGemmVariant::Wgmma, _) => vec![
                    (
                        "if ((kv + KT_BK) % KT_BLOCK == 0 || tile + 1 == tiles) {",
                        "if ((kv + KT_BK) % KT_BLOCK == 0) {",
                    ),
                    (
                        "const int kv = (kb + tile * KT_BKW) * (KT_BK / KT_BKW);",
                        "const int kv = tile * KT_BK;",
                    ),
                    ("kt_issue(KT_WGMMA_ACC, as, bs", "kt_issue(acc, as, bs"),
                    (
                        "KT_A_GROUP_SCALE(min(r0 + 8, m - 1), group)",
                        "KT_A_GROUP_SCALE(min(r0, m - 1), group)",
                    ),
                ],
                (GpuGemmVariant::Mma, _) => vec![
                    (
                        "if ((kv + KT_BK) % KT_BLOCK == 0 || tile + 1 == tiles)",
                        "if ((kv + KT_BK) % KT_BLOCK == 0)",
                    ),
                    (
                        "const int kv = kb + tile * KT_BK;",
                        "const int kv = tile * KT_BK;",
                    ),
                    (
                        "KT_MMA_STEP(KT_MMA_ACC[i][j], af[i], bf[j])",
                        "KT_MMA_STEP(acc[i][j], af[i], bf[j])",
                    ),
                ],
                (_, stages) => {
                    let mut edits = vec![
                        (
                            "if ((kv + KT_BK) % KT_BLOCK == 0 || k0 + KT_BKW >= kel)",
                            "if ((kv + KT_BK) % KT_BLOCK == 0)",
                        ),
                        (
                            "const float sa = KT_A_GROUP_SCALE(min(gr, m - 1), group);",
                            "const float sa = KT_A_GROUP_SCALE(min(gr - e % 4, m - 1), group);",
                        ),
                    ];
                    if stages == 2 {
                        // Words where the tiles hold bytes: the groups of half the k.
                        edits.push((
                            "const int kv = k0 * (KT_BK / KT_BKW);",
                            "const int kv = k0;",
                        ));
                    }
                    edits
                }
            };
            source_edits_show(&emu, &data, &config, source, &edits);
        }
    }
}

#[test]
fn amd_cdna_gemm_candidates_match_the_reference() {
    assert!(variants("mi250", GEMM_BF16_NK).contains(&"Mfma".to_string()));
    assert!(variants("mi250", GEMM_BF16_NK_DECODE).contains(&"Skinny".to_string()));
    for spec in [GEMM_BF16_NK, GEMM_F16_KN, GEMM_F32, GEMM_BF16_NK_DECODE] {
        every_candidate("mi250", spec, None);
    }
    every_candidate_of("mi250", GEMM_F32_NK_DECODE, GpuGemmVariant::Skinny);
}

#[test]
fn amd_rdna_gemm_candidates_match_the_reference() {
    assert_eq!(variants("rx7900xtx", GEMM_BF16_NK), ["Tiled"]);
    assert_eq!(variants("rx7900xtx", GEMM_F16_NK_GEMV), ["Skinny", "Tiled"]);
    every_candidate("rx7900xtx", GEMM_BF16_NK, None);
    every_candidate_of("rx7900xtx", GEMM_F16_NK_GEMV, GpuGemmVariant::Skinny);
}

#[test]
fn flash_candidates_match_the_reference_on_32_and_64_wide_waves() {
    for model in ["h200", "mi250"] {
        for spec in [FLASH_BF16, FLASH_F16, FLASH_F16_128] {
            every_candidate(model, spec, None);
        }
    }
}

// Sliding windows: shorter than any key tile, over queries aligned to the end of more keys
// (split runs some rows see nothing of, rows whose keys lie in one run past the first);
// longer than a 32-key tile at head size 128 (the MFMA variant's).
const FLASH_BF16_WINDOW: &str =
    "flash:q_len=70,kv_len=130,q_heads=2,kv_heads=1,head_dim=64,dtype=bf16,window=13";
const FLASH_F16_128_WINDOW: &str =
    "flash:q_len=40,kv_len=100,q_heads=2,kv_heads=1,head_dim=128,dtype=f16,window=45";

#[test]
fn flash_candidates_match_the_reference_within_a_window() {
    for model in ["h200", "mi250"] {
        for spec in [FLASH_BF16_WINDOW, FLASH_F16_128_WINDOW] {
            every_candidate(model, spec, None);
        }
    }
}

// Value heads narrower than the keys (latent attention's prefill): DeepSeek's 192 and 128 at
// its scale, over more keys than queries (split runs); 128 and 64 in f16 with a window and
// sinks; 40 and 24, whole 8s but not 16s (the rows variant's alone, on NVIDIA).
const FLASH_DEEPSEEK: &str = "flash:q_len=70,kv_len=130,q_heads=2,kv_heads=2,head_dim=192,v_head_dim=128,dtype=bf16,scale=0.1352";
const FLASH_NARROW: &str =
    "flash:q_len=70,kv_len=130,q_heads=4,kv_heads=2,head_dim=128,v_head_dim=64,dtype=bf16";

#[test]
fn flash_candidates_match_the_reference_with_narrow_values() {
    for model in ["h200", "mi250"] {
        for spec in [
            FLASH_DEEPSEEK.to_string(),
            FLASH_NARROW.replace("bf16", "f16") + ",window=45,sinks=true",
            "flash:q_len=33,kv_len=33,q_heads=4,kv_heads=1,head_dim=40,v_head_dim=24,dtype=f16"
                .to_string(),
        ] {
            every_candidate(model, &spec, None);
        }
    }
    // Each form reads V and writes its output (and combines split partial) rows at
    // v_head_dim. A problem small enough that rows taken at head_dim stay within the
    // emulator's guard bytes (further out, a write would corrupt the test's own memory).
    let v_at_d = ("kt_load(v, at * KT_DV + x)", "kt_load(v, at * KT_D + x)");
    let rows_out = ("out[row * KT_DV + lane", "out[row * KT_D + lane");
    let mma_v = (
        "load(vs, v, key_begin, KT_DV)",
        "load(vs, v, key_begin, KT_D)",
    );
    let mma_out = (
        "out[orow(m, r) + 8 * d + 2 * t]",
        "out[qrow(m, r) + 8 * d + 2 * t]",
    );
    let reduce_part = (
        "part_out[slot * KT_DV + e % KT_DV]",
        "part_out[slot * KT_DV + e % KT_D]",
    );
    let mfma_v = (
        "kt_load16(v + at * KT_DV + x)",
        "kt_load16(v + at * KT_D + x)",
    );
    let mfma_out = ("out[row * KT_DV + 32 * d", "out[row * KT_D + 32 * d");
    let small =
        "flash:q_len=20,kv_len=70,q_heads=2,kv_heads=1,head_dim=128,v_head_dim=64,dtype=bf16";
    every_flash_form_catches(
        &small.parse().unwrap(),
        [
            vec![v_at_d, rows_out],
            vec![mma_v, mma_out],
            vec![reduce_part],
            vec![mfma_v, mfma_out],
        ],
    );
}

// Sinks (gpt-oss): grouped heads (each query head its own sink), more keys than queries, so
// the H200's split runs combine rows whose keys span runs; decode over several partitions.
const FLASH_BF16_SINKS: &str =
    "flash:q_len=70,kv_len=130,q_heads=4,kv_heads=2,head_dim=64,dtype=bf16,sinks=true";

/// Every candidate with sinks and ALiBi together: one build each where two every-candidate
/// runs of 134 flash tiles on the H200 took 25 s each from an empty cache; and beside a sink,
/// ALiBi's bias counted from a wrong position is wrong (alone, it shifts a row's scores,
/// which its softmax takes back).
#[test]
fn attention_candidates_match_the_reference_with_sinks_and_alibi() {
    attention_candidates_match(FLASH_BF16_ALIBI, "sinks=true,alibi=true");
}

/// Every candidate of `flash` and of the paged [`PAGED_BF16`] with `extra` (sequences of one
/// token, of a partition and a ragged one) on an H200 and an MI250.
fn attention_candidates_match(flash: &str, extra: &str) {
    let paged = format!("{PAGED_BF16},{extra}");
    for model in ["h200", "mi250"] {
        every_candidate(model, flash, None);
        every_candidate(model, &paged, Some(vec![1, 600, 333]));
    }
}

/// Runs `problem` on each flash form (the H200's rows, whole mma and split mma candidates,
/// the MI250's MFMA one) with flash.hip as it is, then with each of that form's edits
/// (`from` replaced by `to` throughout), each of which must show.
fn every_flash_form_catches(problem: &Problem, edits: [Vec<(&str, &str)>; 4]) {
    let source = include_str!("../hip/flash.hip");
    // Each form's model, and which of its flash candidates is the form.
    type Form<'a> = (&'a str, &'a dyn Fn(&GpuFlashConfig) -> bool);
    let forms: [Form; 4] = [
        ("h200", &|f| f.variant == GpuFlashVariant::Rows),
        ("h200", &|f| {
            f.variant == GpuFlashVariant::Mma && f.split == 1
        }),
        ("h200", &|f| {
            f.variant == GpuFlashVariant::Mma && f.split > 1
        }),
        ("mi250", &|f| f.variant == GpuFlashVariant::Mfma),
    ];
    for ((model, form), edits) in forms.into_iter().zip(edits) {
        let (device, emu) = emulator(model);
        let config = GpuSpace
            .candidates(problem, &device)
            .into_iter()
            .find(|c| matches!(c, Config::GpuFlash(f) if form(f)))
            .unwrap_or_else(|| panic!("{model}: no such flash candidate"));
        let data = ProblemData::random(problem, 4);
        source_edits_show(&emu, &data, &config, source, &edits);
    }
}

/// `config` on `data` matches the reference with `source` as it is, and each edit of it
/// (`from` replaced by `to` throughout) shows.
fn source_edits_show(
    emu: &Emulator,
    data: &ProblemData,
    config: &Config,
    source: &str,
    edits: &[(&str, &str)],
) {
    let reference = data.reference();
    let error = |body: &str| {
        emu.run_source(data, config, body)
            .map(|out| relative_error(&out, &reference))
    };
    // The source and its edits compiled together first (see `Checks`).
    let edited: Vec<String> = edits.iter().map(|(f, t)| source.replace(f, t)).collect();
    emu.prepare_sources(
        std::iter::once(source)
            .chain(edited.iter().map(String::as_str))
            .map(|body| (&data.problem, config, body)),
    );
    let tol = data.problem.tolerance();
    let ok = error(source).unwrap();
    assert!(ok <= tol, "{} {config}: {ok:e}", data.problem);
    for (from, to) in edits {
        assert!(source.contains(from), "the source no longer has `{from}`");
        caught(
            &format!("{config}: `{from}` as `{to}`"),
            error(&source.replace(from, to)),
            tol,
        );
    }
}

/// Each kernel adds its head's sink where it normalizes a row: the rows, mma (whole and
/// split, whose combining kernel adds it) and MFMA flash forms and the paged reduction, each
/// wrong with the weight left out or taken from another head's sink.
#[test]
fn each_kernel_adds_its_heads_sink_where_it_normalizes() {
    let other_head = ("kt_sink_weight(sinks, h,", "kt_sink_weight(sinks, kvh,");
    let rows_sum = (
        "const float total = sum + kt_sink_weight(sinks, h, mx);",
        "const float total = sum;",
    );
    let mma_sum = (
        "const float total = sum[x] + kt_sink_weight(sinks, h, mx[x]);",
        "const float total = sum[x];",
    );
    let reduce_sum = (
        "den += kt_sink_weight(sinks, (int)(rest % q_heads), m);",
        "",
    );
    let reduce_head = ("(int)(rest % q_heads), m)", "0, m)");
    every_flash_form_catches(
        &FLASH_BF16_SINKS.parse().unwrap(),
        [
            vec![rows_sum, other_head],
            vec![mma_sum, other_head],
            vec![reduce_sum, reduce_head],
            vec![rows_sum, other_head],
        ],
    );
    let paged: Problem = format!("{PAGED_BF16},sinks=true").parse().unwrap();
    let (device, emu) = emulator("h200");
    let config = GpuSpace.default_config(&paged, &device);
    let data = ProblemData::random(&paged, 4).with_context_lens(vec![1, 600, 333]);
    let sum = "total += kt_sink_weight(sinks, h, mx);";
    let edits = [(sum, ""), (sum, "total += kt_sink_weight(sinks, 0, mx);")];
    source_edits_show(
        &emu,
        &data,
        &config,
        include_str!("../hip/paged.hip"),
        &edits,
    );
}

// ALiBi (Bloom, MPT) beside sinks: grouped heads (each its own slope), queries after cached
// keys (their positions past their indices), split runs on the H200.
const FLASH_BF16_ALIBI: &str =
    "flash:q_len=70,kv_len=130,q_heads=4,kv_heads=2,head_dim=64,dtype=bf16,sinks=true,alibi=true";

/// Each kernel biases its scores by its head's slope from its query's position: the rows, mma
/// (whole and split) and MFMA flash forms and the paged forms are wrong without the bias,
/// with another head's slope, or with distances counted from one key later (caught beside a
/// sink, whose weight the shift changes).
#[test]
fn each_kernel_biases_its_scores_by_its_heads_slope() {
    let other_head = ("kt_alibi_unit(slopes, h,", "kt_alibi_unit(slopes, kvh,");
    let rows = (
        "kt_softcap(dot, cap_unit) + kt_alibi(alibi_unit, j0 + r, seen - 1)",
        "kt_softcap(dot, cap_unit)",
    );
    let rows_pos = ("j0 + r, seen - 1)", "j0 + r, seen)");
    let mma = (
        "s[n][e] += fmaf(alibi_unit,",
        "s[n][e] += 0.0f * fmaf(alibi_unit,",
    );
    let mma_pos = ("seen[2 * m + r] - 1)", "seen[2 * m + r])");
    let mfma = (
        "s[n][e] += kt_alibi(kt_alibi_unit",
        "s[n][e] += 0.0f * kt_alibi(kt_alibi_unit",
    );
    let mfma_pos = ("4 * half + e % 4, seen - 1)", "4 * half + e % 4, seen)");
    every_flash_form_catches(
        &FLASH_BF16_ALIBI.parse().unwrap(),
        [
            vec![rows, other_head, rows_pos],
            vec![mma, other_head, mma_pos],
            vec![mma, other_head, mma_pos],
            vec![mfma, other_head, mfma_pos],
        ],
    );
    // The paged forms of a thread a token and of groups of lanes: the bias left out where
    // scores are kept, the first head's slope for every head, or the new token one later.
    paged_lane_forms_catch(
        "sinks=true,alibi=true",
        &[
            (
                "b.pos = len - 1 - b.skip * KT_BLOCK;",
                "b.pos = len - b.skip * KT_BLOCK;",
            ),
            (
                "kt_softcap(x, cap_unit) + kt_alibi(alibi, t, pos)",
                "kt_softcap(x, cap_unit)",
            ),
            (
                "const float alibi = kt_alibi_unit(slopes, h, log2e);",
                "const float alibi = kt_alibi_unit(slopes, 0, log2e);",
            ),
        ],
    );
}

/// The H200's paged forms of a thread a token (f32, head size 96) and of groups of lanes
/// (head size 128), on their problems with `extra`, each catching every edit of `edits`.
fn paged_lane_forms_catch(extra: &str, edits: &[(&str, &str)]) {
    for (spec, lanes, lens) in [
        (PAGED_F32, 1, vec![77, 5]),
        (PAGED_BF16_128, 16, vec![300, 17]),
    ] {
        let paged: Problem = format!("{spec},{extra}").parse().unwrap();
        let (device, emu) = emulator("h200");
        let config = GpuSpace
            .candidates(&paged, &device)
            .into_iter()
            .find(|c| matches!(c, Config::GpuPaged(g) if g.lanes == lanes))
            .unwrap();
        let data = ProblemData::random(&paged, 4).with_context_lens(lens);
        source_edits_show(
            &emu,
            &data,
            &config,
            include_str!("../hip/paged.hip"),
            edits,
        );
    }
}

// Soft-capped scores (Gemma 2): a cap below most scores, so every one bends.
const FLASH_F16_SOFTCAP: &str =
    "flash:q_len=70,kv_len=130,q_heads=4,kv_heads=2,head_dim=64,dtype=f16,softcap=0.5";

#[test]
fn attention_candidates_match_the_reference_with_a_softcap() {
    attention_candidates_match(FLASH_F16_SOFTCAP, "softcap=0.5");
}

/// Each kernel caps its scores: the rows, mma (whole and split) and MFMA flash forms and both
/// paged forms are wrong without the cap, or with it after the mask (a masked key's -inf
/// capped to -C counts it).
#[test]
fn each_kernel_caps_its_scores_before_the_mask() {
    let rows = "s[r] = visible ? kt_softcap(dot, cap_unit) + kt_alibi(alibi_unit, j0 + r, seen - 1)\n                           : -KT_INF;";
    let rows_cap = (rows, "s[r] = visible ? dot : -KT_INF;");
    let rows_after_mask = (
        rows,
        "s[r] = kt_softcap(visible ? dot : -KT_INF, cap_unit);",
    );
    let mma_cap = (
        "s[n][e] = kt_softcap(s[n][e], cap_unit);",
        "s[n][e] = s[n][e];",
    );
    let mfma_cap = (
        "s[n][e] = kt_softcap(s[n][e], softcap / scale);",
        "s[n][e] = s[n][e];",
    );
    every_flash_form_catches(
        &FLASH_F16_SOFTCAP.parse().unwrap(),
        [
            vec![rows_cap, rows_after_mask],
            vec![mma_cap],
            vec![mma_cap],
            vec![mfma_cap],
        ],
    );
    // Both paged forms, under a cap of 0.1 that flattens the weights of hundreds of tokens.
    // (Their maximum uncapped would only shift the exponents, which the partition's maximum
    // takes back: wrong only where scores lie far past the cap.)
    paged_lane_forms_catch(
        "softcap=0.1",
        &[(
            "exp2f(kt_score_out(scores[t - t0], cap_unit) - mx)",
            "exp2f(scores[t - t0] - mx)",
        )],
    );
}

#[test]
fn paged_candidates_match_the_reference_on_32_and_64_wide_waves() {
    for model in ["h200", "mi250", "rx7900xtx"] {
        every_candidate(model, PAGED_BF16, Some(vec![1, 600, 333]));
        every_candidate(model, PAGED_F32, Some(vec![77, 5]));
    }
    // A sliding window of 300 tokens: sequences inside it, and past it by 33 tokens (the
    // window starting inside a block) and by 300 (two partitions of 256 from its start).
    let windowed = format!("{PAGED_BF16},window=300");
    // Blocks of 128 tokens (CUTLASS MLA's) and of one (AITER's): partitions of whole blocks,
    // a table entry a token.
    let big = PAGED_BF16.replace("block_size=16", "block_size=128");
    let one = PAGED_BF16.replace("block_size=16", "block_size=1");
    for model in ["h200", "mi250"] {
        every_candidate(model, &windowed, Some(vec![1, 600, 333]));
        every_candidate(model, &big, Some(vec![1, 600, 129]));
        every_candidate(model, &one, Some(vec![1, 600, 129]));
    }
    // Head sizes 128 and 256 take groups of 16 and 32 lanes (one 16-byte piece a lane).
    let grouped = |c: &Config| matches!(c, Config::GpuPaged(p) if p.lanes > 1);
    for model in ["h200", "mi250"] {
        for (spec, lens) in [(PAGED_BF16_128, vec![300, 17]), (PAGED_F16_256, vec![40])] {
            candidates_where(model, spec, Some(lens), grouped);
        }
    }
}

/// Fp8 caches: every H200 and MI250 candidate on each format, under bf16 and f16 queries,
/// with a sequence of one token, a whole partition and a ragged one, head sizes 64 to 256
/// (groups of 8 to 32 lanes, 8-byte pieces): each format's bytes are read as its own (a
/// format read as another's is off by its factor or worse). Each kernel form (a thread a
/// token, groups of lanes) catches the value factor left out of the reduction; the key
/// factor is the launch's (its unit test).
#[test]
fn paged_candidates_match_the_reference_on_fp8_caches() {
    for model in ["h200", "mi250"] {
        for (spec, lens) in [
            (format!("{PAGED_BF16},kv_dtype=fp8_e4m3"), vec![1, 600, 333]),
            (
                format!("{PAGED_BF16_128},kv_dtype=fp8_e4m3fnuz"),
                vec![300, 17],
            ),
            (
                PAGED_F16_256.replace("dtype=f16", "dtype=f16,kv_dtype=fp8_e5m2"),
                vec![40],
            ),
        ] {
            every_candidate(model, &spec, Some(lens));
        }
    }
    let problem: Problem = format!("{PAGED_BF16_128},kv_dtype=fp8_e4m3")
        .parse()
        .unwrap();
    let data = ProblemData::random(&problem, 4).with_context_lens(vec![300, 17]);
    paged_edits_show(
        &data,
        &[("h200", 1, 1), ("h200", 16, 1), ("mi250", 16, 1)],
        256,
        &[("v_scale / total", "1.0f / total")],
    );
}

/// [`source_edits_show`] for paged.hip on `data`, with `threads` threads and partitions of as
/// many tokens, on each `(model, lanes, heads)`.
fn paged_edits_show(
    data: &ProblemData,
    kernels: &[(&str, usize, usize)],
    threads: usize,
    edits: &[(&str, &str)],
) {
    for &(model, lanes, heads) in kernels {
        let (_, emu) = emulator(model);
        let config = Config::GpuPaged(GpuPagedConfig {
            partition: threads,
            threads,
            lanes,
            heads,
            mma: false,
            mfma: false,
        });
        source_edits_show(&emu, data, &config, include_str!("../hip/paged.hip"), edits);
    }
}

/// Latent caches (multi-head latent attention's decode): DeepSeek-V3's TP8 shape (16 query
/// heads on one row of 576, values of 512; a thread a token, since no lane count divides the
/// row into pieces of at most 16 dims) in bf16 and on an E4M3 cache, and rows of 128 with
/// values of 64 (groups of 8 lanes, whose value pieces are half their key pieces), each on
/// an H200's and an MI250's waves. The value cache is empty between guards, so a kernel
/// reading it is poisoned; an output or partial row laid out at the key row's width is
/// caught.
#[test]
fn paged_candidates_match_the_reference_on_latent_caches() {
    let deepseek = "paged:num_seqs=2,context_len=600,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=16,dtype=bf16,scale=0.1352";
    let small = "paged:num_seqs=3,context_len=300,q_heads=4,kv_heads=2,head_dim=128,v_head_dim=64,block_size=16";
    for model in ["h200", "mi250"] {
        for (spec, lens) in [
            (deepseek.to_string(), vec![600, 17]),
            // FlashMLA's blocks of 64 and AITER's of one token.
            (
                deepseek.replace("block_size=16", "block_size=64"),
                vec![600, 65],
            ),
            (
                deepseek.replace("block_size=16", "block_size=1"),
                vec![33, 600],
            ),
            (format!("{deepseek},kv_dtype=fp8_e4m3"), vec![1, 333]),
            (format!("{small},dtype=f16"), vec![300, 1, 77]),
            (
                format!("{small},dtype=bf16,kv_dtype=fp8_e5m2"),
                vec![300, 1, 77],
            ),
        ] {
            every_candidate(model, &spec, Some(lens));
        }
    }
    let problem: Problem = format!("{small},dtype=bf16").parse().unwrap();
    let data = ProblemData::random(&problem, 4).with_context_lens(vec![300, 17, 200]);
    paged_edits_show(
        &data,
        &[
            ("h200", 1, 1),
            ("h200", 8, 1),
            ("mi250", 8, 1),
            ("h200", 1, 2),
        ],
        128,
        &[
            (
                "out[((long)seq * q_heads + h) * KT_DV + x]",
                "out[((long)seq * q_heads + h) * KT_D + x]",
            ),
            (
                "part_out[(base + p) * KT_DV + x]",
                "part_out[(base + p) * KT_D + x]",
            ),
        ],
    );
}

/// Blocks of several query heads (a thread a token, each row read once for all of them): every
/// such candidate of Llama-3.1-70B's TP8 decode shape (8 heads on one KV head) and of
/// DeepSeek's latent one (16 on one row of 576) with a window, sinks, ALiBi, a cap and an fp8
/// cache beside, on an H200's and an MI250's waves; a block whose heads all write the first head's
/// slot, or all take its query, is caught.
#[test]
fn paged_blocks_of_several_heads_match_the_reference() {
    let several = |c: &Config| matches!(c, Config::GpuPaged(p) if p.heads > 1 && !p.mma);
    for model in ["h200", "mi250"] {
        for (spec, lens) in [
            (
                "paged:num_seqs=3,context_len=600,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,window=300,sinks=true,alibi=true",
                vec![600, 1, 333],
            ),
            (
                "paged:num_seqs=2,context_len=300,q_heads=16,kv_heads=2,head_dim=64,dtype=f16,softcap=1,kv_dtype=fp8_e4m3",
                vec![300, 17],
            ),
            (
                "paged:num_seqs=2,context_len=300,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,dtype=bf16,scale=0.1352",
                vec![300, 17],
            ),
        ] {
            let ran = candidates_where(model, spec, Some(lens), several);
            assert!(ran >= 9, "{model} {spec}: {ran}");
        }
    }
    let problem: Problem = PAGED_BF16.parse().unwrap();
    let data = ProblemData::random(&problem, 4).with_context_lens(vec![1, 600, 333]);
    paged_edits_show(
        &data,
        &[("h200", 1, 4), ("mi250", 1, 2)],
        128,
        &[
            (
                "return b.slot0 + (long)g * b.partitions;",
                "return b.slot0;",
            ),
            (
                "((long)seq * q_heads + h0) * KT_D + i) * scale",
                "((long)seq * q_heads + h0) * KT_D + i % KT_D) * scale",
            ),
        ],
    );
}

/// Tensor cores (`mma`): every such H200 candidate of DeepSeek-V3's TP8 latent decode (16
/// heads on one row of 576, values its first 512, blocks of 16; FlashMLA's blocks of 64 and
/// blocks of one token with partitions of 256), of Llama-3.1-70B's TP8 decode (8 heads on one
/// KV head of 128, values their own rows) with a window, sinks and a cap, and of 4 heads on
/// a KV head of 64 in f16 with ALiBi (rows of the tile past the block's heads, whose slope
/// must be read in bounds): sequences of one token,
/// of a partition and a tile plus one.
#[test]
fn paged_tensor_core_candidates_match_the_reference() {
    for (spec, lens) in [
        (
            "paged:num_seqs=2,context_len=600,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=16,dtype=bf16,scale=0.1352",
            vec![600, 65],
        ),
        (
            "paged:num_seqs=2,context_len=600,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=64,dtype=bf16,scale=0.1352",
            vec![1, 517],
        ),
        (
            "paged:num_seqs=2,context_len=300,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=1,dtype=bf16,scale=0.1352",
            vec![300, 129],
        ),
        (
            "paged:num_seqs=3,context_len=600,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,window=300,sinks=true,softcap=30",
            vec![600, 1, 333],
        ),
        (
            "paged:num_seqs=2,context_len=300,q_heads=8,kv_heads=2,head_dim=64,dtype=f16,alibi=true",
            vec![300, 17],
        ),
        // Fp8 caches, widened in shared memory: DeepSeek's latent rows in E4M3 under bf16
        // queries, Llama's own value rows in E5M2 under f16 ones (and in the fnuz E4M3).
        (
            "paged:num_seqs=2,context_len=600,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=16,dtype=bf16,scale=0.1352,kv_dtype=fp8_e4m3",
            vec![600, 65],
        ),
        (
            "paged:num_seqs=3,context_len=600,q_heads=8,kv_heads=1,head_dim=128,dtype=f16,kv_dtype=fp8_e5m2",
            vec![600, 1, 333],
        ),
        (
            "paged:num_seqs=2,context_len=300,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,kv_dtype=fp8_e4m3fnuz",
            vec![300, 77],
        ),
    ] {
        // Other block sizes and cache types change where a token's row lies and how its
        // values widen, not the kernel's structure: partitions of 256 for them.
        let all = !spec.contains("kv_dtype")
            && (spec.contains("block_size=16") || !spec.contains("head_dim=576"));
        let ran = candidates_where("h200", spec, Some(lens), |c| {
            matches!(c, Config::GpuPaged(p) if p.mma && (all || p.partition == 256))
        });
        assert!(ran >= 6, "{spec}: {ran}");
    }
    // Each mistake shows on DeepSeek's latent rows and on Llama's own value rows (and on an
    // fp8 cache): the next tile copied over the one being read, a tile read before its copy
    // lands, P·V on the other stage, the running correction left out, weights for the zero
    // rows past a partition's end, a head's output in its neighbour's slot; on the fp8
    // cache, the widened tile read without a barrier after its widening, and the other
    // stage's bytes widened.
    let (_, emu) = emulator("h200");
    for (spec, lens, heads) in [
        (
            "paged:num_seqs=2,context_len=600,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=16,dtype=bf16,scale=0.1352",
            vec![600, 65],
            16,
        ),
        (
            "paged:num_seqs=2,context_len=600,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
            vec![600, 77],
            8,
        ),
        (
            "paged:num_seqs=2,context_len=600,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,kv_dtype=fp8_e4m3",
            vec![600, 77],
            8,
        ),
    ] {
        let problem: Problem = spec.parse().unwrap();
        let data = ProblemData::random(&problem, 4).with_context_lens(lens);
        let config = Config::GpuPaged(GpuPagedConfig {
            partition: 512,
            threads: 128,
            lanes: 1,
            heads,
            mma: true,
            mfma: false,
        });
        let mut edits = vec![
                (
                    "if (j0 + KT_TC < t1) load(st ^ 1, j0 + KT_TC);",
                    "if (j0 + KT_TC < t1) load(st, j0 + KT_TC);",
                ),
                (
                    "kt_cp_async_wait<1>();  // this tile (and the query",
                    "kt_cp_async_wait<2>();  // this tile (and the query",
                ),
                (
                    "const float corr_lo = row_corr[g], corr_hi = row_corr[g + 8];",
                    "const float corr_lo = 1.0f, corr_hi = 1.0f;",
                ),
                (
                    "i < n ? exp2f(kt_score_out(ss[r * KT_TC + i], cap_unit) - m) : 0.0f",
                    "exp2f(kt_score_out(ss[r * KT_TC + i], cap_unit) - m)",
                ),
        ];
        // P·V on the other stage; an fp8 cache's one widened tile read without a barrier
        // after its widening, or widened from the other stage's bytes.
        if !spec.contains("fp8") {
            edits.push((
                "v_at + stage + 2 * (16 * c * KT_LDV",
                "v_at + 2 * (16 * c * KT_LDV",
            ));
        } else {
            edits.push(("        widen(st);\n        KT_SYNC();", "        widen(st);"));
            edits.push(("        widen(st);", "        widen(st ^ 1);"));
        }
        // Heads 8 .. 15 of the tile are the block's only with 16.
        if heads == 16 {
            edits.push((
                "part_out + slot(g + 8) * KT_DV + x",
                "part_out + slot(g) * KT_DV + x",
            ));
        }
        source_edits_show(&emu, &data, &config, include_str!("../hip/paged.hip"), &edits);
    }
}

/// AMD's matrix cores (`mfma`): every such candidate on an MI300X of DeepSeek-V3's TP8 latent
/// decode (16 heads on one row of 576, values its first 512; blocks of 16, and of one token
/// at partitions of 256), of Llama-3.1-70B's TP8 decode with a window, sinks and a cap, and
/// of 4 heads on a KV head of 128 in f16 with ALiBi (columns past the block's heads), on an
/// MI250 too;
/// fp8 caches widened in registers: sequences of one token, of a partition, of a tile plus
/// one and ragged ones.
#[test]
fn paged_matrix_core_candidates_match_the_reference() {
    for (model, spec, lens) in [
        (
            "mi300x",
            "paged:num_seqs=2,context_len=600,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=16,dtype=bf16,scale=0.1352",
            vec![600, 17],
        ),
        (
            "mi300x",
            "paged:num_seqs=2,context_len=300,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=1,dtype=bf16,scale=0.1352",
            vec![300, 129],
        ),
        (
            "mi300x",
            "paged:num_seqs=3,context_len=600,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,window=300,sinks=true,softcap=30",
            vec![600, 1, 333],
        ),
        (
            "mi250",
            "paged:num_seqs=2,context_len=300,q_heads=8,kv_heads=2,head_dim=128,dtype=f16,alibi=true",
            vec![300, 17],
        ),
        // Fp8 caches, widened in registers: DeepSeek's latent rows in MI300X's E4M3 (fnuz)
        // under bf16 queries, Llama's own value rows in E5M2 under f16 ones.
        (
            "mi300x",
            "paged:num_seqs=2,context_len=600,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=16,dtype=bf16,scale=0.1352,kv_dtype=fp8_e4m3fnuz",
            vec![600, 65],
        ),
        (
            "mi250",
            "paged:num_seqs=3,context_len=600,q_heads=8,kv_heads=1,head_dim=128,dtype=f16,kv_dtype=fp8_e5m2",
            vec![600, 1, 333],
        ),
    ] {
        // Other block sizes and cache types change where a token's row lies and how its
        // values widen, not the kernel's structure: partitions of 256 for them.
        let all = !spec.contains("kv_dtype") && !spec.contains("block_size=1,");
        let ran = candidates_where(model, spec, Some(lens), |c| {
            matches!(c, Config::GpuPaged(p) if p.mfma && (all || p.partition == 256))
        });
        assert!(ran >= 6, "{model} {spec}: {ran}");
    }
    // Each mistake shows on DeepSeek's latent rows, on Llama's own value rows and on an fp8
    // cache: a head's correction taken from its own lane's column instead of its row's, a
    // tile's maximum or a head's sum missing the other half of the wave, the tokens past a
    // partition's end scored, the query's dims out of step with the key's, two tokens' value
    // columns swapped (16-bit: regrouped words; fp8: widened pieces), and in the waves'
    // meeting a wave's factor dropped, its sum stored over the others', the barrier between
    // two waves' turns removed.
    let (_, emu) = emulator("mi300x");
    for (spec, lens) in [
        (
            "paged:num_seqs=2,context_len=600,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=16,dtype=bf16,scale=0.1352",
            vec![600, 65],
        ),
        (
            "paged:num_seqs=2,context_len=600,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
            vec![600, 77],
        ),
        (
            "paged:num_seqs=2,context_len=600,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,kv_dtype=fp8_e4m3fnuz",
            vec![600, 77],
        ),
    ] {
        let problem: Problem = spec.parse().unwrap();
        let data = ProblemData::random(&problem, 4).with_context_lens(lens);
        let Problem::Paged(paged) = &problem else {
            unreachable!("{spec} is paged")
        };
        let heads = paged.group();
        let config = Config::GpuPaged(GpuPagedConfig {
            partition: 512,
            threads: 128,
            lanes: 1,
            heads,
            mma: false,
            mfma: true,
        });
        let mut edits = vec![
            (
                "oc[e] = KT_SHFL(corr, 4 * quad + e);",
                "oc[e] = corr;",
            ),
            (
                "mx = fmaxf(mx, KT_SHFL_XOR(mx, 32));",
                "mx = fmaxf(mx, 0.0f * KT_SHFL_XOR(mx, 32));",
            ),
            (
                "run_sum += KT_SHFL_XOR(run_sum, 32);",
                "run_sum += 0.0f * KT_SHFL_XOR(run_sum, 32);",
            ),
            (
                "x[e] = t < t1 ? kt_softcap",
                "x[e] = true ? kt_softcap",
            ),
            (
                "s = kt_mfma16(k_hi, kt_frag_of(q.z, q.w), s);",
                "s = kt_mfma16(k_hi, kt_frag_of(q.x, q.y), s);",
            ),
            (
                "f[e] = h < KT_HEADS ? exp2f(wave_max[wave][h] - mb) : 0.0f;",
                "f[e] = h < KT_HEADS ? 1.0f : 0.0f;",
            ),
            ("*at = w == 0 ? v : *at + v;", "*at = v;"),
            (
                "            KT_SYNC();\n        }\n        for (int i = tid;",
                "        }\n        for (int i = tid;",
            ),
        ];
        if spec.contains("fp8") {
            edits.push((
                "f[j] = kt_pack4(w[0][j], w[1][j], w[2][j], w[3][j]);",
                "f[j] = kt_pack4(w[1][j], w[0][j], w[2][j], w[3][j]);",
            ));
        } else {
            edits.push((
                "f[2 * q] = kt_frag_of((w[0][q] & 0xffffu) | (w[1][q] << 16),",
                "f[2 * q] = kt_frag_of((w[1][q] & 0xffffu) | (w[0][q] << 16),",
            ));
        }
        source_edits_show(&emu, &data, &config, include_str!("../hip/paged.hip"), &edits);
    }
}

/// The grouped paged attention (16 lanes a token, 256 threads) of `model` on sequences of 300
/// and 17 tokens, with `body` as its source: its relative error.
fn grouped_paged_error(model: &str, body: &str) -> Result<f64, KernelError> {
    let (_, emu) = emulator(model);
    let problem: Problem = PAGED_BF16_128.parse().unwrap();
    let data = ProblemData::random(&problem, 4).with_context_lens(vec![300, 17]);
    let config = Config::GpuPaged(GpuPagedConfig {
        partition: 256,
        threads: 256,
        lanes: 16,
        heads: 1,
        mma: false,
        mfma: false,
    });
    let out = emu.run_source(&data, &config, body)?;
    Ok(relative_error(&out, &data.reference()))
}

fn paged_with(from: &str, to: &str) -> String {
    let source = include_str!("../hip/paged.hip");
    assert!(source.contains(from), "paged.hip no longer has `{from}`");
    source.replace(from, to)
}

#[test]
fn the_grouped_paged_checks_catch_each_mistake() {
    let tol = PAGED_BF16_128.parse::<Problem>().unwrap().tolerance();
    for model in ["h200", "mi250"] {
        let ok = grouped_paged_error(model, include_str!("../hip/paged.hip")).unwrap();
        assert!(ok <= tol, "{model}, the unchanged source: {ok:e}");
        for (what, from, to) in [
            // A token's dot product missing half its group.
            (
                "a short group sum",
                "for (int m = KT_LANES / 2; m > 0; m /= 2)",
                "for (int m = KT_LANES / 4; m > 0; m /= 2)",
            ),
            // The P·V sums of half a wave's groups left out.
            (
                "a short wave sum",
                "for (int m = KT_LANES; m < KT_WAVE; m *= 2)",
                "for (int m = KT_LANES; m < KT_WAVE / 2; m *= 2)",
            ),
            // The waves' sums read before every wave wrote them.
            (
                "a missing barrier",
                "    KT_SYNC();\n    for (int x = tid; x < KT_DV; x += KT_THREADS) {\n        float total",
                "    for (int x = tid; x < KT_DV; x += KT_THREADS) {\n        float total",
            ),
        ] {
            caught(
                &format!("{model}: {what}"),
                grouped_paged_error(model, &paged_with(from, to)),
                tol,
            );
        }
        // Lanes of one wave leaving the score loop at different rounds: a shuffle that not
        // all of them reach, which hangs or reads garbage on a device.
        let e = grouped_paged_error(
            model,
            &paged_with(
                "for (int base = t0; base < t1; base += KT_GROUPS)",
                "for (int base = t0; base + group < t1; base += KT_GROUPS)",
            ),
        )
        .unwrap_err();
        assert!(
            matches!(e, KernelError::EmulatorFault { .. }) && e.to_string().contains("shuffle"),
            "{model}: {e}"
        );
    }
}

/// Prepared builds are compiled several to an object (on a single thread, one translation
/// unit of up to 16 builds that share the unit's macros), each still runs its own kernel, and
/// running them compiles nothing more.
#[test]
fn prepared_builds_share_an_object_and_each_runs_its_own_kernel() {
    use std::os::unix::fs::MetadataExt;
    // Removed when the test ends, passed or failed.
    let cache = tempfile::tempdir().unwrap();
    let (device, emu) = emulator("h200");
    let emu = emu.with_cache(cache.path());
    // Variants that define different macros, so one build's leftovers would break the next.
    let problem: Problem = GEMM_BF16_NK_DECODE.parse().unwrap();
    let mut configs: Vec<Config> = Vec::new();
    for variant in [
        GpuGemmVariant::Skinny,
        GpuGemmVariant::Mma,
        GpuGemmVariant::Tiled,
        GpuGemmVariant::Wgmma,
    ] {
        configs.extend(
            GpuSpace
                .candidates(&problem, &device)
                .into_iter()
                .filter(|c| matches!(c, Config::GpuGemm(g) if g.variant == variant))
                .take(3),
        );
    }
    assert_eq!(configs.len(), 12, "three candidates of each variant");
    let objects = || {
        let mut inodes: Vec<(String, u64)> = std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                (name, e.metadata().unwrap().ino())
            })
            .collect();
        inodes.sort();
        inodes
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(|| emu.prepare(configs.iter().map(|c| (&problem, c))));
    let prepared = objects();
    // wgmma builds emulate the arch-specific target (a macro of the whole unit): a unit of
    // their own, and a runtime of their own beside the other units'.
    let (runtimes, builds): (Vec<_>, Vec<_>) = prepared
        .iter()
        .partition(|(name, _)| name.starts_with("kt-runtime-"));
    assert_eq!(runtimes.len(), 2, "two runtimes: {prepared:?}");
    assert_eq!(builds.len(), configs.len(), "a build each: {prepared:?}");
    let mut inodes: Vec<u64> = builds.iter().map(|(_, ino)| *ino).collect();
    inodes.sort();
    inodes.dedup();
    assert_eq!(inodes.len(), 2, "two objects: {prepared:?}");
    let data = ProblemData::random(&problem, 5);
    let reference = data.reference();
    for config in &configs {
        let out = emu.run(&data, config).unwrap();
        let err = relative_error(&out, &reference);
        assert!(err <= problem.tolerance(), "{config}: error {err:e}");
    }
    assert_eq!(objects(), prepared, "running compiled nothing more");
}

/// A unit links the runtime of its macros from the cache; a cache that kept the unit and lost
/// the runtime (cleaned by hand, say) gets it compiled again at the unit's first load.
#[test]
fn a_cache_that_lost_a_runtime_compiles_it_again() {
    let cache = tempfile::tempdir().unwrap();
    let (device, emu) = emulator("mi250");
    let emu = emu.with_cache(cache.path());
    let problem: Problem = GEMM_F32.parse().unwrap();
    let config = GpuSpace.default_config(&problem, &device);
    emu.prepare([(&problem, &config)]);
    let runtimes = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("kt-runtime-")
            })
            .collect()
    };
    let lost = runtimes();
    assert_eq!(lost.len(), 1, "{lost:?}");
    std::fs::remove_file(&lost[0]).unwrap();
    let data = ProblemData::random(&problem, 2);
    let out = emu.run(&data, &config).unwrap();
    let err = relative_error(&out, &data.reference());
    assert!(err <= problem.tolerance(), "{config}: error {err:e}");
    assert_eq!(runtimes(), lost);
}

#[test]
fn configs_outside_the_space_are_refused_before_compiling() {
    let (device, emu) = emulator("rx7900xtx");
    let problem: Problem = GEMM_BF16_NK.parse().unwrap();
    let data = ProblemData::random(&problem, 1);
    // The MFMA variant of an MI250 config does not exist on RDNA.
    let (mi250, _) = emulator("mi250");
    let mfma = GpuSpace
        .candidates(&problem, &mi250)
        .into_iter()
        .find(|c| matches!(c, Config::GpuGemm(g) if format!("{:?}", g.variant) == "Mfma"))
        .unwrap();
    let e = emu.run(&data, &mfma).unwrap_err();
    assert!(
        matches!(e, KernelError::InvalidConfig { .. }) && e.to_string().contains("MFMA"),
        "{e}"
    );
    // A CPU config is not a GPU build.
    let cpu = kerntune_kernels::CpuSpace.default_config(&problem, &Device::host());
    assert!(emu.run(&data, &cpu).is_err());
    let _ = device;
}

#[test]
fn defaults_match_the_reference_with_portable_fibers() {
    // ucontext switches the fibers on hosts without the x86-64 switch (AArch64 among them).
    for model in ["h200", "mi250"] {
        let (device, emu) = emulator(model);
        let emu = emu.with_portable_fibers();
        for spec in [GEMM_BF16_NK, FLASH_BF16, PAGED_BF16] {
            let problem: Problem = spec.parse().unwrap();
            let data = ProblemData::random(&problem, 5);
            let reference = data.reference();
            for config in [
                GpuSpace.default_config(&problem, &device),
                GpuSpace.heuristic(&problem, &device),
            ] {
                let out = emu.run(&data, &config).unwrap();
                let err = relative_error(&out, &reference);
                assert!(
                    err <= problem.tolerance(),
                    "{model} {spec} {config}: {err:e}"
                );
            }
        }
    }
}

/// The GEMM source with `from` replaced by `to` (which must occur).
fn gemm_with(from: &str, to: &str) -> String {
    let source = include_str!("../hip/gemm.hip");
    assert!(source.contains(from), "gemm.hip no longer has `{from}`");
    source.replace(from, to)
}

/// The tiled GEMM of `model` on an awkward problem, with `body` as its source.
fn tiled_gemm_with(model: &str, body: &str) -> Result<Vec<f32>, KernelError> {
    let (device, emu) = emulator(model);
    let problem: Problem = GEMM_F32.parse().unwrap();
    let data = ProblemData::random(&problem, 3);
    let config = GpuSpace.default_config(&problem, &device);
    emu.run_source(&data, &config, body)
}

#[test]
fn threads_leaving_before_a_barrier_are_an_error_naming_it() {
    // The first occurrence is the tiled variant's.
    let body = gemm_with(
        "    const int tid = KT_TID;\n",
        "    const int tid = KT_TID;\n    if (tid >= 32) return;\n",
    );
    let e = tiled_gemm_with("h200", &body).unwrap_err().to_string();
    assert!(
        e.contains("thread 32 left the kernel while thread 0 waits at the barrier at line"),
        "{e}"
    );
}

#[test]
fn threads_at_different_barriers_are_an_error_naming_both() {
    let body = gemm_with(
        "        KT_SYNC();\n#pragma unroll 4",
        "        if (KT_TID < 64) KT_SYNC();\n        else KT_SYNC();\n#pragma unroll 4",
    );
    let e = tiled_gemm_with("mi250", &body).unwrap_err().to_string();
    assert!(e.contains("thread 0 waits at the barrier at line"), "{e}");
    assert!(e.contains("thread 64 at the barrier at line"), "{e}");
}

#[test]
fn a_write_past_the_output_is_an_error() {
    // Without its column check the last row's tile writes past C's end (M is a multiple of
    // the tile, N is not).
    let body = gemm_with(
        "            if (gc < n) c[(long)gr * n + gc] = acc[i][j] * (row_scale * col_scale[j]);",
        "            c[(long)gr * n + gc] = acc[i][j] * (row_scale * col_scale[j]);",
    );
    let (device, emu) = emulator("h200");
    let problem: Problem = "gemm:m=64,n=100,k=7,dtype=f32".parse().unwrap();
    let data = ProblemData::random(&problem, 3);
    let config = GpuSpace.default_config(&problem, &device);
    let e = emu
        .run_source(&data, &config, &body)
        .unwrap_err()
        .to_string();
    assert!(e.contains("kt_gemm wrote outside `out`"), "{e}");
}

#[test]
fn a_missing_barrier_fails_verification() {
    // Without the barrier after the k loop's products, threads restage the next tiles while
    // others still read the current ones; the fibers' alternating order exposes it.
    let source = include_str!("../hip/gemm.hip");
    let tiled_end = source.find("#elif KT_VARIANT == 1").unwrap();
    let last_sync = source[..tiled_end].rfind("KT_SYNC();").unwrap();
    let body = format!(
        "{}{}",
        &source[..last_sync],
        &source[last_sync + "KT_SYNC();".len()..]
    );
    let out = tiled_gemm_with("h200", &body).unwrap();
    let problem: Problem = GEMM_F32.parse().unwrap();
    let reference = ProblemData::random(&problem, 3).reference();
    let err = relative_error(&out, &reference);
    assert!(err > problem.tolerance(), "{err:e}");
}

#[test]
fn a_source_that_does_not_compile_names_the_error() {
    let body = gemm_with(
        "float acc[KT_TM][KT_TN];",
        "float acc[KT_TM][KT_TN] = undeclared;",
    );
    let e = tiled_gemm_with("h200", &body).unwrap_err();
    assert!(matches!(e, KernelError::EmulatorFault { .. }), "{e}");
    assert!(
        e.to_string().contains("does not compile") && e.to_string().contains("undeclared"),
        "{e}"
    );
}

/// The pipelined mma GEMM (four stages of 32, split-K 2) of the H200 on a decode problem
/// whose two splits both hold k tiles, with `body` as its source: its relative error.
fn pipelined_gemm_error(spec: &str, body: &str) -> Result<f64, KernelError> {
    let (device, emu) = emulator("h200");
    let problem: Problem = spec.parse().unwrap();
    let data = ProblemData::random(&problem, 9);
    // The one-warp-high decode tile (the heuristic from 9 rows up; below, the skinny kernel).
    let config = Config::GpuGemm(GpuGemmConfig::tile(
        GpuGemmVariant::Mma,
        (16, 64, 32),
        (1, 2),
        4,
        2,
    ));
    GpuSpace.validate(&config, &problem, &device).unwrap();
    let out = emu.run_source(&data, &config, body)?;
    Ok(relative_error(&out, &data.reference()))
}

#[test]
fn the_pipelined_split_k_gemm_checks_catch_each_mistake() {
    let tol = GEMM_BF16_NK_DECODE.parse::<Problem>().unwrap().tolerance();
    let source = include_str!("../hip/gemm.hip");
    let ok = pipelined_gemm_error(GEMM_BF16_NK_DECODE, source).unwrap();
    assert!(ok <= tol, "the unchanged source: {ok:e}");
    let wait = "kt_cp_async_wait<KT_STAGES - 2>();";
    for (what, from, to, spec) in [
        // Waiting for one group fewer reads a tile whose copies are still in flight.
        (
            "an early read",
            wait,
            "kt_cp_async_wait<KT_STAGES - 1>();",
            GEMM_BF16_NK_DECODE,
        ),
        // Without the barrier, warps read other threads' copies before those land, and the
        // next copies overwrite a stage others still read.
        (
            "a missing barrier",
            "kt_cp_async_wait<KT_STAGES - 2>();\n        KT_SYNC();",
            wait,
            GEMM_BF16_NK_DECODE,
        ),
        // B fragments from the wrong 8×8 matrices of an ldmatrix.
        (
            "swapped ldmatrix rows",
            "[wn + 8 * (lane / 16) + lane % 8][8 * ((lane / 8) % 2)]);",
            "[wn + 8 * (lane / 16) + lane % 8][8 * (lane / 16)]);",
            GEMM_BF16_NK_DECODE,
        ),
        // A K×N B read without the transpose.
        (
            "a missing transpose",
            "kt_ldmatrix_x4_trans_at(r,",
            "kt_ldmatrix_x4_at(r,",
            GEMM_F16_KN_DECODE,
        ),
        // The reduction dropping the last split's partial products.
        (
            "a dropped split",
            "for (int z = 0; z < KT_SPLIT; ++z)",
            "for (int z = 0; z < KT_SPLIT - 1; ++z)",
            GEMM_BF16_NK_DECODE,
        ),
    ] {
        let body = gemm_with(from, to);
        caught(what, pipelined_gemm_error(spec, &body), tol);
    }
}

/// The pipelined MFMA GEMM of the MI300X (128×128 tiles, two waves by two of 32×32 tiles
/// each, k tiles of 32 in two LDS stages) with `body` as its source, split in two along k:
/// its relative error on `spec`.
fn pipelined_mfma_error(spec: &str, body: &str) -> Result<f64, KernelError> {
    let (device, emu) = emulator("mi300x");
    let problem: Problem = spec.parse().unwrap();
    let data = ProblemData::random(&problem, 5);
    let config = Config::GpuGemm(GpuGemmConfig::tile(
        GpuGemmVariant::Mfma,
        (128, 128, 32),
        (2, 2),
        2,
        2,
    ));
    GpuSpace.validate(&config, &problem, &device).unwrap();
    let out = emu.run_source(&data, &config, body)?;
    Ok(relative_error(&out, &data.reference()))
}

#[test]
fn the_pipelined_mfma_gemm_checks_catch_each_mistake() {
    // Five k tiles of 32 (the last partial) split in two: one split of three tiles, one of two.
    let spec = "gemm:m=150,n=131,k=136,dtype=bf16,b=nk";
    let tol = spec.parse::<Problem>().unwrap().tolerance();
    let ok = pipelined_mfma_error(spec, include_str!("../hip/gemm.hip")).unwrap();
    assert!(ok <= tol, "the unchanged source: {ok:e}");
    for (what, from, to) in [
        // Multiplying the same LDS tile every k tile: the next tile's data goes unread.
        ("a stage never switched", "        st ^= 1;\n", "\n"),
        // The next tile written into the tile being multiplied.
        (
            "the next tile into the current stage",
            "kt_mfma_stage<KT_BM, KT_A_PIECES>(as_[st ^ 1], ra, tid);",
            "kt_mfma_stage<KT_BM, KT_A_PIECES>(as_[st], ra, tid);",
        ),
        // The next tile's loads from this tile's k.
        (
            "a load of the wrong k tile",
            "kt_mfma_fetch<KT_BN, KT_B_PIECES>(rb, bw, col0, n, kw, k0 + KT_BKW, kel, tid);",
            "kt_mfma_fetch<KT_BN, KT_B_PIECES>(rb, bw, col0, n, kw, k0, kel, tid);",
        ),
        // Pieces past k's end read instead of zeroed: the next row's first values (splits
        // are whole k tiles, so only the last tile of the last split has such pieces).
        (
            "k's end ignored",
            "if (p < ROWS * KT_KPIECES && row0 + row < limit && gk < ke)",
            "if (p < ROWS * KT_KPIECES && row0 + row < limit)",
        ),
        // Without the barrier closing a k tile, waves multiply a tile others are still
        // writing, and write the next over one others still multiply.
        (
            "a missing barrier",
            "        st ^= 1;\n#endif\n        KT_SYNC();",
            "        st ^= 1;\n#endif",
        ),
    ] {
        caught(what, pipelined_mfma_error(spec, &gemm_with(from, to)), tol);
    }
}

/// The wgmma GEMM of the H200 (two warpgroups of 64×128, three stages of `bk`, shared memory
/// swizzled by `swizzle` bytes or not at all) on a problem none of whose sizes a tile
/// divides, with `body` as its source: its relative error.
fn wgmma_gemm_error(body: &str, bk: usize, swizzle: usize) -> Result<f64, KernelError> {
    wgmma_config_error(body, wgmma_config(bk, swizzle, false, 3))
}

/// The wgmma GEMM of two warpgroups of 64×128 (and a producer one if `specialized`).
fn wgmma_config(bk: usize, swizzle: usize, specialized: bool, stages: usize) -> Config {
    wgmma_config_tma(bk, swizzle, specialized, stages, false)
}

/// As [`wgmma_config`], its producer copying by TMA if `tma`.
fn wgmma_config_tma(
    bk: usize,
    swizzle: usize,
    specialized: bool,
    stages: usize,
    tma: bool,
) -> Config {
    Config::GpuGemm(GpuGemmConfig {
        variant: GpuGemmVariant::Wgmma,
        bm: 128,
        bn: 128,
        bk,
        tm: 1,
        tn: 128,
        stages,
        split_k: 1,
        swizzle,
        specialized,
        tma,
        block_tiles: 1,
        cluster: 1,
    })
}

/// Compiles `config`'s builds of gemm.hip as it is and with each of `edits` together on the
/// H200's emulator, for a test about to run them one by one (see `Checks`).
fn prepare_wgmma_edits<'a>(config: Config, edits: impl Iterator<Item = (&'a str, &'a str)>) {
    let (_, emu) = emulator("h200");
    let problem: Problem = WGMMA_GEMM.parse().unwrap();
    let mut bodies = vec![include_str!("../hip/gemm.hip").to_string()];
    bodies.extend(edits.map(|(from, to)| gemm_with(from, to)));
    emu.prepare_sources(bodies.iter().map(|body| (&problem, &config, body.as_str())));
}

/// The problem of [`wgmma_config_error`].
const WGMMA_GEMM: &str = "gemm:m=67,n=130,k=520,dtype=bf16,b=nk";

/// `config`'s relative error on the H200's emulator, on a problem of 67×130×520 (no size a
/// tile divides; 9 or 17 k tiles, each stage used twice or more), with `body` as its source.
fn wgmma_config_error(body: &str, config: Config) -> Result<f64, KernelError> {
    let (_, emu) = emulator("h200");
    let problem: Problem = WGMMA_GEMM.parse().unwrap();
    let data = ProblemData::random(&problem, 5);
    let out = emu.run_source(&data, &config, body)?;
    Ok(relative_error(&out, &data.reference()))
}

#[test]
fn the_wgmma_gemm_checks_catch_each_mistake() {
    let tol = GEMM_BF16_NK.parse::<Problem>().unwrap().tolerance();
    let run = |body: &str| wgmma_gemm_error(body, 32, 0);
    let ok = run(include_str!("../hip/gemm.hip")).unwrap();
    assert!(ok <= tol, "the unchanged source: {ok:e}");
    let fence_sync = "kt_fence_async_shared();\n        KT_SYNC();";
    let b_desc = "kt_wgmma_desc(bt + kt_start<KT_BN>(wn, kk), KT_LBO, KT_SBO, KT_LAYOUT)";
    // Wrong results: the operands' layout or the pipeline's order.
    for (what, from, to) in [
        // A tile whose copies are still in flight (poisoned until the wait).
        (
            "an early read",
            "kt_cp_async_wait<KT_STAGES - 3>();\n        kt_fence",
            "kt_cp_async_wait<KT_STAGES - 2>();\n        kt_fence",
        ),
        // Other threads' copies not yet landed, a stage overwritten while others read it.
        ("a missing barrier", fence_sync, "kt_fence_async_shared();"),
        // Descriptors whose offsets do not match the core-matrix layout.
        (
            "a wrong stride offset",
            "#define KT_SBO (KT_BKW * 16)",
            "#define KT_SBO (KT_BKW * 8)",
        ),
        (
            "swapped offsets",
            b_desc,
            "kt_wgmma_desc(bt + kt_start<KT_BN>(wn, kk), KT_SBO, KT_LBO, KT_LAYOUT)",
        ),
        // The next k step starting one core matrix on instead of two.
        (
            "a short k step",
            "(KT_BKW / 8) * 64 + 128 * kk;",
            "(KT_BKW / 8) * 64 + 64 * kk;",
        ),
        // Core matrices read as swizzled rows.
        (
            "a swizzle mode on core matrices",
            "#define KT_LAYOUT 0",
            "#define KT_LAYOUT 1",
        ),
        // Copies into the stage of the tile before, whose products may be in flight.
        (
            "a stage overwritten in use",
            "const int next = tile + KT_STAGES - 2;\n        if (next < tiles) load(next % KT_STAGES,",
            "const int next = tile + KT_STAGES - 1;\n        if (next < tiles) load(next % KT_STAGES,",
        ),
        // Two tiles' products left in flight: the copies overwrite the older one's stage.
        (
            "products waited for too late",
            "kt_wgmma_wait<1>();",
            "kt_wgmma_wait<2>();",
        ),
    ] {
        caught(what, run(&gemm_with(from, to)), tol);
    }
    // Errors the emulator names: what a GPU would run into as garbage or a hang.
    for (from, to, says) in [
        (
            "    kt_wgmma_fence();\n",
            "",
            "a wgmma without a wgmma.fence before it",
        ),
        (
            "    kt_wgmma_wait<0>();\n",
            "",
            "left the kernel with wgmma operations not waited for",
        ),
        (
            b_desc,
            "kt_wgmma_desc(bt + kt_start<KT_BN>(wn, kk), KT_LBO, KT_SBO, KT_LAYOUT) | 1ull << 49",
            "a wgmma descriptor with a base offset",
        ),
    ] {
        faults(run(&gemm_with(from, to)), says);
    }
}

/// Each swizzle width, on one k tile of one swizzled row (128 bytes), of two (64-byte rows)
/// and of two of 32: the copies' permutation, the descriptors' mode and stride, the tiles'
/// alignment and the k steps across rows each matter.
#[test]
fn the_swizzled_wgmma_gemm_checks_catch_each_mistake() {
    let tol = GEMM_BF16_NK.parse::<Problem>().unwrap().tolerance();
    let source = include_str!("../hip/gemm.hip");
    let mistakes = [
        ("copies not swizzled", "base + kt_swizzled(at)", "base + at"),
        (
            "the descriptors' mode one width off",
            "#define KT_LAYOUT (KT_SWIZZLE == 128 ? 1 : KT_SWIZZLE == 64 ? 2 : 3)",
            "#define KT_LAYOUT (KT_SWIZZLE == 128 ? 2 : KT_SWIZZLE == 64 ? 3 : 1)",
        ),
        (
            "a wrong stride offset",
            "#define KT_SBO (8 * KT_SWIZZLE)",
            "#define KT_SBO (4 * KT_SWIZZLE)",
        ),
        // The emulator's dynamic shared memory starts 16 bytes past a 1024-byte line.
        (
            "tiles not aligned to the swizzle's pattern",
            "(KT_ALIGN - kt_smem(smem) % KT_ALIGN) % KT_ALIGN",
            "0",
        ),
    ];
    // A k step past its swizzled row: the next column block is R rows on, not one row.
    let next_row = (
        "(16 * kk / KT_ATOM) * R * KT_ATOM + r * KT_ATOM + 16 * kk % KT_ATOM",
        "r * KT_ATOM + 16 * kk",
    );
    for (bk, swizzle) in [(64, 128), (64, 64), (32, 32), (32, 64)] {
        let edits = mistakes.iter().map(|&(_, from, to)| (from, to));
        let config = wgmma_config(bk, swizzle, false, 3);
        prepare_wgmma_edits(config, edits.chain((2 * bk > swizzle).then_some(next_row)));
        let run = |body: &str| wgmma_gemm_error(body, bk, swizzle);
        let ok = run(source).unwrap();
        assert!(ok <= tol, "swizzle {swizzle}, bk {bk}: error {ok:e}");
        for (what, from, to) in mistakes {
            caught(
                &format!("swizzle {swizzle}, bk {bk}: {what}"),
                run(&gemm_with(from, to)),
                tol,
            );
        }
        if 2 * bk > swizzle {
            let body = gemm_with(next_row.0, next_row.1);
            caught(
                &format!("swizzle {swizzle}, bk {bk}: a k step into the next row"),
                run(&body),
                tol,
            );
        }
    }
    // Half a k step on: the emulator names a step whose 32 bytes cross a swizzled row.
    let body = gemm_with("+ 16 * kk % KT_ATOM;", "+ (16 * kk + 8) % KT_ATOM;");
    let e = wgmma_gemm_error(&body, 32, 32).unwrap_err();
    assert!(
        e.to_string()
            .contains("a wgmma k step that crosses a swizzled row"),
        "{e}"
    );
}

/// The skinny GEMM of `model` (8 groups of two weight rows, two 16-byte steps a tile) on a
/// problem whose k leaves a partial last tile, with `body` as its source: its relative error.
fn skinny_gemm_error(model: &str, body: &str) -> Result<f64, KernelError> {
    let (_, emu) = emulator(model);
    let problem: Problem = "gemm:m=3,n=37,k=1000,dtype=bf16,b=nk".parse().unwrap();
    let data = ProblemData::random(&problem, 9);
    let config = Config::GpuGemm(GpuGemmConfig {
        variant: GpuGemmVariant::Skinny,
        bm: 4,
        bn: 16,
        bk: 512,
        tm: 1,
        tn: 2,
        stages: 1,
        split_k: 1,
        swizzle: 0,
        specialized: false,
        tma: false,
        block_tiles: 1,
        cluster: 1,
    });
    let out = emu.run_source(&data, &config, body)?;
    Ok(relative_error(&out, &data.reference()))
}

#[test]
fn the_skinny_gemm_checks_catch_each_mistake() {
    let tol = GEMM_BF16_NK_DECODE.parse::<Problem>().unwrap().tolerance();
    for model in ["h200", "mi250"] {
        let ok = skinny_gemm_error(model, include_str!("../hip/gemm.hip")).unwrap();
        assert!(ok <= tol, "{model}, the unchanged source: {ok:e}");
        for (what, from, to) in [
            // A group's sums missing the lanes 16 apart.
            (
                "a short reduction",
                "for (int m = 16; m > 0; m /= 2)",
                "for (int m = 8; m > 0; m /= 2)",
            ),
            // The partial last tile's last piece left out.
            (
                "a short tail",
                "x < ke; x += 32 * KT_VEC",
                "x + KT_VEC < ke; x += 32 * KT_VEC",
            ),
            // Steps overlapping: half of each step read twice, the tile's end never.
            (
                "overlapping steps",
                "(32 * u + lane) * KT_VEC",
                "(16 * u + lane) * KT_VEC",
            ),
        ] {
            caught(
                &format!("{model}: {what}"),
                skinny_gemm_error(model, &gemm_with(from, to)),
                tol,
            );
        }
        // What a device would fault on or scribble over.
        for (from, to, says) in [
            (
                "(long)min(row0 + i, m - 1) * k + x)",
                "(long)min(row0 + i, m - 1) * k + x + 1)",
                "16-byte load from an address not 16-byte aligned",
            ),
            ("row0 + i < m && col0 + j < n", "col0 + j < n", "outside"),
        ] {
            faults(skinny_gemm_error(model, &gemm_with(from, to)), says);
        }
    }
}

#[test]
fn misaligned_cp_async_and_ldmatrix_addresses_are_errors() {
    for (from, to, says) in [
        (
            "kt_cp_async16_at(a_to + 2 * (r * KT_LDA + ch),",
            "kt_cp_async16_at(a_to + 2 * (r * KT_LDA + ch) + 2,",
            "cp.async from or to an address not 16-byte aligned",
        ),
        (
            "kt_ldmatrix_x4_at(af[i], a_st + 2 * (16 * i * KT_LDA + kk));",
            "kt_ldmatrix_x4_at(af[i], a_st + 2 * (16 * i * KT_LDA + kk) + 8);",
            "ldmatrix row address not 16-byte aligned",
        ),
    ] {
        faults(
            pipelined_gemm_error(GEMM_BF16_NK_DECODE, &gemm_with(from, to)),
            says,
        );
    }
}

/// The mma flash tile `(br, bc)`, paired or not.
fn mma_flash((br, bc): (usize, usize), paired: bool) -> Config {
    mma_flash_split((br, bc), paired, 1)
}

/// The mma flash tile `(br, bc)`, paired or not, its keys split over `split` blocks.
fn mma_flash_split((br, bc): (usize, usize), paired: bool, split: usize) -> Config {
    Config::GpuFlash(GpuFlashConfig {
        paired,
        split,
        ..GpuFlashConfig::new(GpuFlashVariant::Mma, br, bc, 2)
    })
}

/// The relative error of the emulated H200's run of the mma flash tile `(br, bc)` on
/// `problem`, with a source: the tile checked valid for the problem first.
fn mma_flash_error(problem: &Problem, tile: (usize, usize), paired: bool) -> impl Fn(&str) -> f64 {
    config_error(problem, mma_flash(tile, paired))
}

/// The relative error of the emulated H200's run of `config` on `problem`, with a source:
/// the config checked valid for the problem first.
fn config_error(problem: &Problem, config: Config) -> impl Fn(&str) -> f64 {
    let (device, emu) = emulator("h200");
    GpuSpace.validate(&config, problem, &device).unwrap();
    let data = ProblemData::random(problem, 4);
    let reference = data.reference();
    move |body: &str| relative_error(&emu.run_source(&data, &config, body).unwrap(), &reference)
}

/// Runs of sources on one emulated model, gathered and then compiled together (a translation
/// unit for many builds, where compiling each alone paid the compiler's fixed cost every
/// time), each asserted: the unedited sources match the reference, each edit shows.
struct Checks {
    model: &'static str,
    runs: Vec<Check>,
}

struct Check {
    problem: Problem,
    config: Config,
    body: String,
    /// What the run must show, for an edit; `None` for a source that must match.
    mistake: Option<String>,
}

impl Checks {
    fn on(model: &'static str) -> Checks {
        Checks {
            model,
            runs: Vec::new(),
        }
    }

    /// `config` running `body` on `problem` must match the reference.
    fn matches(&mut self, problem: &Problem, config: Config, body: &str) {
        self.push(problem, config, body, None);
    }

    /// `config` running `body` (a source with a mistake: `what`) on `problem` must miss the
    /// reference (or give NaN).
    fn catches(&mut self, problem: &Problem, config: Config, body: String, what: String) {
        self.push(problem, config, &body, Some(what));
    }

    fn push(&mut self, problem: &Problem, config: Config, body: &str, mistake: Option<String>) {
        self.runs.push(Check {
            problem: *problem,
            config,
            body: body.to_string(),
            mistake,
        });
    }

    /// Compiles every run's build, then runs and asserts each.
    fn assert_all(self) {
        let (device, emu) = emulator(self.model);
        for r in &self.runs {
            GpuSpace.validate(&r.config, &r.problem, &device).unwrap();
        }
        emu.prepare_sources(
            self.runs
                .iter()
                .map(|r| (&r.problem, &r.config, r.body.as_str())),
        );
        for r in &self.runs {
            let data = ProblemData::random(&r.problem, 4);
            let out = emu.run_source(&data, &r.config, &r.body).unwrap();
            let err = relative_error(&out, &data.reference());
            let (problem, config, tol) = (&r.problem, r.config, r.problem.tolerance());
            match &r.mistake {
                None => assert!(err <= tol, "{problem} {config}: {err:e}"),
                Some(what) => assert!(
                    err.is_nan() || err > tol,
                    "{problem} {config}: {what} went unnoticed: error {err:e}"
                ),
            }
        }
    }
}

#[test]
fn the_mfma_flash_loads_and_prefetch_checks_catch_each_mistake() {
    // Head size 128 over two key tiles of 64 on the MI300X: four waves of 32 queries, the
    // second tile's loads in flight over the first one's products.
    let problem: Problem = FLASH_F16_128.parse().unwrap();
    let (device, emu) = emulator("mi300x");
    let config = Config::GpuFlash(GpuFlashConfig {
        prefetch: true,
        ..GpuFlashConfig::new(GpuFlashVariant::Mfma, 128, 64, 2)
    });
    assert_eq!(GpuSpace.heuristic(&problem, &device), config);
    GpuSpace.validate(&config, &problem, &device).unwrap();
    let data = ProblemData::random(&problem, 4);
    let reference = data.reference();
    let error = |body: &str| match emu.run_source(&data, &config, body) {
        Ok(out) => Ok(relative_error(&out, &reference)),
        Err(e) => Err(e),
    };
    let source = include_str!("../hip/flash.hip");
    assert!(error(source).unwrap() <= problem.tolerance());
    for (what, from, to) in [
        // The current tile loaded again where the next one is due.
        (
            "a prefetch of the wrong key tile",
            "kt_mfma_kv_fetch(kp, vp, k, v, b, kv_len, kv_heads, kvh, j0 + KT_BC, tid);",
            "kt_mfma_kv_fetch(kp, vp, k, v, b, kv_len, kv_heads, kvh, j0, tid);",
        ),
        // Waves multiplying a tile others are still writing into LDS.
        (
            "a missing barrier after the LDS writes",
            "        kt_mfma_kv_stage(ks, vt, kp, vp, tid);\n        KT_SYNC();",
            "        kt_mfma_kv_stage(ks, vt, kp, vp, tid);",
        ),
        // V's dims transposed into the wrong rows.
        (
            "a V piece transposed out of order",
            "vt[x + d][r] = ",
            "vt[x + (d ^ 1)][r] = ",
        ),
        // K's second 8-byte half written from its first.
        (
            "a K half written twice",
            "__builtin_memcpy(&ks[r][x + 4], kw + 2, 8);",
            "__builtin_memcpy(&ks[r][x + 4], kw, 8);",
        ),
    ] {
        caught(
            what,
            error(&source.replacen(from, to, 1)),
            problem.tolerance(),
        );
    }
    // A K or V address off a 16-byte boundary faults the emulator as it would the device.
    faults(
        error(&source.replacen(
            "kp = kt_load16(k + at * KT_D + x);",
            "kp = kt_load16(k + at * KT_D + x + 1);",
            1,
        )),
        "16-byte load from an address not 16-byte aligned",
    );
}

#[test]
fn the_mma_flash_pipeline_checks_catch_each_mistake() {
    // Head size 128 over two key tiles of 64: the next tiles' copies overlap the current ones'
    // use, four warps share them.
    let problem: Problem = FLASH_F16_128.parse().unwrap();
    let error = mma_flash_error(&problem, (64, 64), false);
    let source = include_str!("../hip/flash.hip");
    assert!(error(source) <= problem.tolerance());
    for (what, from, to) in [
        // The next K tile copied over the current one while other warps still read it.
        (
            "a missing barrier before the next K tile",
            "        KT_SYNC();  // every warp is done with this K tile: load the next over it\n",
            "",
        ),
        // P·V before this V tile has landed.
        (
            "an early read of V",
            "kt_cp_async_wait<1>();  // this V tile",
            "kt_cp_async_wait<2>();  // this V tile",
        ),
        // V's fragments without the transpose.
        (
            "a missing transpose",
            "kt_ldmatrix_x4_trans_at(r, v_at",
            "kt_ldmatrix_x4_at(r, v_at",
        ),
    ] {
        assert!(source.contains(from), "flash.hip no longer has `{from}`");
        let err = error(&source.replacen(from, to, 1));
        // NaN (a poisoned read) counts as caught.
        assert!(
            err.is_nan() || err > problem.tolerance(),
            "{what} went unnoticed: error {err:e}"
        );
    }
}

#[test]
fn paired_flash_tiles_cover_every_query_once_and_the_checks_catch_a_skipped_mirror() {
    // Five query tiles of 16 on a grid of three blocks (taken last first): the middle tile 2
    // alone, then 1 and 3, then 0 and 4; fewer queries than keys (aligned to the end), GQA.
    let problem: Problem = "flash:q_len=70,kv_len=100,q_heads=4,kv_heads=2,head_dim=64,dtype=bf16"
        .parse()
        .unwrap();
    let error = mma_flash_error(&problem, (16, 32), true);
    let source = include_str!("../hip/flash.hip");
    assert!(error(source) <= problem.tolerance());
    let (from, to) = (
        "if (pass == 1 && qt <= first) break;",
        "if (pass == 1) break;",
    );
    assert!(source.contains(from), "flash.hip no longer has `{from}`");
    let err = error(&source.replacen(from, to, 1));
    assert!(
        err.is_nan() || err > problem.tolerance(),
        "a skipped mirror tile went unnoticed: error {err:e}"
    );
    // Without a causal mask every tile is equal: pairing is refused, naming the fix.
    let full: Problem = "flash:q_len=70,q_heads=4,head_dim=64,dtype=bf16,causal=false"
        .parse()
        .unwrap();
    let paired = mma_flash((16, 32), true);
    let err = GpuSpace
        .validate(&paired, &full, &Device::lookup("h200").unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("take paired = false"), "{err}");
}

/// Warps of 32 query rows (`lanes` 1): two row tiles of 16 sharing each K and V fragment,
/// Q's fragments in registers at head size 64 and from a shared Q tile at 128; over query
/// counts of no tile (a warp's second row tile partly or wholly past the queries), causal
/// with fewer queries than keys, GQA, paired and split. Each way of mixing up the two row
/// tiles shows.
#[test]
fn warps_of_32_rows_match_the_reference_and_catch_each_mistake() {
    let source = include_str!("../hip/flash.hip");
    let tile = |br, bc, paired, split| {
        Config::GpuFlash(GpuFlashConfig {
            paired,
            split,
            ..GpuFlashConfig::new(GpuFlashVariant::Mma, br, bc, 1)
        })
    };
    let mut checks = Checks::on("h200");
    let both: &[(&str, &str, &str)] = &[
        (
            "every warp's rows 16 apart",
            "const int row0 = qt * KT_BR + (tid / 32) * 16 * KT_MR;",
            "const int row0 = qt * KT_BR + (tid / 32) * 16;",
        ),
        (
            "the second row tile masked as the first",
            "const int j = j0 + 8 * n + 2 * t + e % 2, sn = seen[2 * m + e / 2];",
            "const int j = j0 + 8 * n + 2 * t + e % 2, sn = seen[e / 2];",
        ),
        (
            "the first row tile's probabilities in the second's products",
            "kt_mma(o[m][2 * dd + 1], pf[m], b1);",
            "kt_mma(o[m][2 * dd + 1], pf[0], b1);",
        ),
    ];
    for (spec, q_shared) in [
        (
            "flash:q_len=70,kv_len=100,q_heads=4,kv_heads=2,head_dim=128,dtype=f16",
            true,
        ),
        (
            "flash:batch=2,q_len=50,kv_len=77,q_heads=2,kv_heads=1,head_dim=64,dtype=bf16",
            false,
        ),
    ] {
        let problem: Problem = spec.parse().unwrap();
        let own = if q_shared {
            (
                "the second row tile reading the first's queries",
                "q_at + 2 * (16 * m * KT_LDD + 16 * st)",
                "q_at + 2 * (16 * st)",
            )
        } else {
            (
                "the second row tile taking the first's queries",
                "for (int x = 0; x < 4; ++x) qa[m][x] = qf[m][st][x];",
                "for (int x = 0; x < 4; ++x) qa[m][x] = qf[0][st][x];",
            )
        };
        for config in [
            tile(64, 32, false, 1),
            tile(64, 64, true, 1),
            tile(64, 32, false, 2),
        ] {
            checks.matches(&problem, config, source);
            for (what, from, to) in both.iter().chain([&own]) {
                assert!(source.contains(from), "flash.hip no longer has `{from}`");
                checks.catches(
                    &problem,
                    config,
                    source.replacen(from, to, 1),
                    what.to_string(),
                );
            }
        }
    }
    checks.assert_all();
}

/// Head size 256 (Gemma's): warps of 16 rows keep Q's fragments in registers there too (only
/// warps of 32 read them from a shared Q tile), as the launch's shared bytes assume.
#[test]
fn mma_flash_tiles_of_head_size_256_match_the_reference() {
    let problem: Problem = "flash:q_len=37,kv_len=50,q_heads=2,kv_heads=1,head_dim=256,dtype=bf16"
        .parse()
        .unwrap();
    let config = Config::GpuFlash(GpuFlashConfig::new(GpuFlashVariant::Mma, 64, 32, 2));
    let error = config_error(&problem, config)(include_str!("../hip/flash.hip"));
    assert!(error <= problem.tolerance(), "{config}: {error:e}");
}

/// Split-KV: runs of whole key tiles over blocks, combined by a second kernel. Four key tiles
/// of 32 in runs of two (split 2) or one (split 4, and split 8: runs past the keys), fewer
/// queries than keys, so rows see two to four runs and some blocks none; causal and not;
/// and as many queries as keys, where the first rows see one run only, written by the first
/// kernel and left by the second; and a sliding window of 20 keys, where rows see one run
/// past the first, or two, and blocks start past the first run.
#[test]
fn split_flash_runs_cover_every_key_once_and_the_checks_catch_each_mistake() {
    let causal: Problem = "flash:q_len=70,kv_len=120,q_heads=4,kv_heads=2,head_dim=64,dtype=bf16"
        .parse()
        .unwrap();
    let full: Problem =
        "flash:q_len=33,kv_len=120,q_heads=2,kv_heads=1,head_dim=64,dtype=f16,causal=false"
            .parse()
            .unwrap();
    let square: Problem = "flash:q_len=70,q_heads=4,kv_heads=2,head_dim=64,dtype=bf16"
        .parse()
        .unwrap();
    let windowed: Problem =
        "flash:q_len=70,kv_len=120,q_heads=4,kv_heads=2,head_dim=64,dtype=bf16,window=20"
            .parse()
            .unwrap();
    let source = include_str!("../hip/flash.hip");
    let mut checks = Checks::on("h200");
    for problem in [&causal, &full, &square, &windowed] {
        for split in [2, 4, 8] {
            let config = mma_flash_split((16, 32), false, split);
            checks.matches(problem, config, source);
            for (what, from, to) in [
                (
                    "the last run left out",
                    "min(KT_SPLIT, (seen + kt_run(kv_len) - 1) / kt_run(kv_len))",
                    "min(KT_SPLIT, (seen - 1) / kt_run(kv_len))",
                ),
                (
                    "runs overlapping by a tile",
                    "const int run_end = run_begin + kt_run(kv_len);",
                    "const int run_end = run_begin + kt_run(kv_len) + KT_BC;",
                ),
                (
                    "runs' maxima not rescaled",
                    "const float w = exp2f(part_max[slot] - m);",
                    "const float w = 1.0f;",
                ),
                (
                    "every run reading from the first key",
                    "load(ks, k, key_begin, KT_D);",
                    "load(ks, k, 0, KT_D);",
                ),
                (
                    "rows of several runs taken for rows of one",
                    "if (runs - first == 1) return;",
                    "if (runs - first >= 1) return;",
                ),
            ] {
                assert!(source.contains(from), "flash.hip no longer has `{from}`");
                checks.catches(problem, config, source.replacen(from, to, 1), what.into());
            }
        }
    }
    // A window's rows combined from the first run on, or their one run taken for the first.
    for (what, from, to) in [
        (
            "runs before the window combined",
            "const int first = seen <= 0 || !KT_WINDOW ? 0 :",
            "const int first = 1 ? 0 :",
        ),
        (
            "a row's one run taken for the first",
            "const int first_run = KT_WINDOW ? max(0, seen[x] - reach) / kt_run(kv_len) : 0;",
            "const int first_run = 0;",
        ),
    ] {
        assert!(source.contains(from), "flash.hip no longer has `{from}`");
        for split in [2, 4] {
            let config = mma_flash_split((16, 32), false, split);
            checks.catches(&windowed, config, source.replacen(from, to, 1), what.into());
        }
    }
    // Rows of one run left to the partial results: the combining kernel never writes them.
    let (from, to) = (
        "if (run != first_run || seen[x] > run_end) {",
        "if (true) {",
    );
    assert!(source.contains(from), "flash.hip no longer has `{from}`");
    for split in [2, 4] {
        let config = mma_flash_split((16, 32), false, split);
        let what = "rows of one run never written";
        checks.catches(&square, config, source.replacen(from, to, 1), what.into());
    }
    checks.assert_all();
    // Split with paired tiles, or past the workspace's limit, is refused naming the fix.
    let device = Device::lookup("h200").unwrap();
    let err = GpuSpace
        .validate(&mma_flash_split((16, 32), true, 2), &causal, &device)
        .unwrap_err();
    assert!(err.to_string().contains("take split = 1"), "{err}");
    let long: Problem = "flash:q_len=32768,q_heads=64,kv_heads=8,head_dim=128,dtype=bf16"
        .parse()
        .unwrap();
    let err = GpuSpace
        .validate(&mma_flash_split((128, 128), false, 2), &long, &device)
        .unwrap_err();
    assert!(err.to_string().contains("MiB of partial results"), "{err}");
}

/// Warp specialization: a producer warpgroup fills the stages, two multiply, stages handed
/// over by mbarriers; each way of getting the hand-over wrong shows.
#[test]
fn the_warp_specialized_wgmma_gemm_checks_catch_each_mistake() {
    let tol = GEMM_BF16_NK.parse::<Problem>().unwrap().tolerance();
    let source = include_str!("../hip/gemm.hip");
    let mistakes = [
        (
            "multiplying before the tile lands",
            "kt_mbar_wait(&full[st], (it / KT_STAGES) & 1);",
            "",
        ),
        (
            "waiting on the wrong phase of a full stage",
            "kt_mbar_wait(&full[st], (it / KT_STAGES) & 1);",
            "kt_mbar_wait(&full[st], ((it / KT_STAGES) & 1) ^ 1);",
        ),
        (
            "copying into a stage still multiplied",
            "kt_mbar_wait(&empty[st], ((it / KT_STAGES) & 1) ^ 1);",
            "",
        ),
        (
            "releasing the stage whose products run",
            "if (tile > 0 && signals) release(&empty[(it - 1) % KT_STAGES]);",
            "if (tile > 0 && signals) release(&empty[it % KT_STAGES]);",
        ),
        (
            "every multiplying thread signalling, one arrival a warpgroup expected",
            "const bool signals = ctid % 128 == 0;",
            "const bool signals = true;",
        ),
        (
            "a stage full after half the copies",
            "kt_mbar_init(&full[st], KT_TMA ? 1 : 128);",
            "kt_mbar_init(&full[st], KT_TMA ? 1 : 64);",
        ),
    ];
    for (bk, swizzle, stages) in [(64, 128, 3), (64, 128, 4), (32, 0, 3)] {
        let config = wgmma_config(bk, swizzle, true, stages);
        prepare_wgmma_edits(config, mistakes.iter().map(|&(_, from, to)| (from, to)));
        let run = |body: &str| wgmma_config_error(body, config);
        let what = format!("bk {bk}, swizzle {swizzle}, {stages} stages");
        let ok = run(source).unwrap();
        assert!(ok <= tol, "{what}: error {ok:e}");
        for (mistake, from, to) in mistakes {
            caught(
                &format!("{what}: {mistake}"),
                run(&gemm_with(from, to)),
                tol,
            );
        }
    }
    // Errors the emulator names, where a GPU would hang.
    let config = wgmma_config(64, 128, true, 3);
    let named = [
        (
            "kt_mbar_init(&empty[st], KT_CONSUMERS / 128 * KT_CLUSTER);",
            "kt_mbar_init(&empty[st], KT_CONSUMERS / 128 * KT_CLUSTER + 1);",
            "an mbarrier wait, which nothing completes",
        ),
        (
            "const bool signals = ctid % 128 == 0;",
            "const bool signals = ctid == 0;",
            "an mbarrier wait, which nothing completes",
        ),
        (
            "kt_mbar_init(&full[st], KT_TMA ? 1 : 128);",
            "",
            "an mbarrier used before mbarrier.init",
        ),
    ];
    prepare_wgmma_edits(config, named.iter().map(|&(from, to, _)| (from, to)));
    let run = |body: &str| wgmma_config_error(body, config);
    for (from, to, says) in named {
        faults(run(&gemm_with(from, to)), says);
    }
}

/// TMA: one producer thread issues a box of A and one of B a stage, their bytes counted on
/// the stage's mbarrier, zeros past the matrix's edges (67 rows, 130 columns, 520 of k: every
/// edge ragged); each way of getting the boxes or their hand-over wrong shows.
#[test]
fn the_tma_wgmma_gemm_checks_catch_each_mistake() {
    let tol = GEMM_BF16_NK.parse::<Problem>().unwrap().tolerance();
    let source = include_str!("../hip/gemm.hip");
    for stages in [3, 4] {
        let run =
            |body: &str| wgmma_config_error(body, wgmma_config_tma(64, 128, true, stages, true));
        let ok = run(source).unwrap();
        assert!(ok <= tol, "{stages} stages: error {ok:e}");
        for (mistake, from, to) in [
            (
                "multiplying before the boxes land",
                "kt_mbar_wait(&full[st], (it / KT_STAGES) & 1);",
                "",
            ),
            (
                "a box over a stage still multiplied",
                "kt_mbar_wait(&empty[st], ((it / KT_STAGES) & 1) ^ 1);\n#if KT_TMA\n                kt_mbar_expect_tx",
                "#if KT_TMA\n                kt_mbar_expect_tx",
            ),
            (
                "a box's coordinates swapped",
                "&a_map, kb + tile * KT_BKW, row0,",
                "&a_map, row0, kb + tile * KT_BKW,",
            ),
            ("B's box from A's map", "&b_map, kb", "&a_map, kb"),
        ] {
            caught(
                &format!("{stages} stages: {mistake}"),
                run(&gemm_with(from, to)),
                tol,
            );
        }
    }
    // Errors the emulator names: bytes the phase never gets, or more than it expects.
    let run = |body: &str| wgmma_config_error(body, wgmma_config_tma(64, 128, true, 3, true));
    for (from, to, says) in [
        (
            "kt_mbar_expect_tx(&full[st], 2 * (KT_BM + KT_BN) * KT_BKW);",
            "kt_mbar_expect_tx(&full[st], 2 * (KT_BM + KT_BN) * KT_BKW + 2);",
            "which nothing completes",
        ),
        (
            "kt_mbar_expect_tx(&full[st], 2 * (KT_BM + KT_BN) * KT_BKW);",
            "kt_mbar_expect_tx(&full[st], 2 * KT_BM * KT_BKW);",
            "whose bytes its mbarrier's phase does not expect",
        ),
    ] {
        faults(run(&gemm_with(from, to)), says);
    }
}

/// The specialized form's tiles of every column count it takes (64-row warpgroups by 128 to
/// 256 columns, two of them, plus four of 64×128 and two of 128×128), by TMA and by
/// cp.async, and TMA with the k range split: on 200×470 or 469 (two m tiles, the last
/// ragged; two to four n tiles) by 328 of k (six tiles: each stage used again), split ones by 1096 (a
/// split with a partial last tile, one with a short range).
#[test]
fn every_specialized_tile_and_split_matches_the_reference() {
    let (_, emu) = emulator("h200");
    let tol = GEMM_BF16_NK.parse::<Problem>().unwrap().tolerance();
    let check = |spec: &str, config: GpuGemmConfig| {
        let problem: Problem = spec.parse().unwrap();
        let data = ProblemData::random(&problem, 9);
        let out = emu
            .run(&data, &Config::GpuGemm(config))
            .unwrap_or_else(|e| panic!("{spec} {config}: {e}"));
        let err = relative_error(&out, &data.reference());
        assert!(err <= tol, "{spec} {config}: relative error {err:e}");
    };
    let specialized = |(bm, bn, tm, tn): (usize, usize, usize, usize), tma, split_k| {
        let Config::GpuGemm(c) = wgmma_config_tma(64, 128, true, 4, tma) else {
            unreachable!()
        };
        GpuGemmConfig {
            bm,
            bn,
            tm,
            tn,
            split_k,
            ..c
        }
    };
    for tile in [
        (128, 160, 1, 160),
        (128, 192, 1, 192),
        (128, 224, 1, 224),
        (128, 256, 1, 256),
        (256, 128, 1, 128),
        (128, 256, 2, 128),
    ] {
        // An odd n as well: its last column stored alone, the pairs before it unaligned.
        for (tma, spec) in [
            (true, "gemm:m=200,n=470,k=328,dtype=bf16,b=nk"),
            (false, "gemm:m=200,n=469,k=328,dtype=bf16,b=nk"),
        ] {
            check(spec, specialized(tile, tma, 1));
        }
    }
    for split in [2, 4] {
        check(
            "gemm:m=200,n=470,k=1096,dtype=bf16,b=nk",
            specialized((128, 160, 1, 160), true, split),
        );
    }
    // Pairs of an odd n's rows stored as 8-byte vectors would be misaligned: a device faults.
    let problem: Problem = "gemm:m=200,n=469,k=328,dtype=bf16,b=nk".parse().unwrap();
    let data = ProblemData::random(&problem, 9);
    let config = Config::GpuGemm(specialized((128, 160, 1, 160), false, 1));
    let body = gemm_with("gc + 1 < n && n % 2 == 0", "gc + 1 < n");
    faults(
        emu.run_source(&data, &config, &body).map(|_| 0.0),
        "an 8-byte store to an address not 8-byte aligned",
    );
}

/// Clusters of two blocks, one above the other, sharing B's tile: each copies half of it into
/// both by TMA multicast, and hands each stage back to both producers. On 300×470 by 328 (three
/// m tiles: the last cluster's second block lies wholly past m; ragged n and k), with blocks
/// of several tiles and split k too; each way of getting the sharing wrong shows.
#[test]
fn clusters_sharing_b_match_the_reference_and_catch_each_mistake() {
    let (_, emu) = emulator("h200");
    let tol = GEMM_BF16_NK.parse::<Problem>().unwrap().tolerance();
    let run = |spec: &str, config: GpuGemmConfig, body: &str| {
        let problem: Problem = spec.parse().unwrap();
        let data = ProblemData::random(&problem, 6);
        emu.run_source(&data, &Config::GpuGemm(config), body)
            .map(|out| relative_error(&out, &data.reference()))
    };
    let clustered = |(bm, bn, tn): (usize, usize, usize), stages, block_tiles, split_k| {
        let Config::GpuGemm(c) = wgmma_config_tma(64, 128, true, stages, true) else {
            unreachable!()
        };
        GpuGemmConfig {
            bm,
            bn,
            tn,
            stages,
            block_tiles,
            split_k,
            cluster: 2,
            ..c
        }
    };
    let spec = "gemm:m=300,n=470,k=328,dtype=bf16,b=nk";
    let source = include_str!("../hip/gemm.hip");
    for (tile, stages, block_tiles) in [
        ((128, 128, 128), 4, 1),
        ((128, 160, 160), 3, 1),
        ((128, 224, 224), 4, 1),
        ((128, 128, 128), 4, 3),
    ] {
        let config = clustered(tile, stages, block_tiles, 1);
        let err = run(spec, config, source).unwrap_or_else(|e| panic!("{config}: {e}"));
        assert!(err <= tol, "{config}: relative error {err:e}");
    }
    let split = clustered((128, 160, 160), 4, 1, 2);
    let err = run("gemm:m=300,n=470,k=1096,dtype=bf16,b=nk", split, source).unwrap();
    assert!(err <= tol, "{split}: relative error {err:e}");

    let config = clustered((128, 160, 160), 3, 1, 1);
    for (mistake, from, to) in [
        (
            "both blocks taking the same tiles",
            "*row0 = ((first + in % rows) * KT_CLUSTER + kt_cluster_rank()) * KT_BM;",
            "*row0 = ((first + in % rows) * KT_CLUSTER) * KT_BM;",
        ),
        (
            "the second half of B over the first",
            "bs + st * KT_BN * KT_BKW + part * KT_BKW, &b_map,",
            "bs + st * KT_BN * KT_BKW, &b_map,",
        ),
        (
            "a stage free once one block's consumers are done with it",
            "kt_mbar_init(&empty[st], KT_CONSUMERS / 128 * KT_CLUSTER);",
            "kt_mbar_init(&empty[st], KT_CONSUMERS / 128);",
        ),
    ] {
        caught(mistake, run(spec, config, &gemm_with(from, to)), tol);
    }
    // Errors the emulator names, where a GPU would hang or fault.
    for (from, to, says) in [
        (
            "for (int r = 0; r < KT_CLUSTER; ++r) kt_mbar_arrive_cluster(bar, r);",
            "kt_mbar_arrive(bar);",
            "which nothing completes",
        ),
        (
            "(1u << KT_CLUSTER) - 1);",
            "1u << kt_cluster_rank());",
            "which nothing completes",
        ),
    ] {
        faults(run(spec, config, &gemm_with(from, to)), says);
    }
    // Without the barrier before they leave, a block's consumers hand a stage back to a block
    // that has gone.
    let body = gemm_with(
        "        kt_store_acc(acc, c, m, n, row0, col0, wg, ctid KT_SCALE_ARGS);\n    }\n#if KT_CLUSTER > 1\n    kt_cluster_sync();",
        "        kt_store_acc(acc, c, m, n, row0, col0, wg, ctid KT_SCALE_ARGS);\n    }\n#if KT_CLUSTER > 1",
    )
    .replace(
        "#if KT_CLUSTER > 1\n        // Blocks leave together: none while another may still arrive on its mbarriers.\n        kt_cluster_sync();\n#endif",
        "",
    );
    faults(run(spec, config, &body), "that has left");
}

/// Blocks that take several C tiles in turn (6 tiles of 128×160 over 200×470: blocks of 2,
/// and of 4 with the last block taking 2), stages handed on from one C tile to the next; each
/// way of getting that hand-over wrong shows.
#[test]
fn blocks_of_several_c_tiles_match_the_reference_and_catch_each_mistake() {
    let (_, emu) = emulator("h200");
    let tol = GEMM_BF16_NK.parse::<Problem>().unwrap().tolerance();
    let problem: Problem = "gemm:m=200,n=470,k=328,dtype=bf16,b=nk".parse().unwrap();
    let data = ProblemData::random(&problem, 4);
    let config = |tma, stages, block_tiles| {
        let Config::GpuGemm(c) = wgmma_config_tma(64, 128, true, stages, tma) else {
            unreachable!()
        };
        Config::GpuGemm(GpuGemmConfig {
            bn: 160,
            tn: 160,
            block_tiles,
            ..c
        })
    };
    let run = |config: &Config, body: &str| -> Result<f64, KernelError> {
        let out = emu.run_source(&data, config, body)?;
        Ok(relative_error(&out, &data.reference()))
    };
    let source = include_str!("../hip/gemm.hip");
    for tma in [true, false] {
        for (stages, block_tiles) in [(4, 2), (3, 4)] {
            let config = config(tma, stages, block_tiles);
            let ok = run(&config, source).unwrap();
            assert!(ok <= tol, "{config}: error {ok:e}");
            for (mistake, from, to) in [
                (
                    "a C tile's last stage kept from the producer",
                    "if (tiles > 0 && signals) release(&empty[(it - 1) % KT_STAGES]);",
                    "",
                ),
                (
                    "the sums carried into the next C tile",
                    "for (int e = 0; e < KT_TN / 2; ++e) acc[i][e] = 0.0f;\n            kt_wgmma_fence_operand(acc[i]);\n        }\n        for (int tile",
                    "kt_wgmma_fence_operand(acc[i]);\n        }\n        for (int tile",
                ),
                (
                    "every C tile's products stored as the first",
                    "kt_tile_origin(first + ct, m, n, &row0, &col0);\n#pragma unroll",
                    "kt_tile_origin(first, m, n, &row0, &col0);\n#pragma unroll",
                ),
            ] {
                caught(
                    &format!("{config}: {mistake}"),
                    run(&config, &gemm_with(from, to)),
                    tol,
                );
            }
        }
    }
}

/// The wgmma blocks' order: consecutive blocks walk a band's m tiles, then the next n tile.
/// Bands of 1 and 3 m tiles over 5 (the last band partial) cover every tile once; a band
/// that takes its full width where fewer rows are left does not.
#[test]
fn the_wgmma_block_order_covers_every_tile_once() {
    let tol = GEMM_BF16_NK.parse::<Problem>().unwrap().tolerance();
    let (_, emu) = emulator("h200");
    let problem: Problem = "gemm:m=300,n=200,k=72,dtype=bf16,b=nk".parse().unwrap();
    let data = ProblemData::random(&problem, 3);
    let config = wgmma_config(64, 128, false, 3);
    let Config::GpuGemm(c) = config else {
        unreachable!()
    };
    let config = Config::GpuGemm(GpuGemmConfig { bm: 64, tm: 1, ..c });
    let run = |body: &str| -> Result<f64, KernelError> {
        let out = emu.run_source(&data, &config, body)?;
        Ok(relative_error(&out, &data.reference()))
    };
    for band in [1, 3] {
        let ok = run(&gemm_with(
            "#define KT_RASTER 16",
            &format!("#define KT_RASTER {band}"),
        ))
        .unwrap();
        assert!(ok <= tol, "bands of {band}: error {ok:e}");
    }
    caught(
        "a partial band taken at full width",
        run(&gemm_with("#define KT_RASTER 16", "#define KT_RASTER 3")
            .replace("in % rows", "in % KT_RASTER")
            .replace("in / rows", "in / KT_RASTER")),
        tol,
    );
}

/// Flash attention by warpgroup MMA (sm_90): Q's and P's fragments from registers, K k-major
/// and V n-major from swizzled shared memory. Head sizes 64 and 128 over ragged key tiles,
/// causal with fewer queries than keys, GQA, paired, split and warp-specialized (pipelined:
/// the next tile's scores beside this tile's products); each way of getting the operands'
/// layout, the instructions' order, the pipeline's waits or the stages' hand-over wrong
/// shows.
#[test]
fn the_wgmma_flash_matches_the_reference_and_catches_each_mistake() {
    let (device, emu) = emulator("h200");
    let wgmma = |br, bc, paired, split| {
        let Config::GpuFlash(c) = mma_flash_split((br, bc), paired, split) else {
            unreachable!()
        };
        Config::GpuFlash(GpuFlashConfig { wgmma: true, ..c })
    };
    let specialized = |c: Config| {
        let Config::GpuFlash(c) = c else {
            unreachable!()
        };
        Config::GpuFlash(GpuFlashConfig {
            specialized: true,
            ..c
        })
    };
    let pingpong = |c: Config| {
        let Config::GpuFlash(c) = specialized(c) else {
            unreachable!()
        };
        Config::GpuFlash(GpuFlashConfig {
            pingpong: true,
            ..c
        })
    };
    let tma = |c: Config| {
        let Config::GpuFlash(c) = c else {
            unreachable!()
        };
        Config::GpuFlash(GpuFlashConfig {
            specialized: true,
            tma: true,
            ..c
        })
    };
    // Two query tiles, the second's other warpgroup past the queries; 5 and 6 key tiles of
    // 64, so the producer goes round its two stages three times.
    let long = "flash:batch=1,q_len=150,kv_len=330,q_heads=2,kv_heads=1,head_dim=128,dtype=bf16";
    for (spec, config) in [
        (FLASH_F16_128, specialized(wgmma(128, 64, false, 1))),
        (long, specialized(wgmma(128, 64, false, 1))),
        (long, specialized(wgmma(128, 128, false, 2))),
        (long, specialized(wgmma(128, 128, false, 4))),
        (FLASH_F16_128, pingpong(wgmma(128, 128, false, 1))),
        (long, pingpong(wgmma(128, 64, false, 1))),
        (long, pingpong(wgmma(128, 128, false, 2))),
        (FLASH_F16_128, tma(wgmma(128, 128, false, 1))),
        (long, tma(wgmma(128, 64, false, 1))),
        (long, tma(pingpong(wgmma(128, 128, false, 4)))),
        (FLASH_BF16, tma(wgmma(128, 64, false, 1))),
        (FLASH_BF16, wgmma(64, 64, false, 1)),
        (FLASH_BF16, wgmma(128, 128, true, 1)),
        (FLASH_F16_128, wgmma(64, 128, false, 1)),
        (FLASH_F16_128, wgmma(128, 64, false, 2)),
        (
            "flash:batch=1,q_len=200,kv_len=330,q_heads=2,kv_heads=1,head_dim=128,dtype=bf16",
            wgmma(128, 128, false, 4),
        ),
    ] {
        let problem: Problem = spec.parse().unwrap();
        GpuSpace.validate(&config, &problem, &device).unwrap();
        let data = ProblemData::random(&problem, 6);
        let out = emu
            .run(&data, &config)
            .unwrap_or_else(|e| panic!("{spec} {config}: {e}"));
        let err = relative_error(&out, &data.reference());
        let tol = problem.tolerance();
        assert!(err <= tol, "{spec} {config}: relative error {err:e}");
    }
    // The relative error of `body` built as `config` on `problem`.
    let error_of = |problem: &Problem, config: &Config, body: &str| -> Result<f64, KernelError> {
        let data = ProblemData::random(problem, 6);
        let out = emu.run_source(&data, config, body)?;
        Ok(relative_error(&out, &data.reference()))
    };
    let problem: Problem = FLASH_F16_128.parse().unwrap();
    let tol = problem.tolerance();
    let run = |body: &str| error_of(&problem, &wgmma(64, 64, false, 1), body);
    let flash_with = |from: &str, to: &str| {
        let source = include_str!("../hip/flash.hip");
        assert!(source.contains(from), "flash.hip no longer has `{from}`");
        source.replace(from, to)
    };
    assert!(run(include_str!("../hip/flash.hip")).unwrap() <= tol);
    for (mistake, from, to) in [
        (
            "V read k-major",
            "kt_wgmma_rs<1>(ow, pw[c]",
            "kt_wgmma_rs<0>(ow, pw[c]",
        ),
        (
            "V's column blocks at the wrong distance",
            "2 * KT_BC * 64, 1024, 1)",
            "KT_BC * 64, 1024, 1)",
        ),
        (
            "the copies unswizzled",
            "to + (byte ^ (((byte >> 7) & 7) << 4))",
            "to + byte",
        ),
        (
            "K's next 16 dims a step too short",
            "ks + (16 * st / 64) * KT_BC * 64 + 16 * st % 64",
            "ks + (16 * st / 64) * KT_BC * 64 + 8 * st % 64",
        ),
        (
            "P's fragments in the wrong order",
            "pw[c][1] = kt_pack2(s[2 * c][2], s[2 * c][3]);\n                pw[c][2] = kt_pack2(s[2 * c + 1][0], s[2 * c + 1][1]);",
            "pw[c][2] = kt_pack2(s[2 * c][2], s[2 * c][3]);\n                pw[c][1] = kt_pack2(s[2 * c + 1][0], s[2 * c + 1][1]);",
        ),
    ] {
        caught(mistake, run(&flash_with(from, to)), tol);
    }
    // The warp-specialized hand-over.
    let long: Problem = long.parse().unwrap();
    let run_specialized =
        |body: &str| error_of(&long, &specialized(wgmma(128, 64, false, 1)), body);
    let tol = long.tolerance();
    assert!(run_specialized(include_str!("../hip/flash.hip")).unwrap() <= tol);
    for (mistake, from, to) in [
        (
            "the tiles read before they land",
            "kt_mbar_wait(&full[stage], (it / KT_STAGES) & 1);",
            "",
        ),
        (
            "a stage refilled once one warpgroup is done with it",
            "kt_mbar_init(&empty[st], KT_BR / 64);",
            "kt_mbar_init(&empty[st], 1);",
        ),
        (
            "the next tile's softmax before its scores are done",
            "kt_wgmma_wait<1>();  // the next tile's scores",
            "kt_wgmma_wait<2>();  // the next tile's scores",
        ),
        (
            "O rescaled while this tile's products run",
            "            kt_wgmma_wait<0>();\n            kt_wgmma_fence_operand(ow);\n            // The warpgroup's products with this stage are done: back to the producer.\n            if (tid % 128 == 0) kt_mbar_arrive(&empty[it % KT_STAGES]);\n            rescale(0, corr);",
            "            rescale(0, corr);\n            kt_wgmma_wait<0>();\n            kt_wgmma_fence_operand(ow);\n            if (tid % 128 == 0) kt_mbar_arrive(&empty[it % KT_STAGES]);",
        ),
    ] {
        caught(mistake, run_specialized(&flash_with(from, to)), tol);
    }
    faults(
        run_specialized(&flash_with(
            "kt_mbar_wait(&empty[st], ((it / KT_STAGES) & 1) ^ 1);",
            "kt_mbar_wait(&empty[st], (it / KT_STAGES) & 1);",
        )),
        "mbarrier",
    );
    // Turns: each warpgroup's products correct with them; a protocol in which neither goes
    // first, or the turn is handed to oneself, waits forever and is named.
    let run_pingpong = |body: &str| error_of(&long, &pingpong(wgmma(128, 64, false, 1)), body);
    assert!(run_pingpong(include_str!("../hip/flash.hip")).unwrap() <= tol);
    for (from, to) in [
        ("(k & 1) ^ (wg == 0 ? 1 : 0)", "(k & 1)"),
        (
            "kt_mbar_arrive_if(&turn[1 - tid / 128], tid % 128 == 0);",
            "kt_mbar_arrive_if(&turn[tid / 128], tid % 128 == 0);",
        ),
    ] {
        faults(run_pingpong(&flash_with(from, to)), "mbarrier");
    }
    // By TMA: a batch of two, GQA, fewer queries than keys (FLASH_BF16); the boxes' keys,
    // map and bytes each matter.
    let problem: Problem = FLASH_BF16.parse().unwrap();
    let run_tma = |body: &str| error_of(&problem, &tma(wgmma(128, 64, false, 1)), body);
    let tol = problem.tolerance();
    assert!(run_tma(include_str!("../hip/flash.hip")).unwrap() <= tol);
    for (mistake, from, to) in [
        ("V's boxes read through K's map", "&v_map,", "&k_map,"),
        (
            "every batch's keys from the first",
            "kt_tma_load_4d(stages + 2 * st * KT_TILE + cb * KT_BC * 64, &k_map, 64 * cb,\n                                   kvh, j0, b, &full[st]);",
            "kt_tma_load_4d(stages + 2 * st * KT_TILE + cb * KT_BC * 64, &k_map, 64 * cb,\n                                   kvh, j0, 0, &full[st]);",
        ),
    ] {
        caught(mistake, run_tma(&flash_with(from, to)), tol);
    }
    faults(
        run_tma(&flash_with(
            "kt_mbar_expect_tx(&full[st], 2 * KT_TILE * 2);",
            "kt_mbar_expect_tx(&full[st], KT_TILE * 2);",
        )),
        "does not expect",
    );
    for (from, to, says) in [
        (
            "            kt_wgmma_fence();\n#pragma unroll\n            for (int st",
            "#pragma unroll\n            for (int st",
            "a wgmma without a wgmma.fence before it",
        ),
        (
            "            kt_wgmma_commit();\n            kt_wgmma_wait<0>();\n            kt_wgmma_fence_operand(ow);",
            "",
            "left the kernel with wgmma operations not waited for",
        ),
    ] {
        faults(run(&flash_with(from, to)), says);
    }
}

/// The fp8 GEMM of `config` on `model` and `spec`, with `body` as its source, its scales one
/// a row and column or (`per_tensor`) one each: its relative error.
fn fp8_gemm_error(
    model: &str,
    spec: &str,
    config: GpuGemmConfig,
    body: &str,
    per_tensor: bool,
) -> Result<f64, KernelError> {
    let (_, emu) = emulator(model);
    let problem: Problem = spec.parse().unwrap();
    let mut data = ProblemData::random(&problem, 5);
    if per_tensor {
        data.a_scales = vec![0.75 / 200.0];
        data.b_scales = vec![1.25 / 200.0];
    }
    let out = emu.run_source(&data, &Config::GpuGemm(config), body)?;
    Ok(relative_error(&out, &data.reference()))
}

/// Each fp8 variant, split along k or not, matches the reference with scales per row and
/// column and per tensor, and a mistake in either scale or the readings' factor shows.
#[test]
fn each_fp8_gemm_variant_scales_what_it_stores() {
    let prefill = "gemm:m=37,n=100,k=61,dtype=fp8_e4m3,b=nk";
    let cases = [
        (
            "h200",
            prefill,
            GpuGemmConfig::tile(GpuGemmVariant::Tiled, (32, 32, 16), (2, 2), 1, 1),
        ),
        (
            "h200",
            prefill,
            GpuGemmConfig::tile(GpuGemmVariant::Mma, (64, 64, 32), (2, 2), 1, 2),
        ),
        (
            "h200",
            "gemm:m=3,n=37,k=1040,dtype=fp8_e4m3,b=nk",
            GpuGemmConfig::tile(GpuGemmVariant::Skinny, (4, 16, 1024), (1, 2), 1, 2),
        ),
        (
            "mi300x",
            "gemm:m=37,n=100,k=61,dtype=fp8_e4m3fnuz,b=kn",
            GpuGemmConfig::tile(GpuGemmVariant::Mfma, (64, 64, 16), (1, 1), 1, 1),
        ),
    ];
    let source = include_str!("../hip/gemm.hip");
    let row = "#define KT_ROW_SCALE(row) (factor * a_scales[(row) * a_step])";
    let col = "#define KT_COL_SCALE(col) (b_scales[(col) * b_step])";
    for (model, spec, config) in cases {
        let tol = spec.parse::<Problem>().unwrap().tolerance();
        let what = format!("{model} {spec} {}", Config::GpuGemm(config));
        for per_tensor in [false, true] {
            let ok = fp8_gemm_error(model, spec, config, source, per_tensor).unwrap();
            assert!(ok <= tol, "{what}, per tensor {per_tensor}: {ok:e}");
        }
        for (mistake, from, to) in [
            (
                "the readings' factor left out",
                row,
                "#define KT_ROW_SCALE(row) (a_scales[(row) * a_step])",
            ),
            (
                "one scale for every row of A",
                row,
                "#define KT_ROW_SCALE(row) (factor * a_scales[0])",
            ),
            (
                "one scale for every column of C",
                col,
                "#define KT_COL_SCALE(col) (b_scales[0])",
            ),
            ("B's scales left out", col, "#define KT_COL_SCALE(col) 1.0f"),
        ] {
            caught(
                &format!("{what}: {mistake}"),
                fp8_gemm_error(model, spec, config, &gemm_with(from, to), false),
                tol,
            );
        }
    }
    // The pipelined mma (m16n8k32), wgmma (m64nNk32) and MFMA (32x32x16 fp8) tiles multiply
    // the bytes themselves: their products are the values, so the readings' factor applied
    // there shows as much as one left out elsewhere. wgmma: k of a partial last tile, split.
    let native = "#define KT_ROW_SCALE(row) (a_scales[(row) * a_step])";
    let wgmma_spec = "gemm:m=67,n=130,k=272,dtype=fp8_e4m3,b=nk";
    let wgmma = GpuGemmVariant::Wgmma;
    for (model, spec, config, stride) in [
        (
            "h200",
            "gemm:m=67,n=130,k=80,dtype=fp8_e4m3,b=nk",
            GpuGemmConfig::tile(GpuGemmVariant::Mma, (64, 64, 64), (2, 2), 3, 2),
            "const int kw = k * (int)sizeof(kt_in) / 2, kbw",
        ),
        (
            "mi300x",
            GEMM_FNUZ_NK_PIPELINED,
            GpuGemmConfig::tile(GpuGemmVariant::Mfma, (64, 64, 32), (1, 1), 2, 2),
            "const int kw = k * (int)sizeof(kt_in) / 2;\n    const int kbl",
        ),
        (
            "h200",
            wgmma_spec,
            GpuGemmConfig {
                swizzle: 128,
                ..GpuGemmConfig::tile(wgmma, (64, 128, 128), (1, 128), 3, 2)
            },
            "const int kw = k * (int)sizeof(kt_in) / 2;\n    kb = kb",
        ),
        (
            "h200",
            wgmma_spec,
            GpuGemmConfig {
                swizzle: 128,
                specialized: true,
                tma: true,
                ..GpuGemmConfig::tile(wgmma, (128, 128, 128), (1, 128), 4, 2)
            },
            "kb = kb * (int)sizeof(kt_in) / 2;",
        ),
    ] {
        let tol = spec.parse::<Problem>().unwrap().tolerance();
        for per_tensor in [false, true] {
            let ok = fp8_gemm_error(model, spec, config, source, per_tensor).unwrap();
            assert!(
                ok <= tol,
                "{model} {spec} pipelined, per tensor {per_tensor}: {ok:e}"
            );
        }
        let strided = stride
            .replace("k * (int)sizeof(kt_in) / 2", "k")
            .replace("kb * (int)sizeof(kt_in) / 2", "kb");
        for (mistake, from, to) in [
            (
                "the readings' factor applied",
                native,
                "#define KT_ROW_SCALE(row) (factor * a_scales[(row) * a_step])",
            ),
            (
                "one scale for every row of A",
                native,
                "#define KT_ROW_SCALE(row) (a_scales[0])",
            ),
            (
                "one scale for every column of C",
                col,
                "#define KT_COL_SCALE(col) (b_scales[0])",
            ),
            ("rows strided in bytes, not words", stride, strided.as_str()),
        ] {
            caught(
                &format!("{model} {spec} pipelined: {mistake}"),
                fp8_gemm_error(model, spec, config, &gemm_with(from, to), false),
                tol,
            );
        }
    }
}
