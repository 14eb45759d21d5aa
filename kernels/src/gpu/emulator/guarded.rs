//! Buffers between guard bytes, as the emulator hands them to a launch: what a kernel reads
//! past an input poisons its result, and what it writes outside an output is found after the
//! launch.

use super::GUARD;
use crate::TensorBuf;

/// A buffer between guard bytes. The storage is 16-byte words so every element type, and the
/// 16-byte copies of the pipelined kernels, are aligned as on a device.
pub(super) struct Guarded {
    words: Vec<u128>,
    /// Data bytes, starting at `GUARD`.
    len: usize,
    guard: u8,
}

impl Guarded {
    fn with(len: usize, guard: u8) -> Guarded {
        let total = (2 * GUARD + len).div_ceil(16);
        let mut g = Guarded {
            words: vec![0; total],
            len,
            guard,
        };
        g.bytes_mut().fill(guard);
        g
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.words.len() * 16;
        // SAFETY: the words' storage is n initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), n) }
    }

    fn bytes(&self) -> &[u8] {
        let n = self.words.len() * 16;
        // SAFETY: as above, read-only.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), n) }
    }

    fn data_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.bytes_mut()[GUARD..GUARD + len]
    }

    /// Inputs: a NaN of the element type in every guard byte pair or word (0x7f bytes read
    /// as f32, bf16 and f16 are all NaN), so a stray read poisons the result.
    pub fn input(t: &TensorBuf) -> Guarded {
        let bytes: Vec<u8> = match t {
            TensorBuf::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorBuf::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            TensorBuf::Bf16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            TensorBuf::Fp8(_, v) => v.to_vec(),
            TensorBuf::Int4(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        Guarded::input_bytes(&bytes)
    }

    /// f32 inputs beside the tensors (attention sinks, ALiBi slopes), between the same NaN
    /// guards.
    pub fn floats_input(v: &[f32]) -> Guarded {
        Guarded::input_bytes(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
    }

    fn input_bytes(bytes: &[u8]) -> Guarded {
        let mut g = Guarded::with(bytes.len(), 0x7f);
        g.data_mut().copy_from_slice(bytes);
        g
    }

    /// Block tables and context lengths: zero guards, a valid block index, so a stray read of
    /// a table stays inside the caches.
    pub fn words(v: &[u32]) -> Guarded {
        let mut g = Guarded::with(4 * v.len(), 0);
        g.data_mut()
            .copy_from_slice(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
        g
    }

    /// Outputs: data and guards NaN (0xff bytes), so an element the kernel never writes fails
    /// verification; the guards are checked after each launch.
    pub fn output(floats: usize) -> Guarded {
        Guarded::with(4 * floats, 0xff)
    }

    pub fn addr(&mut self) -> u64 {
        self.bytes_mut()[GUARD..].as_mut_ptr() as u64
    }

    /// Where a guard byte changed, if one did.
    pub fn damaged_guard(&self) -> Option<String> {
        let b = self.bytes();
        if let Some(i) = b[..GUARD].iter().rposition(|&x| x != self.guard) {
            return Some(format!("{} bytes before its start", GUARD - i));
        }
        let end = GUARD + self.len;
        b[end..end + GUARD]
            .iter()
            .position(|&x| x != self.guard)
            .map(|i| format!("{} bytes past its end", i))
    }

    pub fn floats(&self) -> Vec<f32> {
        self.bytes()[GUARD..GUARD + self.len]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}
