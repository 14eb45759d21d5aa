//! Every GEMM config against the f64 reference on awkward sizes.

mod common;

use common::{check_all, described_amx_host, described_avx512_host};
use kerntune_kernels::config::{GemmConfig, GemmVariant, Inner, Split};
use kerntune_kernels::cpu::microkernel_shapes;
use kerntune_kernels::{Config, CpuSpace, DType, Device, Fp8, Isa, Problem, Space};
use proptest::prelude::*;

fn problem(spec: &str) -> Problem {
    spec.parse().unwrap()
}

/// Small problems that hit every edge: M = 1, primes, K below any KC, sizes that are not
/// multiples of any tile, both B layouts and all dtypes, the fp8 formats (W8A8) included.
fn awkward() -> Vec<Problem> {
    let mut out = Vec::new();
    for (m, n, k) in [
        (1, 37, 13),
        (7, 61, 5),
        (17, 33, 389),
        (13, 97, 131),
        (3, 5, 1),
    ] {
        for dtype in DType::ALL.into_iter().chain(Fp8::ALL.map(DType::Fp8)) {
            for b in ["kn", "nk"] {
                out.push(problem(&format!(
                    "gemm:m={m},n={n},k={k},dtype={dtype},b={b}"
                )));
            }
        }
    }
    out
}

#[test]
fn every_candidate_matches_reference_on_awkward_sizes() {
    let device = Device::host();
    let mut ran = 0;
    for p in awkward() {
        let configs = CpuSpace.candidates(&p, &device);
        assert!(!configs.is_empty(), "{p}: no candidates");
        ran += check_all(&p, &configs);
    }
    eprintln!("verified {ran} GEMM configs");
}

/// The candidate list sweeps the host's best ISA levels; this covers every level the host can
/// run (portable included) and every microkernel shape of each.
#[test]
fn every_isa_and_microkernel_shape_matches_reference() {
    let host = kerntune_kernels::CpuInfo::detect();
    let p = problem("gemm:m=29,n=67,k=45,dtype=f32,b=nk");
    let q = problem("gemm:m=5,n=41,k=300,dtype=bf16,b=kn");
    let fp8 = problem("gemm:m=11,n=37,k=53,dtype=fp8_e4m3,b=nk");
    for isa in Isa::supported_by(host.isa) {
        let mut configs = Vec::new();
        for (mr, nr) in microkernel_shapes(isa) {
            for (mc, kc, nc) in [(mr, 7, nr), (mr * 3, 64, nr * 2)] {
                for (split, inner) in splits_and_orders() {
                    configs.push(Config::Gemm(GemmConfig {
                        variant: GemmVariant::Packed,
                        isa,
                        mr,
                        nr,
                        mc,
                        kc,
                        nc,
                        split,
                        threads: host.threads,
                        prefetch: true,
                        inner,
                    }));
                }
            }
        }
        for rows in [1, 2, 4] {
            configs.push(Config::Gemm(GemmConfig {
                variant: GemmVariant::Stream,
                isa,
                mr: rows,
                nr: 16,
                mc: rows,
                kc: 1,
                nc: 8,
                split: Split::N,
                threads: host.threads,
                prefetch: true,
                inner: Inner::M,
            }));
        }
        check_all(&p, &configs);
        check_all(&q, &configs);
        check_all(&fp8, &configs);
        eprintln!("{isa}: {} configs verified", configs.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// Random sizes and a random sample of the full space.
    #[test]
    fn random_sizes_and_configs_match_reference(
        m in 1usize..40, n in 1usize..90, k in 1usize..300,
        dt in 0usize..6, layout in prop::bool::ANY, pick in any::<prop::sample::Index>(),
    ) {
        let dtype = DType::ALL.into_iter().chain(Fp8::ALL.map(DType::Fp8)).nth(dt).unwrap();
        let b = if layout { "kn" } else { "nk" };
        let p = problem(&format!("gemm:m={m},n={n},k={k},dtype={dtype},b={b}"));
        let device = Device::host();
        let candidates = CpuSpace.candidates(&p, &device);
        let mut sample = vec![CpuSpace.default_config(&p, &device), CpuSpace.heuristic(&p, &device)];
        sample.push(*pick.get(&candidates));
        check_all(&p, &sample);
    }
}

/// Both thread splits, each with both tile orders of the packed loop nest.
fn splits_and_orders() -> impl Iterator<Item = (Split, Inner)> {
    [Split::M, Split::N]
        .into_iter()
        .flat_map(|s| [(s, Inner::M), (s, Inner::N)])
}

/// Configs of a packed-loop-nest variant for every shape: one-tile blocks with a depth below a
/// vector, several tiles with an even depth, and an odd depth (a lone value after the last
/// bf16 pair), each split by M and by N, in both tile orders.
fn blocked(
    variant: GemmVariant,
    isa: Isa,
    shapes: &[(usize, usize)],
    threads: usize,
) -> Vec<Config> {
    let mut configs = Vec::new();
    for &(mr, nr) in shapes {
        for (mc, kc, nc) in [(mr, 7, nr), (mr * 3, 64, nr * 2), (mr * 2, 33, nr)] {
            for (split, inner) in splits_and_orders() {
                configs.push(Config::Gemm(GemmConfig {
                    variant,
                    isa,
                    mr,
                    nr,
                    mc,
                    kc,
                    nc,
                    split,
                    threads,
                    prefetch: true,
                    inner,
                }));
            }
        }
    }
    configs
}

/// The AVX-512-BF16 kernel: every microkernel shape, odd and even cache-block depths (an odd
/// one pads the last bf16 pair), both B layouts, split by M and by N. On hosts without
/// AVX-512-BF16 the space must refuse it instead.
#[test]
fn dpbf16_shapes_match_reference_or_are_refused() {
    let host = kerntune_kernels::CpuInfo::detect();
    let device = Device::host();
    let configs = blocked(
        GemmVariant::Dpbf16,
        host.isa,
        kerntune_kernels::cpu::DPBF16_SHAPES,
        host.threads,
    );
    let problems = [
        problem("gemm:m=29,n=67,k=45,dtype=bf16,b=nk"),
        problem("gemm:m=1,n=33,k=1,dtype=bf16,b=kn"),
        problem("gemm:m=40,n=130,k=100,dtype=bf16,b=kn"),
    ];
    if !host.avx512_bf16 {
        for c in &configs {
            let err = CpuSpace.validate(c, &problems[0], &device).unwrap_err();
            assert!(err.to_string().contains("AVX-512-BF16"), "{err}");
        }
        eprintln!(
            "dpbf16 kernels not run: {} has no AVX-512-BF16 (refusal checked)",
            host.model
        );
        return;
    }
    for p in &problems {
        assert_eq!(check_all(p, &configs), configs.len(), "{p}");
        assert!(CpuSpace
            .candidates(p, &device)
            .iter()
            .any(|c| matches!(c, Config::Gemm(g) if g.variant == GemmVariant::Dpbf16)));
    }
    // Other dtypes are refused with the reason.
    let f32_problem = problem("gemm:m=29,n=67,k=45,dtype=f32");
    let err = CpuSpace
        .validate(&configs[0], &f32_problem, &device)
        .unwrap_err();
    assert!(err.to_string().contains("bf16 inputs"), "{err}");
}

/// The direct kernels (weights read in place, the product transposed): every microkernel shape
/// of every SIMD level the host runs for f32, every pair shape for bf16 where the host has
/// AVX-512-BF16, every AMX shape where it has AMX tiles; weight rows that leave a short last sliver, token counts below, at and past a
/// sliver and past a panel, depths below and past a slice, both splits. Refusals name their
/// reason.
#[test]
fn direct_matches_reference_for_every_shape() {
    let host = kerntune_kernels::CpuInfo::detect();
    let device = Device::host();
    let mut ran = 0;
    type Level = (GemmVariant, DType, Isa, Vec<(usize, usize)>);
    let mut levels: Vec<Level> = Isa::supported_by(host.isa)
        .into_iter()
        .map(|isa| {
            (
                GemmVariant::Direct,
                DType::F32,
                isa,
                microkernel_shapes(isa),
            )
        })
        .collect();
    if host.avx512_bf16 {
        let pairs = kerntune_kernels::cpu::DPBF16_SHAPES.to_vec();
        levels.push((GemmVariant::Direct, DType::Bf16, host.isa, pairs));
    }
    // AMX tiles where the host has them (the unit tests run the tile model everywhere).
    if host.isa == Isa::Avx512Amx {
        let tiles = kerntune_kernels::cpu::AMX_SHAPES.to_vec();
        levels.push((GemmVariant::AmxDirect, DType::Bf16, Isa::Avx512Amx, tiles));
    }
    for (variant, dtype, isa, shapes) in levels {
        // bf16 needs an even K and kc; f32 takes odd ones.
        let (ks, kcs): (&[usize], &[usize]) = match dtype {
            DType::Bf16 => (&[2, 14, 390], &[6, 64, 390]),
            _ => (&[1, 13, 389], &[7, 64, 389]),
        };
        for &k in ks {
            for (m, n) in [(1, 37), (7, 61), (33, 130), (40, 97), (300, 19)] {
                let p = problem(&format!("gemm:m={m},n={n},k={k},dtype={dtype},b=nk"));
                let mut configs = Vec::new();
                for &(mr, nr) in &shapes {
                    for &kc in kcs {
                        for (nc, split) in [(nr, Split::N), (nr * 2, Split::M)] {
                            configs.push(Config::Gemm(GemmConfig {
                                variant,
                                isa,
                                mr,
                                nr,
                                // The AMX kernel blocks the weights: two slivers per block
                                // on the M split, so blocks end mid-matrix and mid-sliver.
                                mc: match (variant, split) {
                                    (GemmVariant::AmxDirect, Split::M) => 2 * mr,
                                    _ => mr,
                                },
                                kc,
                                nc,
                                split,
                                threads: host.threads,
                                prefetch: true,
                                inner: Inner::M,
                            }));
                        }
                    }
                }
                ran += check_all(&p, &configs);
            }
        }
    }
    assert!(ran > 0);
    eprintln!("verified {ran} direct configs");
    // Refusals: B stored [K, N], an odd K on bf16, f16, a blocked mc.
    let one = |(mr, nr): (usize, usize)| GemmConfig {
        variant: GemmVariant::Direct,
        isa: host.isa,
        mr,
        nr,
        mc: mr,
        kc: 64,
        nc: nr,
        split: Split::N,
        threads: 1,
        prefetch: true,
        inner: Inner::M,
    };
    let f32_shape = microkernel_shapes(host.isa)[0];
    let refused = |spec: &str, c: GemmConfig, why: &str| {
        let err = CpuSpace
            .validate(&Config::Gemm(c), &problem(spec), &device)
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{spec}: {err}");
    };
    refused(
        "gemm:m=8,n=64,k=64,dtype=f32,b=kn",
        one(f32_shape),
        "[N, K]",
    );
    refused(
        "gemm:m=8,n=64,k=64,dtype=f16,b=nk",
        one(f32_shape),
        "not f16",
    );
    let blocked = GemmConfig {
        mc: 2 * f32_shape.0,
        ..one(f32_shape)
    };
    refused(
        "gemm:m=8,n=64,k=64,dtype=f32,b=nk",
        blocked,
        "no mc blocking",
    );
    if host.avx512_bf16 {
        refused("gemm:m=8,n=64,k=63,dtype=bf16,b=nk", one((8, 32)), "even K");
    } else {
        refused(
            "gemm:m=8,n=64,k=64,dtype=bf16,b=nk",
            one((8, 32)),
            "AVX-512-BF16",
        );
    }
}

/// The AMX tile kernel on the host's tiles: every microkernel shape, depths below, at and past a
/// 32-value k block, corners that fill the tiles and ones that do not, both B layouts and both
/// splits. On hosts without usable AMX the space must refuse it with the reason and never offer
/// it; the kernel's packing and tile plan are verified on every host by the unit tests of
/// `cpu::amx`, on a software model of the tile instructions.
#[test]
fn amx_shapes_match_reference_or_are_refused() {
    let host = kerntune_kernels::CpuInfo::detect();
    let device = Device::host();
    let configs = blocked(
        GemmVariant::Amx,
        Isa::Avx512Amx,
        kerntune_kernels::cpu::AMX_SHAPES,
        host.threads,
    );
    let problems = [
        problem("gemm:m=29,n=67,k=45,dtype=bf16,b=nk"),
        problem("gemm:m=1,n=33,k=1,dtype=bf16,b=kn"),
        problem("gemm:m=64,n=96,k=100,dtype=bf16,b=kn"),
        problem("gemm:m=96,n=64,k=256,dtype=bf16,b=nk"),
    ];
    if host.isa != Isa::Avx512Amx {
        let direct = Config::Gemm(GemmConfig {
            variant: GemmVariant::AmxDirect,
            isa: Isa::Avx512Amx,
            mr: 32,
            nr: 32,
            mc: 32,
            kc: 64,
            nc: 32,
            split: Split::N,
            threads: 1,
            prefetch: true,
            inner: Inner::M,
        });
        for c in configs.iter().chain([&direct]) {
            let err = CpuSpace.validate(c, &problems[3], &device).unwrap_err();
            assert!(err.to_string().contains("needs AMX tiles"), "{err}");
        }
        assert!(!CpuSpace
            .candidates(&problems[3], &device)
            .iter()
            .any(|c| matches!(c, Config::Gemm(g) if g.variant == GemmVariant::Amx)));
        eprintln!(
            "amx kernel not run on tiles: {} has no usable AMX ({}; refusal checked)",
            host.model, host.isa
        );
        return;
    }
    for p in &problems {
        assert_eq!(check_all(p, &configs), configs.len(), "{p}");
    }
    // fp8 weights widened a sliver at a time into the tiles in place: every such candidate of
    // two formats (K of one and several slices, edge slivers), and the heuristic's at 32 tokens.
    for spec in [
        "gemm:m=29,n=67,k=46,dtype=fp8_e5m2,b=nk",
        "gemm:m=17,n=130,k=2050,dtype=fp8_e4m3,b=nk",
        "gemm:m=32,n=200,k=1030,dtype=fp8_e4m3fnuz,b=nk",
    ] {
        let p = problem(spec);
        let direct: Vec<Config> = CpuSpace
            .candidates(&p, &device)
            .into_iter()
            .filter(|c| matches!(c, Config::Gemm(g) if g.variant == GemmVariant::AmxDirect))
            .chain(std::iter::once(CpuSpace.heuristic(&p, &device)))
            .collect();
        assert!(direct.len() > 1, "{spec}: no amx-direct candidates");
        assert_eq!(check_all(&p, &direct), direct.len(), "{p}");
    }
    // The prompt heuristic: B panels of a thread's share of N in equal parts (two of 2272
    // columns a thread on two threads), the last one short.
    let wide = problem("gemm:m=130,n=9001,k=40,dtype=bf16,b=nk");
    let h = CpuSpace.heuristic(&wide, &device);
    assert!(
        matches!(h, Config::Gemm(g) if g.variant == GemmVariant::Amx),
        "{h}"
    );
    assert_eq!(check_all(&wide, std::slice::from_ref(&h)), 1, "{h}");
    assert!(CpuSpace
        .candidates(&problems[3], &device)
        .iter()
        .any(|c| matches!(c, Config::Gemm(g) if g.variant == GemmVariant::Amx)));
    let err = CpuSpace
        .validate(
            &configs[0],
            &problem("gemm:m=29,n=67,k=45,dtype=f16"),
            &device,
        )
        .unwrap_err();
    assert!(err.to_string().contains("bf16 inputs"), "{err}");
}

/// The space on an AMX host (described, as the tuner's sharing checks describe a colleague's
/// machine): bf16 problems get AMX candidates at the avx512-amx level, every one valid there,
/// fp8 ones the packed kernel's, and other dtypes none.
#[test]
fn an_amx_host_is_offered_valid_amx_configs_for_bf16_and_fp8_only() {
    let amx_host = described_amx_host();
    let bf16 = problem("gemm:m=128,n=7168,k=8192,dtype=bf16,b=nk");
    let of = |variant| -> Vec<Config> {
        CpuSpace
            .candidates(&bf16, &amx_host)
            .into_iter()
            .filter(|c| matches!(c, Config::Gemm(g) if g.variant == variant))
            .collect()
    };
    let (amx, direct) = (of(GemmVariant::Amx), of(GemmVariant::AmxDirect));
    // 3 shapes × 2 mc × 4 kc × 2 nc = 48 blockings, 44 of them in both tile orders (a
    // 2048 × 1024 bf16 B panel, 4 MiB, is past the 2 MiB L2 for `inner = n`); both splits on
    // 2 and 4 threads, one on 1. Then per shape and thread count a thread's share of N as
    // the panel (3584 columns on 1 and 2 threads, 1792 on 4), at kc 1024 and 2048, past L2
    // for `inner = n`.
    assert_eq!(amx.len(), 92 * (1 + 2 + 2) + 3 * 2 * (1 + 2 + 2));
    assert_eq!(
        amx.iter()
            .filter(|c| matches!(c, Config::Gemm(g) if g.inner == Inner::N))
            .count(),
        44 * (1 + 2 + 2)
    );
    // 3 shapes × 2 mc × 5 kc (256, 512, 1024, 2048, all of K) × 3 nc, splits as above.
    assert_eq!(direct.len(), 90 + 180 + 180);
    for c in amx.iter().chain(&direct) {
        CpuSpace
            .validate(c, &bf16, &amx_host)
            .unwrap_or_else(|e| panic!("{c}: {e}"));
        assert!(
            matches!(c, Config::Gemm(g) if g.isa == Isa::Avx512Amx),
            "{c}"
        );
    }
    let tiles = |c: &Config| matches!(c, Config::Gemm(g) if matches!(g.variant, GemmVariant::Amx | GemmVariant::AmxDirect));
    let f16 = problem("gemm:m=128,n=7168,k=8192,dtype=f16,b=nk");
    assert!(!CpuSpace.candidates(&f16, &amx_host).iter().any(tiles));
    // Weights stored [K, N]: the packed tile kernel only.
    let kn = problem("gemm:m=128,n=7168,k=8192,dtype=bf16,b=kn");
    let kn_tiles: Vec<Config> = CpuSpace
        .candidates(&kn, &amx_host)
        .into_iter()
        .filter(tiles)
        .collect();
    assert_eq!(kn_tiles.len(), amx.len());
    assert!(!kn_tiles
        .iter()
        .any(|c| matches!(c, Config::Gemm(g) if g.variant == GemmVariant::AmxDirect)));
    let err = CpuSpace.validate(&amx[0], &f16, &amx_host).unwrap_err();
    assert!(err.to_string().contains("bf16 inputs"), "{err}");
    // fp8: the packed tile kernel, which widens the bytes as it packs them, and the weights
    // in place, widened a sliver at a time: the bf16 configs.
    let fp8 = problem("gemm:m=128,n=7168,k=8192,dtype=fp8_e4m3,b=nk");
    let fp8_tiles: Vec<Config> = CpuSpace
        .candidates(&fp8, &amx_host)
        .into_iter()
        .filter(tiles)
        .collect();
    assert_eq!(fp8_tiles.len(), amx.len() + direct.len());
    for c in &fp8_tiles {
        CpuSpace
            .validate(c, &fp8, &amx_host)
            .unwrap_or_else(|e| panic!("{c}: {e}"));
    }
    // Its heuristic: the bytes streamed in place below 5 tokens, widened into the tiles in
    // place from 5 to 256, the packed tiles past them (and where B is [K, N]).
    for (m, b, variant) in [
        (4, "nk", GemmVariant::Stream),
        (5, "nk", GemmVariant::AmxDirect),
        (256, "nk", GemmVariant::AmxDirect),
        (32, "kn", GemmVariant::Amx),
        (257, "nk", GemmVariant::Amx),
        (2048, "nk", GemmVariant::Amx),
    ] {
        let p = problem(&format!(
            "gemm:m={m},n=7168,k=8192,dtype=fp8_e4m3fnuz,b={b}"
        ));
        let h = CpuSpace.heuristic(&p, &amx_host);
        assert!(
            matches!(h, Config::Gemm(g) if g.variant == variant),
            "M = {m}: {h}"
        );
        CpuSpace
            .validate(&h, &p, &amx_host)
            .unwrap_or_else(|e| panic!("{h}: {e}"));
    }
    // The heuristic there: the weights in place for short prompts, the packed kernel with
    // large blocks from 512 tokens, or from 64 where K is at most 1024; valid on that host
    // either way.
    for (m, k, variant) in [
        (128, 8192, GemmVariant::AmxDirect),
        (256, 3584, GemmVariant::AmxDirect),
        (512, 8192, GemmVariant::Amx),
        (2048, 8192, GemmVariant::Amx),
        (32, 1024, GemmVariant::AmxDirect),
        (64, 1024, GemmVariant::Amx),
        (128, 1024, GemmVariant::Amx),
    ] {
        let p = problem(&format!("gemm:m={m},n=7168,k={k},dtype=bf16,b=nk"));
        let h = CpuSpace.heuristic(&p, &amx_host);
        assert!(
            matches!(h, Config::Gemm(g) if g.variant == variant),
            "M = {m}, K = {k}: {h}"
        );
        CpuSpace
            .validate(&h, &p, &amx_host)
            .unwrap_or_else(|e| panic!("{h}: {e}"));
    }
    // From 128 tokens the packed heuristic's B panel is a thread's share of N, in equal
    // panels of at most 4096 columns, and the tuner sweeps it too.
    for (n, threads, nc) in [
        (7168, 4, 1792),
        (1280, 4, 320),
        (7168, 1, 3584),
        (8192, 1, 4096),
    ] {
        let mut host = described_amx_host();
        let Device::Cpu(info) = &mut host else {
            unreachable!("a described CPU")
        };
        info.threads = threads;
        let p = problem(&format!("gemm:m=2048,n={n},k=8192,dtype=bf16,b=nk"));
        let h = CpuSpace.heuristic(&p, &host);
        assert!(
            matches!(h, Config::Gemm(g) if g.variant == GemmVariant::Amx && g.nc == nc),
            "N = {n} on {threads} threads: {h}"
        );
        // Narrower shares are the grid's 1024-column panel, cut at the share's edge.
        let Config::Gemm(g) = h else { unreachable!() };
        let swept = Config::Gemm(GemmConfig {
            nc: nc.max(1024),
            ..g
        });
        assert!(CpuSpace.candidates(&p, &host).contains(&swept), "{h}");
    }
    // Below 128 tokens A is packed again per 1024-column panel: cheaper than a wider panel.
    let short = problem("gemm:m=64,n=8192,k=1024,dtype=bf16,b=nk");
    let h = CpuSpace.heuristic(&short, &amx_host);
    assert!(
        matches!(h, Config::Gemm(g) if g.variant == GemmVariant::Amx && g.nc == 1024),
        "{h}"
    );
}

/// The streaming AVX-512-BF16 kernel: every row count and a narrow and a wide column chunk,
/// against k around its 32-value vector (1, 31, 32, 33 and odd depths that leave a lone value
/// after the last pair), column counts below, at and past its 4-row and 64-column passes, and
/// both B layouts; fp8 weights `[N, K]` of every format likewise (`[K, N]` refused). On hosts
/// without AVX-512-BF16 the space must refuse it instead.
#[test]
fn stream_dpbf16_matches_reference_or_is_refused() {
    let host = kerntune_kernels::CpuInfo::detect();
    let device = Device::host();
    let mut configs = Vec::new();
    for rows in [1, 2, 4] {
        for nc in [4, 64, 1024] {
            configs.push(Config::Gemm(GemmConfig {
                variant: GemmVariant::StreamDpbf16,
                isa: host.isa,
                mr: rows,
                nr: 32,
                mc: rows,
                kc: 1,
                nc,
                split: Split::N,
                threads: host.threads,
                prefetch: true,
                inner: Inner::M,
            }));
        }
    }
    let mut problems = Vec::new();
    for (m, n) in [(1, 1), (1, 67), (3, 5), (7, 130), (16, 64)] {
        for k in [1, 31, 32, 33, 65, 389] {
            for b in ["nk", "kn"] {
                problems.push(problem(&format!("gemm:m={m},n={n},k={k},dtype=bf16,b={b}")));
            }
            // fp8 weights [N, K], widened as they stream: every format.
            for dtype in Fp8::ALL.map(DType::Fp8) {
                problems.push(problem(&format!(
                    "gemm:m={m},n={n},k={k},dtype={dtype},b=nk"
                )));
            }
        }
    }
    if !host.avx512_bf16 {
        for c in &configs {
            let err = CpuSpace.validate(c, &problems[0], &device).unwrap_err();
            assert!(err.to_string().contains("AVX-512-BF16"), "{err}");
        }
        eprintln!(
            "stream-dpbf16 kernel not run: {} has no AVX-512-BF16 (refusal checked)",
            host.model
        );
        return;
    }
    for p in &problems {
        assert_eq!(check_all(p, &configs), configs.len(), "{p}");
    }
    let decode = problem("gemm:m=4,n=1280,k=8192,dtype=bf16");
    assert!(CpuSpace
        .candidates(&decode, &device)
        .iter()
        .any(|c| matches!(c, Config::Gemm(g) if g.variant == GemmVariant::StreamDpbf16)));
    for other in [
        "gemm:m=4,n=64,k=64,dtype=f32",
        "gemm:m=4,n=64,k=64,dtype=f16",
    ] {
        let err = CpuSpace
            .validate(&configs[0], &problem(other), &device)
            .unwrap_err();
        assert!(err.to_string().contains("bf16 inputs"), "{err}");
    }
    let fp8_kn = problem("gemm:m=4,n=64,k=64,dtype=fp8_e4m3,b=kn");
    let err = CpuSpace
        .validate(&configs[0], &fp8_kn, &device)
        .unwrap_err();
    assert!(err.to_string().contains("stored [N, K]"), "{err}");
    let fp8_decode = problem("gemm:m=4,n=1280,k=8192,dtype=fp8_e5m2");
    assert!(CpuSpace
        .candidates(&fp8_decode, &device)
        .iter()
        .any(|c| matches!(c, Config::Gemm(g) if g.variant == GemmVariant::StreamDpbf16)));
    let prefill = problem("gemm:m=300,n=64,k=64,dtype=bf16");
    let err = CpuSpace
        .validate(&configs[0], &prefill, &device)
        .unwrap_err();
    assert!(err.to_string().contains("decode shapes"), "{err}");
}

/// The backend starts its scratch on a cache line wherever the caller's begins, within the
/// length it declares: every variant the host offers, on scratch of exactly that length at
/// word offsets that leave it on no line boundary, matches the reference.
#[test]
fn scratch_at_any_alignment_is_enough() {
    use kerntune_kernels::data::ProblemData;
    use kerntune_kernels::reference::relative_error;
    use kerntune_kernels::{Backend, CpuBackend};
    let device = Device::host();
    let mut ran = 0;
    for spec in [
        "gemm:m=37,n=67,k=130,dtype=f32,b=nk",
        "gemm:m=37,n=67,k=130,dtype=bf16,b=nk",
        "gemm:m=5,n=45,k=64,dtype=bf16,b=kn",
    ] {
        let p = problem(spec);
        let mut data = ProblemData::random(&p, 3);
        let reference = data.reference();
        let candidates = CpuSpace.candidates(&p, &device);
        // One candidate of each variant, and the heuristic.
        let mut configs = vec![CpuSpace.heuristic(&p, &device)];
        for c in &candidates {
            let variant = |c: &Config| match c {
                Config::Gemm(g) => Some(g.variant),
                _ => None,
            };
            if !configs.iter().any(|k| variant(k) == variant(c)) {
                configs.push(*c);
            }
        }
        for config in &configs {
            let needed = CpuBackend.scratch_len(&p, config);
            let mut buf = vec![0f32; needed + 16];
            for off in [1, 7, 15] {
                data.out.fill(f32::NAN);
                CpuBackend
                    .run(&p, config, data.args(), &mut buf[off..off + needed])
                    .unwrap_or_else(|e| panic!("{p} with {config} at +{off}: {e}"));
                let err = relative_error(&data.out, &reference);
                assert!(err <= p.tolerance(), "{p} with {config} at +{off}: {err:e}");
                ran += 1;
            }
        }
    }
    assert!(ran >= 3 * 3 * 2, "only {ran} runs");
}

/// The stream kernels' weight-row prefetch is a tuned field: both settings are offered for
/// weights stored `[N, K]` and match the reference; stored configs from before the field read
/// as prefetching and keep their text; other variants and `[K, N]` weights refuse `false`.
#[test]
fn the_stream_prefetch_is_tuned_and_old_configs_keep_their_meaning() {
    let host = Device::host();
    for spec in [
        "gemm:m=1,n=37,k=1031,dtype=f32,b=nk",
        "gemm:m=3,n=5,k=4099,dtype=bf16,b=nk",
        "gemm:m=1,n=13,k=17,dtype=f16,b=nk",
    ] {
        let p = problem(spec);
        let streams: Vec<Config> = CpuSpace
            .candidates(&p, &host)
            .into_iter()
            .filter(|c| {
                matches!(c, Config::Gemm(g)
                    if matches!(g.variant, GemmVariant::Stream | GemmVariant::StreamDpbf16))
            })
            .collect();
        let off = streams
            .iter()
            .filter(|c| matches!(c, Config::Gemm(g) if !g.prefetch))
            .count();
        assert_eq!(
            2 * off,
            streams.len(),
            "{spec}: every stream config both ways"
        );
        assert!(off > 0, "{spec}");
        check_all(&p, &streams);
    }

    let kn = problem("gemm:m=1,n=37,k=1031,dtype=f32,b=kn");
    assert!(CpuSpace
        .candidates(&kn, &host)
        .iter()
        .all(|c| matches!(c, Config::Gemm(g) if g.prefetch)));

    // A winner stored before the field: no `prefetch` key, read as prefetching, written back
    // the same; turning it off adds the key.
    let stored = r#"{"family":"gemm","variant":"stream","isa":"portable","mr":1,"nr":8,"mc":4,"kc":1031,"nc":256,"split":"n","threads":1}"#;
    let old: Config = serde_json::from_str(stored).unwrap();
    let Config::Gemm(mut g) = old else {
        panic!("{old}")
    };
    assert!(g.prefetch);
    assert_eq!(serde_json::to_string(&old).unwrap(), stored);
    g.prefetch = false;
    let off = Config::Gemm(g);
    let text = serde_json::to_string(&off).unwrap();
    assert!(text.contains(r#""prefetch":false"#), "{text}");
    assert_eq!(serde_json::from_str::<Config>(&text).unwrap(), off);
    assert!(off.to_string().ends_with(" no-prefetch"), "{off}");
    let nk = problem("gemm:m=1,n=37,k=1031,dtype=f32,b=nk");
    CpuSpace.validate(&off, &nk, &host).unwrap();

    for (config, p) in [
        (off, kn),
        (
            {
                let mut packed = match CpuSpace.default_config(&nk, &host) {
                    Config::Gemm(g) => g,
                    other => panic!("{other}"),
                };
                packed.prefetch = false;
                Config::Gemm(packed)
            },
            nk,
        ),
    ] {
        let err = CpuSpace
            .validate(&config, &p, &host)
            .unwrap_err()
            .to_string();
        assert!(err.contains("prefetch = false"), "{config} on {p}: {err}");
        assert!(err.contains("drop the field"), "{err}");
    }
}

/// The untuned path's prefetch choice on an AMX Xeon, as measured there: the widening f32
/// kernel without it for rows of up to 16 KiB, with it beyond; the bf16 pair kernel with it.
#[test]
fn the_heuristic_prefetch_follows_the_row_length_on_amx_hosts() {
    let amx = described_amx_host();
    let prefetch = |spec: &str| match CpuSpace.heuristic(&problem(spec), &amx) {
        Config::Gemm(g) => {
            assert!(
                matches!(g.variant, GemmVariant::Stream | GemmVariant::StreamDpbf16),
                "{spec}: {g:?}"
            );
            g.prefetch
        }
        other => panic!("{spec}: {other}"),
    };
    assert!(!prefetch("gemm:m=1,n=8192,k=1024,dtype=f32,b=nk"));
    assert!(!prefetch("gemm:m=1,n=8192,k=3584,dtype=f32,b=nk"));
    assert!(prefetch("gemm:m=1,n=1280,k=8192,dtype=f32,b=nk"));
    assert!(prefetch("gemm:m=1,n=8192,k=1024,dtype=bf16,b=nk"));
    assert!(prefetch("gemm:m=4,n=8192,k=1024,dtype=f32,b=nk"));
}

/// The untuned path for bf16 prompts follows the core, not only the ISA level: on an Intel
/// core that lacks AMX tiles (a guest that hides them) prompts of 256 rows and more and
/// decode of 3 to 16 tokens widen to f32, because `vdpbf16ps` runs there at half the FMA
/// rate; on Zen 4, where it runs at the full rate, for one or two tokens (bound by the
/// weights' reads) and for short prompts, the pair kernels keep them (the widening kernels
/// on bf16 are verified with the rest of the space).
#[test]
fn the_bf16_prompt_heuristic_follows_the_core() {
    let xeon = described_avx512_host("Intel(R) Xeon(R) Processor");
    let zen4 = described_avx512_host("AMD EPYC 9R14 96-Core Processor");
    let variant = |spec: &str, host: &Device| match CpuSpace.heuristic(&problem(spec), host) {
        Config::Gemm(g) => g.variant,
        other => panic!("{spec}: {other}"),
    };
    let long = "gemm:m=2048,n=1280,k=8192,dtype=bf16,b=nk";
    let short = "gemm:m=128,n=1280,k=8192,dtype=bf16,b=nk";
    assert_eq!(variant(long, &xeon), GemmVariant::Packed);
    assert_eq!(variant(long, &zen4), GemmVariant::Direct);
    assert_eq!(variant(short, &xeon), GemmVariant::Direct);
    for m in [256, 512] {
        let prompt = format!("gemm:m={m},n=1280,k=8192,dtype=bf16,b=nk");
        assert_eq!(variant(&prompt, &xeon), GemmVariant::Packed, "{prompt}");
        assert_eq!(variant(&prompt, &zen4), GemmVariant::Direct, "{prompt}");
    }
    let below = "gemm:m=255,n=1280,k=8192,dtype=bf16,b=nk";
    assert_eq!(variant(below, &xeon), GemmVariant::Direct);
    for m in [1, 2, 3, 8, 9, 16, 17] {
        let decode = format!("gemm:m={m},n=7168,k=8192,dtype=bf16,b=nk");
        let (on_xeon, on_zen4) = (variant(&decode, &xeon), variant(&decode, &zen4));
        let widened = (3..=16).contains(&m);
        assert_eq!(
            on_xeon == GemmVariant::Stream,
            widened,
            "{decode} on the Xeon: {on_xeon:?}"
        );
        assert!(
            matches!(on_zen4, GemmVariant::StreamDpbf16 | GemmVariant::Direct),
            "{decode} on Zen 4: {on_zen4:?}"
        );
    }
    assert_eq!(
        variant("gemm:m=1024,n=96,k=64,dtype=bf16,b=kn", &xeon),
        GemmVariant::Packed
    );
    assert_eq!(
        variant("gemm:m=1024,n=96,k=64,dtype=bf16,b=kn", &zen4),
        GemmVariant::Dpbf16
    );
    assert_eq!(
        variant(long, &described_amx_host()),
        GemmVariant::Amx,
        "AMX tiles where the host grants them"
    );
}

/// The packed loop nest's tile order: both orders offered where the `inner = n` B panel fits
/// L2, verified; stored winners without the field keep their meaning and text; variants
/// without the loop nest refuse `inner = n` with the fix.
#[test]
fn the_tile_order_is_tuned_and_old_configs_keep_their_meaning() {
    let host = Device::host();
    let Device::Cpu(info) = &host else {
        panic!("the host is a CPU")
    };
    let p = problem("gemm:m=53,n=101,k=300,dtype=f32,b=kn");
    let packed: Vec<GemmConfig> = CpuSpace
        .candidates(&p, &host)
        .into_iter()
        .filter_map(|c| match c {
            Config::Gemm(g) if g.variant == GemmVariant::Packed => Some(g),
            _ => None,
        })
        .collect();
    let n_inner: Vec<Config> = packed
        .iter()
        .filter(|g| g.inner == Inner::N)
        .map(|&g| Config::Gemm(g))
        .collect();
    assert!(!n_inner.is_empty());
    for c in &n_inner {
        let Config::Gemm(g) = c else { unreachable!() };
        assert!(g.kc * g.nc * 4 <= info.l2_bytes, "{c}: B panel past L2");
        // Its twin in the other order is a candidate too.
        let twin = GemmConfig {
            inner: Inner::M,
            ..*g
        };
        assert!(packed.contains(&twin), "{c}");
    }
    check_all(&p, &n_inner);

    let stored = r#"{"family":"gemm","variant":"packed","isa":"portable","mr":4,"nr":8,"mc":64,"kc":256,"nc":256,"split":"n","threads":1}"#;
    let old: Config = serde_json::from_str(stored).unwrap();
    let Config::Gemm(mut g) = old else {
        panic!("{old}")
    };
    assert_eq!(g.inner, Inner::M);
    assert_eq!(serde_json::to_string(&old).unwrap(), stored);
    g.inner = Inner::N;
    let swapped = Config::Gemm(g);
    let text = serde_json::to_string(&swapped).unwrap();
    assert!(text.contains(r#""inner":"n""#), "{text}");
    assert_eq!(serde_json::from_str::<Config>(&text).unwrap(), swapped);
    assert!(swapped.to_string().ends_with(" inner=n"), "{swapped}");
    CpuSpace.validate(&swapped, &p, &host).unwrap();

    let decode = problem("gemm:m=1,n=37,k=1031,dtype=f32,b=nk");
    let stream = CpuSpace
        .candidates(&decode, &host)
        .into_iter()
        .find_map(|c| match c {
            Config::Gemm(g) if g.variant == GemmVariant::Stream => Some(g),
            _ => None,
        })
        .expect("decode shapes stream");
    let err = CpuSpace
        .validate(
            &Config::Gemm(GemmConfig {
                inner: Inner::N,
                ..stream
            }),
            &decode,
            &host,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("inner = n"), "{err}");
    assert!(err.contains("drop the field"), "{err}");
}

/// Block-scaled fp8 (DeepSeek-V3's scheme): every candidate of every format against the
/// reference, on sizes that leave a partial block of weight rows and a partial group of k
/// (N = 67 with blocks of 32, K = 130), one row and primes of rows (every row pass: 1, 2 and
/// 4 rows), more rows than the stream kernel takes without blocks, and one block of 128.
/// The stream kernel and (on AMX hosts) amx-direct in slices of whole blocks are the ones
/// offered; the default and the guess match too.
#[test]
fn block_scaled_fp8_candidates_match_reference() {
    let device = Device::host();
    let mut ran = 0;
    for spec in [
        "m=1,n=67,k=130,block=32",
        "m=7,n=67,k=130,block=32",
        "m=3,n=129,k=300,block=128",
        "m=37,n=64,k=96,block=64",
        "m=2,n=1,k=1,block=32",
    ] {
        for format in Fp8::ALL {
            let p = problem(&format!("gemm:{spec},dtype={}", DType::Fp8(format)));
            let configs = CpuSpace.candidates(&p, &device);
            assert!(!configs.is_empty(), "{p}: no candidates");
            let Problem::Gemm(g) = p else { unreachable!() };
            for c in &configs {
                assert!(
                    matches!(c, Config::Gemm(c) if c.variant == GemmVariant::Stream
                        || (c.variant == GemmVariant::AmxDirect
                            && c.kc.is_multiple_of(g.block.unwrap()))),
                    "{p}: {c}"
                );
            }
            let untuned = [
                CpuSpace.default_config(&p, &device),
                CpuSpace.heuristic(&p, &device),
            ];
            for c in &untuned {
                CpuSpace.validate(c, &p, &device).unwrap();
            }
            ran += check_all(&p, &configs) + check_all(&p, &untuned);
        }
    }
    eprintln!("verified {ran} block-scaled fp8 GEMM configs");
}

/// The untuned block-scaled configs on an AMX host: the stream kernel, the default at every
/// M and the guess to 4 tokens; amx-direct in slices of 512 (four blocks of 128, one of
/// 1024) from 5 tokens (prompts too); the stream kernel everywhere on a host without AMX,
/// and for an odd K (amx-direct takes pairs of k).
#[test]
fn block_scaled_untuned_configs_follow_the_host() {
    let amx = described_amx_host();
    let avx512 = described_avx512_host("Intel Xeon Platinum 8380");
    for (host, m, k, block, variant) in [
        (&amx, 4, 7168, 128, GemmVariant::Stream),
        (&amx, 5, 7168, 128, GemmVariant::AmxDirect),
        (&amx, 2048, 7168, 128, GemmVariant::AmxDirect),
        (&amx, 64, 7168, 1024, GemmVariant::AmxDirect),
        (&amx, 64, 7167, 128, GemmVariant::Stream),
        (&avx512, 64, 7168, 128, GemmVariant::Stream),
    ] {
        let p = problem(&format!(
            "gemm:m={m},n=4608,k={k},dtype=fp8_e4m3,block={block}"
        ));
        let h = CpuSpace.heuristic(&p, host);
        assert!(
            matches!(h, Config::Gemm(g) if g.variant == variant
                && (variant == GemmVariant::Stream || g.kc == block.max(512))),
            "M = {m}, K = {k}: {h}"
        );
        let d = CpuSpace.default_config(&p, host);
        assert!(matches!(d, Config::Gemm(g) if g.variant == GemmVariant::Stream));
        for c in [h, d] {
            CpuSpace
                .validate(&c, &p, host)
                .unwrap_or_else(|e| panic!("{c}: {e}"));
        }
    }
}

/// A kernel that took one scale for a whole row or column, or the wrong group's, misses the
/// reference of a block-scaled problem by far more than fp8's tolerance: the check above
/// has the power to catch it. The same bytes with per-token and per-channel scales (the
/// mean of each block's) differ from the block-scaled reference.
#[test]
fn block_scales_change_the_product() {
    use kerntune_kernels::data::ProblemData;
    use kerntune_kernels::reference::relative_error;
    let p = problem("gemm:m=5,n=67,k=130,dtype=fp8_e4m3,block=32");
    let data = ProblemData::random(&p, 3);
    let blocked = data.reference();
    let Problem::Gemm(g) = p else { unreachable!() };
    let groups = g.k_groups();
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    let mut flat = ProblemData::random(&problem("gemm:m=5,n=67,k=130,dtype=fp8_e4m3"), 3);
    flat.a_scales = data.a_scales.chunks(groups).map(mean).collect();
    flat.b_scales = (0..g.n)
        .map(|j| mean(&data.b_scales[j / 32 * groups..][..groups]))
        .collect();
    let err = relative_error(
        &flat
            .reference()
            .iter()
            .map(|&v| v as f32)
            .collect::<Vec<_>>(),
        &blocked,
    );
    assert!(err > 10.0 * p.tolerance(), "{err:e}");
}

/// Int4 weights (W4A16) on awkward sizes: one row and primes of rows, one column and primes
/// of columns (strips of the kernel's width and short ones), one word of k, groups of 8 to
/// all of k, every activation dtype; every candidate (the stream kernel on the words, the
/// dense kernels after the dequantizing pass), the untuned configs and the stream kernel at
/// every ISA level the host runs, with zero points and without (8 throughout).
#[test]
fn int4_candidates_match_reference() {
    use kerntune_kernels::data::ProblemData;
    let device = Device::host();
    let host = kerntune_kernels::CpuInfo::detect();
    let pairs_host = host.avx512_bf16 && host.isa >= Isa::Avx512;
    let mut ran = 0;
    for (m, n, k, group) in [
        (1, 67, 8, 8),
        (3, 1, 40, 8),
        (7, 129, 96, 32),
        (2, 33, 264, 264),
        (37, 31, 256, 128),
    ] {
        for dtype in DType::ALL {
            let spec = format!("gemm:m={m},n={n},k={k},dtype={dtype},b=kn,int4={group}");
            let p = problem(&spec);
            let mut configs = CpuSpace.candidates(&p, &device);
            assert!(!configs.is_empty(), "{p}: no candidates");
            // The stream kernels on the words (widened to f32, or to bf16 pairs); from two
            // tokens, the dense problem's kernels after the dequantizing pass too, on the
            // weights `[N, K]` for those that read B in place, else `[K, N]`.
            let dense = |g: &GemmConfig| {
                let layout = g.variant.int4_pass_layout();
                problem(&format!("gemm:m={m},n={n},k={k},dtype={dtype},b={layout}"))
            };
            let mut in_place = 0;
            for c in &configs {
                let Config::Gemm(g) = c else { unreachable!() };
                let streams = [GemmVariant::Stream, GemmVariant::StreamDpbf16];
                assert!(
                    streams.contains(&g.variant)
                        || (m > 1
                            && g.variant != GemmVariant::StreamDpbf16
                            && CpuSpace.validate(c, &dense(g), &device).is_ok()),
                    "{p}: {c}"
                );
                in_place += usize::from(g.variant.reads_b_in_place());
            }
            // `direct` takes f32, and bf16 on AVX-512-BF16 hosts; no kernel reads f16 in place.
            let direct = m > 1 && (dtype == DType::F32 || (pairs_host && dtype == DType::Bf16));
            assert_eq!(in_place > 0, direct, "{p}: {in_place} in place");
            let dequantizing = configs.iter().filter(|c| {
                !matches!(c, Config::Gemm(g)
                    if matches!(g.variant, GemmVariant::Stream | GemmVariant::StreamDpbf16))
            });
            assert_eq!(dequantizing.count() > 0, m > 1, "{p}");
            configs.push(CpuSpace.default_config(&p, &device));
            configs.push(CpuSpace.heuristic(&p, &device));
            // The bf16 pairs' kernel wherever the host runs it: strips of 32 columns, short
            // ones masked.
            let pairs = dtype == DType::Bf16 && host.avx512_bf16;
            for isa in Isa::supported_by(host.isa) {
                let variants = [GemmVariant::Stream, GemmVariant::StreamDpbf16];
                let kinds = if pairs && isa >= Isa::Avx512 { 2 } else { 1 };
                let shapes = [(1, 4), (2, 32), (4, 1024)];
                for (&variant, (mr, nc)) in variants[..kinds]
                    .iter()
                    .flat_map(|v| shapes.iter().map(move |&s| (v, s)))
                {
                    configs.push(Config::Gemm(GemmConfig {
                        variant,
                        isa,
                        mr,
                        nr: 8,
                        mc: mr,
                        kc: k,
                        nc,
                        split: Split::N,
                        threads: host.threads,
                        prefetch: true,
                        inner: Inner::M,
                    }));
                }
            }
            for c in &configs {
                CpuSpace
                    .validate(c, &p, &device)
                    .unwrap_or_else(|e| panic!("{p} {c}: {e}"));
            }
            ran += common::check_all(&p, &configs);
            // Symmetric checkpoints: no zero points, 8 throughout.
            let mut data = ProblemData::random(&p, 7);
            data.zeros.clear();
            ran += common::check_all_on(&mut data, &configs);
        }
    }
    eprintln!("verified {ran} int4 GEMM configs");
}

/// The untuned int4 configs: the bf16 pairs' stream kernel to 128 tokens where the host has
/// AVX-512-BF16 and the activations are bf16, the widening one to 32 tokens elsewhere, the
/// dense guess after the dequantizing pass beyond; the default is the widening stream kernel,
/// which runs everywhere.
#[test]
fn int4_untuned_configs_follow_the_host_and_the_tokens() {
    let pairs = described_avx512_host("AMD EPYC 9654");
    let mut info = kerntune_kernels::CpuInfo::detect().clone();
    info.model = "Intel Core i7-8700".into();
    info.isa = Isa::Avx2Fma;
    info.avx512_bf16 = false;
    info.threads = 2;
    let avx2 = Device::Cpu(info);
    for (host, dtype, m, want) in [
        (&pairs, "bf16", 1, Some(GemmVariant::StreamDpbf16)),
        (&pairs, "bf16", 128, Some(GemmVariant::StreamDpbf16)),
        (&pairs, "bf16", 256, None),
        (&pairs, "f16", 32, Some(GemmVariant::Stream)),
        (&pairs, "f16", 64, None),
        (&avx2, "bf16", 32, Some(GemmVariant::Stream)),
        (&avx2, "bf16", 64, None),
    ] {
        let p = problem(&format!(
            "gemm:m={m},n=1280,k=8192,dtype={dtype},b=kn,int4=128"
        ));
        let h = CpuSpace.heuristic(&p, host);
        let Config::Gemm(g) = h else { unreachable!() };
        match want {
            Some(variant) => assert_eq!(g.variant, variant, "{p}: {h}"),
            None => assert!(
                !matches!(g.variant, GemmVariant::Stream | GemmVariant::StreamDpbf16),
                "{p}: {h}"
            ),
        }
        let d = CpuSpace.default_config(&p, host);
        assert!(matches!(d, Config::Gemm(g) if g.variant == GemmVariant::Stream));
        for c in [h, d] {
            CpuSpace
                .validate(&c, &p, host)
                .unwrap_or_else(|e| panic!("{p} {c}: {e}"));
        }
    }
}
