//! Model descriptions: presets and Hugging Face `config.json` files
//! ([`Model::from_config_json`], in `config_json.rs`), named by path, by the model's folder or
//! by a Hugging Face model id in the local hub cache (`hub.rs`).

mod blocks;
mod config_json;
mod delta_net;
mod families;
mod hub;
mod hunyuan;
mod hybrid;
mod kimi_delta;
mod lightning;
mod mamba;
mod mistral;
mod mixers;
mod short_conv;

pub use blocks::Blocks;
pub use delta_net::GatedDeltaNet;
pub use hub::is_address as is_hub_address;
pub use kimi_delta::KimiDelta;
pub use lightning::Lightning;
pub use mamba::{Mamba1, Mamba2};
pub use mixers::{Hybrid, Mixer};
pub use short_conv::ShortConv;

use std::path::Path;

use kerntune_kernels::DType;

use crate::error::{usage, Result};

/// The dimensions of a decoder-only transformer that decide its kernel shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub name: String,
    pub hidden: usize,
    /// Width of the dense MLP: every layer's in a dense model, the dense layers' in a mixture
    /// of experts (0 where it has none).
    pub intermediate: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub layers: usize,
    pub vocab: usize,
    pub experts: Option<Experts>,
    /// DeepSeek's multi-head latent attention, whose projections replace the fused QKV and O
    /// GEMMs (`None`: query, key and value heads of `head_dim`).
    pub latent: Option<Latent>,
    /// A hybrid's other mixers and how its layers divide between them, attention and MLPs
    /// (Mamba: Bamba, Granite 4.0-H, Nemotron-H, Falcon-H1, Jamba; gated delta nets:
    /// Qwen3-Next, Qwen3.5; short convolutions: LFM2; lightning attention: MiniMax-Text-01
    /// and M1; Kimi delta attention: Kimi Linear); `None`: every layer is attention and an
    /// MLP.
    pub hybrid: Option<Hybrid>,
    /// Layers each of their own KV head count and MLP width (Llama-Nemotron's
    /// `block_configs`), which then stand for `kv_heads` and `intermediate`; `None`: every
    /// layer is alike.
    pub blocks: Option<Blocks>,
    /// Whether the query projection carries an output gate of the same width (Qwen3-Next's
    /// full attention), doubling the query part of the fused QKV GEMM.
    pub attn_output_gate: bool,
    /// Whether the dense MLP is gated (a fused gate and up projection of twice its width, as
    /// Llama's SwiGLU), or one up projection (Phi-2, GPT-NeoX, StarCoder2, Nemotron).
    pub gated_mlp: bool,
    /// Attention's softmax scale where the config sets one other than `1 / sqrt(head_dim)`
    /// (Gemma's `query_pre_attn_scalar`, Granite's `attention_multiplier`).
    pub scale: Option<f32>,
    /// Layers whose attention looks back a bounded distance (`sliding_window`: Mistral 7B
    /// v0.1, Gemma 2 and 3, gpt-oss, Phi-3), where the config has them.
    pub window: Option<Window>,
    /// Llama 4's chunked attention (`attention_chunk_size`): each query sees the keys of its
    /// own chunk only, which kerntune's kernels do not compute; lengths past a chunk are
    /// refused.
    pub chunked_attention: Option<usize>,
    /// Whether each query head's softmax has a learned sink logit (gpt-oss): its attention
    /// problems are the ones with sinks.
    pub sinks: bool,
    /// Attention scores soft-capped at this value (Gemma 2's `attn_logit_softcapping`).
    pub softcap: Option<f32>,
    /// Attention scores biased by each head's ALiBi slope times the key's distance (Bloom,
    /// MPT, Baichuan 13B, Falcon-RW): its attention problems are the ones with ALiBi.
    pub alibi: bool,
    pub dtype: DType,
    /// An FP8 checkpoint's format (W8A8 with per-tensor, per-token or per-channel scales:
    /// `quantization_config` of `fp8`, `fbgemm_fp8` or `compressed-tensors`): its attention
    /// and MLP projections are fp8 GEMMs; the LM head, routers and gates stay at `dtype`.
    pub fp8_weights: Option<kerntune_kernels::Fp8>,
    /// A block-scaled FP8 checkpoint's block edge (`weight_block_size = [128, 128]`:
    /// DeepSeek-V3, Qwen3's and Kimi K2's FP8 releases): its fp8 GEMMs are block-scaled ones.
    pub fp8_block: Option<usize>,
    /// A 4-bit checkpoint's group of k (GPTQ, AWQ, compressed-tensors W4A16; 0: one group of
    /// all of k): its projections are int4 GEMMs under `dtype` activations.
    pub int4_group: Option<usize>,
    /// What the config asks for that the kernels do not compute; `shapes::derive` refuses
    /// the families concerned unless the command's flags leave them out.
    pub unsupported: Unsupported,
}

/// Sliding-window attention: layers whose queries see only the `size` keys ending at their
/// own position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub size: usize,
    /// Layers of full attention run beside the windowed ones (Gemma 2 and 3, gpt-oss,
    /// Qwen2's first `max_window_layers`); else every attention layer is windowed (Mistral 7B
    /// v0.1, Phi-3).
    pub full_layers: bool,
}

/// The mixture-of-experts layers of a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Experts {
    /// Routed experts per layer.
    pub count: usize,
    /// Routed experts each token runs.
    pub active: usize,
    /// FFN width of one routed expert.
    pub intermediate: usize,
    /// FFN width of the shared experts every token runs besides (0: none).
    pub shared_intermediate: usize,
    /// Layers with a dense MLP instead of experts.
    pub dense_layers: usize,
    /// Whether each expert's MLP is gated (a fused gate and up projection, as Mixtral's), or
    /// one up projection (Nemotron-H's squared-ReLU experts).
    pub gated: bool,
    /// Nemotron 3's latent experts (`moe_latent_size`): tokens projected down to this width
    /// before the routed experts and back after (`expert_latent_in`, `expert_latent_out`,
    /// whole on every shard), the experts running at it; `None`: at the hidden size.
    pub latent: Option<usize>,
    /// Whether the shared experts' output is scaled by a gate of one output per token
    /// (`shared_expert_gate`: Qwen2-MoE, Qwen3-Next, Qwen3.5).
    pub shared_gate: bool,
}

impl Experts {
    /// The width the routed experts take and give.
    pub fn width_in(&self, hidden: usize) -> usize {
        self.latent.unwrap_or(hidden)
    }
}

/// Multi-head latent attention (DeepSeek-V2 and V3, Kimi K2, MiniCPM3): keys and values are
/// projected down to one latent vector per token, which is what the KV cache holds, and up
/// again per head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latent {
    /// Width of the queries' low-rank projection (`None`: a full-rank query projection, as
    /// DeepSeek-V2-Lite).
    pub q_lora_rank: Option<usize>,
    /// Width of the latent the KV cache holds per token.
    pub kv_lora_rank: usize,
    /// Query and key head size without and with rotary embedding; they add up to `head_dim`.
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// DeepSeek-V3.2's sparse-attention indexer: its heads and their size.
    pub indexer: Option<(usize, usize)>,
}

impl Latent {
    /// Values of the cached latent row each token's decode attends over: the latent, then the
    /// rotary part of its key.
    pub fn row(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Weights of one layer's attention, in elements.
    fn weights(&self, hidden: usize, heads: usize) -> usize {
        let qk = self.qk_nope_head_dim + self.qk_rope_head_dim;
        let q = match self.q_lora_rank {
            Some(r) => hidden * r + r * heads * qk,
            None => hidden * heads * qk,
        };
        let indexer = match (self.indexer, self.q_lora_rank) {
            (Some((n, d)), Some(r)) => r * n * d + hidden * (d + n),
            _ => 0,
        };
        q + hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
            + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            + heads * self.v_head_dim * hidden
            + indexer
    }
}

/// Why a config's kernels are not the ones kerntune tunes, per family.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Unsupported {
    /// The config's input type is none the kernels take (f32, f16, bf16).
    pub dtype: Option<String>,
    /// The weights are quantized in a way kerntune's GEMMs do not compute (GPTQ, AWQ, int8,
    /// block-scaled or weight-only FP8, MXFP4): the server's GEMMs are not the ones derived.
    pub gemm: Option<String>,
    /// Some layers' GEMMs are not derived: layers that are neither attention, an MLP nor a
    /// mixer of a hybrid family read (other linear attention, convolutions), or experts under
    /// names not read; `--dtype` does not change that.
    pub layers: Option<String>,
    /// The attention is not the softmax attention the kernels compute (a sparse indexer's
    /// top-k keys).
    pub attention: Option<String>,
}

/// Presets from the models' published `config.json` files.
pub const PRESETS: [&str; 5] = [
    "llama70b",
    "llama2-70b",
    "llama8b",
    "mistral7b",
    "mixtral8x7b",
];

impl Model {
    pub fn preset(name: &str) -> Option<Model> {
        let m = |name: &str, hidden, inter, q, kv, layers, vocab, experts| Model {
            name: name.to_string(),
            hidden,
            intermediate: inter,
            q_heads: q,
            kv_heads: kv,
            head_dim: hidden / q,
            layers,
            vocab,
            experts,
            latent: None,
            hybrid: None,
            blocks: None,
            attn_output_gate: false,
            gated_mlp: true,
            scale: None,
            window: None,
            chunked_attention: None,
            sinks: false,
            softcap: None,
            alibi: false,
            dtype: DType::Bf16,
            fp8_weights: None,
            fp8_block: None,
            int4_group: None,
            unsupported: Unsupported::default(),
        };
        Some(match name.to_ascii_lowercase().as_str() {
            "llama70b" | "llama3-70b" | "llama-3.1-70b" => {
                m("llama70b", 8192, 28672, 64, 8, 80, 128256, None)
            }
            "llama2-70b" => m("llama2-70b", 8192, 28672, 64, 8, 80, 32000, None),
            "llama8b" | "llama3-8b" | "llama-3.1-8b" => {
                m("llama8b", 4096, 14336, 32, 8, 32, 128256, None)
            }
            "mistral7b" => Model {
                window: Some(Window {
                    size: 4096,
                    full_layers: false,
                }),
                ..m("mistral7b", 4096, 14336, 32, 8, 32, 32000, None)
            },
            "mixtral8x7b" => {
                let experts = Experts {
                    count: 8,
                    active: 2,
                    intermediate: 14336,
                    shared_intermediate: 0,
                    dense_layers: 0,
                    gated: true,
                    latent: None,
                    shared_gate: false,
                };
                m("mixtral8x7b", 4096, 0, 32, 8, 32, 32000, Some(experts))
            }
            _ => return None,
        })
    }

    /// The model `--shapes` names: a preset, a config.json, the folder holding one (what
    /// vLLM's `--model` takes), or a Hugging Face model id whose config.json is in the local
    /// hub cache. `Ok(None)` where the name is none of these.
    pub fn named(spec: &str) -> Result<Option<Model>> {
        if let Some(m) = Model::preset(spec) {
            return Ok(Some(m));
        }
        let path = Path::new(spec);
        if spec.ends_with(".json") || path.is_file() {
            return Model::from_config_json(path).map(Some);
        }
        if path.is_dir() {
            // vLLM reads a folder's config.json, Mistral's params.json where it has no other.
            let config = ["config.json", "params.json"]
                .into_iter()
                .map(|name| path.join(name))
                .find(|config| config.is_file())
                .ok_or_else(|| {
                    usage(format!(
                        "--shapes {spec} is a folder without a config.json (or Mistral's \
                         params.json): name the model's folder (the one a server loads it \
                         from) or its config.json"
                    ))
                })?;
            return Model::from_config_json(&config).map(Some);
        }
        let Some(repo) = hub::RepoId::parse(spec) else {
            return Ok(None);
        };
        let Some(config) = hub::locate(spec, repo).map_err(usage)? else {
            return Ok(None);
        };
        // The id the user typed says more than a path into the cache's snapshots.
        Model::from_config_json(&config).map(|m| {
            Some(Model {
                name: spec.to_string(),
                ..m
            })
        })
    }

    /// Each KV head count the model's attention layers have, with how many layers have it.
    pub fn attention_kinds(&self) -> Vec<(usize, usize)> {
        match &self.blocks {
            Some(b) => b.attention.clone(),
            None => vec![(
                self.kv_heads,
                self.hybrid.map_or(self.layers, |h| h.attention_layers),
            )],
        }
    }

    /// Each width the dense MLPs have (one, but for `block_configs`).
    pub fn dense_widths(&self) -> Vec<usize> {
        match &self.blocks {
            Some(b) => b.mlp.iter().map(|&(width, _)| width).collect(),
            None => vec![self.intermediate],
        }
    }

    /// Every FFN width the model's layers split over tensor-parallel shards (dense, routed
    /// experts unless spread whole with expert parallelism, shared experts): what a
    /// tensor-parallel degree must divide.
    pub fn ffn_widths(&self, expert_parallel: bool) -> Vec<(&'static str, usize)> {
        let mut widths = Vec::new();
        match self.experts {
            None if self.blocks.is_some() => widths.extend(
                self.dense_widths()
                    .into_iter()
                    .map(|w| ("a block_configs MLP width", w)),
            ),
            None => widths.push(("intermediate_size", self.intermediate)),
            Some(e) => {
                if !expert_parallel {
                    widths.push(("the experts' intermediate size", e.intermediate));
                }
                if e.shared_intermediate > 0 {
                    widths.push((
                        "the shared experts' intermediate size",
                        e.shared_intermediate,
                    ));
                }
                if e.dense_layers > 0 {
                    widths.push(("intermediate_size", self.intermediate));
                }
            }
        }
        widths
    }

    /// Weight bytes of the whole model at its dtype.
    pub fn weight_bytes(&self) -> f64 {
        let attn = |kv_heads: usize| match &self.latent {
            Some(l) => l.weights(self.hidden, self.q_heads),
            None => {
                let q_heads = self.q_heads * (1 + usize::from(self.attn_output_gate));
                self.hidden * (q_heads + 2 * kv_heads) * self.head_dim
                    + self.q_heads * self.head_dim * self.hidden
            }
        };
        // An MLP from `input` wide to `width` and back, with or without a gate.
        let mlp = |gated: bool, input: usize, width: usize| match gated {
            true => 3 * input * width,
            false => 2 * input * width,
        };
        let dense = |width: usize| mlp(self.gated_mlp, self.hidden, width);
        let dense_mlp = dense(self.intermediate);
        let (mlp_layers, mixers) = match &self.hybrid {
            Some(h) => (h.mlp_layers, h.mixer_layers * h.mixer.weights(self.hidden)),
            None => (self.layers, 0),
        };
        let attns: usize = self
            .attention_kinds()
            .into_iter()
            .map(|(kv, layers)| layers * attn(kv))
            .sum();
        let mlps = match (self.experts, &self.blocks) {
            (None, Some(b)) => b.mlp.iter().map(|&(w, layers)| layers * dense(w)).sum(),
            (None, None) => mlp_layers * dense_mlp,
            (Some(e), _) => {
                let routed = mlp(e.gated, e.width_in(self.hidden), e.intermediate);
                let shared = mlp(e.gated, self.hidden, e.shared_intermediate);
                let latent = e.latent.map_or(0, |l| 2 * self.hidden * l);
                let gate = usize::from(e.shared_gate) * self.hidden;
                let moe = e.count * (routed + self.hidden) + shared + latent + gate;
                mlp_layers.saturating_sub(e.dense_layers) * moe + e.dense_layers * dense_mlp
            }
        };
        let layers = attns + mlps + mixers;
        (layers as f64 + 2.0 * (self.vocab * self.hidden) as f64) * self.dtype.size() as f64
    }
}
