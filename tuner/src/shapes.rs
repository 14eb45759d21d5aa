//! From `--shapes` to problems: model presets and config.json files are expanded the way a
//! server runs the model, explicit problem specs are parsed, `untuned:PATH` files and PyTorch
//! TunableOp's GEMM files (`tunableop:PATH`, in [`crate::tunableop`]) are read.
//!
//! Per tensor-parallel shard of size t (weights stored `[N, K]`, tokens M rows): fused QKV
//! N = (q_heads / t + 2·max(1, kv_heads / t))·head_dim, K = hidden (KV heads replicated
//! where t exceeds them); O N = hidden, K = q_heads·head_dim / t; fused gate_up N =
//! 2·intermediate / t (up, N = intermediate / t, where the MLP has no gate), K = hidden;
//! down N = hidden, K = intermediate / t; lm_head N = vocab
//! / t (rounded up), K = hidden, at decode batch sizes only (prefill computes logits for
//! the last token of each sequence). Attention per shard has q_heads / t query heads and
//! max(1, kv_heads / t) KV heads. Mixture-of-experts layers run the expert GEMMs at
//! M·active/experts tokens (rounded up; at the experts' whole width with expert parallelism,
//! each shard holding experts/t of them) plus the router GEMM (N = experts), the shared
//! experts' gate_up and down at M tokens where the model has them, and the dense ones where
//! some of its layers have no experts. Latent attention (DeepSeek) runs its own projections
//! in place of QKV and O (`latent_projections`); a hybrid's other mixers run their
//! projections (`Mixer::projections`: Mamba-2, Mamba-1, gated delta nets).

use std::collections::HashSet;
use std::path::Path;

use kerntune_kernels::problem::{BLayout, FlashProblem, GemmProblem, PagedProblem, Scale};
use kerntune_kernels::{DType, Device, Family, Fp8, KernelError, Problem};

use crate::error::{usage, Result, TuneError};
use crate::models::{is_hub_address, Latent, Model, PRESETS};
use crate::tunableop;

/// Token and context buckets, and which kernels to derive.
#[derive(Debug, Clone)]
pub struct Buckets {
    pub batch_sizes: Vec<usize>,
    pub prefill_lens: Vec<usize>,
    pub context_lens: Vec<usize>,
    pub kernels: Vec<Family>,
    pub dtype: Option<DType>,
    /// What paged attention's caches hold (`None`: the model's dtype).
    pub kv_cache: Option<DType>,
    pub block_size: usize,
    /// Tokens per block of a latent (multi-head latent attention) cache: `block_size` where
    /// `--block-size` is given, else what vLLM's MLA backend on the device allocates
    /// ([`mla_backend`]).
    pub latent_block_size: usize,
    /// vLLM's MLA backend on the device and the blocks it allocates a latent cache in
    /// ([`mla_backend`]).
    pub mla: MlaBackend,
    /// Experts spread whole over the shards (vLLM's expert parallelism) instead of each
    /// expert's FFN split over them.
    pub expert_parallel: bool,
    /// The device's E4M3, which an FP8 checkpoint's E4M3 GEMMs run in: fnuz on MI300X,
    /// whose hardware has no other (vLLM converts the weights as it loads them), OCP
    /// elsewhere.
    pub e4m3: Fp8,
}

impl Default for Buckets {
    fn default() -> Self {
        Buckets {
            batch_sizes: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
            prefill_lens: vec![512, 2048],
            context_lens: vec![1024, 4096],
            kernels: Family::ALL.to_vec(),
            dtype: None,
            kv_cache: None,
            block_size: 16,
            latent_block_size: 16,
            mla: MlaBackend::PLAIN,
            expert_parallel: false,
            e4m3: Fp8::E4m3,
        }
    }
}

/// vLLM's default backend for multi-head latent attention's decode on a device, and the
/// tokens a block it allocates a latent cache in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaBackend {
    pub name: &'static str,
    pub block_size: usize,
}

impl MlaBackend {
    /// Where vLLM's MLA backend keeps its default blocks of 16 (Triton MLA).
    pub const PLAIN: MlaBackend = MlaBackend {
        name: "Triton MLA",
        block_size: 16,
    };
}

/// What vLLM's MLA backend on `device` allocates a latent cache in when `--block-size` is not
/// given: on sm_90 (H100, H200) its default is FlashMLA, whose kernels take blocks of 64
/// tokens; on sm_100 (B200) FlashInfer's MLA (vLLM's default there since early 2026, after
/// CUTLASS MLA's blocks of 128), which takes 32 or 64 and is given 64; vLLM raises the block
/// size to the backend's. Elsewhere (A100, AMD without AITER, the CPU) its default of 16.
/// Tuned at 16, such a server's decode calls would find no winner of their block size.
pub fn mla_backend(device: &Device) -> MlaBackend {
    match device {
        Device::Gpu(g) if g.arch == "sm_90" => MlaBackend {
            name: "FlashMLA",
            block_size: 64,
        },
        Device::Gpu(g) if g.arch == "sm_100" => MlaBackend {
            name: "FlashInfer MLA",
            block_size: 64,
        },
        _ => MlaBackend::PLAIN,
    }
}

/// A problem with a label saying where it came from (`llama70b tp8 qkv`).
#[derive(Debug, Clone, PartialEq)]
pub struct Derived {
    pub problem: Problem,
    pub origin: String,
}

/// The tensor-parallel degree a model is derived at without `--tp`: the smallest power of two
/// that splits it ([`check_tp`]) and whose shard of the weights fits in `memory` bytes (with
/// 10% left for activations and the KV cache). Where none both splits and fits (MiniMax-M2's
/// 48 heads on a 24 GiB host), the largest that splits, with a note saying so.
pub fn default_tp(model: &Model, memory: f64, expert_parallel: bool) -> (usize, Option<String>) {
    let splits: Vec<usize> = std::iter::successors(Some(1usize), |tp| Some(tp * 2))
        .take_while(|&tp| tp <= model.q_heads)
        .filter(|&tp| check_tp(model, tp, expert_parallel).is_ok())
        .collect();
    let shard = |tp: usize| model.weight_bytes() / tp as f64;
    if let Some(&tp) = splits.iter().find(|&&tp| shard(tp) <= 0.9 * memory) {
        return (tp, None);
    }
    // A degree of 1 always splits, so there is a largest.
    let tp = splits.last().copied().unwrap_or(1);
    let note = format!(
        "{}: no power-of-two tensor-parallel degree both splits it and fits a shard in this device's {:.0} GiB; its shapes are derived at --tp {tp} ({:.1} GiB a shard): pass --tp with the degree your server runs",
        model.name,
        memory / GIB,
        shard(tp) / GIB
    );
    (tp, Some(note))
}

const GIB: f64 = (1u64 << 30) as f64;

/// vLLM pads the vocabulary to a multiple of this before splitting its embedding and head over
/// the shards (`DEFAULT_VOCAB_PADDING_SIZE` of `ParallelLMHead`), so a shard's head GEMM runs
/// the padding rows too: GPT-2's 50257 tokens are 50304 rows.
const VOCAB_PADDING: usize = 64;

pub fn check_tp(model: &Model, tp: usize, expert_parallel: bool) -> Result<()> {
    if tp == 0 {
        return Err(usage(
            "--tp 0: a tensor-parallel degree is the number of devices a model is split over, at least 1",
        ));
    }
    let widths = model.ffn_widths(expert_parallel);
    let undivided = widths.iter().find(|(_, w)| !w.is_multiple_of(tp));
    // KV heads are split over the shards, or each replicated over tp / kv_heads of them.
    let kv_unsplit = model
        .attention_kinds()
        .into_iter()
        .map(|(kv, _)| kv)
        .find(|kv| !(kv.is_multiple_of(tp) || tp.is_multiple_of(*kv)));
    if !model.q_heads.is_multiple_of(tp) || undivided.is_some() {
        let widths: Vec<String> = widths
            .iter()
            .map(|(name, w)| format!("{name} = {w}"))
            .collect();
        return Err(usage(format!(
            "--tp {tp} does not divide {}: q_heads = {} and {} must be multiples of it",
            model.name,
            model.q_heads,
            widths.join(", ")
        )));
    }
    if let (true, Some(e)) = (expert_parallel, model.experts) {
        if !e.count.is_multiple_of(tp) {
            return Err(usage(format!(
                "--expert-parallel over {tp} shards: {}'s {} experts do not spread evenly over them",
                model.name, e.count
            )));
        }
    }
    if let Some(why) = model.hybrid.and_then(|h| h.mixer.tp_refusal(tp)) {
        return Err(usage(format!(
            "--tp {tp} cannot split {}'s mixers: {why}",
            model.name
        )));
    }
    if let Some(kv) = kv_unsplit {
        return Err(usage(format!(
            "--tp {tp} neither divides nor is a multiple of {}'s num_key_value_heads = {kv}: its KV heads cannot be split over the shards or replicated evenly",
            model.name
        )));
    }
    Ok(())
}

/// Refuses what the model asks of kernels that do not compute it, unless the flags leave it
/// out: a config's unknown input type without `--dtype`, quantized weights' GEMMs, a hybrid's
/// GEMMs, attention that is not plain softmax attention, attention longer than its chunk
/// (Llama 4's chunked attention). Each refusal names only flags under which the rest of the model is tuned, so
/// following its advice never meets another refusal.
fn check_supported(model: &Model, b: &Buckets) -> Result<()> {
    let u = &model.unsupported;
    if let (Some(why), None) = (&u.dtype, b.dtype) {
        return Err(usage(format!(
            "{why}: pass --dtype (f32, f16 or bf16) to tune its shapes at one of those"
        )));
    }
    let gemms = b.kernels.contains(&Family::Gemm);
    let attention = b.kernels.iter().any(|f| *f != Family::Gemm);
    let quantized = u.gemm.is_some() && b.dtype.is_none();
    let attention_alone = u
        .attention
        .is_none()
        .then(|| "pass --kernels flash,paged to tune its attention alone".to_string());
    let explicit = "tune its GEMMs as explicit problems (--shapes gemm:m=...,n=...,k=...)";
    let refuse = |why: &str, fixes: &[Option<String>]| {
        let fixes: Vec<&str> = fixes.iter().flatten().map(String::as_str).collect();
        let fixes = match fixes.is_empty() {
            true => explicit.to_string(),
            false => fixes.join(", or "),
        };
        Err(usage(format!("{why}: {fixes}")))
    };
    if let (Some(why), true) = (&u.layers, gemms) {
        return refuse(
            why,
            &[attention_alone.as_ref().map(|_| {
                "pass --kernels flash,paged to tune its attention layers alone, and its GEMMs as explicit problems (--shapes gemm:m=...,n=...,k=...)".to_string()
            })],
        );
    }
    if let (Some(why), true, true) = (&u.gemm, gemms, quantized) {
        let unquantized = match attention && u.attention.is_some() {
            true => "pass --kernels gemm --dtype bf16 to tune its GEMM shapes alone, with unquantized weights",
            false => "pass --dtype bf16 to tune its GEMM shapes with unquantized weights",
        };
        return refuse(why, &[attention_alone, Some(unquantized.into())]);
    }
    if let (Some(why), true) = (&u.attention, attention) {
        let gemms_alone = match (u.layers.is_some(), quantized) {
            (true, _) => None,
            (false, true) => Some(
                "pass --kernels gemm --dtype bf16 to tune its GEMM shapes alone, with unquantized weights",
            ),
            (false, false) => Some("pass --kernels gemm to tune its GEMMs alone"),
        };
        return refuse(why, &[gemms_alone.map(String::from)]);
    }
    // Chunked attention computes what full attention does as long as no length exceeds a
    // chunk; beyond it the kernels would compute another function.
    let lengths = b
        .kernels
        .iter()
        .flat_map(|f| match f {
            Family::Flash => b.prefill_lens.as_slice(),
            Family::Paged => b.context_lens.as_slice(),
            Family::Gemm => &[],
        })
        .copied()
        .max();
    if let (Some(chunk), Some(longest)) = (model.chunked_attention, lengths) {
        if longest > chunk {
            return Err(usage(format!(
                "{}: its attention sees only the keys of its own chunk of attention_chunk_size = {chunk} tokens (on some or all of its layers), which kerntune's attention kernels do not compute, and {longest} tokens exceed it: pass --prefill-lens and --context-lens of at most {chunk}, where the chunks change nothing, or --kernels gemm",
                model.name
            )));
        }
    }
    Ok(())
}

/// Every problem one shard of `model` runs, de-duplicated, in a stable order.
pub fn derive(model: &Model, tp: usize, b: &Buckets) -> Result<Vec<Derived>> {
    check_tp(model, tp, b.expert_parallel)?;
    // Expert parallelism: each shard runs whole experts, for every token routed to them.
    let expert_tp = if b.expert_parallel { 1 } else { tp };
    check_supported(model, b)?;
    let dtype = b.dtype.unwrap_or(model.dtype);
    let scale = model
        .scale
        .and_then(Scale::new)
        .unwrap_or_else(|| Scale::default_for(model.head_dim));
    let q_heads = model.q_heads / tp;
    // Each KV head count of its attention layers, per shard (Llama-Nemotron's differ).
    let kv_kinds: Vec<usize> = model
        .attention_kinds()
        .into_iter()
        .map(|(kv, _)| (kv / tp).max(1))
        .collect();
    let d = model.head_dim;
    let mut out = Vec::new();
    let tag = format!("{} tp{tp}", model.name);
    let gemm_tokens = |prefill: bool| match prefill {
        true => "--prefill-lens",
        false => "--batch-sizes",
    };
    // An FP8 checkpoint's projections in fp8, unless --dtype asks for unquantized ones; its
    // LM head, routers and gates stay unquantized (the ignore lists of the FP8 checkpoints
    // of llm-compressor, AutoFP8 and FBGEMM name them).
    let fp8 = match b.dtype {
        Some(_) => None,
        None => model.fp8_weights.map(|f| match f {
            Fp8::E4m3 | Fp8::E4m3Fnuz => b.e4m3,
            Fp8::E5m2 => Fp8::E5m2,
        }),
    };
    // A 4-bit checkpoint's projections likewise take int4 weights under `dtype` activations
    // (GPTQ's packing, `[K / 8, N]`), unless --dtype asks for unquantized ones.
    let int4 = model.int4_group.filter(|_| b.dtype.is_none());
    let gemm = |role: &str, m: usize, n: usize, k: usize, prefill: bool| -> Result<Derived> {
        let quantized = !matches!(role, "lm_head" | "router" | "shared_expert_gate");
        let dtype = match fp8 {
            Some(f) if quantized => DType::Fp8(f),
            _ => dtype,
        };
        let group = int4
            .filter(|_| quantized)
            .map(|g| if g == 0 { k } else { g });
        let layout = if group.is_some() {
            BLayout::Kn
        } else {
            BLayout::Nk
        };
        let mut problem = GemmProblem::new(m, n, k, dtype, layout)
            .map_err(|e| blame(e, &[("m", gemm_tokens(prefill))]))?;
        if let Some(group) = group {
            problem = problem.with_int4(group).map_err(|e| {
                TuneError::Usage(format!(
                    "{tag} {role}: {e}; its 4-bit weights are grouped so that this shard's k does not hold whole groups: another --tp, or --dtype for unquantized GEMMs of the same shapes"
                ))
            })?;
        }
        // A block-scaled checkpoint's fp8 projections scale per block of its weights.
        if let (Some(block), Some(_)) = (model.fp8_block, problem.fp8()) {
            problem = problem.with_block(block)?;
        }
        Ok(Derived {
            problem: Problem::Gemm(problem),
            origin: format!("{tag} {role}"),
        })
    };
    if b.kernels.contains(&Family::Gemm) {
        let tokens = b
            .batch_sizes
            .iter()
            .map(|&m| (m, false))
            .chain(b.prefill_lens.iter().map(|&m| (m, true)));
        for (m, prefill) in tokens {
            if let Some(hybrid) = &model.hybrid {
                for (role, n, k) in hybrid.mixer.projections(model.hidden, tp) {
                    out.push(gemm(role, m, n, k, prefill)?);
                }
            }
            match &model.latent {
                None if kv_kinds.is_empty() => {}
                None => {
                    let query_heads = q_heads * (1 + usize::from(model.attn_output_gate));
                    for kv_heads in &kv_kinds {
                        out.push(gemm(
                            "qkv",
                            m,
                            (query_heads + 2 * kv_heads) * d,
                            model.hidden,
                            prefill,
                        )?);
                    }
                    out.push(gemm("o", m, model.hidden, model.q_heads * d / tp, prefill)?);
                }
                Some(l) => {
                    for (role, n, k) in latent_projections(l, model.hidden, q_heads, prefill) {
                        out.push(gemm(role, m, n, k, prefill)?);
                    }
                }
            }
            let dense = |out: &mut Vec<Derived>, prefix: &str, width: usize| -> Result<()> {
                let (up, n) = match model.gated_mlp {
                    true => ("gate_up", 2 * width / tp),
                    false => ("up", width / tp),
                };
                out.push(gemm(&format!("{prefix}{up}"), m, n, model.hidden, prefill)?);
                out.push(gemm(
                    &format!("{prefix}down"),
                    m,
                    model.hidden,
                    width / tp,
                    prefill,
                )?);
                Ok(())
            };
            match model.experts {
                None => {
                    for width in model.dense_widths() {
                        dense(&mut out, "", width)?;
                    }
                }
                Some(e) => {
                    let per_expert = (m * e.active).div_ceil(e.count);
                    out.push(gemm("router", m, e.count, model.hidden, prefill)?);
                    let (up, width) = match e.gated {
                        true => ("expert_gate_up", 2 * e.intermediate),
                        false => ("expert_up", e.intermediate),
                    };
                    // Latent experts: every token projected down before the routed experts
                    // and back after, whole on every shard.
                    let width_in = e.width_in(model.hidden);
                    if let Some(latent) = e.latent {
                        out.push(gemm("expert_latent_in", m, latent, model.hidden, prefill)?);
                        out.push(gemm("expert_latent_out", m, model.hidden, latent, prefill)?);
                    }
                    out.push(gemm(up, per_expert, width / expert_tp, width_in, prefill)?);
                    out.push(gemm(
                        "expert_down",
                        per_expert,
                        width_in,
                        e.intermediate / expert_tp,
                        prefill,
                    )?);
                    if e.shared_intermediate > 0 {
                        dense(&mut out, "shared_", e.shared_intermediate)?;
                    }
                    if e.shared_gate {
                        out.push(gemm("shared_expert_gate", m, 1, model.hidden, prefill)?);
                    }
                    if e.dense_layers > 0 {
                        dense(&mut out, "", model.intermediate)?;
                    }
                }
            }
        }
        for &m in &b.batch_sizes {
            out.push(gemm(
                "lm_head",
                m,
                model.vocab.next_multiple_of(VOCAB_PADDING).div_ceil(tp),
                model.hidden,
                false,
            )?);
        }
    }
    // A sliding window's layers run the windowed problem (the full one where the window
    // reaches every key); the model's other layers, where it has them, the full one.
    let window = model.window.map(|w| w.size);
    let full_layers = model.window.is_none_or(|w| w.full_layers);
    let attention = |role: &str, problem: Problem, windowed: Problem| {
        let full = (full_layers || windowed == problem).then(|| Derived {
            problem,
            origin: format!("{tag} {role}"),
        });
        let sliding = (windowed != problem).then(|| Derived {
            problem: windowed,
            origin: format!("{tag} sliding {role}"),
        });
        full.into_iter().chain(sliding)
    };
    // Latent attention's prefill runs as vLLM's MLA backends run it: keys and values projected
    // up from the latent for every query head (keys of qk_nope + qk_rope values, the queries'
    // width; values of v_head_dim).
    let (flash_v, flash_kinds) = match &model.latent {
        Some(l) => (l.v_head_dim, vec![q_heads]),
        None => (d, kv_kinds.clone()),
    };
    if b.kernels.contains(&Family::Flash) {
        for (&len, &kv_heads) in b
            .prefill_lens
            .iter()
            .flat_map(|l| flash_kinds.iter().map(move |k| (l, k)))
        {
            let p = FlashProblem::new(1, len, len, q_heads, kv_heads, d, true, scale, dtype)
                .and_then(|p| p.with_v_head_dim(flash_v))
                .map_err(|e| blame(e, &[("q_len", "--prefill-lens")]))?
                .with_sinks(model.sinks)
                .with_softcap(model.softcap)
                .and_then(|p| p.with_alibi(model.alibi))
                .map_err(TuneError::from)?;
            let windowed = p.with_window(window).map_err(TuneError::from)?;
            out.extend(attention(
                "prefill",
                Problem::Flash(p),
                Problem::Flash(windowed),
            ));
        }
    }
    // Latent attention decodes as vLLM's MLA backends run it: every query head of the shard
    // (its query absorbed into the latent) against the one cached latent row per token,
    // whose first kv_lora_rank values are the value; the output is projected up after.
    let (paged_d, paged_v, paged_kinds, block_size) = match &model.latent {
        Some(l) => (l.row(), l.kv_lora_rank, vec![1], b.latent_block_size),
        None => (d, d, kv_kinds, b.block_size),
    };
    if b.kernels.contains(&Family::Paged) {
        for (&seqs, &kv_heads) in b
            .batch_sizes
            .iter()
            .flat_map(|s| paged_kinds.iter().map(move |k| (s, k)))
        {
            for &ctx in &b.context_lens {
                let p = PagedProblem::new(
                    seqs, ctx, q_heads, kv_heads, paged_d, block_size, scale, dtype,
                )
                .and_then(|p| p.with_v_head_dim(paged_v))
                .map_err(|e| {
                    blame(
                        e,
                        &[
                            ("num_seqs", "--batch-sizes"),
                            ("context_len", "--context-lens"),
                            ("block_size", "--block-size"),
                        ],
                    )
                })?
                .with_kv_dtype(b.kv_cache.unwrap_or(dtype))
                .map_err(|e| blame(e, &[("kv_dtype", "--kv-cache-dtype")]))?
                .with_sinks(model.sinks)
                .with_softcap(model.softcap)
                .and_then(|p| p.with_alibi(model.alibi))
                .map_err(TuneError::from)?;
                let windowed = p.with_window(window).map_err(TuneError::from)?;
                out.extend(attention(
                    "decode",
                    Problem::Paged(p),
                    Problem::Paged(windowed),
                ));
            }
        }
    }
    Ok(dedup(out))
}

/// The GEMMs (role, N, K) of one shard's latent attention with `heads` query heads, as vLLM
/// runs them: the queries' and the latent's down projections fused into one GEMM every shard
/// runs whole (`qkv_a`; a full-rank `q` and `kv_a` where the model has no `q_lora_rank`), the
/// queries' up projection `q_b`, the keys' and values' up projection `kv_b` on prompt tokens
/// only (decode multiplies each head by its slice of those weights, a batched product
/// kerntune's GEMM does not take), `o`, and DeepSeek-V3.2's indexer (`indexer_q`,
/// `indexer_k`, whole on every shard).
fn latent_projections(
    l: &Latent,
    hidden: usize,
    heads: usize,
    prefill: bool,
) -> Vec<(&'static str, usize, usize)> {
    let qk = l.qk_nope_head_dim + l.qk_rope_head_dim;
    let kv_a = l.kv_lora_rank + l.qk_rope_head_dim;
    let mut gemms = match l.q_lora_rank {
        Some(r) => vec![("qkv_a", r + kv_a, hidden), ("q_b", heads * qk, r)],
        None => vec![("q", heads * qk, hidden), ("kv_a", kv_a, hidden)],
    };
    if prefill {
        gemms.push((
            "kv_b",
            heads * (l.qk_nope_head_dim + l.v_head_dim),
            l.kv_lora_rank,
        ));
    }
    gemms.push(("o", hidden, heads * l.v_head_dim));
    if let (Some((n, d)), Some(r)) = (l.indexer, l.q_lora_rank) {
        gemms.push(("indexer_q", n * d, r));
        gemms.push(("indexer_k", d + n, hidden));
    }
    gemms
}

/// A derived problem's range error, naming the flag that set the dimension at fault where a
/// bucket flag did (`fields`: problem field and flag), since the user typed the flag and not
/// the problem.
fn blame(e: KernelError, fields: &[(&str, &str)]) -> TuneError {
    if let KernelError::InvalidProblem { field, .. } = &e {
        if let Some((_, flag)) = fields.iter().find(|(f, _)| f == field) {
            return usage(format!("{flag}: {e}"));
        }
    }
    e.into()
}

fn dedup(list: Vec<Derived>) -> Vec<Derived> {
    let mut seen = HashSet::new();
    list.into_iter()
        .filter(|d| seen.insert(d.problem))
        .collect()
}

/// The problems `--shapes` values expand to, de-duplicated, and notes on what they left out.
#[derive(Debug, Default)]
pub struct Shapes {
    pub problems: Vec<Derived>,
    /// What a value named but kerntune does not tune (a TunableOp file's batched GEMMs), for
    /// the user to read.
    pub notes: Vec<String>,
}

/// Expands one `--shapes` value: a model at each tensor-parallel degree of `tp` (default: the
/// smallest that fits `memory`), a problem, or a file of problems.
pub fn expand(spec: &str, tp: Option<&[usize]>, memory: f64, b: &Buckets) -> Result<Shapes> {
    if let Some(path) = spec.strip_prefix("untuned:") {
        return Ok(Shapes {
            problems: read_untuned(Path::new(path))?,
            notes: Vec::new(),
        });
    }
    if let Some(path) = spec.strip_prefix("tunableop:") {
        let (problems, note) = tunableop::read(Path::new(path))?;
        return Ok(Shapes {
            problems: dedup(problems),
            notes: note.into_iter().collect(),
        });
    }
    if !names_a_model(spec) {
        let problem: Problem = spec.parse()?;
        return Ok(Shapes {
            problems: vec![Derived {
                problem,
                origin: "explicit".into(),
            }],
            notes: Vec::new(),
        });
    }
    let Some(model) = Model::named(spec)? else {
        return Err(usage(format!(
            "unknown --shapes `{spec}`: expected a preset ({}), a config.json (or Mistral's params.json) or the folder holding one, a Hugging Face model id in the local cache (meta-llama/Llama-3.1-70B-Instruct), a problem such as `gemm:m=1,n=1280,k=8192,dtype=bf16`, untuned:PATH or tunableop:PATH",
            PRESETS.join(", ")
        )));
    };
    let (tps, mut notes) = match tp {
        Some(list) => (list.to_vec(), Vec::new()),
        None => {
            let (tp, note) = default_tp(&model, memory, b.expert_parallel);
            (vec![tp], note.into_iter().collect())
        }
    };
    let latent_decode = model.latent.is_some() && b.kernels.contains(&Family::Paged);
    let (chosen, vllm, backend) = (b.latent_block_size, b.mla.block_size, b.mla.name);
    if latent_decode && vllm != 16 && chosen == vllm {
        notes.push(format!(
            "{}'s latent cache in blocks of {chosen} tokens, as vLLM's MLA backend on this device ({backend}) allocates it; pass --block-size to choose",
            model.name
        ));
    } else if latent_decode && !chosen.is_multiple_of(vllm) {
        notes.push(format!(
            "{}'s latent cache in blocks of {chosen} tokens (--block-size), which vLLM's MLA backend on this device ({backend}) raises to {vllm}: a vLLM server's decode calls will not find these winners",
            model.name
        ));
    }
    let mut problems = Vec::new();
    for tp in tps {
        problems.extend(derive(&model, tp, b)?);
    }
    Ok(Shapes {
        problems: dedup(problems),
        notes,
    })
}

/// Whether a `--shapes` value names a model (a preset, a config.json, its folder or its
/// Hugging Face id) rather than problems as written (`family:key=value,...`, `untuned:PATH`,
/// `tunableop:PATH`).
pub fn names_a_model(spec: &str) -> bool {
    !spec.starts_with("untuned:")
        && !spec.starts_with("tunableop:")
        && (!spec.contains(':') || spec.ends_with(".json") || is_hub_address(spec))
}

/// Expands every `--shapes` value and de-duplicates across them.
pub fn expand_all(
    specs: &[String],
    tp: Option<&[usize]>,
    memory: f64,
    b: &Buckets,
) -> Result<Shapes> {
    let mut all = Shapes::default();
    for s in specs {
        let one = expand(s, tp, memory, b)?;
        all.problems.extend(one.problems);
        all.notes.extend(one.notes);
    }
    all.problems = dedup(all.problems);
    Ok(all)
}

/// The file the runtime writes: one problem key per line, optionally followed by a tab and a
/// count; `#` starts a comment.
fn read_untuned(path: &Path) -> Result<Vec<Derived>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        usage(format!(
            "cannot read untuned-shapes file {}: {e}",
            path.display()
        ))
    })?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(key) = line.split_whitespace().next() else {
            continue;
        };
        let problem: Problem = key
            .parse()
            .map_err(|e| usage(format!("{}:{}: {e}", path.display(), n + 1)))?;
        out.push(Derived {
            problem,
            origin: format!("untuned {}", path.display()),
        });
    }
    Ok(dedup(out))
}
