//! The AMX tile operations the bf16 AMX GEMM uses, behind one trait with two implementations:
//! the instructions themselves ([`Hardware`]) and, in test builds, a software model of them
//! (`Model`).
//!
//! The model follows the instruction set reference (tile configuration, row and column limits,
//! `tdpbf16ps` shape rules and its order of accumulation) and refuses what the hardware would
//! fault on. It exists so the kernel's packing, strides and tile shapes are verified against the
//! reference on every machine: the hosts kerntune is developed and tested on have no AMX, and
//! the instructions can only run on Sapphire Rapids or later with the kernel's permission.
//!
//! Rust's AMX intrinsics are unstable, so [`Hardware`] issues each instruction with `asm!`;
//! tile register numbers are immediates, hence the fixed register plan below.

/// Tile registers: accumulators `C(i, j)` at `i * 2 + j`, A tiles at 4 and 5, B tiles at 6
/// and 7, so a kernel holds at most 2 × 2 accumulators.
pub const fn c_tile(i: usize, j: usize) -> usize {
    i * 2 + j
}
pub const A_TILE: usize = 4;
pub const B_TILE: usize = 6;
/// Rows of a tile and bytes per row: every tile this kernel configures is full, 16 × 64 bytes
/// (16 × 16 f32 accumulators, 16 rows × 16 bf16 pairs of A, 16 pairs × 16 columns of B).
pub const ROWS: usize = 16;
pub const ROW_BYTES: usize = 64;

/// The 64-byte operand of `ldtilecfg`: palette 1, then bytes per row of each of 16 tiles
/// (u16 from byte 16) and their rows (u8 from byte 48).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileConfig([u8; 64]);

impl TileConfig {
    /// Configures the tiles of an `mt × nt` block of accumulators (`mt` A tiles, `nt` B tiles)
    /// as full 16 × 64-byte tiles; the rest stay unconfigured.
    pub fn full(mt: usize, nt: usize) -> TileConfig {
        TileConfig::shaped(&[ROWS; 2][..mt], nt)
    }

    /// As [`TileConfig::full`], but A tile `i` and its row of accumulators have `a_rows[i]`
    /// rows (at most 16): products whose A side is short, such as a few query rows, load and
    /// store only the rows that exist.
    pub fn shaped(a_rows: &[usize], nt: usize) -> TileConfig {
        let mut raw = [0u8; 64];
        raw[0] = 1;
        let mut set = |t: usize, rows: usize| {
            raw[16 + 2 * t..18 + 2 * t].copy_from_slice(&(ROW_BYTES as u16).to_le_bytes());
            raw[48 + t] = rows.min(ROWS) as u8;
        };
        for (i, &rows) in a_rows.iter().enumerate() {
            for j in 0..nt {
                set(c_tile(i, j), rows);
            }
            set(A_TILE + i, rows);
        }
        for j in 0..nt {
            set(B_TILE + j, ROWS);
        }
        TileConfig(raw)
    }

    #[cfg(test)]
    fn rows(&self, t: usize) -> usize {
        usize::from(self.0[48 + t])
    }

    #[cfg(test)]
    fn colsb(&self, t: usize) -> usize {
        usize::from(u16::from_le_bytes([self.0[16 + 2 * t], self.0[17 + 2 * t]]))
    }
}

/// The tile operations, with tile numbers from the register plan.
///
/// # Safety
/// Every method but `configure` needs a configuration loaded first. Loads read `rows` rows of
/// `colsb` bytes, `stride` bytes apart, from `base`; stores write as many; both need that
/// memory valid. On [`Hardware`] the host must have AMX-TILE and AMX-BF16 and the process the
/// kernel's permission to use tile data.
pub trait Tiles {
    unsafe fn configure(&mut self, config: &TileConfig);
    unsafe fn zero(&mut self, t: usize);
    unsafe fn load(&mut self, t: usize, base: *const u8, stride: usize);
    unsafe fn store(&mut self, t: usize, base: *mut u8, stride: usize);
    /// `tdpbf16ps C, A, B`: `C[m][n] += A[m].pair[k] · B[k].pair[n]` over every pair `k`.
    unsafe fn dot(&mut self, c: usize, a: usize, b: usize);
    unsafe fn release(&mut self);
}

/// Tiles configured for one register plan while this lives: `ldtilecfg` when made,
/// `tilerelease` when dropped (on unwinding too).
///
/// The GEMM kernels hold one per task, not per microkernel call: configuring and releasing
/// the tiles for each 32 × 32 tile of C cost a quarter of a bf16 GEMM whose K is short
/// (Llama-70B TP8 o, K = 1024, at M = 2048, two threads, cold: 21.7-22.6 ms against
/// 29.4-29.8, builds alternating, session 19), 2-7% where the direct kernel runs many short
/// slices (qkv at M = 512) and nothing measurable at K = 8192. Nothing else runs on the
/// thread within a task, and nothing stays configured past it, so other tile users on the
/// thread (a framework's own AMX kernels) still find the tiles released between kerntune's
/// calls.
#[derive(Debug)]
pub struct Configured<T: Tiles>(T);

impl<T: Tiles> Configured<T> {
    /// # Safety
    /// As [`Tiles::configure`]: on [`Hardware`] the host runs AMX and the process may use tile
    /// data.
    pub unsafe fn new(mut tiles: T, config: &TileConfig) -> Self {
        // SAFETY: the caller's contract.
        unsafe { tiles.configure(config) };
        Configured(tiles)
    }
}

impl<T: Tiles> std::ops::Deref for Configured<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Tiles> std::ops::DerefMut for Configured<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T: Tiles> Drop for Configured<T> {
    fn drop(&mut self) {
        // SAFETY: `new` configured the tiles, so releasing them is allowed.
        unsafe { self.0.release() }
    }
}

/// A borrowed implementation, so a test can look at what a [`Configured`] left behind.
#[cfg(test)]
impl<T: Tiles> Tiles for &mut T {
    unsafe fn configure(&mut self, config: &TileConfig) {
        unsafe { (**self).configure(config) }
    }
    unsafe fn zero(&mut self, t: usize) {
        unsafe { (**self).zero(t) }
    }
    unsafe fn load(&mut self, t: usize, base: *const u8, stride: usize) {
        unsafe { (**self).load(t, base, stride) }
    }
    unsafe fn store(&mut self, t: usize, base: *mut u8, stride: usize) {
        unsafe { (**self).store(t, base, stride) }
    }
    unsafe fn dot(&mut self, c: usize, a: usize, b: usize) {
        unsafe { (**self).dot(c, a, b) }
    }
    unsafe fn release(&mut self) {
        unsafe { (**self).release() }
    }
}

/// The AMX instructions.
#[derive(Debug, Default)]
pub struct Hardware;

/// Expands `$op!(N)` for the constant tile number equal to `$t`, over the given numbers.
#[cfg(target_arch = "x86_64")]
macro_rules! with_tile {
    ($t:expr, [$($n:literal),*], $op:ident) => {
        match $t {
            $($n => $op!($n),)*
            t => unreachable!("tile {t} is outside the register plan"),
        }
    };
}

#[cfg(target_arch = "x86_64")]
impl Tiles for Hardware {
    #[inline(always)]
    unsafe fn configure(&mut self, config: &TileConfig) {
        // SAFETY: the trait's contract; the operand is 64 readable bytes.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly))
        };
    }

    #[inline(always)]
    unsafe fn zero(&mut self, t: usize) {
        macro_rules! op {
            ($n:literal) => {
                // SAFETY: the trait's contract.
                unsafe { std::arch::asm!("tilezero tmm{t}", t = const $n, options(nostack, nomem)) }
            };
        }
        with_tile!(t, [0, 1, 2, 3], op)
    }

    #[inline(always)]
    unsafe fn load(&mut self, t: usize, base: *const u8, stride: usize) {
        macro_rules! op {
            ($n:literal) => {
                // SAFETY: the trait's contract on the rows read.
                unsafe {
                    std::arch::asm!(
                        "tileloadd tmm{t}, [{base} + {stride}*1]",
                        t = const $n,
                        base = in(reg) base,
                        stride = in(reg) stride,
                        options(nostack, readonly)
                    )
                }
            };
        }
        with_tile!(t, [0, 1, 2, 3, 4, 5, 6, 7], op)
    }

    #[inline(always)]
    unsafe fn store(&mut self, t: usize, base: *mut u8, stride: usize) {
        macro_rules! op {
            ($n:literal) => {
                // SAFETY: the trait's contract on the rows written.
                unsafe {
                    std::arch::asm!(
                        "tilestored [{base} + {stride}*1], tmm{t}",
                        t = const $n,
                        base = in(reg) base,
                        stride = in(reg) stride,
                        options(nostack)
                    )
                }
            };
        }
        with_tile!(t, [0, 1, 2, 3], op)
    }

    #[inline(always)]
    unsafe fn dot(&mut self, c: usize, a: usize, b: usize) {
        macro_rules! op {
            ($c:literal, $a:literal, $b:literal) => {
                // SAFETY: the trait's contract; the shapes agree by the register plan.
                unsafe {
                    std::arch::asm!(
                        "tdpbf16ps tmm{c}, tmm{a}, tmm{b}",
                        c = const $c,
                        a = const $a,
                        b = const $b,
                        options(nostack, nomem)
                    )
                }
            };
        }
        match (c, a, b) {
            (0, 4, 6) => op!(0, 4, 6),
            (1, 4, 7) => op!(1, 4, 7),
            (2, 5, 6) => op!(2, 5, 6),
            (3, 5, 7) => op!(3, 5, 7),
            _ => unreachable!("tdpbf16ps tmm{c}, tmm{a}, tmm{b} is outside the register plan"),
        }
    }

    #[inline(always)]
    unsafe fn release(&mut self) {
        // SAFETY: releasing the tile state is always allowed once configured.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) };
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
impl Hardware {
    /// `sttilecfg`: the configuration this thread's tiles hold now, all zero when released.
    ///
    /// # Safety
    /// The host runs AMX.
    pub unsafe fn loaded() -> [u8; 64] {
        let mut config = TileConfig([0; 64]);
        // SAFETY: the caller's contract; the operand is 64 writable bytes.
        unsafe {
            std::arch::asm!("sttilecfg [{}]", in(reg) config.0.as_mut_ptr(), options(nostack))
        };
        config.0
    }
}

/// Other architectures have no tiles: validation refuses AMX configs there, so no kernel
/// reaches these.
#[cfg(not(target_arch = "x86_64"))]
impl Tiles for Hardware {
    unsafe fn configure(&mut self, _: &TileConfig) {
        unreachable!("validation refuses AMX configs on hosts without AMX")
    }
    unsafe fn zero(&mut self, _: usize) {
        unreachable!("validation refuses AMX configs on hosts without AMX")
    }
    unsafe fn load(&mut self, _: usize, _: *const u8, _: usize) {
        unreachable!("validation refuses AMX configs on hosts without AMX")
    }
    unsafe fn store(&mut self, _: usize, _: *mut u8, _: usize) {
        unreachable!("validation refuses AMX configs on hosts without AMX")
    }
    unsafe fn dot(&mut self, _: usize, _: usize, _: usize) {
        unreachable!("validation refuses AMX configs on hosts without AMX")
    }
    unsafe fn release(&mut self) {
        unreachable!("validation refuses AMX configs on hosts without AMX")
    }
}

/// The tile operations in software, checking what the hardware checks (built for the tests).
#[cfg(test)]
#[derive(Debug, Clone)]
pub struct Model {
    config: Option<TileConfig>,
    tiles: [[u8; ROWS * ROW_BYTES]; 8],
}

#[cfg(test)]
impl Default for Model {
    fn default() -> Self {
        Model {
            config: None,
            tiles: [[0; ROWS * ROW_BYTES]; 8],
        }
    }
}

#[cfg(test)]
impl Model {
    /// The shape of tile `t` as (rows, bytes per row); faults like the hardware when the tile
    /// is unconfigured.
    fn shape(&self, t: usize) -> (usize, usize) {
        let config = self
            .config
            .as_ref()
            .expect("tile instruction before ldtilecfg");
        assert!(t < 8, "tmm{t} does not exist");
        let shape = (config.rows(t), config.colsb(t));
        assert!(shape.0 > 0 && shape.1 > 0, "tmm{t} used but not configured");
        shape
    }

    fn f32_at(&self, t: usize, row: usize, col: usize) -> f32 {
        let at = row * ROW_BYTES + 4 * col;
        f32::from_le_bytes(self.tiles[t][at..at + 4].try_into().unwrap())
    }

    fn bf16_at(&self, t: usize, row: usize, i: usize) -> f32 {
        let at = row * ROW_BYTES + 2 * i;
        half::bf16::from_bits(u16::from_le_bytes([
            self.tiles[t][at],
            self.tiles[t][at + 1],
        ]))
        .to_f32()
    }
}

#[cfg(test)]
impl Tiles for Model {
    unsafe fn configure(&mut self, config: &TileConfig) {
        assert_eq!(config.0[0], 1, "palette {} is not palette 1", config.0[0]);
        for t in 0..8 {
            assert!(
                config.rows(t) <= ROWS && config.colsb(t) <= ROW_BYTES,
                "tmm{t} configured past 16 rows of 64 bytes"
            );
        }
        self.config = Some(*config);
        self.tiles = [[0; ROWS * ROW_BYTES]; 8];
    }

    unsafe fn zero(&mut self, t: usize) {
        self.shape(t);
        self.tiles[t].fill(0);
    }

    unsafe fn load(&mut self, t: usize, base: *const u8, stride: usize) {
        let (rows, colsb) = self.shape(t);
        self.tiles[t].fill(0);
        for r in 0..rows {
            // SAFETY: the trait's contract on the rows read.
            let src = unsafe { std::slice::from_raw_parts(base.add(r * stride), colsb) };
            self.tiles[t][r * ROW_BYTES..r * ROW_BYTES + colsb].copy_from_slice(src);
        }
    }

    unsafe fn store(&mut self, t: usize, base: *mut u8, stride: usize) {
        let (rows, colsb) = self.shape(t);
        for r in 0..rows {
            // SAFETY: the trait's contract on the rows written.
            let dst = unsafe { std::slice::from_raw_parts_mut(base.add(r * stride), colsb) };
            dst.copy_from_slice(&self.tiles[t][r * ROW_BYTES..r * ROW_BYTES + colsb]);
        }
    }

    unsafe fn dot(&mut self, c: usize, a: usize, b: usize) {
        let ((c_rows, c_colsb), (a_rows, a_colsb), (b_rows, b_colsb)) =
            (self.shape(c), self.shape(a), self.shape(b));
        assert!(
            c != a && c != b && a != b,
            "tdpbf16ps needs three distinct tiles"
        );
        // The shape rules whose violation raises #UD.
        assert_eq!(c_rows, a_rows, "tdpbf16ps: C and A rows differ");
        assert_eq!(c_colsb, b_colsb, "tdpbf16ps: C and B row bytes differ");
        assert_eq!(
            a_colsb,
            4 * b_rows,
            "tdpbf16ps: A's pairs and B's rows differ"
        );
        for m in 0..c_rows {
            let mut row: Vec<f32> = (0..c_colsb / 4).map(|n| self.f32_at(c, m, n)).collect();
            for k in 0..a_colsb / 4 {
                for (n, acc) in row.iter_mut().enumerate() {
                    *acc += self.bf16_at(a, m, 2 * k) * self.bf16_at(b, k, 2 * n);
                    *acc += self.bf16_at(a, m, 2 * k + 1) * self.bf16_at(b, k, 2 * n + 1);
                }
            }
            for (n, v) in row.into_iter().enumerate() {
                let at = m * ROW_BYTES + 4 * n;
                self.tiles[c][at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
    }

    unsafe fn release(&mut self) {
        self.config = None;
        self.tiles = [[0; ROWS * ROW_BYTES]; 8];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task's tiles are configured while its guard lives and released when it goes, on
    /// unwinding too.
    #[test]
    fn configured_tiles_are_released_when_the_guard_goes() {
        let mut model = Model::default();
        {
            // SAFETY: the model runs anywhere.
            let mut tiles = unsafe { Configured::new(&mut model, &TileConfig::full(2, 2)) };
            unsafe { tiles.zero(c_tile(1, 1)) };
            assert!(tiles.config.is_some());
        }
        assert!(
            model.config.is_none(),
            "the guard's drop released the tiles"
        );
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: as above.
            let _tiles = unsafe { Configured::new(&mut model, &TileConfig::full(1, 2)) };
            panic!("a kernel's task fails");
        }));
        assert!(unwound.is_err());
        assert!(model.config.is_none(), "unwinding released the tiles");
    }

    /// The model against a plain 16 × 32 by 32 × 16 product: the pair layout of A rows and
    /// B's VNNI rows, and accumulation on top of a loaded C.
    #[test]
    fn model_dot_is_the_pair_product() {
        let a: Vec<half::bf16> = (0..16 * 32)
            .map(|i| half::bf16::from_f32(((i * 7) % 11) as f32 - 5.0))
            .collect();
        // B as a [32][16] matrix, packed as pairs of consecutive k per column.
        let b_at = |k: usize, n: usize| ((k * 3 + n * 5) % 13) as f32 - 6.0;
        let mut vnni = vec![half::bf16::ZERO; 32 * 16];
        for k in 0..32 {
            for n in 0..16 {
                vnni[(k / 2) * 32 + 2 * n + k % 2] = half::bf16::from_f32(b_at(k, n));
            }
        }
        let c0: Vec<f32> = (0..256).map(|i| i as f32).collect();
        let mut out = vec![0f32; 256];
        let mut m = Model::default();
        // SAFETY: every buffer holds 16 rows of 64 bytes.
        unsafe {
            m.configure(&TileConfig::full(1, 1));
            m.load(0, c0.as_ptr().cast(), 64);
            m.load(A_TILE, a.as_ptr().cast(), 64);
            m.load(B_TILE, vnni.as_ptr().cast(), 64);
            m.dot(0, A_TILE, B_TILE);
            m.store(0, out.as_mut_ptr().cast(), 64);
        }
        for i in 0..16 {
            for n in 0..16 {
                let want: f32 = c0[i * 16 + n]
                    + (0..32)
                        .map(|k| a[i * 32 + k].to_f32() * b_at(k, n))
                        .sum::<f32>();
                assert_eq!(out[i * 16 + n], want, "C[{i}][{n}]");
            }
        }
    }

    #[test]
    #[should_panic(expected = "not configured")]
    fn model_refuses_an_unconfigured_tile() {
        let mut m = Model::default();
        // SAFETY: the model checks the tile before touching memory.
        unsafe {
            m.configure(&TileConfig::full(1, 1));
            m.zero(2);
        }
    }
}
