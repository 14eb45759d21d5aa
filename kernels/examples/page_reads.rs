//! How fast one core reads 4 KiB pages in random order from DRAM, and how much of that a
//! kernel keeps when it also computes: the ceiling behind paged-attention decode from a cold
//! KV cache, where every 16-token block of one KV head is a page of its own.
//!
//! Each thread walks its own pages of a 1 GiB buffer (random order, each page read once per
//! call, 64 MiB a call like the decode bench's cache, calls rotating through the buffer so the
//! L3 holds none of it) in the order the paged kernels read a key tile: a 64-byte column of
//! each of 16 rows of 256 bytes, four columns. Variants: no software prefetch; the first 512
//! bytes of the page `AHEAD` pages on requested into L2 (the AMX decode kernel's page-head
//! prefetch, which requests 768: a plain walk reads the same either way); and either with work per page standing in for the kernel's arithmetic, whose
//! cost alone is printed too (the same walk over one page, in L1): a chain of dependent
//! multiply-adds, few instructions that leave the out-of-order window free to run ahead to the
//! next pages' loads, or rounds of 16 independent 512-bit FMAs (AVX-512 hosts), many
//! instructions that fill it as the decode kernel's tile and vector arithmetic does.
//!
//! ```text
//! cargo run --release -p kerntune-kernels --example page_reads [-- threads...]
//! ```

use std::time::Instant;

const PAGE: usize = 4096;
const BUFFER: usize = 1 << 30;
const PER_CALL: usize = (64 << 20) / PAGE;
const AHEAD: usize = 4;

fn main() {
    let threads: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("thread counts, e.g. `1 2`"))
        .collect();
    let threads = if threads.is_empty() {
        vec![1, 2]
    } else {
        threads
    };
    if !cfg!(target_arch = "x86_64") {
        eprintln!("page_reads: the prefetch variants use x86-64 instructions; this is not x86-64");
        std::process::exit(2);
    }
    let buffer = vec![1u8; BUFFER + PAGE];
    let base = buffer.as_ptr().align_offset(PAGE);
    let pages = BUFFER / PAGE;
    // A fixed shuffle (xorshift), so runs compare.
    let mut order: Vec<u32> = (0..pages as u32).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..pages).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let data = &buffer[base..base + BUFFER];
    println!("random 4 KiB pages, 64 MiB a call, median of 15 calls");
    for &t in &threads {
        let wide = cfg!(target_arch = "x86_64") && has_avx512();
        let mut variants = vec![
            (false, Work::None),
            (true, Work::None),
            (true, Work::Chain(20)),
            (true, Work::Chain(40)),
        ];
        if wide {
            variants.extend([Work::Wide(20), Work::Wide(40)].map(|w| (true, w)));
        }
        for (prefetch, work) in variants {
            let gbs = measure(data, &order, t, prefetch, work);
            let alone = if work != Work::None {
                let ns = work_alone(data, work);
                format!("  (the work alone: {ns:.0} ns a page)")
            } else {
                String::new()
            };
            println!(
                "threads {t}  head prefetch {prefetch:<5}  {:<16} {gbs:5.1} GB/s{alone}",
                format!("{work}:")
            );
        }
    }
}

/// What a walk does per page besides reading it, in four equal parts (one per column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    None,
    /// Dependent multiply-adds a page.
    Chain(usize),
    /// Rounds of 16 independent 512-bit FMAs a page.
    Wide(usize),
}

impl std::fmt::Display for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Work::None => write!(f, "no work"),
            Work::Chain(n) => write!(f, "chain of {n}"),
            Work::Wide(n) => write!(f, "{n} FMA rounds"),
        }
    }
}

fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Median GB/s of 15 calls, each reading `PER_CALL` pages split among `threads`.
fn measure(data: &[u8], order: &[u32], threads: usize, prefetch: bool, work: Work) -> f64 {
    let calls = order.len() / PER_CALL;
    let mut secs: Vec<f64> = (0..15)
        .map(|call| {
            let pages = &order[(call % calls) * PER_CALL..][..PER_CALL];
            let start = Instant::now();
            std::thread::scope(|s| {
                for share in pages.chunks(PER_CALL / threads) {
                    s.spawn(move || std::hint::black_box(walk(data, share, prefetch, work)));
                }
            });
            start.elapsed().as_secs_f64()
        })
        .collect();
    secs.sort_by(f64::total_cmp);
    (PER_CALL * PAGE) as f64 / secs[secs.len() / 2] / 1e9
}

/// Nanoseconds a page of `work` alone: the walk over one page again and again (in L1).
fn work_alone(data: &[u8], work: Work) -> f64 {
    let same = vec![0u32; PER_CALL];
    let start = Instant::now();
    std::hint::black_box(walk(data, &same, false, work));
    start.elapsed().as_secs_f64() * 1e9 / PER_CALL as f64
}

/// Reads each page of `pages` as a key tile is read; returns a sum so nothing is elided.
fn walk(data: &[u8], pages: &[u32], prefetch: bool, work: Work) -> u64 {
    let mut sum = 0u64;
    let mut chain = 1.0001f64;
    // Written only by the FMA work, which exists on x86-64.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut lanes = [0.5f32; 256];
    for (i, &page) in pages.iter().enumerate() {
        let at = page as usize * PAGE;
        if prefetch {
            if let Some(&next) = pages.get(i + AHEAD) {
                for line in 0..8 {
                    request(&data[next as usize * PAGE + 64 * line]);
                }
            }
        }
        for column in 0..4 {
            for row in 0..16 {
                let offset = at + row * 256 + column * 64;
                let word = u64::from_ne_bytes(data[offset..offset + 8].try_into().unwrap());
                sum = sum.wrapping_add(word);
            }
            match work {
                Work::None => {}
                Work::Chain(n) => {
                    for _ in 0..n / 4 {
                        chain = chain * 0.5 + 0.5;
                    }
                }
                #[cfg(target_arch = "x86_64")]
                // SAFETY: Wide work is measured only where the host has AVX-512F.
                Work::Wide(n) => unsafe { fma_rounds(n / 4, &mut lanes) },
                #[cfg(not(target_arch = "x86_64"))]
                Work::Wide(_) => unreachable!("wide work runs on AVX-512 hosts"),
            }
        }
    }
    let lanes: f32 = lanes.iter().sum();
    sum.wrapping_add(chain.to_bits())
        .wrapping_add(u64::from(lanes.to_bits()))
}

/// `n` rounds of 16 independent 512-bit FMAs on `lanes`.
///
/// # Safety
/// The host has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_rounds(n: usize, lanes: &mut [f32; 256]) {
    use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_storeu_ps};
    let (a, b) = (_mm512_set1_ps(0.999), _mm512_set1_ps(0.001));
    // SAFETY: 16 vectors of 16 lanes are the array's 256 values.
    unsafe {
        let mut r: [_; 16] = std::array::from_fn(|i| _mm512_loadu_ps(lanes.as_ptr().add(16 * i)));
        for _ in 0..n {
            for x in r.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        for (i, x) in r.iter().enumerate() {
            _mm512_storeu_ps(lanes.as_mut_ptr().add(16 * i), *x);
        }
    }
}

/// Asks for the line holding `byte` into L2 (a hint: never faults).
#[inline(always)]
fn request(byte: &u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch hint neither faults nor changes memory.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
            (byte as *const u8).cast(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = byte;
}
