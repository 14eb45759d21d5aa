//! Reading a Hugging Face `config.json`: the fields of a Llama-style decoder, the places other
//! families keep them (a multimodal model's `text_config`, transformers 5's `dtype`, the own
//! names of GPT-2, Falcon, Bloom, MPT, DBRX, ChatGLM, OPT, EXAONE and ERNIE 4.5 in
//! `families.rs`), the
//! mixture-of-experts fields of Mixtral, Qwen and DeepSeek, DeepSeek's latent attention,
//! Gemma's and Granite's attention scales, and what the kernels do not compute, named so that
//! `tune` can refuse it instead of tuning shapes no server runs.

use std::path::Path;

use serde_json::{Map, Value};

use kerntune_kernels::{DType, Fp8};

use super::blocks::blocks;
use super::delta_net::delta_net;
use super::families::llama_names;
use super::hunyuan::{cross_layer_attention, hunyuan_fields};
use super::hybrid::other_layers;
use super::kimi_delta::kimi_delta;
use super::lightning::lightning;
use super::mamba::mamba;
use super::mistral::{hf_fields, is_params_json};
use super::short_conv::{is_lfm2, lfm2_mlp_width, short_conv};
use super::{Experts, Latent, Mixer, Model, Unsupported, Window};
use crate::error::{usage, Result, TuneError};

/// The fields of one config object, with errors that name the file.
struct Fields<'a> {
    path: &'a Path,
    map: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    fn error(&self, msg: impl std::fmt::Display) -> TuneError {
        usage(format!("{}: {msg}", self.path.display()))
    }

    fn int(&self, key: &str) -> Result<Option<usize>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .filter(|&n| n > 0)
                .map(|n| Some(n as usize))
                .ok_or_else(|| {
                    self.error(format!(
                        "field `{key}` must be a positive integer, found {x}"
                    ))
                }),
        }
    }

    /// A count that may be 0 (`first_k_dense_replace`, a dense model's experts).
    fn count(&self, key: &str) -> Result<usize> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(0),
            Some(x) => x.as_u64().map(|n| n as usize).ok_or_else(|| {
                self.error(format!("field `{key}` must be a whole number, found {x}"))
            }),
        }
    }

    /// The first of `keys` present, as a positive integer, with the key it came from.
    fn first_int(&self, keys: &[&'static str]) -> Result<Option<(&'static str, usize)>> {
        for &key in keys {
            if let Some(v) = self.int(key)? {
                return Ok(Some((key, v)));
            }
        }
        Ok(None)
    }

    fn float(&self, key: &str) -> Result<Option<f64>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.error(format!("field `{key}` must be a number, found {x}"))),
        }
    }

    fn str(&self, key: &str) -> Option<&str> {
        self.map.get(key).and_then(Value::as_str)
    }
}

/// The fields every decoder-only config must have (the dense or experts' FFN width besides).
const REQUIRED: [&str; 4] = [
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "vocab_size",
];

impl Model {
    /// Reads a Hugging Face `config.json`; missing or contradictory fields are named.
    pub fn from_config_json(path: &Path) -> Result<Model> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage(format!("cannot read model config {}: {e}", path.display())))?;
        let root: Value = serde_json::from_str(&text)
            .map_err(|e| usage(format!("{} is not valid JSON: {e}", path.display())))?;
        let Some(root) = root.as_object() else {
            return Err(usage(format!(
                "{}: a config.json is a JSON object, found {}",
                path.display(),
                kind_of(&root)
            )));
        };
        // Mistral's params.json reads as the Hugging Face config vLLM makes of it.
        let mistral = is_params_json(root)
            .then(|| hf_fields(root))
            .transpose()
            .map_err(|e| usage(format!("{}: {e}", path.display())))?;
        let root = mistral.as_ref().unwrap_or(root);
        let top = Fields { path, map: root };
        // Multimodal models (Gemma 3, Mistral 3, Llama 4) keep the language model's fields
        // in `text_config`; the decoder is what a server's kernels run.
        let f = match root.get("text_config").and_then(Value::as_object) {
            Some(text) if !top.has("hidden_size") => Fields { path, map: text },
            _ => Fields { path, map: root },
        };
        // A list of one MLP width is that width (vLLM's Nemotron-H).
        let unlisted = match f.map.get("intermediate_size") {
            Some(Value::Array(widths)) if widths.len() == 1 => {
                let mut map = f.map.clone();
                map.insert("intermediate_size".into(), widths[0].clone());
                Some(map)
            }
            _ => None,
        };
        let f = match &unlisted {
            Some(map) => Fields { path, map },
            None => f,
        };
        // Hunyuan's experts per layer and under its own names.
        let hunyuan = model_type(&top, &f)
            .is_some_and(|t| t.starts_with("hunyuan_v1"))
            .then(|| hunyuan_fields(f.map))
            .transpose()
            .map_err(|e| f.error(e))?;
        let f = match &hunyuan {
            Some(map) => Fields { path, map },
            None => f,
        };
        let renamed = llama_names(model_type(&top, &f), f.map);
        let f = match &renamed {
            Some(map) => Fields { path, map },
            None => f,
        };
        if let Some(why) = encoder(&top, &f) {
            return Err(f.error(format!(
                "{why}: kerntune derives the problems of decoder-only models (causal attention over a KV cache); tune its GEMMs as explicit problems (--shapes gemm:m=...,n=...,k=...)"
            )));
        }
        let hybrid = other_layers(f.map);
        if let (Some(why), false) = (&hybrid, f.has("num_attention_heads")) {
            return Err(f.error(format!(
                "no attention heads, and {why}: a model without attention layers runs none of the kernel problems kerntune derives from a config; tune its GEMMs as explicit problems (--shapes gemm:m=...,n=...,k=...)"
            )));
        }
        let moe_width = f.int("moe_intermediate_size")?;
        let mut required = REQUIRED.to_vec();
        // Llama-Nemotron gives each layer's MLP width in `block_configs`.
        if moe_width.is_none() && !f.has("block_configs") {
            required.insert(1, "intermediate_size");
        }
        let missing: Vec<&str> = required.iter().copied().filter(|k| !f.has(k)).collect();
        if !missing.is_empty() {
            return Err(f.error(format!(
                "missing required field(s) {}; a decoder-only config.json needs {}",
                missing.join(", "),
                required.join(", ")
            )));
        }
        let hidden = f.int("hidden_size")?.unwrap();
        let q_heads = f.int("num_attention_heads")?.unwrap();
        let latent = latent(&f, hidden, q_heads)?;
        // Latent attention projects each query head its own key and value.
        let kv_heads = match latent {
            Some(_) => q_heads,
            None => f.int("num_key_value_heads")?.unwrap_or(q_heads),
        };
        if q_heads % kv_heads != 0 {
            return Err(f.error(format!(
                "num_attention_heads = {q_heads} is not a multiple of num_key_value_heads = {kv_heads}"
            )));
        }
        let head_dim = match (latent, f.int("head_dim")?) {
            (Some(l), _) => l.qk_nope_head_dim + l.qk_rope_head_dim,
            (None, Some(d)) => d,
            (None, None) if hidden % q_heads == 0 => hidden / q_heads,
            (None, None) => {
                return Err(f.error(format!(
                    "no head_dim, and hidden_size = {hidden} is not a multiple of num_attention_heads = {q_heads}"
                )))
            }
        };
        let layers = f.int("num_hidden_layers")?.unwrap();
        let blocks = blocks(f.map, q_heads, kv_heads, hidden, layers).map_err(|e| f.error(e))?;
        let intermediate_size = match &blocks {
            Some(b) => b.mlp.last().map_or(0, |&(width, _)| width),
            None => f.int("intermediate_size")?.unwrap_or(0),
        };
        let experts = experts(&f, layers, intermediate_size, moe_width)?;
        // Llama 4's dense layers have a width of their own; its intermediate_size is the
        // experts'. Qwen (the first, model_type qwen) counts its gate and up projections
        // together: each is half as wide (transformers' and vLLM's QWenMLP).
        let family = model_type(&top, &f);
        let intermediate = match f.int("intermediate_size_mlp")? {
            Some(w) => w,
            None if family == Some("qwen") => intermediate_size / 2,
            // Granite's MoE families without experts (Granite 4.0-H Micro) run their shared
            // MLP alone.
            None if experts.is_none() && family.is_some_and(|t| t.starts_with("granitemoe")) => f
                .int("shared_intermediate_size")?
                .unwrap_or(intermediate_size),
            // LFM2 narrows its MLP from `intermediate_size`; LFM2-MoE's dense layers do not.
            None if is_lfm2(family) && !family.is_some_and(|t| t.contains("moe")) => {
                lfm2_mlp_width(f.map, intermediate_size).map_err(|e| f.error(e))?
            }
            None => intermediate_size,
        };
        // The first hybrid family that recognises the config reads it.
        let hybrid_layers = [
            mamba(f.map, family, hidden, layers),
            delta_net(f.map, family, layers),
            short_conv(f.map, family, hidden, layers),
            lightning(f.map, q_heads, head_dim, layers),
            kimi_delta(f.map, layers),
        ]
        .into_iter()
        .find_map(Result::transpose)
        .transpose()
        .map_err(|e| f.error(e))?;
        let gated_mlp = !family.is_some_and(|t| UNGATED_MLP.contains(&t));
        // Experts share their family's MLP (Nemotron-H's squared ReLU has no gate), and a
        // schedule that names expert layers says which layers are dense.
        let dense_in_schedule = hybrid_layers.and_then(|h| h.dense_mlp_layers);
        if dense_in_schedule.is_some() && experts.is_none() {
            return Err(f.error(
                "its layer schedule names expert layers, but no experts are given (n_routed_experts and num_experts_per_tok)",
            ));
        }
        // Qwen's shared experts are scaled by a gate of their own, a GEMM of one output.
        let shared_gate = family.is_some_and(|t| {
            ["qwen2_moe", "qwen3_next", "qwen3_5"]
                .iter()
                .any(|q| t.starts_with(q))
        });
        let experts = experts.map(|e| Experts {
            gated: gated_mlp,
            dense_layers: dense_in_schedule.unwrap_or(e.dense_layers),
            shared_gate: shared_gate && e.shared_intermediate > 0,
            ..e
        });
        if experts.is_some_and(|e| e.dense_layers > 0) && intermediate == 0 {
            return Err(f.error(
                "some layers have a dense MLP, whose width is intermediate_size, which is missing",
            ));
        }
        // Gemma scales queries by 1 / sqrt(query_pre_attn_scalar), Granite by its
        // attention_multiplier, rather than by 1 / sqrt(head size).
        let gemma3n = family.is_some_and(|t| t.starts_with("gemma3n"));
        let scale = match (
            f.int("query_pre_attn_scalar")?,
            f.float("attention_multiplier")?,
        ) {
            // Gemma 3n normalises queries and keys per head and scales by 1 (vLLM's
            // Gemma3nAttention: `scale=1.0`).
            _ if gemma3n => Some(1.0),
            (Some(s), _) if s != head_dim => Some(1.0 / (s as f32).sqrt()),
            (_, Some(m)) if m > 0.0 => Some(m as f32),
            (_, Some(m)) => {
                return Err(f.error(format!(
                    "field `attention_multiplier` must be positive, found {m}"
                )))
            }
            _ => None,
        };
        let scale = match latent {
            Some(_) if scale.is_none() => Some(latent_scale(&f, head_dim)?),
            _ => scale,
        };
        // Gemma 2 soft-caps its attention scores (Gemma 3 writes null).
        let softcap = match f.float("attn_logit_softcapping")? {
            Some(c) if c > 0.0 && (c as f32).is_finite() => Some(c as f32),
            Some(c) => {
                return Err(f.error(format!(
                    "field `attn_logit_softcapping` must be positive (null for none), found {c}"
                )))
            }
            None => None,
        };
        // Qwen2 writes a window it does not use unless `use_sliding_window` says so.
        let window = match f.map.get("use_sliding_window") {
            Some(Value::Bool(false)) => None,
            _ => f.int("sliding_window")?,
        };
        let window = match window {
            Some(size) => {
                windowed_layers(&f, &top, layers)?.map(|full_layers| Window { size, full_layers })
            }
            None => None,
        };
        // transformers 5 writes `dtype`; earlier versions `torch_dtype`.
        let dtype_field = ["dtype", "torch_dtype"]
            .into_iter()
            .find_map(|k| top.str(k).or_else(|| f.str(k)).map(|v| (k, v)));
        let (dtype, dtype_refusal) = match dtype_field {
            None | Some((_, "auto")) => (DType::Bf16, None),
            Some((_, "float32")) => (DType::F32, None),
            Some((_, "float16")) => (DType::F16, None),
            Some((_, "bfloat16")) => (DType::Bf16, None),
            Some((key, other)) => (
                DType::Bf16,
                Some(format!(
                    "{}: `{key}` = \"{other}\" is none of the input types kerntune's kernels take (float32, float16, bfloat16)",
                    path.display()
                )),
            ),
        };
        let quantized = quantization(&top).or_else(|| quantization(&f));
        let (fp8_weights, fp8_block, int4_group, gemm_refusal) = match quantized {
            None => (None, None, None, None),
            Some(Ok(Quant::Fp8(format, block))) => (Some(format), block, None, None),
            Some(Ok(Quant::Int4(group))) => (None, None, Some(group), None),
            Some(Err(why)) => (None, None, None, Some(why)),
        };
        let unsupported = Unsupported {
            dtype: dtype_refusal,
            gemm: gemm_refusal,
            layers: hybrid
                .filter(|_| hybrid_layers.is_none())
                .map(|why| {
                    format!(
                        "{}: not every layer is attention and an MLP ({why}), and kerntune derives the GEMMs of those alone (and of the Mamba mixers of Bamba, Granite 4.0-H, Falcon-H1, Nemotron-H and Jamba, Qwen3-Next's delta nets, LFM2's short convolutions, MiniMax's lightning attention and Kimi Linear's delta attention): it would miss the other layers' projections and could mistake this family's MLP",
                        path.display()
                    )
                })
                .or_else(|| unread_experts(&f, experts.is_some()))
                .or_else(|| narrow_embeddings(&f, family, hidden))
                .or_else(|| {
                    cross_layer_attention(f.map).map(|why| format!("{}: {why}", path.display()))
                })
                .or_else(|| {
                    gemma3n.then(|| {
                        format!(
                            "{}: Gemma 3n's layers run GEMMs besides attention and the MLP (AltUp's predictions and corrections, LAuReL's low-rank residual, the per-layer input gate and projection) that kerntune does not derive",
                            path.display()
                        )
                    })
                }),
            attention: latent.and_then(|l| sparse_refusal(&f, &l)),
        };
        let alibi = alibi(&f, &top);
        let name = top
            .str("_name_or_path")
            .map(str::to_string)
            .unwrap_or_else(|| path.display().to_string());
        Ok(Model {
            name,
            hidden,
            intermediate,
            q_heads,
            // `block_configs` stands for it; the most KV heads a layer has, for the record.
            kv_heads: blocks
                .as_ref()
                .and_then(|b| b.attention.last())
                .map_or(kv_heads, |&(kv, _)| kv),
            head_dim,
            layers,
            vocab: f.int("vocab_size")?.unwrap(),
            experts,
            latent,
            hybrid: hybrid_layers,
            blocks,
            // Qwen3-Next gates its full attention's output unless the config says not.
            attn_output_gate: hybrid_layers.is_some_and(|h| matches!(h.mixer, Mixer::DeltaNet(_)))
                && f.map.get("attn_output_gate") != Some(&Value::Bool(false)),
            gated_mlp,
            scale,
            window,
            chunked_attention: f.int("attention_chunk_size")?,
            // gpt-oss's attention layers all hold a sink per query head (transformers'
            // GptOssAttention, vLLM's `sinks`).
            sinks: model_type(&top, &f) == Some("gpt_oss"),
            softcap,
            alibi: alibi.is_some(),
            dtype,
            fp8_weights,
            fp8_block,
            int4_group,
            unsupported,
        })
    }
}

/// Which layers a config with a `sliding_window` runs it on: `Some(true)` where layers of full
/// attention run beside windowed ones, `Some(false)` where every attention layer is windowed,
/// `None` where none is. As transformers reads them: the layers' kinds (`layer_types`:
/// Gemma 3, gpt-oss, and every config transformers 4.5x writes), Qwen2's layers from
/// `max_window_layers` on, every `sliding_window_pattern`-th layer global (Gemma 3, Cohere
/// 2), Gemma 2's alternation, else every layer (Mistral 7B v0.1, Phi-3, Starcoder 2).
fn windowed_layers(f: &Fields<'_>, top: &Fields<'_>, layers: usize) -> Result<Option<bool>> {
    if let Some(Value::Array(kinds)) = f.map.get("layer_types") {
        let kinds: Vec<&str> = kinds.iter().filter_map(Value::as_str).collect();
        let sliding = kinds.iter().filter(|&&k| k == "sliding_attention").count();
        let full = kinds
            .iter()
            .any(|&k| k == "full_attention" || k == "attention");
        return Ok((sliding > 0).then_some(full));
    }
    if f.map.get("use_sliding_window") == Some(&Value::Bool(true)) {
        if let Some(full) = f.int("max_window_layers")? {
            return Ok((full < layers).then_some(true));
        }
    }
    if let Some(pattern) = f.int("sliding_window_pattern")? {
        return Ok((pattern > 1).then_some(true));
    }
    let gemma2 = [f.str("model_type"), top.str("model_type")].contains(&Some("gemma2"));
    Ok(Some(gemma2))
}

/// The mixture of experts, under Mixtral's (`num_local_experts`; Granite's shared experts'
/// `shared_intermediate_size`), Qwen's (`num_experts`,
/// `moe_intermediate_size`, `shared_expert_intermediate_size`, `decoder_sparse_step`,
/// `mlp_only_layers`), DeepSeek's (`n_routed_experts`, `n_shared_experts`,
/// `first_k_dense_replace`), Llama 4's (`interleave_moe_layer_step`, a shared expert) or
/// Jamba's (`expert_layer_period`, `expert_layer_offset`) names.
fn experts(
    f: &Fields<'_>,
    layers: usize,
    intermediate: usize,
    moe_width: Option<usize>,
) -> Result<Option<Experts>> {
    // Dense members of MoE families (Granite 4.0-H Micro) write 0 experts.
    let mut count = None;
    for key in ["num_local_experts", "num_experts", "n_routed_experts"] {
        if let n @ 1.. = f.count(key)? {
            count = Some((key, n));
            break;
        }
    }
    // Kimi Linear writes `num_experts_per_token`.
    let active = Some(
        f.count("num_experts_per_tok")?
            .max(f.count("num_experts_per_token")?),
    )
    .filter(|&n| n > 0);
    let (count_key, count, active) = match (count, active) {
        (None, None) => return Ok(None),
        (Some((key, e)), Some(a)) if a <= e => (key, e, a),
        (Some((key, e)), Some(a)) => {
            return Err(f.error(format!("num_experts_per_tok = {a} exceeds {key} = {e}")))
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(f.error(
                "a mixture of experts needs both the number of experts (num_local_experts, num_experts or n_routed_experts) and num_experts_per_tok",
            ))
        }
    };
    let width = match moe_width {
        Some(w) => w,
        None if intermediate > 0 => intermediate,
        None => {
            return Err(f.error(format!(
                "{count_key} = {count} but neither moe_intermediate_size nor intermediate_size gives the experts' width"
            )))
        }
    };
    // A width or count of 0 is no shared expert (MiniMax-M2 writes `shared_intermediate_size:
    // 0`).
    let shared_width = [
        "shared_expert_intermediate_size",
        "shared_intermediate_size",
        "moe_shared_expert_intermediate_size",
    ]
    .into_iter()
    .find(|key| f.has(key))
    .map(|key| f.count(key).map(|w| (key, w)))
    .transpose()?;
    // DeepSeek's count, or Kimi's and Ling's under another name: that many of the routed
    // experts' width.
    let shared_count = ["n_shared_experts", "num_shared_experts"]
        .into_iter()
        .find(|key| f.has(key))
        .map(|key| f.count(key));
    let shared_intermediate = match (shared_width, shared_count.transpose()?) {
        // Nemotron-H's is one shared expert's width (vLLM's NemotronHMoE multiplies it by
        // n_shared_experts); Qwen's and Granite's are the whole shared MLP's.
        (Some(("moe_shared_expert_intermediate_size", w)), Some(n)) => w * n,
        (Some((_, w)), _) => w,
        (None, Some(n)) => n * width,
        // Llama 4's MoE layers run one shared expert of the routed ones' width.
        (None, None) if f.str("model_type") == Some("llama4_text") => width,
        (None, None) => 0,
    };
    // Layers without experts: DeepSeek's first k, Qwen's listed ones and those off its (or
    // Llama 4's, or ERNIE 4.5's) step.
    let step = f
        .first_int(&[
            "decoder_sparse_step",
            "interleave_moe_layer_step",
            "moe_layer_interval",
        ])?
        .map_or(1, |(_, s)| s);
    let listed: Vec<usize> = match f.map.get("mlp_only_layers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_u64().map(|n| n as usize).filter(|&n| n < layers))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                f.error(format!(
                    "field `mlp_only_layers` must list layer indices below num_hidden_layers = {layers}"
                ))
            })?,
        Some(x) => {
            return Err(f.error(format!(
                "field `mlp_only_layers` must be a list of layer indices, found {x}"
            )))
        }
    };
    // LFM2-MoE names DeepSeek's `first_k_dense_replace` `num_dense_layers`, ERNIE 4.5
    // `moe_layer_start_index`, beside which it bounds its expert layers by
    // `moe_layer_end_index` (-1, transformers' default: the last layer).
    let first_dense = f
        .count("first_k_dense_replace")?
        .max(f.count("num_dense_layers")?)
        .max(f.count("moe_layer_start_index")?);
    let last_moe = match f.map.get("moe_layer_end_index") {
        None | Some(Value::Null) => layers - 1,
        Some(v) if v.as_i64() == Some(-1) => layers - 1,
        Some(_) => f.count("moe_layer_end_index")?,
    };
    // DeepSeek counts its MoE layers' frequency from layer 0 (vLLM: `i % moe_layer_freq ==
    // 0`), Qwen and Llama 4 their step from layer 1.
    let freq = f.int("moe_layer_freq")?.unwrap_or(1);
    // Jamba's experts are every `expert_layer_period`-th layer from `expert_layer_offset`.
    let period = f.int("expert_layer_period")?.unwrap_or(1);
    let offset = f.count("expert_layer_offset")? % period;
    let dense_layers = (0..layers)
        .filter(|&i| {
            i < first_dense
                || i > last_moe
                || listed.contains(&i)
                || (i + 1) % step != 0
                || i % freq != 0
                || i % period != offset
        })
        .count();
    Ok(Some(Experts {
        count,
        active,
        intermediate: width,
        shared_intermediate,
        dense_layers,
        gated: true,
        latent: f.int("moe_latent_size")?,
        shared_gate: false,
    }))
}

/// Multi-head latent attention, where `kv_lora_rank` says the model has it.
fn latent(f: &Fields<'_>, hidden: usize, q_heads: usize) -> Result<Option<Latent>> {
    let Some(kv_lora_rank) = f.int("kv_lora_rank")? else {
        return Ok(None);
    };
    let need = |key: &str| -> Result<usize> {
        f.int(key)?.ok_or_else(|| {
            f.error(format!(
                "kv_lora_rank = {kv_lora_rank} says its attention is multi-head latent attention, which needs `{key}` too"
            ))
        })
    };
    let q_lora_rank = f.int("q_lora_rank")?;
    // MiniCPM3's config may leave the value heads' size out; transformers then takes
    // hidden_size / num_attention_heads.
    let v_head_dim = match f.int("v_head_dim")? {
        Some(d) => d,
        None if hidden.is_multiple_of(q_heads) => hidden / q_heads,
        None => need("v_head_dim")?,
    };
    let indexer = match f.int("index_topk")? {
        None => None,
        Some(_) if q_lora_rank.is_none() => {
            return Err(f.error(
                "index_topk: the sparse-attention indexer reads the queries' low-rank projection, but q_lora_rank is missing",
            ))
        }
        Some(_) => Some((need("index_n_heads")?, need("index_head_dim")?)),
    };
    Ok(Some(Latent {
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim: need("qk_nope_head_dim")?,
        qk_rope_head_dim: need("qk_rope_head_dim")?,
        v_head_dim,
        indexer,
    }))
}

/// Why DeepSeek-V3.2's sparse attention is not what kerntune's kernels compute: each query
/// attends to the keys its indexer picks, not to its whole context.
fn sparse_refusal(f: &Fields<'_>, l: &Latent) -> Option<String> {
    l.indexer?;
    Some(format!(
        "{}: its attention is sparse (index_topk = {}): each query attends only to the keys its indexer picks, which kerntune's attention kernels do not compute",
        f.path.display(),
        f.int("index_topk").ok().flatten().unwrap_or(0)
    ))
}

/// Latent attention's softmax scale, as vLLM's DeepSeek attention sets it: 1 / sqrt of the
/// query and key head size, times `mscale²` where `rope_scaling` is set (YaRN's attention
/// factor, `0.1 · mscale_all_dim · ln(factor) + 1` for a factor above 1, which vLLM applies
/// to the scores rather than to the rotary embedding).
fn latent_scale(f: &Fields<'_>, head_dim: usize) -> Result<f32> {
    let base = 1.0 / (head_dim as f64).sqrt();
    let Some(Value::Object(rope)) = f.map.get("rope_scaling") else {
        return Ok(base as f32);
    };
    let number = |key: &str| -> Result<f64> {
        match rope.get(key) {
            None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(0.0),
            Some(v) => v.as_f64().ok_or_else(|| {
                f.error(format!(
                    "field `rope_scaling.{key}` must be a number, found {v}"
                ))
            }),
        }
    };
    let (factor, all_dim) = (number("factor")?, number("mscale_all_dim")?);
    let mscale = if factor <= 1.0 {
        1.0
    } else {
        0.1 * all_dim * factor.ln() + 1.0
    };
    Ok((base * mscale * mscale) as f32)
}

/// Why the MLP is not derived where fields describe experts under names [`experts`] does not
/// read: derived without them, its GEMMs would be shapes its server never runs. Without any
/// experts read, any positive `moe_*` or `*expert*` field (Step-3's `moe_num_experts` and
/// `moe_top_k`: read as dense, every layer would run an MLP of `intermediate_size`); with
/// experts read, shared experts or a schedule of MoE layers under other names (Hunyuan's
/// `num_shared_expert` outside a Hunyuan config, Arctic's `moe_layer_frequency`), which would
/// drop or miscount GEMMs.
fn unread_experts(f: &Fields<'_>, experts_read: bool) -> Option<String> {
    const READ_SHARED: [&str; 4] = [
        "shared_expert_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "n_shared_experts",
        "num_shared_experts",
    ];
    // Schedules of MoE layers.
    const SCHEDULES: [&str; 1] = ["moe_layer_frequency"];
    let named: Vec<&str> = f
        .map
        .iter()
        .filter(|(key, value)| {
            let says = match value {
                Value::Number(n) => n.as_f64().is_some_and(|x| x > 0.0),
                Value::Array(items) => !items.is_empty(),
                Value::Object(fields) => !fields.is_empty(),
                _ => false,
            };
            let unread = match experts_read {
                false => key.contains("expert") || key.starts_with("moe_"),
                true => {
                    (key.contains("shared_expert") && !READ_SHARED.contains(&key.as_str()))
                        || SCHEDULES.contains(&key.as_str())
                }
            };
            says && unread
        })
        .map(|(key, _)| key.as_str())
        .collect();
    (!named.is_empty()).then(|| {
        format!(
            "{}: {} describe its mixture of experts under names kerntune does not read (it reads Mixtral's, Qwen's, DeepSeek's and Llama 4's), and its MLP is refused rather than guessed",
            f.path.display(),
            named.join(", ")
        )
    })
}

/// Why the GEMMs are not derived where OPT's embeddings are narrower than its layers
/// (`word_embed_proj_dim`, OPT-350m): vLLM runs a `project_in` and a `project_out` GEMM around
/// the layers and a head of the embeddings' width, which the derivation does not.
fn narrow_embeddings(f: &Fields<'_>, family: Option<&str>, hidden: usize) -> Option<String> {
    let width = f.int("word_embed_proj_dim").ok().flatten()?;
    (family == Some("opt") && width != hidden).then(|| {
        format!(
            "{}: its embeddings are word_embed_proj_dim = {width} wide against hidden_size = {hidden}, so its server projects them in and out around the layers and runs a head of that width, GEMMs kerntune does not derive",
            f.path.display()
        )
    })
}

/// How a checkpoint's projections are quantized, where kerntune's GEMMs compute it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quant {
    /// W8A8 in this fp8 format, scaled per tensor, token or channel, or per square block of
    /// this edge.
    Fp8(Fp8, Option<usize>),
    /// W4A16: 4-bit weights in groups of this many values of k (0: one group of all of k,
    /// GPTQ's and AWQ's `group_size = -1`).
    Int4(usize),
}

/// What `quantization_config` says of the weights: the fp8 format of an FP8 W8A8
/// checkpoint whose scales are per tensor, token or channel (`fp8` without
/// `weight_block_size`, as AutoFP8 and vLLM write it; `fbgemm_fp8`; `compressed-tensors` with
/// 8-bit float weights and activations) or per square block (`fp8` with `weight_block_size`
/// = [b, b], DeepSeek-V3's, its activations scaled per token and b values of k as vLLM
/// quantizes them); the group of 4-bit weights under 16-bit activations (GPTQ and AWQ of 4
/// bits, compressed-tensors' `pack-quantized` W4A16), else why the server's GEMMs are not the
/// ones derived (GPTQ with act-order, other bit widths, int8, bitsandbytes, weight-only FP8,
/// MXFP4, blocks that are not square).
fn quantization(f: &Fields<'_>) -> Option<Result<Quant, String>> {
    let q = f.map.get("quantization_config")?.as_object()?;
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("unnamed");
    let scheme = match method {
        "fp8" => {
            let format = match q.get("fmt").and_then(Value::as_str) {
                Some("e5m2") => Fp8::E5m2,
                _ => Fp8::E4m3,
            };
            match q.get("weight_block_size").filter(|b| !b.is_null()) {
                Some(block) => square_block(block).map(|b| Quant::Fp8(format, Some(b))),
                None => Ok(Quant::Fp8(format, None)),
            }
        }
        "fbgemm_fp8" => Ok(Quant::Fp8(Fp8::E4m3, None)),
        "gptq" | "awq" => int4_group(method, q),
        "compressed-tensors" => compressed_tensors(q),
        _ => Err(format!(
            "its weights are quantized (quantization_config.quant_method = \"{method}\"), and kerntune's GEMMs take f32, f16, bf16, fp8 (W8A8) or 4-bit GPTQ, AWQ and compressed-tensors (W4A16) weights"
        )),
    };
    Some(scheme.map_err(|why| format!("{}: {why}", f.path.display())))
}

/// The group of a GPTQ or AWQ checkpoint of 4-bit weights (`bits`, AWQ's `w_bit`; `group_size`,
/// AWQ's `q_group_size`; -1 for one group of all of k), else why its GEMMs are not int4 ones:
/// another bit width, or GPTQ's act-order (`desc_act`), whose groups gather values of k out
/// of order through `g_idx`.
fn int4_group(method: &str, q: &Map<String, Value>) -> Result<Quant, String> {
    let int = |keys: &[&str]| keys.iter().find_map(|k| q.get(*k).and_then(Value::as_i64));
    let bits = int(&["bits", "w_bit"]).unwrap_or(4);
    if bits != 4 {
        return Err(format!(
            "its weights are {bits}-bit {method} (quantization_config.bits), and kerntune's quantized-weight GEMMs take 4-bit ones (W4A16)"
        ));
    }
    if q.get("desc_act") == Some(&Value::Bool(true)) {
        return Err(format!(
            "its {method} weights use act-order (quantization_config.desc_act = true): each group gathers values of k through g_idx, and kerntune's int4 GEMMs take groups of consecutive values"
        ));
    }
    match int(&["group_size", "q_group_size"]).unwrap_or(128) {
        -1 => Ok(Quant::Int4(0)),
        g if g > 0 && g % 8 == 0 => Ok(Quant::Int4(g as usize)),
        g => Err(format!(
            "its {method} weights are grouped by {g} values of k (quantization_config.group_size), and kerntune's int4 GEMMs take groups of a multiple of 8 (or -1, one group)"
        )),
    }
}

/// The edge of a `weight_block_size` of square blocks that the block-scaled GEMMs take
/// ([`kerntune_kernels::GemmProblem::with_block`]: a multiple of 32), else why not.
fn square_block(block: &Value) -> Result<usize, String> {
    let edges: Option<Vec<u64>> = block
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect());
    match edges.as_deref() {
        Some(&[n, k]) if n == k && n > 0 && n % 32 == 0 && n <= 4096 => Ok(n as usize),
        _ => Err(format!(
            "its FP8 weights are scaled per block of quantization_config.weight_block_size = {block}, and kerntune's block-scaled fp8 GEMMs take square blocks of a multiple of 32 (DeepSeek-V3's [128, 128])"
        )),
    }
}

/// The fp8 format of a `compressed-tensors` config whose every group quantizes weights and
/// input activations to 8-bit floats, weights per tensor or channel (the FP8 checkpoints of
/// llm-compressor: `FP8`, `FP8_DYNAMIC`), or the group of one whose every group quantizes
/// weights alone to 4-bit integers per group or channel (`W4A16`, packed), else why its GEMMs
/// are other ones.
fn compressed_tensors(q: &Map<String, Value>) -> Result<Quant, String> {
    let groups = q
        .get("config_groups")
        .and_then(Value::as_object)
        .filter(|g| !g.is_empty())
        .ok_or(
            "its weights are quantized by compressed-tensors, and its config_groups are missing",
        )?;
    let mut found = None;
    for (name, group) in groups {
        let int4 = group
            .get("weights")
            .filter(|w| {
                w.get("num_bits").and_then(Value::as_u64) == Some(4)
                    && w.get("type").and_then(Value::as_str) == Some("int")
            })
            .filter(|_| group.get("input_activations").is_none_or(Value::is_null));
        if let Some(w) = int4 {
            let size = w.get("group_size").and_then(Value::as_i64);
            let scheme = match (w.get("strategy").and_then(Value::as_str), size) {
                (Some("channel"), _) => Quant::Int4(0),
                (Some("group"), Some(g)) if g > 0 && g % 8 == 0 => Quant::Int4(g as usize),
                (strategy, _) => {
                    return Err(format!(
                        "its 4-bit weights are quantized per {} (compressed-tensors config_groups.{name}.weights: strategy, group_size {}), and kerntune's int4 GEMMs take groups of a multiple of 8 values of k, or channels",
                        strategy.unwrap_or("tensor"),
                        size.map_or("none".into(), |g| g.to_string())
                    ))
                }
            };
            if w.get("actorder")
                .is_some_and(|a| !a.is_null() && a != &Value::Bool(false))
            {
                return Err(format!(
                    "its 4-bit weights use act-order (compressed-tensors config_groups.{name}.weights.actorder): each group gathers values of k out of order, and kerntune's int4 GEMMs take groups of consecutive values"
                ));
            }
            if found.is_some_and(|f| f != scheme) {
                return Err("its compressed-tensors config_groups quantize layers differently, and kerntune derives one scheme for every projection".into());
            }
            found = Some(scheme);
            continue;
        }
        let fp8 = |role: &str| {
            let args = group.get(role).filter(|a| !a.is_null())?;
            let bits = args.get("num_bits").and_then(Value::as_u64);
            let kind = args.get("type").and_then(Value::as_str);
            (bits == Some(8) && kind == Some("float")).then_some(args)
        };
        let scheme = |role: &str| {
            group
                .get(role)
                .filter(|a| !a.is_null())
                .map(|a| {
                    format!(
                        "{}-bit {}",
                        a.get("num_bits").unwrap_or(&Value::Null),
                        a.get("type").and_then(Value::as_str).unwrap_or("int")
                    )
                })
                .unwrap_or_else(|| "unquantized".into())
        };
        let (Some(weights), Some(_)) = (fp8("weights"), fp8("input_activations")) else {
            return Err(format!(
                "its weights are quantized by compressed-tensors (config_groups.{name}: {} weights, {} activations), and kerntune's GEMMs take f32, f16, bf16 or fp8 weights with fp8 activations (W8A8), or 4-bit integer weights under unquantized activations (W4A16)",
                scheme("weights"),
                scheme("input_activations")
            ));
        };
        match weights.get("strategy").and_then(Value::as_str) {
            Some("tensor" | "channel") | None => {}
            Some(other) => {
                return Err(format!(
                    "its FP8 weights are scaled per {other} (compressed-tensors config_groups.{name}.weights.strategy), and kerntune's fp8 GEMMs take scales per tensor, token or channel"
                ))
            }
        }
        if found.is_some_and(|f| f != Quant::Fp8(Fp8::E4m3, None)) {
            return Err("its compressed-tensors config_groups quantize layers differently, and kerntune derives one scheme for every projection".into());
        }
        found = Some(Quant::Fp8(Fp8::E4m3, None));
    }
    Ok(found.unwrap_or(Quant::Fp8(Fp8::E4m3, None)))
}

/// Decoder families whose MLP is one up projection, an activation and a down projection,
/// without the gate Llama's SwiGLU fuses into its up projection.
const UNGATED_MLP: [&str; 15] = [
    "phi",
    "apertus",
    "arcee",
    "gpt_neox",
    "starcoder2",
    "nemotron",
    "nemotron_h",
    "persimmon",
    "gpt2",
    "gptj",
    "gpt_bigcode",
    "falcon",
    "bloom",
    "mpt",
    "opt",
];

/// Families whose attention vLLM runs with ALiBi position biases whatever the config says:
/// Bloom's only position encoding, and MPT's (vLLM's MPTAttention asserts `alibi`).
const ALIBI_FAMILIES: [&str; 2] = ["bloom", "mpt"];

/// Encoder families that carry a decoder's fields (BERT-style embedding and reranking
/// models): bidirectional attention, no KV cache, an ungated MLP.
const ENCODERS: [&str; 10] = [
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "camembert",
    "electra",
    "deberta-v2",
    "mpnet",
    "nomic_bert",
    "modernbert",
];

fn model_type<'a>(top: &'a Fields<'_>, f: &'a Fields<'_>) -> Option<&'a str> {
    top.str("model_type").or_else(|| f.str("model_type"))
}

/// Why the config is not a decoder-only model's, where it says so.
fn encoder(top: &Fields<'_>, f: &Fields<'_>) -> Option<String> {
    if top.map.get("is_encoder_decoder") == Some(&Value::Bool(true)) {
        return Some(
            "an encoder-decoder model (is_encoder_decoder = true, as T5, BART and Whisper)".into(),
        );
    }
    let kind = model_type(top, f)?;
    ENCODERS.contains(&kind).then(|| {
        format!(
            "an encoder (model_type {kind}), whose attention looks both ways and keeps no KV cache"
        )
    })
}

/// Why the model's attention adds ALiBi's position biases to its logits, where it does:
/// Bloom and MPT; Falcon's `alibi` switch (Falcon-RW); Baichuan 13B, which vLLM tells from
/// the 7B (rotary) by its hidden size.
fn alibi(f: &Fields<'_>, top: &Fields<'_>) -> Option<String> {
    let family = model_type(top, f).unwrap_or_default();
    let baichuan_13b = family == "baichuan" && f.int("hidden_size").ok().flatten() != Some(4096);
    if ALIBI_FAMILIES.contains(&family) {
        Some(format!("model_type {family}"))
    } else if baichuan_13b {
        Some("model_type baichuan at a hidden_size other than 4096: Baichuan 13B".into())
    } else {
        (f.map.get("alibi") == Some(&Value::Bool(true))).then(|| "alibi = true".into())
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
