//! The same GPU sources compiled offline with NVRTC for sm_80 (A100), sm_90 (H100, H200) and
//! sm_100 (B200), resources read from ptxas's report, and pruning.
//!
//! Needs NVRTC 13 (`pip install nvidia-cuda-nvrtc`, or a CUDA 13 toolkit). Without it each test
//! says it did not run and why; with `KERNTUNE_REQUIRE_NVRTC=1` (set by `.ci/run`, which
//! installs the wheel) a missing NVRTC fails the test instead.

use kerntune_kernels::config::{GpuGemmConfig, GpuGemmVariant};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kerntune_kernels::gpu::nvrtc::{NvrtcCompiler, NvrtcOutput};
use kerntune_kernels::gpu::{judge, KernelBuild, Verdict};
use kerntune_kernels::{Config, Device, GpuFlashConfig, GpuFlashVariant, GpuSpace, Problem, Space};

fn compiler(test: &str) -> Option<NvrtcCompiler> {
    match NvrtcCompiler::find() {
        Ok(c) => Some(c),
        Err(e) if std::env::var_os("KERNTUNE_REQUIRE_NVRTC").is_some() => {
            panic!("{test}: KERNTUNE_REQUIRE_NVRTC is set but {e}")
        }
        Err(e) => {
            eprintln!("{test} did not run: {e}");
            None
        }
    }
}

/// A build compiled for a target: each once in this process.
type Compiled = Arc<OnceLock<Result<NvrtcOutput, String>>>;

/// `build` compiled for `arch` by `nvrtc`, once in this process: the tests share builds (the
/// latent cache's tensor-core candidates are the tensor-core test's, a GEMM tile for decode
/// and for a prefill one build), and one compile took a third of a second on the 2-core CI.
fn compiled(nvrtc: &NvrtcCompiler, build: &KernelBuild, arch: &str) -> Compiled {
    static COMPILED: OnceLock<Mutex<HashMap<(KernelBuild, String), Compiled>>> = OnceLock::new();
    let slot = COMPILED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((build.clone(), arch.to_string()))
        .or_default()
        .clone();
    slot.get_or_init(|| nvrtc.compile(build, arch, build.threads as u32));
    slot
}

/// Compiles every config of `configs` for `name`'s target in parallel and checks each: PTX
/// with mma.sync, shared memory as the space computes it, no spills for the heuristic, which
/// must be among them.
fn check_mma_candidates(nvrtc: &NvrtcCompiler, name: &str, p: &Problem, configs: &[Config]) {
    let heuristic = GpuSpace.heuristic(p, &Device::lookup(name).unwrap());
    assert!(
        configs.contains(&heuristic),
        "{name}: heuristic {heuristic}"
    );
    check_candidates(nvrtc, name, p, configs, "mma.sync.aligned.m16n8k16");
}

/// Compiles every config of `configs` for `name`'s target in parallel and checks each: PTX
/// with `instruction` (and the pipelines' copies and fragment loads where they have stages,
/// the skinny variant's shuffles),
/// shared memory as the space computes it, no spills for the heuristic if among them nor for
/// the wgmma and skinny variants.
fn check_candidates(
    nvrtc: &NvrtcCompiler,
    name: &str,
    p: &Problem,
    configs: &[Config],
    instruction: &str,
) {
    use rayon::prelude::*;
    let device = Device::lookup(name).unwrap();
    let Device::Gpu(g) = device else {
        unreachable!()
    };
    let heuristic = GpuSpace.heuristic(p, &device);
    let results: Vec<_> = configs
        .par_iter()
        .map(|c| {
            let build = KernelBuild::new(p, c).unwrap();
            (*c, compiled(nvrtc, &build, g.arch))
        })
        .collect();
    for (c, out) in results {
        let out = out.get().unwrap().as_ref();
        let out = out.unwrap_or_else(|e| panic!("{name} {c}: {e}"));
        assert!(out.cubin.starts_with(b"\x7fELF"), "{name} {c}: no CUBIN");
        let (ptx, kernels) = (std::str::from_utf8(&out.ptx).unwrap(), &out.kernels);
        assert!(ptx.contains(instruction), "{name} {c}: no {instruction}");
        // ptxas keeps every wgmma asynchronous: a non-wgmma access to a product's registers
        // while it may run (or a path it cannot rule that out on) makes it wait for each.
        assert!(
            !out.log.contains("serialized"),
            "{name} {c}: ptxas serialized its wgmma: {}",
            out.log
        );
        let also: &[&str] = match c {
            // Clusters are the kernel's own (launched as any grid); B by multicast, stages
            // handed back to every block's producer.
            Config::GpuGemm(g) if g.cluster == 2 => &[
                ".target sm_90a",
                ".reqnctapercluster 2, 1, 1",
                "mbarrier::complete_tx::bytes.multicast::cluster",
                "mbarrier.arrive.expect_tx.shared::cta.b64",
                "mapa.shared::cluster.u32",
                "mbarrier.arrive.release.cluster.shared::cluster.b64",
                "barrier.cluster.arrive.release",
                "barrier.cluster.wait.acquire",
                "wgmma.wait_group.sync.aligned",
            ],
            Config::GpuGemm(g) if g.tma => &[
                ".target sm_90a",
                "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
                "mbarrier.arrive.expect_tx.shared::cta.b64",
                "mbarrier.init.shared::cta.b64",
                "mbarrier.try_wait.parity.shared::cta.b64",
                "%globaltimer",
                "trap;",
                "mbarrier.arrive.shared::cta.b64",
                "wgmma.commit_group.sync.aligned",
                "wgmma.wait_group.sync.aligned",
            ],
            Config::GpuGemm(g) if g.specialized => &[
                ".target sm_90a",
                "cp.async.cg.shared.global",
                "mbarrier.init.shared::cta.b64",
                "fence.mbarrier_init.release.cluster",
                "cp.async.mbarrier.arrive.noinc.shared::cta.b64",
                "mbarrier.try_wait.parity.shared::cta.b64",
                "%globaltimer",
                "trap;",
                "mbarrier.arrive.shared::cta.b64",
                "fence.proxy.async.shared::cta",
                "wgmma.commit_group.sync.aligned",
                "wgmma.wait_group.sync.aligned",
            ],
            Config::GpuGemm(g) if g.variant == GpuGemmVariant::Wgmma => &[
                ".target sm_90a",
                "cp.async.cg.shared.global",
                "cp.async.wait_group",
                "fence.proxy.async.shared::cta",
                "wgmma.fence.sync.aligned",
                "wgmma.commit_group.sync.aligned",
                "wgmma.wait_group.sync.aligned",
            ],
            // By TMA: one thread's boxes of the 4D maps, their bytes expected.
            Config::GpuFlash(f) if f.tma => &[
                ".target sm_90a",
                "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes",
                "mbarrier.arrive.expect_tx.shared::cta.b64",
                "mbarrier.try_wait.parity.shared::cta.b64",
                "wgmma.wait_group.sync.aligned",
            ],
            // Taking turns: the predicated arrive that passes the turn.
            Config::GpuFlash(f) if f.pingpong => &[
                ".target sm_90a",
                "@p mbarrier.arrive.shared::cta.b64",
                "cp.async.mbarrier.arrive.noinc.shared::cta.b64",
                "mbarrier.try_wait.parity.shared::cta.b64",
                "wgmma.wait_group.sync.aligned",
            ],
            Config::GpuFlash(f) if f.specialized => &[
                ".target sm_90a",
                ", p, 1, 1, 0; }",
                ", p, 1, 1, 1; }",
                "cp.async.cg.shared.global",
                "mbarrier.init.shared::cta.b64",
                "cp.async.mbarrier.arrive.noinc.shared::cta.b64",
                "mbarrier.try_wait.parity.shared::cta.b64",
                "mbarrier.arrive.shared::cta.b64",
                "fence.proxy.async.shared::cta",
                "wgmma.wait_group.sync.aligned",
            ],
            Config::GpuFlash(f) if f.wgmma => &[
                ".target sm_90a",
                ", p, 1, 1, 0; }",
                ", p, 1, 1, 1; }",
                "cp.async.cg.shared.global",
                "fence.proxy.async.shared::cta",
                "wgmma.fence.sync.aligned",
                "wgmma.commit_group.sync.aligned",
                "wgmma.wait_group.sync.aligned",
            ],
            Config::GpuGemm(g) if g.variant == GpuGemmVariant::Skinny => &["shfl.sync.bfly"],
            // Tensor cores fed by a pipeline of asynchronous copies.
            Config::GpuPaged(g) if g.mma => &[
                "mma.sync.aligned.m16n8k16",
                "ldmatrix.sync.aligned.m8n8.x4.trans",
                "cp.async.cg.shared.global",
                "cp.async.wait_group 1",
            ],
            Config::GpuPaged(g) if g.lanes > 1 => &["shfl.sync.bfly"],
            Config::GpuGemm(g) if g.stages > 1 => &[
                "cp.async.cg.shared.global",
                "cp.async.wait_group",
                "ldmatrix.sync",
            ],
            _ => &[],
        };
        for op in also {
            assert!(ptx.contains(op), "{name} {c}: no {op}");
        }
        let build = KernelBuild::new(p, &c).unwrap();
        let k = kernels.iter().find(|k| k.name == build.entries[0]).unwrap();
        // Static shared memory from ptxas, dynamic from the build (the launch passes it).
        assert_eq!(
            k.lds as usize + build.dynamic_lds,
            kerntune_kernels::space::lds_bytes(&c, p, g),
            "{name} {c}"
        );
        // The heuristic, and every candidate of the variants whose registers have room (the
        // block-scaled space keeps only tiles with room for a group's products beside the
        // sums).
        let blocks = matches!(p, Problem::Gemm(q) if q.block.is_some() || q.int4.is_some());
        let roomy = match c {
            Config::GpuGemm(g) => {
                blocks || matches!(g.variant, GpuGemmVariant::Wgmma | GpuGemmVariant::Skinny)
            }
            Config::GpuPaged(g) => g.lanes > 1 || g.heads > 1,
            // Warps of 32 rows: the plain 32-key tiles, which the space leads with.
            Config::GpuFlash(f) => {
                f.wgmma || (f.lanes == 1 && f.bc == 32 && !f.paired && f.split == 1)
            }
            _ => false,
        };
        if c == heuristic || roomy {
            assert_eq!(k.vgpr_spill, 0, "{name} {c}: {k:?}");
        }
        // The warp-specialized flash of head size 128 launches with the registers its
        // setmaxnreg split shares out (168 · 384 = 128 · 40 + 256 · 232 copying by
        // cp.async, 128 · 24 + 256 · 240 by TMA).
        if build.launch_registers > 0 {
            assert_eq!(k.vgpr, build.launch_registers, "{name} {c}: {k:?}");
            let by_tma = matches!(c, Config::GpuFlash(f) if f.tma);
            let (dec, inc) = if by_tma { (24, 240) } else { (40, 232) };
            for op in [
                format!("setmaxnreg.dec.sync.aligned.u32 {dec}"),
                format!("setmaxnreg.inc.sync.aligned.u32 {inc}"),
            ] {
                assert!(ptx.contains(&op), "{name} {c}: no {op}");
            }
        }
        eprintln!("{name} {c}: {} registers, {} spilled", k.vgpr, k.vgpr_spill);
    }
}

/// The candidates of `p` on model `name` that `keep` selects.
fn candidates_where(name: &str, p: &Problem, keep: impl Fn(&Config) -> bool) -> Vec<Config> {
    GpuSpace
        .candidates(p, &Device::lookup(name).unwrap())
        .into_iter()
        .filter(|c| keep(c))
        .collect()
}

fn problems() -> Vec<Problem> {
    [
        "gemm:m=1,n=1280,k=8192,dtype=bf16",
        "gemm:m=2048,n=1280,k=8192,dtype=f16,b=kn",
        "gemm:m=37,n=100,k=61,dtype=f32",
        "gemm:m=2048,n=1280,k=8192,dtype=fp8_e4m3",
        "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
        "flash:q_len=64,q_heads=4,kv_heads=4,head_dim=80,dtype=f16,causal=false",
        "paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect()
}

#[test]
fn defaults_compile_for_sm80_sm90_and_sm100_without_spills() {
    let Some(nvrtc) = compiler("defaults_compile_for_sm80_sm90_and_sm100_without_spills") else {
        return;
    };
    for name in ["a100", "h100", "h200", "b200"] {
        let device = Device::lookup(name).unwrap();
        let Device::Gpu(g) = device else {
            unreachable!()
        };
        for p in problems() {
            let config = GpuSpace.default_config(&p, &device);
            GpuSpace.validate(&config, &p, &device).unwrap();
            let build = KernelBuild::new(&p, &config).unwrap();
            let out = nvrtc
                .compile(&build, g.arch, build.threads as u32)
                .unwrap_or_else(|e| panic!("{p} {config} for {}: {e}", g.arch));
            // The CUBIN is an ELF image for the architecture compiled for.
            assert!(out.cubin.starts_with(b"\x7fELF"), "{p}: no CUBIN");
            let (ptx, kernels) = (String::from_utf8(out.ptx).unwrap(), out.kernels);
            for entry in build.entries {
                assert!(
                    ptx.contains(&format!(".entry {entry}(")),
                    "{p}: no {entry} in the PTX"
                );
            }
            for entry in build.entries {
                let k = kernels.iter().find(|k| k.name == *entry).unwrap();
                assert_eq!(k.vgpr_spill, 0, "{p} {config}: {k:?}");
                assert!(k.vgpr > 0 && k.vgpr <= 255, "{p} {config}: {k:?}");
            }
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

/// NVRTC 12.9 and later serve a build they compiled before from a cache of their own, with no
/// ptxas report unless that cache is off: the same build compiled again, in this process or
/// (the case met on an H200) after another, still reports its resources.
#[test]
fn a_build_compiled_again_still_reports_its_resources() {
    let Some(nvrtc) = compiler("a_build_compiled_again_still_reports_its_resources") else {
        return;
    };
    let p: Problem = "paged:num_seqs=8,context_len=2048,q_heads=8,kv_heads=1,head_dim=128"
        .parse()
        .unwrap();
    let device = Device::lookup("h200").unwrap();
    let build = KernelBuild::new(&p, &GpuSpace.default_config(&p, &device)).unwrap();
    for round in 0..2 {
        let out = nvrtc
            .compile(&build, "sm_90", build.threads as u32)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        for entry in build.entries {
            let k = out.kernels.iter().find(|k| k.name == *entry);
            assert!(
                k.is_some_and(|k| k.vgpr > 0),
                "round {round}: no resources for {entry}: {:?}",
                out.kernels
            );
        }
    }
}

#[test]
fn static_shared_memory_over_48k_is_refused_and_pruned() {
    let Some(nvrtc) = compiler("static_shared_memory_over_48k_is_refused_and_pruned") else {
        return;
    };
    let device = Device::lookup("h100").unwrap();
    let Device::Gpu(g) = device else {
        unreachable!()
    };
    let p: Problem = "flash:q_len=256,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16"
        .parse()
        .unwrap();
    // 64 keys × 128 dims × 4 bytes × (K and V) = 64 KiB of static shared memory.
    let config = Config::GpuFlash(GpuFlashConfig::new(GpuFlashVariant::Rows, 32, 64, 8));
    let err = GpuSpace.validate(&config, &p, &device).unwrap_err();
    assert!(err.to_string().contains("LDS"), "{err}");
    let build = KernelBuild::new(&p, &config).unwrap();
    let compiled = nvrtc
        .compile(&build, g.arch, build.threads as u32)
        .map(|out| out.kernels);
    match judge(&build, &compiled, g, 1.0) {
        Verdict::Pruned { reason } => assert!(reason.starts_with("over-LDS"), "{reason}"),
        kept => panic!("kept: {kept:?}"),
    }
}

/// The tensor-core variant (mma.sync m16n8k16): every candidate of the space compiles for
/// sm_80 and sm_90 in f16 and bf16, both B layouts, and its shared memory is what the space
/// computes; none spills at the heuristic's tile.
#[test]
fn every_mma_candidate_compiles_for_sm80_and_sm90() {
    let Some(nvrtc) = compiler("every_mma_candidate_compiles_for_sm80_and_sm90") else {
        return;
    };
    for (name, spec) in [
        ("a100", "gemm:m=2048,n=1280,k=8192,dtype=bf16"),
        ("h100", "gemm:m=133,n=1000,k=4096,dtype=f16,b=kn"),
        // Decode: split-K and the one-warp-high tiles.
        ("h200", "gemm:m=16,n=1280,k=8192,dtype=bf16,b=nk"),
        // Rows not of 8 elements: the single-stage kernel only.
        ("h100", "gemm:m=100,n=1000,k=4092,dtype=bf16,b=kn"),
    ] {
        let device = Device::lookup(name).unwrap();
        let p: Problem = spec.parse().unwrap();
        let mma: Vec<Config> = GpuSpace
            .candidates(&p, &device)
            .into_iter()
            .filter(|c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Mma))
            .collect();
        assert!(mma.len() >= 20, "{name}: {} mma candidates", mma.len());
        check_mma_candidates(&nvrtc, name, &p, &mma);
    }
    // f32 and AMD get no mma candidates.
    let p: Problem = "gemm:m=64,n=64,k=64,dtype=f32".parse().unwrap();
    let h100 = Device::lookup("h100").unwrap();
    assert!(!GpuSpace
        .candidates(&p, &h100)
        .iter()
        .any(|c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Mma)));
}

/// Hopper's warpgroup MMA: every wgmma candidate of a Llama prefill and decode GEMM compiles
/// for the arch-specific target sm_90a (the build asks for it), with the copies, the proxy
/// fence and the wgmma fence, commit and wait in its PTX, shared memory as the space computes
/// it and no spilled register; models without sm_90, f32, and a [K, N] B get none.
#[test]
fn every_wgmma_candidate_compiles_for_sm90a() {
    let Some(nvrtc) = compiler("every_wgmma_candidate_compiles_for_sm90a") else {
        return;
    };
    let wgmma = |p: &Problem, name: &str| {
        candidates_where(
            name,
            p,
            |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Wgmma),
        )
    };
    for (name, spec, count) in [
        // 10 warp-specialized tiles by TMA and 5 of them in clusters, 10 by cp.async, then
        // 18 tiles swizzled and in core matrices.
        ("h200", "gemm:m=2048,n=1280,k=8192,dtype=bf16,b=nk", 61),
        // Decode: 64-row tiles with every split, after the mma ones; two specialized tiles
        // split by TMA first among those (too few blocks unsplit). The unsplit 64x128 tile of
        // 3 stages is one of the general tiles too, offered once.
        ("h200", "gemm:m=16,n=1280,k=8192,dtype=bf16,b=nk", 67),
        // Two m tiles of 128 pair in clusters; one of 256 does not.
        ("h100", "gemm:m=133,n=1000,k=4096,dtype=f16,b=nk", 62),
    ] {
        let p: Problem = spec.parse().unwrap();
        let configs = wgmma(&p, name);
        assert_eq!(configs.len(), count, "{name} {spec}: {configs:?}");
        check_candidates(&nvrtc, name, &p, &configs, "wgmma.mma_async.sync.aligned");
    }
    for (name, spec) in [
        ("a100", "gemm:m=2048,n=1280,k=8192,dtype=bf16,b=nk"),
        ("h100", "gemm:m=2048,n=1280,k=8192,dtype=f32,b=nk"),
        ("h100", "gemm:m=2048,n=1280,k=8192,dtype=bf16,b=kn"),
        ("h100", "gemm:m=2048,n=1280,k=8190,dtype=bf16,b=nk"),
        ("mi300x", "gemm:m=2048,n=1280,k=8192,dtype=bf16,b=nk"),
    ] {
        let p: Problem = spec.parse().unwrap();
        assert!(wgmma(&p, name).is_empty(), "{name} {spec}");
    }
}

#[test]
fn every_skinny_candidate_compiles_for_sm80_and_sm90_with_16_byte_loads() {
    let Some(nvrtc) =
        compiler("every_skinny_candidate_compiles_for_sm80_and_sm90_with_16_byte_loads")
    else {
        return;
    };
    // Three tiles (two where 16 rows of A leave room for two weight rows a group), two
    // depths, five splits.
    for (name, spec, count) in [
        ("h200", "gemm:m=1,n=1280,k=8192,dtype=bf16,b=nk", 30),
        ("h200", "gemm:m=4,n=1280,k=8192,dtype=bf16,b=nk", 30),
        ("h200", "gemm:m=8,n=7168,k=8192,dtype=f16,b=nk", 30),
        ("h200", "gemm:m=16,n=8192,k=1024,dtype=bf16,b=nk", 20),
        ("a100", "gemm:m=4,n=1000,k=4096,dtype=f16,b=nk", 30),
        ("a100", "gemm:m=3,n=61,k=132,dtype=f32,b=nk", 30),
    ] {
        let p: Problem = spec.parse().unwrap();
        let configs = candidates_where(
            name,
            &p,
            |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Skinny),
        );
        assert_eq!(configs.len(), count, "{name} {spec}: {configs:?}");
        // The weights and activations arrive in 16-byte loads; the sums meet by shuffles.
        check_candidates(&nvrtc, name, &p, &configs, "ld.global.nc.v4.");
    }
}

#[test]
fn every_grouped_paged_candidate_compiles_for_sm80_and_sm90_with_16_byte_loads() {
    let Some(nvrtc) =
        compiler("every_grouped_paged_candidate_compiles_for_sm80_and_sm90_with_16_byte_loads")
    else {
        return;
    };
    // Groups of 4, 8 and 16 lanes where a lane takes whole pieces and at most 16 dims (32
    // made ptxas spill at 56 registers), three partitions, four block sizes.
    for (name, spec, count) in [
        (
            "h200",
            "paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
            24,
        ),
        (
            "a100",
            "paged:num_seqs=8,context_len=2048,q_heads=32,kv_heads=8,head_dim=64,dtype=f16",
            24,
        ),
        (
            "h100",
            "paged:num_seqs=4,context_len=999,q_heads=8,kv_heads=8,head_dim=96,dtype=f32,block_size=32",
            12,
        ),
    ] {
        let p: Problem = spec.parse().unwrap();
        let configs = candidates_where(name, &p, |c| matches!(c, Config::GpuPaged(c) if c.lanes > 1));
        assert_eq!(configs.len(), count, "{name} {spec}: {configs:?}");
        check_candidates(&nvrtc, name, &p, &configs, "ld.global.nc.v4.");
    }
}

/// Flash attention by warpgroup MMA: every such candidate of Llama-70B TP8's prefill (head
/// size 128) and of head size 64, warp-specialized or not, compiles for sm_90a with S's
/// k-major and O's n-major instructions in its PTX and no spilled register (the specialized
/// ones with their register split and mbarriers); other models get none.
#[test]
fn every_wgmma_flash_candidate_compiles_for_sm90a() {
    let Some(nvrtc) = compiler("every_wgmma_flash_candidate_compiles_for_sm90a") else {
        return;
    };
    let wgmma = |c: &Config| matches!(c, Config::GpuFlash(f) if f.wgmma);
    for (spec, instruction) in [
        (
            "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
        ),
        (
            "flash:q_len=300,q_heads=4,kv_heads=4,head_dim=64,dtype=f16,causal=false",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
        ),
    ] {
        let p: Problem = spec.parse().unwrap();
        let configs = candidates_where("h200", &p, wgmma);
        // Four tiles, two paired where the mask is causal, four split; the four of 128 rows
        // unpaired also warp-specialized, copying by cp.async and by TMA, each without and
        // with turns.
        let causal = matches!(p, Problem::Flash(f) if f.causal);
        assert_eq!(configs.len(), if causal { 26 } else { 24 }, "{spec}");
        // O's product (N = the head size) in every build; the k-major and n-major forms by
        // their last immediate.
        check_candidates(&nvrtc, "h200", &p, &configs, instruction);
        assert!(candidates_where("a100", &p, wgmma).is_empty(), "{spec}");
        // The specialized tiles with 128 keys or of head size 128 split the registers (the
        // others fit in an even share); a build whose kernel would launch with fewer
        // registers than its split shares out is refused by the compile, never run.
        let Problem::Flash(f) = p else { unreachable!() };
        for c in &configs {
            let Config::GpuFlash(g) = c else {
                unreachable!()
            };
            if !g.specialized {
                continue;
            }
            let mut build = KernelBuild::new(&p, c).unwrap();
            let split = f.head_dim == 128 || g.bc == 128;
            assert_eq!(build.launch_registers > 0, split, "{spec} {c}");
            if split {
                build.launch_registers += 8;
                let e = nvrtc
                    .compile(&build, "sm_90", build.threads as u32)
                    .unwrap_err();
                assert!(e.contains("would wait forever"), "{e}");
            }
        }
    }
}

/// Sliding-window builds (KT_WINDOW, their masks): every warpgroup-MMA tile of a windowed
/// Llama-70B TP8 prefill, and the NVIDIA heuristic, compile for sm_90a without spills, with
/// the space's shared memory; the builds of the problem without a window hold none of that
/// code (their names, and so their compiled code, differ).
#[test]
fn windowed_flash_builds_compile_for_sm90a_without_spills() {
    let Some(nvrtc) = compiler("windowed_flash_builds_compile_for_sm90a_without_spills") else {
        return;
    };
    let spec = "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16";
    let p: Problem = format!("{spec},window=512").parse().unwrap();
    let mut configs = candidates_where("h200", &p, |c| matches!(c, Config::GpuFlash(f) if f.wgmma));
    assert_eq!(configs.len(), 26, "{p}");
    configs.push(GpuSpace.heuristic(&p, &Device::lookup("h200").unwrap()));
    check_candidates(&nvrtc, "h200", &p, &configs, "mma");
    let full: Problem = spec.parse().unwrap();
    for c in &configs {
        let windowed = KernelBuild::new(&p, c).unwrap().key();
        assert!(windowed.contains("KT_WINDOW=1"), "{windowed}");
        let plain = KernelBuild::new(&full, c).unwrap().key();
        assert!(!plain.contains("KT_WINDOW"), "{plain}");
    }
}

/// Every warpgroup-MMA tile and the heuristic of each flash spec, every candidate of each
/// paged one, of `specs` with `extra` appended: compiled for sm_90a, no spills, each build
/// carrying `define`, which the build of the spec without `extra` lacks.
fn attention_builds_compile_without_spills(
    nvrtc: &NvrtcCompiler,
    specs: &[String],
    extra: &str,
    define: &str,
) {
    let h200 = Device::lookup("h200").unwrap();
    for spec in specs {
        let plain: Problem = spec.parse().unwrap();
        let p: Problem = format!("{spec},{extra}").parse().unwrap();
        let mut configs = candidates_where("h200", &p, |c| match c {
            Config::GpuFlash(f) => f.wgmma,
            _ => true,
        });
        assert!(!configs.is_empty(), "{p}");
        configs.push(GpuSpace.heuristic(&p, &h200));
        let variant = if spec.starts_with("flash") {
            "mma"
        } else {
            "kt_paged_reduce"
        };
        check_candidates(nvrtc, "h200", &p, &configs, variant);
        for c in &configs {
            let key = KernelBuild::new(&p, c).unwrap().key();
            assert!(key.contains(&format!("{define}=1")), "{key}");
            let key = KernelBuild::new(&plain, c).unwrap().key();
            assert!(!key.contains(define), "{key}");
        }
    }
}

/// Sink builds (KT_SINKS): gpt-oss-120b's attention at TP8 (8 query heads on one KV head of
/// 64 dims, every other layer in a window of 128 tokens, sinks in all), the windowed and the
/// full prefill and the decode.
#[test]
fn sink_builds_compile_for_sm90a_without_spills() {
    let Some(nvrtc) = compiler("sink_builds_compile_for_sm90a_without_spills") else {
        return;
    };
    let prefill = "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16";
    let decode = "paged:num_seqs=64,context_len=8192,q_heads=8,kv_heads=1,head_dim=64,dtype=bf16";
    let specs = [
        format!("{prefill},window=128"),
        prefill.into(),
        decode.into(),
    ];
    attention_builds_compile_without_spills(&nvrtc, &specs, "sinks=true", "KT_SINKS");
}

/// Soft-capped builds (KT_SOFTCAP): Gemma 2 27B's attention at TP4 (8 query heads on 4 KV
/// heads of 128 dims, a cap of 50, a window of 4096 tokens every other layer), the windowed
/// and the full prefill and the decode.
#[test]
fn softcap_builds_compile_for_sm90a_without_spills() {
    let Some(nvrtc) = compiler("softcap_builds_compile_for_sm90a_without_spills") else {
        return;
    };
    let prefill = "flash:q_len=8192,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16";
    let decode = "paged:num_seqs=64,context_len=8192,q_heads=8,kv_heads=4,head_dim=128,dtype=bf16";
    let specs = [
        format!("{prefill},window=4096"),
        prefill.into(),
        decode.into(),
    ];
    attention_builds_compile_without_spills(&nvrtc, &specs, "softcap=50", "KT_SOFTCAP");
}

/// ALiBi builds (KT_ALIBI): Bloom-176B's attention at TP8 (14 heads of 128 dims, each its own
/// KV head), the prefill and the decode.
#[test]
fn alibi_builds_compile_for_sm90a_without_spills() {
    let Some(nvrtc) = compiler("alibi_builds_compile_for_sm90a_without_spills") else {
        return;
    };
    let specs = [
        "flash:q_len=2048,q_heads=14,kv_heads=14,head_dim=128,dtype=bf16".to_string(),
        "paged:num_seqs=64,context_len=2048,q_heads=14,kv_heads=14,head_dim=128,dtype=bf16".into(),
    ];
    attention_builds_compile_without_spills(&nvrtc, &specs, "alibi=true", "KT_ALIBI");
}

/// fp8 (W8A8) GEMMs of Llama-3.1-70B at TP8: every skinny candidate of a decode step (the
/// weights' bytes in 16-byte loads); the pipelined mma tiles of a prefill for sm_90, 128 bytes
/// of k deep (the others differ from them in depth only) and the heuristic, multiplying the
/// bytes by m16n8k32; and the A100's one-stage tiles 32 deep, which widen the bytes to f16.
#[test]
fn fp8_gemm_builds_compile_for_sm80_and_sm90() {
    let Some(nvrtc) = compiler("fp8_gemm_builds_compile_for_sm80_and_sm90") else {
        return;
    };
    let decode: Problem = "gemm:m=4,n=1280,k=8192,dtype=fp8_e4m3,b=nk"
        .parse()
        .unwrap();
    let skinny = candidates_where(
        "h200",
        &decode,
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Skinny),
    );
    assert_eq!(skinny.len(), 30, "{skinny:?}");
    check_candidates(&nvrtc, "h200", &decode, &skinny, "ld.global.nc.v4.");
    let prefill: Problem = "gemm:m=2048,n=1280,k=8192,dtype=fp8_e5m2,b=nk"
        .parse()
        .unwrap();
    let heuristic = GpuSpace.heuristic(&prefill, &Device::lookup("h200").unwrap());
    let native = candidates_where(
        "h200",
        &prefill,
        |c| matches!(c, Config::GpuGemm(g) if g.variant == GpuGemmVariant::Mma && (g.bk == 128 || *c == heuristic)),
    );
    assert_eq!(native.len(), 19, "{native:?}");
    check_candidates(
        &nvrtc,
        "h200",
        &prefill,
        &native,
        "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32",
    );
    // Hopper's m64nNk32 on the bytes: the bf16 prefill's 61 wgmma tiles, twice as deep.
    let wgmma = candidates_where(
        "h200",
        &prefill,
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Wgmma),
    );
    assert_eq!(wgmma.len(), 61, "{wgmma:?}");
    check_candidates(&nvrtc, "h200", &prefill, &wgmma, "k32.f32.e5m2.e5m2");
    let a100: Problem = "gemm:m=2048,n=1280,k=8192,dtype=fp8_e4m3,b=nk"
        .parse()
        .unwrap();
    let widened = candidates_where(
        "a100",
        &a100,
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Mma && c.bk == 32),
    );
    assert_eq!(widened.len(), 19, "{widened:?}");
    check_candidates(
        &nvrtc,
        "a100",
        &a100,
        &widened,
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    );
}

/// Int4 GEMMs (KT_INT4, GPTQ's words) of Llama-3.1-70B at TP8, qkv: every skinny candidate
/// of a decode step unsplit (the words read in place, A in 16-byte loads), and of a prompt
/// the one-stage mma tiles 32 deep, the guess among them, and the default tiled tile (each
/// word unpacked as staged; f16 rounded by the conversion instruction), none spilling.
#[test]
fn int4_gemm_builds_compile_for_sm80_and_sm90() {
    let Some(nvrtc) = compiler("int4_gemm_builds_compile_for_sm80_and_sm90") else {
        return;
    };
    let h200 = Device::lookup("h200").unwrap();
    let decode: Problem = "gemm:m=1,n=1280,k=8192,dtype=bf16,b=kn,int4=128"
        .parse()
        .unwrap();
    let skinny = candidates_where(
        "h200",
        &decode,
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Skinny && c.split_k == 1),
    );
    assert_eq!(skinny.len(), 10, "{skinny:?}");
    check_candidates(&nvrtc, "h200", &decode, &skinny, "ld.global.nc.v4.u32");
    let prefill: Problem = "gemm:m=2048,n=1280,k=8192,dtype=f16,b=kn,int4=128"
        .parse()
        .unwrap();
    let staged = candidates_where(
        "h200",
        &prefill,
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Mma && c.bk == 32),
    );
    assert_eq!(staged.len(), 19, "{staged:?}");
    assert!(staged.contains(&GpuSpace.heuristic(&prefill, &h200)));
    check_candidates(&nvrtc, "h200", &prefill, &staged, "cvt.rn.f16.f32");
    let tiled = [GpuSpace.default_config(&prefill, &h200)];
    check_candidates(&nvrtc, "a100", &prefill, &tiled, "fma.rn.f32");
}

/// Block-scaled fp8 GEMMs (KT_BLOCK) of DeepSeek-V3 at TP8, gate and up: every skinny
/// candidate of a decode step (16-byte weight loads, each piece's products scaled by its
/// group's scales), the tiled prompt tiles 16 of k deep (the others differ in depth only) and
/// the pipelined mma tiles 128 bytes deep and the guess (m16n8k32 on the bytes, a group's
/// products held apart until promoted) for sm_90 and the wgmma tiles for sm_90a (each k tile a
/// group, waited for before it is promoted, every other wgmma still asynchronous), none
/// spilling.
#[test]
fn block_scaled_fp8_builds_compile_for_sm90() {
    let Some(nvrtc) = compiler("block_scaled_fp8_builds_compile_for_sm90") else {
        return;
    };
    let decode: Problem = "gemm:m=4,n=4608,k=7168,dtype=fp8_e4m3,b=nk,block=128"
        .parse()
        .unwrap();
    let skinny = candidates_where(
        "h200",
        &decode,
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Skinny),
    );
    assert_eq!(skinny.len(), 30, "{skinny:?}");
    check_candidates(&nvrtc, "h200", &decode, &skinny, "ld.global.nc.v4.");
    let prefill: Problem = "gemm:m=2048,n=4608,k=7168,dtype=fp8_e4m3,b=nk,block=128"
        .parse()
        .unwrap();
    let tiled = candidates_where(
        "h200",
        &prefill,
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Tiled && c.bk == 16),
    );
    assert_eq!(tiled.len(), 21, "{tiled:?}");
    check_candidates(&nvrtc, "h200", &prefill, &tiled, "fma.rn.f32");
    let heuristic = GpuSpace.heuristic(&prefill, &Device::lookup("h200").unwrap());
    let native = candidates_where(
        "h200",
        &prefill,
        |c| matches!(c, Config::GpuGemm(g) if g.variant == GpuGemmVariant::Mma && (g.bk == 128 || *c == heuristic)),
    );
    assert_eq!(native.len(), 11, "{native:?}");
    check_candidates(
        &nvrtc,
        "h200",
        &prefill,
        &native,
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32",
    );
    // Hopper's m64nNk32, each k tile a group: not warp-specialized, 64 sums a thread at most.
    let wgmma = candidates_where(
        "h200",
        &prefill,
        |c| matches!(c, Config::GpuGemm(c) if c.variant == GpuGemmVariant::Wgmma),
    );
    assert_eq!(wgmma.len(), 12, "{wgmma:?}");
    check_candidates(&nvrtc, "h200", &prefill, &wgmma, "k32.f32.e4m3.e4m3");
}

/// Fp8-cache builds (KT_KV_FP8): every paged candidate of Llama-3.1-70B's TP8 decode on an
/// E4M3 cache for sm_90a, none spilling; the grouped candidates of an E5M2 cache under f16
/// queries (head size 64, 4 KV heads) for sm_80 and sm_90, reading their cache rows in
/// 8-byte pieces.
#[test]
fn fp8_cache_builds_compile_without_spills() {
    let Some(nvrtc) = compiler("fp8_cache_builds_compile_without_spills") else {
        return;
    };
    let decode = "paged:num_seqs=64,context_len=8192,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16";
    attention_builds_compile_without_spills(
        &nvrtc,
        &[decode.into()],
        "kv_dtype=fp8_e4m3",
        "KT_KV_FP8",
    );
    let p: Problem = "paged:num_seqs=8,context_len=2048,q_heads=32,kv_heads=4,head_dim=64,dtype=f16,kv_dtype=fp8_e5m2"
        .parse()
        .unwrap();
    for name in ["a100", "h100"] {
        let configs = candidates_where(
            name,
            &p,
            |c| matches!(c, Config::GpuPaged(c) if c.lanes > 1),
        );
        assert_eq!(configs.len(), 24, "{name}: {configs:?}");
        check_candidates(&nvrtc, name, &p, &configs, "ld.global.nc.v2.");
    }
}

/// Blocks of several query heads (KT_HEADS): every such candidate of Llama-3.1-70B's TP8
/// decode (8 heads on one KV head) for sm_80 and sm_90a, none spilling, each keyed by its
/// heads. (The latent test below compiles DeepSeek's, 16 heads on one row of 576.)
#[test]
fn several_heads_builds_compile_without_spills() {
    let Some(nvrtc) = compiler("several_heads_builds_compile_without_spills") else {
        return;
    };
    let p: Problem =
        "paged:num_seqs=64,context_len=8192,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16"
            .parse()
            .unwrap();
    for name in ["a100", "h200"] {
        let configs = candidates_where(
            name,
            &p,
            |c| matches!(c, Config::GpuPaged(c) if c.heads > 1 && !c.mma),
        );
        assert_eq!(configs.len(), 27, "{name}: {configs:?}");
        check_candidates(&nvrtc, name, &p, &configs, "kt_paged_reduce");
        for c in &configs {
            let Config::GpuPaged(g) = c else {
                unreachable!()
            };
            let key = KernelBuild::new(&p, c).unwrap().key();
            assert!(key.contains(&format!("KT_HEADS={}", g.heads)), "{key}");
        }
    }
}

/// Latent-cache builds (KT_DV): every paged candidate of DeepSeek-V3's TP8 decode (16 query
/// heads on one latent row of 576 values, values of 512) on a bf16 and an E4M3 cache, for
/// sm_80 and sm_90a, none spilling, each keyed by its value width.
#[test]
fn latent_cache_builds_compile_without_spills() {
    let Some(nvrtc) = compiler("latent_cache_builds_compile_without_spills") else {
        return;
    };
    let decode = "paged:num_seqs=64,context_len=8192,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,dtype=bf16,scale=0.1352";
    for spec in [decode.to_string(), format!("{decode},kv_dtype=fp8_e4m3")] {
        let p: Problem = spec.parse().unwrap();
        for name in ["a100", "h200"] {
            let device = Device::lookup(name).unwrap();
            let mut configs = candidates_where(name, &p, |_| true);
            assert!(!configs.is_empty(), "{name} {p}");
            configs.push(GpuSpace.heuristic(&p, &device));
            check_candidates(&nvrtc, name, &p, &configs, "kt_paged_reduce");
            for c in &configs {
                let key = KernelBuild::new(&p, c).unwrap().key();
                assert!(key.contains("KT_DV=512"), "{key}");
            }
        }
    }
}

/// Tensor-core builds (KT_PAGED_MMA): every such candidate of DeepSeek-V3's TP8 latent
/// decode (16 heads on rows of 576, values their first 512) and of Llama-3.1-70B's TP8
/// decode (8 heads on a KV head of 128), on bf16 and E4M3 caches, for sm_80 and sm_90a:
/// mma.sync fed by ldmatrix from a pipeline of cp.async copies, shared memory as the space
/// computes it, none spilling. DeepSeek's blocks take the warps their two stages of rows of
/// 584 leave room for: 2 or 4 on an H200 (4: 171 KiB of its 227; 170 KiB on E4M3, two
/// stages of bytes and one widened), 2 on an A100 (164 KiB).
#[test]
fn tensor_core_paged_builds_compile_without_spills() {
    let Some(nvrtc) = compiler("tensor_core_paged_builds_compile_without_spills") else {
        return;
    };
    let deepseek = "paged:num_seqs=64,context_len=8192,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,dtype=bf16,scale=0.1352";
    let llama = "paged:num_seqs=64,context_len=8192,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16";
    let e4m3 = ",kv_dtype=fp8_e4m3";
    for (spec, name, threads) in [
        (deepseek, "a100", &[64][..]),
        (deepseek, "h200", &[64, 128]),
        (llama, "a100", &[64, 128, 256]),
        (llama, "h200", &[64, 128, 256]),
        (&format!("{deepseek}{e4m3}"), "a100", &[64]),
        (&format!("{deepseek}{e4m3}"), "h200", &[64, 128]),
        (&format!("{llama}{e4m3}"), "h200", &[64, 128, 256]),
    ] {
        let p: Problem = spec.parse().unwrap();
        let configs = candidates_where(name, &p, |c| matches!(c, Config::GpuPaged(c) if c.mma));
        let mut seen: Vec<usize> = configs
            .iter()
            .map(|c| match c {
                Config::GpuPaged(c) => c.threads,
                _ => unreachable!(),
            })
            .collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen, threads, "{name} {p}");
        check_candidates(&nvrtc, name, &p, &configs, "kt_paged_reduce");
    }
}

/// The B200 (sm_100) has no warpgroup MMA (Hopper's alone; Blackwell's own tensor-core
/// instructions, tcgen05, are not what kerntune emits): its GEMM and flash candidates are
/// mma.sync and CUDA-core forms, and every problem's heuristic, and every tensor-core
/// candidate of DeepSeek-V3's TP8 latent decode, compile for sm_100 without spills.
#[test]
fn b200_builds_take_mma_sync_and_compile_for_sm100() {
    let Some(nvrtc) = compiler("b200_builds_take_mma_sync_and_compile_for_sm100") else {
        return;
    };
    let b200 = Device::lookup("b200").unwrap();
    for p in problems() {
        let all = GpuSpace.candidates(&p, &b200);
        assert!(!all.is_empty(), "{p}");
        assert!(
            all.iter().all(|c| match c {
                Config::GpuGemm(g) => g.variant != GpuGemmVariant::Wgmma,
                Config::GpuFlash(f) => !f.wgmma,
                _ => true,
            }),
            "{p}"
        );
        let heuristic = GpuSpace.heuristic(&p, &b200);
        check_candidates(&nvrtc, "b200", &p, &[heuristic], ".target sm_100");
    }
    let wgmma: Problem = "gemm:m=2048,n=1280,k=8192,dtype=bf16".parse().unwrap();
    let wg = GpuGemmConfig {
        variant: GpuGemmVariant::Wgmma,
        ..match GpuSpace.heuristic(&wgmma, &Device::lookup("h200").unwrap()) {
            Config::GpuGemm(g) => g,
            other => panic!("{other}"),
        }
    };
    let e = GpuSpace
        .validate(&Config::GpuGemm(wg), &wgmma, &b200)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sm_100"), "{e}");
    let deepseek: Problem = "paged:num_seqs=64,context_len=8192,q_heads=16,kv_heads=1,head_dim=576,v_head_dim=512,block_size=64,dtype=bf16,scale=0.1352".parse().unwrap();
    let configs = candidates_where(
        "b200",
        &deepseek,
        |c| matches!(c, Config::GpuPaged(c) if c.mma),
    );
    assert!(configs.len() >= 16, "{configs:?}");
    check_candidates(
        &nvrtc,
        "b200",
        &deepseek,
        &configs,
        "mma.sync.aligned.m16n8k16",
    );
}

/// Narrow-value builds (KT_DV): every flash candidate of DeepSeek-V3's TP8 prefill (16 heads,
/// keys of 192, values of 128), with the heuristic and the default, compiled for sm_80 and
/// sm_90a, each keyed by its value width; no warpgroup-MMA tile among them (its tiles take
/// values as wide as the keys), and the heuristic an mma.sync tile.
#[test]
fn narrow_value_builds_compile() {
    let Some(nvrtc) = compiler("narrow_value_builds_compile") else {
        return;
    };
    let p: Problem = "flash:q_len=4096,q_heads=16,kv_heads=16,head_dim=192,v_head_dim=128,dtype=bf16,scale=0.1352"
        .parse()
        .unwrap();
    for name in ["a100", "h200"] {
        let device = Device::lookup(name).unwrap();
        let mut configs = candidates_where(name, &p, |_| true);
        assert!(
            !configs
                .iter()
                .any(|c| matches!(c, Config::GpuFlash(f) if f.wgmma)),
            "{name}"
        );
        let mma: Vec<Config> = configs
            .iter()
            .copied()
            .filter(|c| matches!(c, Config::GpuFlash(f) if f.variant == GpuFlashVariant::Mma))
            .collect();
        assert!(!mma.is_empty(), "{name}");
        check_mma_candidates(&nvrtc, name, &p, &mma);
        configs.retain(|c| !mma.contains(c));
        configs.push(GpuSpace.default_config(&p, &device));
        check_candidates(&nvrtc, name, &p, &configs, "kt_flash");
        for c in configs.iter().chain(&mma) {
            let key = KernelBuild::new(&p, c).unwrap().key();
            assert!(key.contains("KT_DV=128"), "{key}");
        }
    }
}

#[test]
fn every_flash_mma_candidate_compiles_for_sm80_and_sm90() {
    let Some(nvrtc) = compiler("every_flash_mma_candidate_compiles_for_sm80_and_sm90") else {
        return;
    };
    for (name, spec) in [
        (
            "a100",
            "flash:q_len=2048,q_heads=8,kv_heads=1,head_dim=128,dtype=bf16",
        ),
        (
            "h200",
            "flash:q_len=500,q_heads=4,kv_heads=4,head_dim=80,dtype=f16,causal=false",
        ),
    ] {
        let device = Device::lookup(name).unwrap();
        let p: Problem = spec.parse().unwrap();
        let mma: Vec<Config> = GpuSpace
            .candidates(&p, &device)
            .into_iter()
            .filter(|c| matches!(c, Config::GpuFlash(c) if c.variant == GpuFlashVariant::Mma))
            .collect();
        // 16 tiles of 16 rows a warp and 4 of 32, paired too where the mask is causal, and
        // 8 and 4 with their keys split.
        let tiles = if matches!(p, Problem::Flash(f) if f.causal) {
            2 * (16 + 4) + 8 + 4
        } else {
            16 + 4 + 8 + 4
        };
        assert_eq!(mma.len(), tiles, "{name}: {mma:?}");
        check_mma_candidates(&nvrtc, name, &p, &mma);
    }
    // f32, head sizes not a multiple of 16, and AMD get no mma flash candidates.
    for (name, spec) in [
        (
            "h100",
            "flash:q_len=64,q_heads=2,kv_heads=2,head_dim=64,dtype=f32",
        ),
        (
            "h100",
            "flash:q_len=64,q_heads=2,kv_heads=2,head_dim=72,dtype=bf16",
        ),
        (
            "mi300x",
            "flash:q_len=64,q_heads=2,kv_heads=2,head_dim=64,dtype=bf16",
        ),
    ] {
        let p: Problem = spec.parse().unwrap();
        assert!(!GpuSpace
            .candidates(&p, &Device::lookup(name).unwrap())
            .iter()
            .any(|c| matches!(c, Config::GpuFlash(c) if c.variant == GpuFlashVariant::Mma)));
    }
}
