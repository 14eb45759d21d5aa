//! Invalid problems, specs, configs and buffers give typed errors, never panics.

use kerntune_kernels::config::{GemmConfig, GemmVariant, Inner, PagedConfig, RocblasConfig, Split};
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::kernel::{Args, GemmArgs, GemmScales, Scratch};
use kerntune_kernels::{
    Backend, Config, CpuBackend, CpuSpace, DType, Device, Family, Fp8, KernelError, Problem, Space,
    Tensor, TensorBuf,
};

fn parse_err(spec: &str) -> KernelError {
    spec.parse::<Problem>().expect_err(spec)
}

#[test]
fn malformed_specs_name_the_problem() {
    for (spec, needle) in [
        ("gemm m=1", "family:key=value"),
        ("conv:m=1", "unknown kernel family"),
        ("gemm:m=1,n=2", "missing required key `k`"),
        ("gemm:m=1,n=2,k=3,q=4", "unknown key `q`"),
        ("gemm:m=x,n=2,k=3", "`m=x`"),
        ("gemm:m=1,n=2,k=3,m=4", "given twice"),
        ("gemm:m=1,n=2,k=3,dtype=f8", "unknown dtype"),
        ("gemm:m=1,n=2,k=3,b=tn", "unknown B layout"),
        ("gemm:m1,n=2,k=3", "not `key=value`"),
    ] {
        let msg = parse_err(spec).to_string();
        assert!(msg.contains(needle), "{spec}: {msg}");
        assert!(
            msg.contains(spec) || spec.starts_with("gemm m"),
            "{spec}: {msg}"
        );
    }
}

#[test]
fn invalid_problems_are_typed_errors() {
    let cases = [
        ("gemm:m=0,n=2,k=3", Family::Gemm, "m"),
        (
            "flash:q_len=8,q_heads=6,kv_heads=4,head_dim=64",
            Family::Flash,
            "kv_heads",
        ),
        (
            "flash:q_len=9,kv_len=8,q_heads=1,head_dim=64,causal=true",
            Family::Flash,
            "q_len",
        ),
        (
            "flash:q_len=9,q_heads=1,head_dim=0",
            Family::Flash,
            "head_dim",
        ),
        (
            "paged:context_len=8,q_heads=4,head_dim=64,block_size=12",
            Family::Paged,
            "block_size",
        ),
        (
            "paged:context_len=0,q_heads=4,head_dim=64",
            Family::Paged,
            "context_len",
        ),
        // Scale blocks: fp8 only, a Linear layer's weights, whole tiles.
        (
            "gemm:m=1,n=64,k=64,dtype=bf16,block=128",
            Family::Gemm,
            "block",
        ),
        (
            "gemm:m=1,n=64,k=64,dtype=fp8_e4m3,b=kn,block=128",
            Family::Gemm,
            "block",
        ),
        (
            "gemm:m=1,n=64,k=64,dtype=fp8_e4m3,block=48",
            Family::Gemm,
            "block",
        ),
        (
            "gemm:m=1,n=64,k=64,dtype=fp8_e4m3,block=0",
            Family::Gemm,
            "block",
        ),
    ];
    for (spec, family, field) in cases {
        match parse_err(spec) {
            KernelError::InvalidProblem {
                family: f,
                field: got,
                ..
            } => {
                assert_eq!((f, got), (family, field), "{spec}");
            }
            other => panic!("{spec}: {other:?}"),
        }
    }
    assert!(matches!(
        "flash:q_len=4,q_heads=1,head_dim=64,scale=-1".parse::<Problem>(),
        Err(KernelError::InvalidProblem { field: "scale", .. })
    ));
}

#[test]
fn keys_round_trip_and_are_canonical() {
    for spec in [
        "gemm:m=1,n=1280,k=8192,dtype=bf16",
        "flash:batch=1,q_len=2048,kv_len=2048,q_heads=8,kv_heads=1,head_dim=128,causal=true,dtype=bf16",
        "paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,block_size=16,dtype=bf16",
        "flash:q_len=4,q_heads=2,head_dim=16,scale=0.5",
        "gemm:m=1,n=4608,k=7168,dtype=fp8_e4m3,b=nk,block=128",
    ] {
        let p: Problem = spec.parse().unwrap();
        let again: Problem = p.key().parse().unwrap();
        assert_eq!(p, again);
        assert_eq!(p.key(), again.key());
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Problem>(&json).unwrap(), p);
    }
    let a: Problem = "gemm:k=3,n=2,m=1".parse().unwrap();
    assert_eq!(a.key(), "gemm:m=1,n=2,k=3,dtype=f32,b=nk");
    // Problems stored before scale blocks read as they were written, and write no block.
    let old = r#"{"family":"gemm","m":1,"n":2,"k":3,"dtype":"fp8_e4m3","b_layout":"nk"}"#;
    let p: Problem = serde_json::from_str(old).unwrap();
    assert_eq!(p.key(), "gemm:m=1,n=2,k=3,dtype=fp8_e4m3,b=nk");
    assert_eq!(serde_json::to_string(&p).unwrap(), old);
    // A stored block is checked as a spec's is.
    let bad = old.replace(r#""nk"}"#, r#""nk","block":100}"#);
    assert!(serde_json::from_str::<Problem>(&bad).is_err());
}

#[test]
fn hostile_configs_are_rejected_before_running() {
    let device = Device::host();
    let p: Problem = "gemm:m=8,n=8,k=8".parse().unwrap();
    let host = kerntune_kernels::CpuInfo::detect();
    let base = GemmConfig {
        variant: GemmVariant::Packed,
        isa: host.isa,
        mr: 4,
        nr: 16,
        mc: 8,
        kc: 8,
        nc: 16,
        split: Split::N,
        threads: 1,
        prefetch: true,
        inner: Inner::M,
    };
    let bad = [
        GemmConfig { mr: 5, ..base },
        GemmConfig { mc: 0, ..base },
        GemmConfig { mc: 6, ..base },
        GemmConfig { kc: 0, ..base },
        GemmConfig {
            kc: usize::MAX,
            ..base
        },
        GemmConfig {
            nc: 1 << 40,
            ..base
        },
        GemmConfig { threads: 0, ..base },
        GemmConfig {
            threads: 100_000,
            ..base
        },
    ];
    let mut scratch = Scratch::new();
    for c in bad {
        let c = Config::Gemm(c);
        let err = CpuSpace
            .validate(&c, &p, &device)
            .expect_err(&c.to_string());
        assert!(
            matches!(
                err,
                KernelError::InvalidConfig {
                    family: Family::Gemm,
                    ..
                }
            ),
            "{err:?}"
        );
        let mut data = ProblemData::random(&p, 1);
        let run = CpuBackend.run(&p, &c, data.args(), scratch.get(1 << 16));
        assert!(run.is_err(), "{c} ran");
    }
    // A config of another family.
    let paged = Config::Paged(PagedConfig {
        isa: host.isa,
        partition: 0,
        group_heads: false,
        threads: 1,
        key_tiles: false,
        amx: false,
        whole_rows: false,
        turn: 0,
        widen: false,
    });
    assert!(matches!(
        CpuSpace.validate(&paged, &p, &device),
        Err(KernelError::FamilyMismatch { .. })
    ));
    // A config whose JSON has unknown fields or a missing one does not parse at all.
    assert!(Config::from_json(
        r#"{"family":"paged","isa":"avx2","partition":0,"group_heads":false,"threads":1,"evil":1}"#
    )
    .is_err());
    assert!(Config::from_json(r#"{"family":"paged","isa":"avx2","partition":0}"#).is_err());
    // A GPU device has no CPU space.
    let gpu = Device::lookup("mi250").unwrap();
    assert!(CpuSpace.candidates(&p, &gpu).is_empty());
    assert!(CpuSpace
        .validate(&CpuSpace.default_config(&p, &device), &p, &gpu)
        .is_err());
}

#[test]
fn wrong_buffers_and_short_scratch_are_errors() {
    let p: Problem = "gemm:m=4,n=4,k=4".parse().unwrap();
    let c = CpuSpace.default_config(&p, &Device::host());
    let need = CpuBackend.scratch_len(&p, &c);
    let a = TensorBuf::from_f32(DType::F32, &[1.0; 16]);
    let short = TensorBuf::from_f32(DType::F32, &[1.0; 15]);
    let half = TensorBuf::from_f32(DType::Bf16, &[1.0; 16]);
    let mut out = vec![0.0; 16];
    let mut scratch = vec![0.0; need];
    let run = |a: &TensorBuf, b: &TensorBuf, out: &mut [f32], s: &mut [f32]| {
        CpuBackend.run(
            &p,
            &c,
            Args::Gemm(GemmArgs::new(a.view(), b.view(), out)),
            s,
        )
    };
    assert!(matches!(
        run(&a, &short, &mut out, &mut scratch),
        Err(KernelError::BadBuffer { name: "b", .. })
    ));
    assert!(matches!(
        run(&a, &half, &mut out, &mut scratch),
        Err(KernelError::BadBuffer { name: "b", .. })
    ));
    assert!(matches!(
        run(&a, &a, &mut out[..3], &mut scratch),
        Err(KernelError::BadBuffer { name: "c", .. })
    ));
    if need > 0 {
        assert!(matches!(
            run(&a, &a, &mut out, &mut scratch[..need - 1]),
            Err(KernelError::ScratchTooSmall { .. })
        ));
    }
    run(&a, &a, &mut out, &mut scratch).unwrap();
    assert!(out.iter().all(|&x| x == 4.0));
}

/// An fp8 GEMM's scales are checked by name: one or one per row of A (column of B), finite
/// and positive, none for other dtypes; the kernel is not run on bad ones. With good ones,
/// a hand computation: A's bytes 1.0 and 2.0, B's 3.0 and -0.5 in E4M3 (0x38, 0x40, 0x44,
/// 0xb0), per-tensor and per-row/column scales.
#[test]
fn fp8_gemm_scales_are_checked_by_name_and_applied() {
    let p: Problem = "gemm:m=2,n=2,k=2,dtype=fp8_e4m3,b=nk".parse().unwrap();
    let c = CpuSpace.default_config(&p, &Device::host());
    let mut scratch = vec![0.0; CpuBackend.scratch_len(&p, &c)];
    // A = [[1, 2], [2, 1]], B (rows are output channels) = [[3, -0.5], [-0.5, 3]].
    let e4m3 = DType::Fp8(Fp8::E4m3);
    let a = TensorBuf::from_f32(e4m3, &[1.0, 2.0, 2.0, 1.0]);
    let b = TensorBuf::from_f32(e4m3, &[3.0, -0.5, -0.5, 3.0]);
    assert_eq!(a.view().as_bytes(), [0x38, 0x40, 0x40, 0x38]);
    assert_eq!(b.view().as_bytes(), [0x44, 0xb0, 0xb0, 0x44]);
    let mut run = |a_scales: &[f32], b_scales: &[f32]| {
        let mut out = vec![f32::NAN; 4];
        let scales = GemmScales {
            a: a_scales,
            b: b_scales,
            zeros: &[],
        };
        let args = Args::Gemm(GemmArgs::scaled(a.view(), b.view(), scales, &mut out));
        CpuBackend.run(&p, &c, args, &mut scratch).map(|()| out)
    };
    for (a_scales, b_scales, name, needle) in [
        (&[][..], &[1.0][..], "a_scales", "holds 0 values"),
        (
            &[1.0, 1.0, 1.0],
            &[1.0],
            "a_scales",
            "one (per tensor) or 2",
        ),
        (&[1.0], &[1.0, 0.0], "b_scales", "[1] is 0"),
        (&[f32::NAN], &[1.0], "a_scales", "finite and positive"),
        (&[1.0], &[-2.0], "b_scales", "finite and positive"),
    ] {
        match run(a_scales, b_scales) {
            Err(KernelError::BadArgument { name: got, reason }) => {
                assert_eq!(got, name, "{reason}");
                assert!(reason.contains(needle), "{name}: {reason}");
            }
            other => panic!("{a_scales:?} {b_scales:?}: {other:?}"),
        }
    }
    // C = A·Bᵀ = [[2, 5.5], [5.5, 2]], per tensor times 0.5 · 4.
    assert_eq!(run(&[0.5], &[4.0]).unwrap(), [4.0, 11.0, 11.0, 4.0]);
    // Per token (0.5, 2) and per channel (1, 0.25).
    assert_eq!(
        run(&[0.5, 2.0], &[1.0, 0.25]).unwrap(),
        [1.0, 0.6875, 11.0, 1.0]
    );
    // A bf16 GEMM given scales is refused: they would be ignored.
    let q: Problem = "gemm:m=2,n=2,k=2,dtype=bf16,b=nk".parse().unwrap();
    let c = CpuSpace.default_config(&q, &Device::host());
    let x = TensorBuf::from_f32(DType::Bf16, &[1.0; 4]);
    let mut out = vec![0.0; 4];
    let scales = GemmScales {
        a: &[1.0],
        b: &[1.0],
        zeros: &[],
    };
    let args = Args::Gemm(GemmArgs::scaled(x.view(), x.view(), scales, &mut out));
    let err = CpuBackend.run(&q, &c, args, &mut scratch).unwrap_err();
    assert!(
        matches!(&err, KernelError::BadArgument { name: "a_scales", reason } if reason.contains("pass none")),
        "{err}"
    );
    // Block-scaled: A's [M, K / 64] and B's [N / 64, K / 64] (rounded up), by name.
    let p: Problem = "gemm:m=2,n=65,k=130,dtype=fp8_e4m3,block=64"
        .parse()
        .unwrap();
    let c = CpuSpace.default_config(&p, &Device::host());
    let (a, b) = (vec![0x38u8; 2 * 130], vec![0x38u8; 65 * 130]);
    let mut out = vec![f32::NAN; 2 * 65];
    let mut scratch = vec![0.0; CpuBackend.scratch_len(&p, &c)];
    let mut run = |a_scales: &[f32], b_scales: &[f32]| {
        let scales = GemmScales {
            a: a_scales,
            b: b_scales,
            zeros: &[],
        };
        let (a, b) = (Tensor::Fp8(Fp8::E4m3, &a), Tensor::Fp8(Fp8::E4m3, &b));
        let args = Args::Gemm(GemmArgs::scaled(a, b, scales, &mut out));
        CpuBackend.run(&p, &c, args, &mut scratch)
    };
    for (a_len, b_len, name, needle) in [
        (
            2,
            6,
            "a_scales",
            "takes 6, [2, 3]: one per token and 64 values of k",
        ),
        (6, 3, "b_scales", "takes 6, [2, 3]: one per 64 × 64 block"),
        (6, 130, "b_scales", "holds 130 values"),
    ] {
        match run(&vec![1.0; a_len], &vec![1.0; b_len]) {
            Err(KernelError::BadArgument { name: got, reason }) => {
                assert_eq!(got, name, "{reason}");
                assert!(reason.contains(needle), "{name}: {reason}");
            }
            other => panic!("{a_len} {b_len}: {other:?}"),
        }
    }
    let mut a_scales = vec![1.0; 6];
    a_scales[5] = f32::INFINITY;
    let err = run(&a_scales, &[1.0; 6]).unwrap_err().to_string();
    assert!(err.contains("[5] is inf"), "{err}");
    // Ones everywhere: each of C's values is the 130 products of 1 · 1.
    run(&[1.0; 6], &[1.0; 6]).unwrap();
    assert!(out.iter().all(|&v| v == 130.0), "{out:?}");
    // fp8 stays a KV-cache type for attention.
    let flash = parse_err("flash:q_len=4,q_heads=2,head_dim=8,dtype=fp8_e4m3").to_string();
    assert!(flash.contains("GEMMs take fp8"), "{flash}");
}

#[test]
fn paged_block_table_out_of_range_is_an_error() {
    let p: Problem = "paged:num_seqs=2,context_len=20,q_heads=2,head_dim=16,block_size=8"
        .parse()
        .unwrap();
    let c = CpuSpace.default_config(&p, &Device::host());
    let mut data = ProblemData::random(&p, 1);
    data.block_tables[1] = 999;
    let mut scratch = Scratch::new();
    let err = CpuBackend
        .run(
            &p,
            &c,
            data.args(),
            scratch.get(CpuBackend.scratch_len(&p, &c)),
        )
        .unwrap_err();
    assert!(err.to_string().contains("block 999"), "{err}");
    let mut data = ProblemData::random(&p, 1).with_context_lens(vec![21, 3]);
    let err = CpuBackend
        .run(
            &p,
            &c,
            data.args(),
            scratch.get(CpuBackend.scratch_len(&p, &c)),
        )
        .unwrap_err();
    assert!(err.to_string().contains("context length 21"), "{err}");
}

#[test]
fn devices_resolve_by_name_and_alias() {
    for (name, model) in [
        ("mi250", "mi250"),
        ("MI250X", "mi250x"),
        ("gfx90a", "mi250"),
        ("gfx942", "mi300x"),
        ("H100", "h100"),
        ("sm_80", "a100"),
        ("Radeon RX 7900 XTX", "rx7900xtx"),
    ] {
        assert_eq!(Device::lookup(name).unwrap().name(), model, "{name}");
    }
    assert!(Device::lookup("cpu").unwrap().is_cpu());
    let err = Device::lookup("tpu").unwrap_err().to_string();
    assert!(
        err.contains("unknown device `tpu`") && err.contains("mi300x"),
        "{err}"
    );
}

/// Block-scaled fp8 runs on the GPU configs that scale each group of k apart (tiled, skinny,
/// and mma, MFMA and wgmma tiles no deeper than a group): every GPU's candidates, default and
/// guess are of them, and a warp-specialized wgmma config or a k tile across groups is refused
/// by name, by the space and by `KernelBuild::new` (through which every GPU backend and the
/// plan build), so no device run reads the scales as per-channel ones.
#[test]
fn block_scaled_fp8_runs_only_on_configs_that_scale_each_group() {
    use kerntune_kernels::config::{GpuGemmConfig, GpuGemmVariant};
    use kerntune_kernels::gpu::KernelBuild;
    use kerntune_kernels::{Config, GpuSpace};
    for m in [1, 16, 2048] {
        let p: Problem = format!("gemm:m={m},n=4608,k=7168,dtype=fp8_e4m3,b=nk,block=128")
            .parse()
            .unwrap();
        for name in ["h100", "h200", "a100", "mi300x", "mi250"] {
            let device = Device::lookup(name).unwrap();
            let mut configs = GpuSpace.candidates(&p, &device);
            assert!(!configs.is_empty(), "{name} {p}");
            configs.push(GpuSpace.default_config(&p, &device));
            configs.push(GpuSpace.heuristic(&p, &device));
            for c in &configs {
                let Config::GpuGemm(g) = c else { panic!("{c}") };
                assert!(!g.specialized, "{name} {p}: {c}");
                assert!(
                    128 % g.bk == 0
                        || !matches!(g.variant, GpuGemmVariant::Mma | GpuGemmVariant::Mfma),
                    "{c}"
                );
                GpuSpace.validate(c, &p, &device).unwrap();
                KernelBuild::new(&p, c).unwrap();
            }
        }
    }
    // The guesses are the per-channel ones (the skinny kernel for one token on NVIDIA, the
    // pipelined MFMA tile on the bytes for MI300X's prompts), but for NVIDIA's prompts, whose
    // 128x256 mma tile has no room for a group's products beside its sums: 128x128 there.
    let h200 = Device::lookup("h200").unwrap();
    let prompt: Problem = "gemm:m=2048,n=4608,k=7168,dtype=fp8_e4m3,b=nk,block=128"
        .parse()
        .unwrap();
    assert_eq!(
        GpuSpace.heuristic(&prompt, &h200),
        Config::GpuGemm(GpuGemmConfig::tile(
            GpuGemmVariant::Mma,
            (128, 128, 128),
            (4, 4),
            3,
            1
        ))
    );
    for (m, name, variant) in [
        (1, "h200", GpuGemmVariant::Skinny),
        (2048, "mi300x", GpuGemmVariant::Mfma),
    ] {
        let dtype = if name == "mi300x" {
            "fp8_e4m3fnuz"
        } else {
            "fp8_e4m3"
        };
        let blocks: Problem = format!("gemm:m={m},n=4608,k=7168,dtype={dtype},b=nk,block=128")
            .parse()
            .unwrap();
        let plain: Problem = format!("gemm:m={m},n=4608,k=7168,dtype={dtype},b=nk")
            .parse()
            .unwrap();
        let device = Device::lookup(name).unwrap();
        let guess = GpuSpace.heuristic(&blocks, &device);
        assert_eq!(guess, GpuSpace.heuristic(&plain, &device), "{name}");
        assert!(
            matches!(guess, Config::GpuGemm(g) if g.variant == variant),
            "{name}: {guess}"
        );
    }
    let p: Problem = "gemm:m=16,n=4608,k=7168,dtype=fp8_e4m3,b=nk,block=128"
        .parse()
        .unwrap();
    let wgmma = GpuGemmConfig::tile(GpuGemmVariant::Wgmma, (128, 128, 128), (1, 128), 4, 1);
    assert!(GpuSpace
        .validate(&Config::GpuGemm(wgmma), &p, &h200)
        .is_ok());
    let specialized = Config::GpuGemm(GpuGemmConfig {
        specialized: true,
        swizzle: 128,
        ..wgmma
    });
    let e = GpuSpace
        .validate(&specialized, &p, &h200)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("block-scaled fp8 (block = 128)") && e.contains("take specialized = false"),
        "{e}"
    );
    let e = KernelBuild::new(&p, &specialized).unwrap_err().to_string();
    assert!(e.contains("warp-specialized wgmma"), "{e}");
    // Blocks of 32 under k tiles of 128 bytes: a tile would straddle four groups.
    let small: Problem = "gemm:m=16,n=4608,k=7168,dtype=fp8_e4m3,b=nk,block=32"
        .parse()
        .unwrap();
    let deep = Config::GpuGemm(GpuGemmConfig::tile(
        GpuGemmVariant::Mma,
        (16, 64, 128),
        (1, 2),
        3,
        1,
    ));
    assert!(GpuSpace.validate(&deep, &p, &h200).is_ok());
    let e = GpuSpace
        .validate(&deep, &small, &h200)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bk = 128 must divide the block"), "{e}");
}

/// Int4 problems: what the group, the dtype and the layout must be, the buffers an int4 call
/// takes (words for B; scales and zero points one per group and column, A's scales none),
/// zero points refused elsewhere, the configs that compute it (the stream variant) and the
/// GPUs that do not, each by name; and a small product computed by hand.
#[test]
fn int4_gemms_are_checked_by_name_and_computed() {
    for (spec, needle) in [
        ("m=1,n=4,k=16,dtype=bf16,int4=8", "use b=kn"),
        (
            "m=1,n=4,k=16,dtype=fp8_e4m3,b=kn,int4=8",
            "take activations in f32, f16 or bf16",
        ),
        (
            "m=1,n=4,k=16,dtype=f16,b=kn,int4=12",
            "positive multiple of 8",
        ),
        (
            "m=1,n=4,k=16,dtype=f16,b=kn,int4=0",
            "positive multiple of 8",
        ),
        ("m=1,n=4,k=20,dtype=f16,b=kn,int4=8", "must divide k = 20"),
        (
            "m=1,n=4,k=64,dtype=fp8_e4m3,b=nk,block=32,int4=8",
            "scale blocks are fp8's",
        ),
    ] {
        let msg = parse_err(&format!("gemm:{spec}")).to_string();
        assert!(
            msg.contains("int4") && msg.contains(needle),
            "{spec}: {msg}"
        );
    }
    // A 2 × 16 of f32, B's values q[p][j] = (p + 3j) % 16 for 3 columns, groups of 8.
    let p: Problem = "gemm:m=2,n=3,k=16,dtype=f32,b=kn,int4=8".parse().unwrap();
    let c = CpuSpace.default_config(&p, &Device::host());
    let mut scratch = vec![0.0; CpuBackend.scratch_len(&p, &c)];
    let a: Vec<f32> = (0..32).map(|i| (i % 5) as f32 - 2.0).collect();
    let mut words = vec![0u32; 2 * 3];
    for k in 0..16 {
        for j in 0..3 {
            words[k / 8 * 3 + j] |= (((k + 3 * j) % 16) as u32) << (4 * (k % 8));
        }
    }
    let scales = [0.5, 0.25, 2.0, 1.0, 0.5, 0.25];
    let zeros = [8.0, 7.0, 0.0, 15.0, 3.0, 9.0];
    let want = |zeros: &[f32]| -> Vec<f32> {
        (0..6)
            .map(|o| {
                let (i, j) = (o / 3, o % 3);
                (0..16)
                    .map(|k| {
                        let at = k / 8 * 3 + j;
                        let zero = zeros.get(at).copied().unwrap_or(8.0);
                        a[i * 16 + k] * scales[at] * (((k + 3 * j) % 16) as f32 - zero)
                    })
                    .sum()
            })
            .collect()
    };
    let mut run = |b: Tensor<'_>, given: GemmScales<'_>| {
        let mut out = vec![f32::NAN; 6];
        let args = Args::Gemm(GemmArgs::scaled(Tensor::F32(&a), b, given, &mut out));
        CpuBackend.run(&p, &c, args, &mut scratch).map(|()| out)
    };
    let b = Tensor::Int4(&words);
    assert_eq!(
        run(b, GemmScales::int4(&scales, &zeros)).unwrap(),
        want(&zeros)
    );
    // Symmetric: no zero points, 8 throughout.
    assert_eq!(run(b, GemmScales::int4(&scales, &[])).unwrap(), want(&[]));
    let f32_b = [0.0f32; 48];
    for (b, given, name, needle) in [
        (
            Tensor::F32(&f32_b),
            GemmScales::int4(&scales, &zeros),
            "b",
            "weights are int4, [K / 8, N] words",
        ),
        (
            b,
            GemmScales::int4(&scales[..3], &zeros),
            "b_scales",
            "takes 6, [2, 3]: one per 8 values of k and column",
        ),
        (
            b,
            GemmScales::int4(&scales, &zeros[..5]),
            "zeros",
            "or none, for a zero point of 8",
        ),
        (
            b,
            GemmScales {
                a: &[1.0],
                b: &scales,
                zeros: &zeros,
            },
            "a_scales",
            "unscaled: pass none",
        ),
        (
            b,
            GemmScales::int4(&[0.5, 0.25, f32::INFINITY, 1.0, 0.5, 0.25], &zeros),
            "b_scales",
            "[2] is inf",
        ),
    ] {
        match run(b, given) {
            Err(KernelError::BadArgument { name: got, reason })
            | Err(KernelError::BadBuffer { name: got, reason }) => {
                assert_eq!(got, name, "{reason}");
                assert!(reason.contains(needle), "{name}: {reason}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    // Zero points belong to int4 GEMMs.
    let q: Problem = "gemm:m=2,n=2,k=2,dtype=f32,b=nk".parse().unwrap();
    let cq = CpuSpace.default_config(&q, &Device::host());
    let x = [1.0f32; 4];
    let mut out = [0.0f32; 4];
    let args = Args::Gemm(GemmArgs::scaled(
        Tensor::F32(&x),
        Tensor::F32(&x),
        GemmScales::int4(&[], &[8.0]),
        &mut out,
    ));
    let mut scratch = vec![0.0; CpuBackend.scratch_len(&q, &cq)];
    let err = CpuBackend.run(&q, &cq, args, &mut scratch).unwrap_err();
    assert!(
        matches!(&err, KernelError::BadArgument { name: "zeros", reason } if reason.contains("belong to int4")),
        "{err}"
    );
    // The stream variant reads the words; the others run after the dequantizing pass, as
    // the dense problem's (the same product here, every value exact), but stream-dpbf16,
    // which reads the words as bf16 pairs, so bf16 activations only; no GPU computes int4
    // weights.
    let packed = CpuSpace.default_config(&q, &Device::host());
    CpuSpace.validate(&packed, &p, &Device::host()).unwrap();
    let mut scratch = vec![0.0; CpuBackend.scratch_len(&p, &packed)];
    let mut out = vec![f32::NAN; 6];
    let args = Args::Gemm(GemmArgs::scaled(
        Tensor::F32(&a),
        Tensor::Int4(&words),
        GemmScales::int4(&scales, &zeros),
        &mut out,
    ));
    CpuBackend.run(&p, &packed, args, &mut scratch).unwrap();
    assert_eq!(out, want(&zeros));
    let Config::Gemm(g) = packed else {
        unreachable!()
    };
    let pairs = Config::Gemm(GemmConfig {
        variant: GemmVariant::StreamDpbf16,
        ..g
    });
    let err = CpuSpace.validate(&pairs, &p, &Device::host()).unwrap_err();
    assert!(
        err.to_string().contains("takes bf16 inputs") && err.to_string().contains("int4"),
        "{err}"
    );
    // On GPUs: every candidate, guess and default builds; the tiles that copy B's rows as they
    // lie (wgmma, pipelined mma and MFMA) and rocBLAS's dense solutions are refused by name.
    let gpus = kerntune_kernels::GpuSpace;
    for gpu in ["h200", "mi300x", "mi250"] {
        let device = Device::lookup(gpu).unwrap();
        let mut configs = gpus.candidates(&p, &device);
        assert!(!configs.is_empty(), "{gpu}");
        configs.push(gpus.heuristic(&p, &device));
        configs.push(gpus.default_config(&p, &device));
        for c in &configs {
            gpus.validate(c, &p, &device)
                .unwrap_or_else(|e| panic!("{gpu} {c}: {e}"));
            assert!(
                kerntune_kernels::gpu::KernelBuild::new(&p, c).is_ok(),
                "{gpu}: {c}"
            );
        }
        // Decode: the words read in place.
        assert!(
            gpus.heuristic(&p, &device).to_string().contains("skinny"),
            "{gpu}"
        );
    }
    let dense: Problem = "gemm:m=2048,n=1280,k=8192,dtype=bf16,b=nk".parse().unwrap();
    for gpu in ["h200", "mi300x"] {
        let device = Device::lookup(gpu).unwrap();
        let pipelined = gpus.heuristic(&dense, &device);
        let err = gpus
            .validate(&pipelined, &p, &device)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("int4 = 8") && err.contains("unpacked as staged"),
            "{gpu} {pipelined}: {err}"
        );
    }
    let rocblas = Config::Rocblas(RocblasConfig {
        solution: 3,
        version: 40200,
    });
    let err = gpus
        .validate(&rocblas, &p, &Device::lookup("mi300x").unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("rocBLAS multiplies dense matrices"), "{err}");
}
