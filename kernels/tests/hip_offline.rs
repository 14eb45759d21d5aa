//! The GPU sources compiled offline with the real HIP compiler for gfx90a (MI250) and for
//! MI300X (gfx942 where the compiler knows it, else gfx940, the same CDNA3 ISA), resources read
//! back from the code objects, and pruning.
//!
//! Needs clang with HIP headers and ROCm device libraries (Debian: hipcc, libamdhip64-dev;
//! clang-19 and lld-19 for gfx942). Without them each test says it did not run and why; with
//! `KERNTUNE_REQUIRE_HIP=1` (set by `.ci/run`, which installs them all) a missing compiler
//! fails the test instead.

use kerntune_kernels::gpu::hip::HipCompiler;
use kerntune_kernels::gpu::{judge, metadata, KernelBuild, Verdict};
use kerntune_kernels::{
    Config, Device, GpuFlashConfig, GpuFlashVariant, GpuSpace, KernelError, Problem, Space,
};

fn compiler(test: &str) -> Option<HipCompiler> {
    found(test, HipCompiler::find())
}

/// Debian's two HIP compilers: hipcc's clang 15 (gfx940 standing in for gfx942) and clang 19.
fn each_clang(test: &str) -> Vec<HipCompiler> {
    ["clang++-15", "clang++-19"]
        .into_iter()
        .filter_map(|clang| {
            found(
                &format!("{test} with {clang}"),
                HipCompiler::with_clang(clang),
            )
        })
        .collect()
}

fn found(test: &str, compiler: Result<HipCompiler, KernelError>) -> Option<HipCompiler> {
    match compiler {
        Ok(c) => Some(c),
        Err(e) if std::env::var_os("KERNTUNE_REQUIRE_HIP").is_some() => {
            panic!("{test}: KERNTUNE_REQUIRE_HIP is set but {e}")
        }
        Err(e) => {
            eprintln!("{test} did not run: {e}");
            None
        }
    }
}

/// What `hip` compiles for the catalog's `name`.
fn target(hip: &HipCompiler, name: &str) -> String {
    let Device::Gpu(g) = Device::lookup(name).unwrap() else {
        unreachable!()
    };
    hip.target_for(g).unwrap().0
}

/// Llama-3.1-70B TP8 shapes of each family, bf16, an f32 GEMM with a Linear layout, and
/// gpt-oss-120b's TP8 attention (head size 64, sinks, a window of 128 on every other layer) and
/// Gemma 2 27B's at TP4 (soft-capped at 50, 4 KV heads of 128 dims); Llama-70B's TP8 decode on
/// an fp8 (fnuz, MI300X's) cache; DeepSeek-V3's TP8 decode on its latent cache and its
/// prefill (keys of 192, values of 128); Bloom-176B's TP8 attention (14 heads of 128, ALiBi).
fn problems() -> Vec<Problem> {
    [
        "gemm:m=1,n=1280,k=8192,dtype=bf16",
        "gemm:m=512,n=8192,k=1024,dtype=bf16,b=kn",
        "gemm:m=37,n=100,k=61,dtype=f32",
        "gemm:m=4,n=1280,k=8192,dtype=fp8_e4m3fnuz",
        "flash:q_len=512,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
        "flash:q_len=64,q_heads=4,kv_heads=4,head_dim=64,dtype=f16,causal=false",
        "paged:num_seqs=8,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
        "flash:q_len=512,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16,window=128,sinks=true",
        "paged:num_seqs=8,context_len=4096,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16,sinks=true",
        "flash:q_len=512,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16,softcap=50",
        "paged:num_seqs=8,context_len=4096,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16,softcap=50",
        "paged:num_seqs=8,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,kv_dtype=fp8_e4m3fnuz",
        "paged:num_seqs=8,context_len=4096,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,dtype=bf16,scale=0.1352",
        "flash:q_len=2048,q_heads=16,kv_heads=16,head_dim=192,v_head_dim=128,dtype=bf16,scale=0.1352",
        "flash:q_len=512,q_heads=14,kv_heads=14,head_dim=128,dtype=bf16,alibi=true",
        "paged:num_seqs=8,context_len=2048,q_heads=14,kv_heads=14,head_dim=128,dtype=bf16,alibi=true",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect()
}

fn compile(
    hip: &HipCompiler,
    build: &KernelBuild,
    target: &str,
) -> Result<Vec<metadata::KernelResources>, String> {
    hip.compile(build, target)
        .and_then(|object| metadata::read(&object))
}

#[test]
fn defaults_compile_for_mi250_and_mi300x_without_spills_and_within_lds() {
    for hip in each_clang("defaults_compile_for_mi250_and_mi300x") {
        defaults_compile_without_spills_and_within_lds(&hip);
    }
}

fn defaults_compile_without_spills_and_within_lds(hip: &HipCompiler) {
    for name in ["mi250", "mi300x"] {
        let device = Device::lookup(name).unwrap();
        let Device::Gpu(g) = device else {
            unreachable!()
        };
        let target = &target(hip, name);
        for p in problems() {
            let config = GpuSpace.default_config(&p, &device);
            GpuSpace.validate(&config, &p, &device).unwrap();
            let build = KernelBuild::new(&p, &config).unwrap();
            let kernels = compile(hip, &build, target)
                .unwrap_or_else(|e| panic!("{p} {config} for {target} ({}): {e}", hip.version));
            for entry in build.entries {
                let k = kernels.iter().find(|k| k.name == *entry).unwrap();
                assert_eq!((k.vgpr_spill, k.sgpr_spill), (0, 0), "{p} {config}: {k:?}");
                assert!(k.lds <= g.lds_per_block, "{p} {config}: {k:?}");
                assert!(k.vgpr > 0 && k.sgpr > 0, "{p} {config}: {k:?}");
                assert_eq!(k.wave_size, 64);
            }
            // The LDS the space computes is what the compiler allocated.
            let main = kernels.iter().find(|k| k.name == build.entries[0]).unwrap();
            assert_eq!(
                main.lds as usize,
                kerntune_kernels::space::lds_bytes(&config, &p, g),
                "{p} {config}"
            );
            assert!(
                judge(&build, &Ok(kernels), g, 1.0).is_kept(),
                "{p} {config}"
            );
        }
    }
}

/// The machine code of a code object: its `.text` section.
fn text_of(code_object: &[u8]) -> Vec<u8> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(code_object).unwrap();
    let text = file.section_by_name(".text").unwrap();
    text.data().unwrap().to_vec()
}

/// Compiles reading the HIP headers precompiled make the same code as compiles parsing them:
/// the heuristic of a problem of each family (Llama-3.1-70B TP8's, the decode on an fp8
/// cache), for MI250 and MI300X, with each clang, has the same machine code and the same
/// resources both ways (the object's compilation-unit id, a hash of its input, differs).
#[test]
fn precompiled_headers_change_nothing_but_the_time() {
    for hip in each_clang("precompiled_headers_change_nothing_but_the_time") {
        let parsing = HipCompiler::with_clang(&hip.clang)
            .unwrap()
            .without_precompiled_headers();
        for name in ["mi250", "mi300x"] {
            let device = Device::lookup(name).unwrap();
            let target = &target(&hip, name);
            let pch = hip.precompiled(target);
            assert!(
                pch.as_ref().is_some_and(|p| p.exists()),
                "{} made no precompiled headers for {target}",
                hip.version
            );
            assert_eq!(parsing.precompiled(target), None);
            for spec in [
                "gemm:m=512,n=8192,k=1024,dtype=bf16,b=kn",
                "flash:q_len=512,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
                "paged:num_seqs=8,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,kv_dtype=fp8_e4m3fnuz",
            ] {
                let p: Problem = spec.parse().unwrap();
                let config = GpuSpace.heuristic(&p, &device);
                let build = KernelBuild::new(&p, &config).unwrap();
                let what = format!("{p} {config} for {target} ({})", hip.version);
                let fast = hip.compile(&build, target).unwrap_or_else(|e| panic!("{what}: {e}"));
                let slow = parsing
                    .compile(&build, target)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(text_of(&fast), text_of(&slow), "{what}");
                assert_eq!(metadata::read(&fast), metadata::read(&slow), "{what}");
            }
        }
    }
}

#[test]
fn a_sample_of_candidates_compiles_and_is_judged() {
    let Some(hip) = compiler("a_sample_of_candidates_compiles_and_is_judged") else {
        return;
    };
    let device = Device::lookup("mi250").unwrap();
    let Device::Gpu(g) = device else {
        unreachable!()
    };
    let mut kept = 0;
    for p in problems() {
        let candidates = GpuSpace.candidates(&p, &device);
        assert!(!candidates.is_empty(), "{p}");
        // First, middle and last: both GEMM variants where MFMA applies.
        for c in [0, candidates.len() / 2, candidates.len() - 1].map(|i| candidates[i]) {
            let build = KernelBuild::new(&p, &c).unwrap();
            let verdict = judge(&build, &compile(&hip, &build, "gfx90a"), g, 1.0);
            if let Verdict::Pruned { reason } = &verdict {
                // Pruned, but only for a reason the plan names, never a failed compile.
                assert!(
                    reason.starts_with("spills") || reason.starts_with("low occupancy"),
                    "{p} {c}: {reason}"
                );
            } else {
                kept += 1;
            }
        }
    }
    assert!(kept >= problems().len(), "kept only {kept}");
}

#[test]
fn a_config_built_to_overflow_lds_is_pruned() {
    let Some(hip) = compiler("a_config_built_to_overflow_lds_is_pruned") else {
        return;
    };
    let device = Device::lookup("mi250").unwrap();
    let Device::Gpu(g) = device else {
        unreachable!()
    };
    let p: Problem = "flash:q_len=256,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16"
        .parse()
        .unwrap();
    // 128 keys × 128 dims × 4 bytes × (K and V) = 128 KiB, twice the 64 KiB of a CU.
    let config = Config::GpuFlash(GpuFlashConfig::new(GpuFlashVariant::Rows, 16, 128, 8));
    let err = GpuSpace.validate(&config, &p, &device).unwrap_err();
    assert!(err.to_string().contains("LDS"), "{err}");
    // Past the space, the compiler and the judge refuse it too.
    let build = KernelBuild::new(&p, &config).unwrap();
    match judge(&build, &compile(&hip, &build, "gfx90a"), g, 1.0) {
        Verdict::Pruned { reason } => assert!(reason.starts_with("over-LDS"), "{reason}"),
        kept => panic!("an LDS overflow was kept: {kept:?}"),
    }
}

#[test]
fn mfma_is_only_offered_where_it_exists() {
    let p: Problem = "gemm:m=256,n=256,k=256,dtype=bf16".parse().unwrap();
    let is_mfma = |c: &Config| matches!(c, Config::GpuGemm(g) if g.variant == kerntune_kernels::GpuGemmVariant::Mfma);
    for (name, mfma) in [
        ("mi250", true),
        ("mi300x", true),
        ("rx7900xtx", false),
        ("h100", false),
    ] {
        let device = Device::lookup(name).unwrap();
        let candidates = GpuSpace.candidates(&p, &device);
        assert_eq!(candidates.iter().any(is_mfma), mfma, "{name}");
        for c in &candidates {
            GpuSpace.validate(c, &p, &device).unwrap();
            let threads = c.threads() as u32;
            let Device::Gpu(g) = device else {
                unreachable!()
            };
            assert!(threads.is_multiple_of(g.wave_size) && threads <= g.max_threads_per_block);
        }
    }
    let f32: Problem = "gemm:m=256,n=256,k=256".parse().unwrap();
    let mi250 = Device::lookup("mi250").unwrap();
    assert!(!GpuSpace.candidates(&f32, &mi250).iter().any(is_mfma));
    // The CPU space refuses GPU configs and the GPU space CPU ones, with the reason.
    let host = Device::host();
    let gpu_config = GpuSpace.default_config(&p, &mi250);
    let err = kerntune_kernels::CpuSpace
        .validate(&gpu_config, &p, &host)
        .unwrap_err();
    assert!(err.to_string().contains("GPU config"), "{err}");
    let cpu_config = kerntune_kernels::CpuSpace.default_config(&p, &host);
    let err = GpuSpace.validate(&cpu_config, &p, &mi250).unwrap_err();
    assert!(err.to_string().contains("CPU config"), "{err}");
}

#[test]
fn defaults_and_heuristics_are_valid_on_every_gpu_for_awkward_problems() {
    let problems: Vec<Problem> = [
        "gemm:m=1,n=1,k=1",
        "gemm:m=7,n=13,k=17,dtype=f16,b=kn",
        "gemm:m=1,n=1,k=1,dtype=fp8_e4m3",
        "gemm:m=3,n=7,k=33,dtype=fp8_e5m2",
        "gemm:m=100,n=13,k=17,dtype=fp8_e4m3fnuz,b=kn",
        "gemm:m=1,n=1,k=8,dtype=f16,b=kn,int4=8",
        "gemm:m=9,n=13,k=24,dtype=f32,b=kn,int4=24",
        "gemm:m=100,n=13,k=16,dtype=bf16,b=kn,int4=8",
        "flash:q_len=1,q_heads=1,kv_heads=1,head_dim=7",
        "flash:q_len=33,kv_len=65,q_heads=64,kv_heads=8,head_dim=80,dtype=bf16",
        "flash:q_len=9,q_heads=2,kv_heads=1,head_dim=256",
        "paged:num_seqs=1,context_len=1,q_heads=1,kv_heads=1,head_dim=96,block_size=32",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect();
    for g in kerntune_kernels::device::GPU_CATALOG.iter() {
        let device = Device::Gpu(g);
        for p in &problems {
            for c in [
                GpuSpace.default_config(p, &device),
                GpuSpace.heuristic(p, &device),
            ] {
                GpuSpace
                    .validate(&c, p, &device)
                    .unwrap_or_else(|e| panic!("{} {p} {c}: {e}", g.name));
            }
            assert!(
                !GpuSpace.candidates(p, &device).is_empty(),
                "{} {p}",
                g.name
            );
        }
    }
}

/// On a host without an AMD GPU the runtime, when installed, answers "no device": a clear
/// error, never a crash. Where a GPU exists it is listed.
#[test]
fn the_hip_runtime_probe_answers_clearly() {
    match kerntune_kernels::gpu::hip_runtime::probe() {
        Ok(devices) => {
            assert!(!devices.is_empty());
            eprintln!("HIP devices: {devices:?}");
        }
        Err(e) => {
            assert!(
                e.contains("no HIP runtime")
                    || e.contains("no usable device")
                    || e.contains("no device"),
                "{e}"
            );
            // CI installs libamdhip64: there the library loads and reports no device.
            if std::env::var_os("KERNTUNE_REQUIRE_HIP").is_some() {
                assert!(e.contains("libamdhip64"), "{e}");
                assert!(!e.contains("no HIP runtime"), "{e}");
            }
            eprintln!("HIP runtime: {e}");
        }
    }
}

/// The on-device path (feature `rocm`) opens the runtime and answers "no device" here; where
/// an AMD GPU exists it opens it.
#[cfg(feature = "rocm")]
#[test]
fn the_rocm_device_path_opens_or_says_why() {
    match kerntune_kernels::gpu::rocm::HipGpu::open(0) {
        Ok(gpu) => eprintln!("opened {}", gpu.name),
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.contains("hip") && (e.contains("hipInit") || e.contains("no HIP runtime")),
                "{e}"
            );
            if std::env::var_os("KERNTUNE_REQUIRE_HIP").is_some() {
                assert!(
                    e.contains("hipInit found no usable device")
                        || e.contains("hipGetDeviceCount found no device"),
                    "{e}"
                );
            }
        }
    }
}

#[test]
fn every_mfma_flash_candidate_compiles_for_mi250_and_mi300x() {
    use rayon::prelude::*;
    let Some(hip) = compiler("every_mfma_flash_candidate_compiles_for_mi250_and_mi300x") else {
        return;
    };
    for (name, spec) in [
        (
            "mi250",
            "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
        ),
        (
            "mi300x",
            "flash:q_len=500,q_heads=4,kv_heads=4,head_dim=64,dtype=f16,causal=false",
        ),
    ] {
        let target = &target(&hip, name);
        let device = Device::lookup(name).unwrap();
        let Device::Gpu(g) = device else {
            unreachable!()
        };
        let p: Problem = spec.parse().unwrap();
        let mfma: Vec<Config> = GpuSpace
            .candidates(&p, &device)
            .into_iter()
            .filter(|c| matches!(c, Config::GpuFlash(c) if c.variant == GpuFlashVariant::Mfma))
            .collect();
        // Three row tiles by two key tiles, each prefetched and not.
        assert_eq!(mfma.len(), 12, "{name}: {mfma:?}");
        let heuristic = GpuSpace.heuristic(&p, &device);
        assert!(mfma.contains(&heuristic), "{name}: heuristic {heuristic}");
        let results: Vec<_> = mfma
            .par_iter()
            .map(|c| (*c, compile(&hip, &KernelBuild::new(&p, c).unwrap(), target)))
            .collect();
        for (c, out) in results {
            let kernels = out.unwrap_or_else(|e| panic!("{name} {c}: {e}"));
            let k = &kernels[0];
            assert_eq!(
                k.lds as usize,
                kerntune_kernels::space::lds_bytes(&c, &p, g),
                "{name} {c}"
            );
            assert!(k.agpr > 0 || k.vgpr > 0, "{name} {c}: {k:?}");
            if c == heuristic {
                assert_eq!((k.vgpr_spill, k.sgpr_spill), (0, 0), "{name} {c}: {k:?}");
            }
            eprintln!(
                "{name} {c}: {} VGPRs, {} AGPRs, {} spilled",
                k.vgpr, k.agpr, k.vgpr_spill
            );
        }
    }
}

/// Compiles the candidates `keep` selects of each `(model, spec, count)` in parallel and
/// checks each: `count` of them, LDS as the space computes it, nothing spilled.
fn every_candidate_compiles_without_spills(
    hip: &HipCompiler,
    cases: &[(&str, &str, usize)],
    keep: impl Fn(&Config) -> bool,
) {
    use rayon::prelude::*;
    for &(name, spec, count) in cases {
        let target = &target(hip, name);
        let device = Device::lookup(name).unwrap();
        let Device::Gpu(g) = device else {
            unreachable!()
        };
        let p: Problem = spec.parse().unwrap();
        let kept: Vec<Config> = GpuSpace
            .candidates(&p, &device)
            .into_iter()
            .filter(|c| keep(c))
            .collect();
        assert_eq!(kept.len(), count, "{name} {spec}: {kept:?}");
        let results: Vec<_> = kept
            .par_iter()
            .map(|c| (*c, compile(hip, &KernelBuild::new(&p, c).unwrap(), target)))
            .collect();
        for (c, out) in results {
            let kernels = out.unwrap_or_else(|e| panic!("{name} {c}: {e}"));
            let build = KernelBuild::new(&p, &c).unwrap();
            let k = kernels.iter().find(|k| k.name == build.entries[0]).unwrap();
            assert_eq!(
                k.lds as usize,
                kerntune_kernels::space::lds_bytes(&c, &p, g),
                "{name} {c}"
            );
            assert_eq!((k.vgpr_spill, k.sgpr_spill), (0, 0), "{name} {c}: {k:?}");
            eprintln!("{name} {c}: {} VGPRs, {} SGPRs", k.vgpr, k.sgpr);
        }
    }
}

#[test]
fn every_skinny_candidate_compiles_for_mi250_and_mi300x_without_spills() {
    use kerntune_kernels::config::GpuGemmVariant;
    let Some(hip) = compiler("every_skinny_candidate_compiles_for_mi250_and_mi300x") else {
        return;
    };
    // No LDS at all (the space's figure is 0).
    every_candidate_compiles_without_spills(
        &hip,
        &[
            ("mi250", "gemm:m=1,n=1280,k=8192,dtype=bf16,b=nk", 30),
            ("mi250", "gemm:m=16,n=8192,k=1024,dtype=f16,b=nk", 20),
            ("mi300x", "gemm:m=5,n=61,k=132,dtype=f32,b=nk", 30),
        ],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Skinny),
    );
}

/// fp8 (W8A8, MI300X's fnuz) GEMMs of Llama-3.1-70B at TP8: every skinny candidate of a
/// decode step, the one-stage MFMA tiles of a prefill 32 of k deep (the others differ from
/// them in k depth only), staging the bytes' readings as f16, and every pipelined MFMA tile,
/// multiplying the bytes by CDNA3's fp8 MFMA.
#[test]
fn fp8_gemm_candidates_compile_for_mi300x_without_spills() {
    use kerntune_kernels::config::GpuGemmVariant;
    let Some(hip) = compiler("fp8_gemm_candidates_compile_for_mi300x") else {
        return;
    };
    every_candidate_compiles_without_spills(
        &hip,
        &[(
            "mi300x",
            "gemm:m=4,n=1280,k=8192,dtype=fp8_e4m3fnuz,b=nk",
            30,
        )],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Skinny),
    );
    every_candidate_compiles_without_spills(
        &hip,
        &[(
            "mi300x",
            "gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3fnuz,b=nk",
            19,
        )],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Mfma && c.bk == 32 && c.stages == 1),
    );
    // The pipelined tiles on the bytes themselves (v_mfma_f32_32x32x16_fp8_fp8), 64 and 128
    // bytes of k deep.
    every_candidate_compiles_without_spills(
        &hip,
        &[(
            "mi300x",
            "gemm:m=2048,n=7168,k=8192,dtype=fp8_e4m3fnuz,b=nk",
            24,
        )],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Mfma && c.stages == 2),
    );
}

/// Block-scaled fp8 (KT_BLOCK, MI300X's fnuz) GEMMs of DeepSeek-V3 at TP8, gate and up: every
/// skinny candidate of a decode step, the tiled prompt tiles 16 of k deep (the others differ
/// in depth only) and every pipelined MFMA tile (a group's products held apart until
/// promoted), and for MI250 the one-stage MFMA tiles 32 deep, none spilling.
#[test]
fn block_scaled_fp8_candidates_compile_for_mi300x_without_spills() {
    use kerntune_kernels::config::GpuGemmVariant;
    let Some(hip) = compiler("block_scaled_fp8_candidates_compile_for_mi300x") else {
        return;
    };
    every_candidate_compiles_without_spills(
        &hip,
        &[(
            "mi300x",
            "gemm:m=4,n=4608,k=7168,dtype=fp8_e4m3fnuz,b=nk,block=128",
            30,
        )],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Skinny),
    );
    every_candidate_compiles_without_spills(
        &hip,
        &[(
            "mi300x",
            "gemm:m=2048,n=4608,k=7168,dtype=fp8_e4m3fnuz,b=nk,block=128",
            19,
        )],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Tiled && c.bk == 16),
    );
    every_candidate_compiles_without_spills(
        &hip,
        &[(
            "mi300x",
            "gemm:m=2048,n=4608,k=7168,dtype=fp8_e4m3fnuz,b=nk,block=128",
            19,
        )],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Mfma && c.stages == 2),
    );
    // MI250, whose MFMA takes no fp8: the one-stage tiles 32 deep on the bytes' f16 readings.
    every_candidate_compiles_without_spills(
        &hip,
        &[(
            "mi250",
            "gemm:m=2048,n=4608,k=7168,dtype=fp8_e4m3fnuz,b=nk,block=128",
            11,
        )],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Mfma && c.bk == 32),
    );
}

/// Int4 GEMMs (KT_INT4, GPTQ's words) of Llama-3.1-70B at TP8, qkv: every unsplit skinny
/// candidate of a decode step for MI300X (the words read in place) and the one-stage MFMA
/// tiles 32 deep of a prompt for MI250 (each word unpacked as staged, rounded to bf16), none
/// spilling, their LDS as the space counts it.
#[test]
fn int4_gemm_candidates_compile_for_mi250_and_mi300x_without_spills() {
    use kerntune_kernels::config::GpuGemmVariant;
    let Some(hip) = compiler("int4_gemm_candidates_compile_for_mi250_and_mi300x") else {
        return;
    };
    every_candidate_compiles_without_spills(
        &hip,
        &[(
            "mi300x",
            "gemm:m=1,n=1280,k=8192,dtype=bf16,b=kn,int4=128",
            10,
        )],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Skinny && c.split_k == 1),
    );
    every_candidate_compiles_without_spills(
        &hip,
        &[(
            "mi250",
            "gemm:m=2048,n=1280,k=8192,dtype=bf16,b=kn,int4=128",
            19,
        )],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Mfma && c.bk == 32),
    );
}

#[test]
fn every_pipelined_mfma_gemm_candidate_compiles_for_mi250_and_mi300x_without_spills() {
    use kerntune_kernels::config::GpuGemmVariant;
    let Some(hip) = compiler("every_pipelined_mfma_gemm_candidate_compiles_for_mi250_and_mi300x")
    else {
        return;
    };
    // Two LDS tiles of each operand, rows padded by 8 halves: the space's figure.
    every_candidate_compiles_without_spills(
        &hip,
        &[
            ("mi250", "gemm:m=2048,n=1280,k=8192,dtype=bf16,b=nk", 24),
            ("mi300x", "gemm:m=2048,n=7168,k=8192,dtype=f16,b=nk", 24),
        ],
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Mfma && c.stages == 2),
    );
}

#[test]
fn every_grouped_paged_candidate_compiles_for_mi250_and_mi300x_without_spills() {
    let Some(hip) = compiler("every_grouped_paged_candidate_compiles_for_mi250_and_mi300x") else {
        return;
    };
    every_candidate_compiles_without_spills(
        &hip,
        &[
            (
                "mi250",
                "paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
                24,
            ),
            (
                "mi300x",
                "paged:num_seqs=4,context_len=999,q_heads=8,kv_heads=8,head_dim=96,dtype=f32,block_size=32",
                12,
            ),
        ],
        |c| matches!(c, Config::GpuPaged(c) if c.lanes > 1),
    );
}

/// Blocks of several query heads: every such candidate of Llama-3.1-70B's TP8 decode (8 heads
/// on one KV head: 2, 4 and 8 a block) and of DeepSeek-V3's latent decode (16 on one row of
/// 576, values of 512, on an fp8 cache: the candidates whose rows of scores fit the LDS).
#[test]
fn every_paged_candidate_of_several_heads_compiles_without_spills() {
    let Some(hip) = compiler("every_paged_candidate_of_several_heads_compiles_without_spills")
    else {
        return;
    };
    every_candidate_compiles_without_spills(
        &hip,
        &[
            (
                "mi250",
                "paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
                27,
            ),
            (
                "mi300x",
                "paged:num_seqs=8,context_len=4096,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,dtype=bf16,kv_dtype=fp8_e4m3fnuz,scale=0.1352",
                33,
            ),
        ],
        |c| matches!(c, Config::GpuPaged(c) if c.heads > 1 && !c.mfma),
    );
}

/// Matrix cores (`mfma`): every candidate of DeepSeek-V3's TP8 latent decode on an MI300X
/// (16 heads on one row of 576, values of 512: 128 accumulators a lane) and of
/// Llama-3.1-70B's TP8 decode on an fp8 cache on an MI250 (widened in registers).
#[test]
fn every_matrix_core_paged_candidate_compiles_without_spills() {
    let Some(hip) = compiler("every_matrix_core_paged_candidate_compiles_without_spills") else {
        return;
    };
    every_candidate_compiles_without_spills(
        &hip,
        &[
            (
                "mi300x",
                "paged:num_seqs=32,context_len=4096,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=64,dtype=bf16,scale=0.1352",
                45,
            ),
            (
                "mi250",
                "paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16,kv_dtype=fp8_e4m3fnuz",
                30,
            ),
        ],
        |c| matches!(c, Config::GpuPaged(c) if c.mfma),
    );
}

/// The machine of an AMDGPU code object: `EF_AMDGPU_MACH`, the low byte of the ELF header's
/// `e_flags` (byte 48 of a 64-bit header).
fn machine(object: &[u8]) -> u32 {
    u32::from_le_bytes(object[48..52].try_into().unwrap()) & 0xff
}

#[test]
fn mi300x_code_objects_are_gfx942_where_the_compiler_knows_it() {
    // EF_AMDGPU_MACH_AMDGCN_GFX940 and _GFX942.
    const GFX940: u32 = 0x40;
    const GFX942: u32 = 0x4c;
    let device = Device::lookup("mi300x").unwrap();
    let Device::Gpu(g) = device else {
        unreachable!()
    };
    let p: Problem = "flash:q_len=512,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16"
        .parse()
        .unwrap();
    let build = KernelBuild::new(&p, &GpuSpace.default_config(&p, &device)).unwrap();
    let compilers = each_clang("mi300x_code_objects_are_gfx942_where_the_compiler_knows_it");
    for hip in &compilers {
        let (target, warning) = hip.target_for(g).unwrap();
        let object = hip.compile(&build, &target).unwrap();
        if hip.supports("gfx942") {
            // ROCm 5.2's device libraries stop at gfx940, whose ISA-version library stands in.
            assert_eq!(
                (target.as_str(), &warning),
                ("gfx942", &None),
                "{}",
                hip.version
            );
            assert_eq!(machine(&object), GFX942, "{}", hip.version);
        } else {
            assert_eq!(target, "gfx940", "{}", hip.version);
            let warning = warning.unwrap();
            assert!(warning.contains("clang-19 and lld-19"), "{warning}");
            assert_eq!(machine(&object), GFX940, "{}", hip.version);
        }
        let kernels = metadata::read(&object).unwrap();
        let k = kernels.iter().find(|k| k.name == build.entries[0]).unwrap();
        assert_eq!(
            (k.vgpr_spill, k.sgpr_spill),
            (0, 0),
            "{}: {k:?}",
            hip.version
        );
        eprintln!(
            "{} for {target}: {} VGPRs, {} AGPRs",
            hip.version, k.vgpr, k.agpr
        );
    }
    // Where any compiler here builds gfx942, the plan's choice does.
    if compilers.iter().any(|c| c.supports("gfx942")) {
        let chosen = HipCompiler::find_for(g).unwrap();
        assert_eq!(
            chosen.target_for(g).unwrap().0,
            "gfx942",
            "{}",
            chosen.version
        );
    }
}
