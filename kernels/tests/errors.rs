//! Invalid problems, specs, configs and buffers give typed errors, never panics.

use kerntune_kernels::config::{GemmConfig, GemmVariant, Inner, PagedConfig, Split};
use kerntune_kernels::data::ProblemData;
use kerntune_kernels::kernel::{Args, GemmArgs, Scratch};
use kerntune_kernels::{
    Backend, Config, CpuBackend, CpuSpace, DType, Device, Family, KernelError, Problem, Space,
    TensorBuf,
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
            Args::Gemm(GemmArgs {
                a: a.view(),
                b: b.view(),
                c: out,
            }),
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
