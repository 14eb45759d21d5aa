//! Named real shapes the benchmarks and examples share, so figures are comparable across tools.

/// Llama-3.1-70B at tensor-parallel 8: (name, N, K) of each GEMM with weights stored `[N, K]`.
pub const LLAMA70B_TP8_GEMMS: [(&str, usize, usize); 4] = [
    ("qkv", 1280, 8192),
    ("o", 8192, 1024),
    ("gate_up", 7168, 8192),
    ("down", 8192, 3584),
];

/// Token counts the benchmarks run each Llama GEMM at: decode, small batch, prefill chunk.
pub const TOKEN_COUNTS: [usize; 4] = [1, 16, 128, 2048];

/// Flash attention prefill of one Llama-3.1-70B TP8 shard: 8 query heads, 1 KV head.
pub fn llama70b_tp8_prefill(dtype: crate::DType) -> String {
    format!("flash:batch=1,q_len=2048,kv_len=2048,q_heads=8,kv_heads=1,head_dim=128,causal=true,dtype={dtype}")
}

/// Paged decode of 32 sequences at 4096 context on one Llama-3.1-70B TP8 shard.
pub fn llama70b_tp8_decode(dtype: crate::DType) -> String {
    format!("paged:num_seqs=32,context_len=4096,q_heads=8,kv_heads=1,head_dim=128,block_size=16,dtype={dtype}")
}

/// Paged decode of 8 sequences at 4096 context of Llama-3.1-8B on one device (no tensor
/// parallelism): 32 query heads on 8 KV heads, so each token row of the cache holds 8 heads
/// side by side.
pub fn llama8b_decode(dtype: crate::DType) -> String {
    format!("paged:num_seqs=8,context_len=4096,q_heads=32,kv_heads=8,head_dim=128,block_size=16,dtype={dtype}")
}
