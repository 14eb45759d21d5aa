//! How fast one core reads 4 KiB pages in random order from DRAM, and how much of that a
//! kernel keeps when it also computes: the ceiling behind paged-attention decode from a cold
//! KV cache, where every 16-token block of one KV head is a page of its own.
//!
//! Each thread walks its own pages of a 1 GiB buffer (random order, each page read once per
//! call, 64 MiB a call like the decode bench's cache, calls rotating through the buffer so the
//! L3 holds none of it) in the order the paged kernels read a key tile: a 64-byte column of
//! each of 16 rows of 256 bytes, four columns. Variants: no software prefetch; the first 512
//! bytes of the page `AHEAD` pages on requested into L2 (the AMX decode kernel's page-head
//! prefetch); and either with `work` dependent multiply-adds per page standing in for the
//! kernel's arithmetic, whose cost alone is printed too (the same walk over one page, in L1).
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
        for (prefetch, work) in [(false, 0), (true, 0), (true, 20), (true, 40)] {
            let gbs = measure(data, &order, t, prefetch, work);
            let alone = if work > 0 {
                let ns = work_alone(data, work);
                format!("  (the work alone: {ns:.0} ns a page)")
            } else {
                String::new()
            };
            println!(
                "threads {t}  head prefetch {prefetch:<5}  work {work:>2} a page: {gbs:5.1} GB/s{alone}"
            );
        }
    }
}

/// Median GB/s of 15 calls, each reading `PER_CALL` pages split among `threads`.
fn measure(data: &[u8], order: &[u32], threads: usize, prefetch: bool, work: usize) -> f64 {
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
fn work_alone(data: &[u8], work: usize) -> f64 {
    let same = vec![0u32; PER_CALL];
    let start = Instant::now();
    std::hint::black_box(walk(data, &same, false, work));
    start.elapsed().as_secs_f64() * 1e9 / PER_CALL as f64
}

/// Reads each page of `pages` as a key tile is read; returns a sum so nothing is elided.
fn walk(data: &[u8], pages: &[u32], prefetch: bool, work: usize) -> u64 {
    let mut sum = 0u64;
    let mut chain = 1.0001f64;
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
            for _ in 0..work / 4 {
                chain = chain * 0.5 + 0.5;
            }
        }
    }
    sum.wrapping_add(chain.to_bits())
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
