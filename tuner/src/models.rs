//! Model descriptions: presets and Hugging Face `config.json` files.

use std::path::Path;

use serde_json::Value;

use crate::error::{usage, Result};
use kerntune_kernels::DType;

/// The dimensions of a decoder-only transformer that decide its kernel shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub name: String,
    pub hidden: usize,
    pub intermediate: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub layers: usize,
    pub vocab: usize,
    /// Mixture of experts: (experts, active per token).
    pub experts: Option<(usize, usize)>,
    pub dtype: DType,
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
            dtype: DType::Bf16,
        };
        Some(match name.to_ascii_lowercase().as_str() {
            "llama70b" | "llama3-70b" | "llama-3.1-70b" => {
                m("llama70b", 8192, 28672, 64, 8, 80, 128256, None)
            }
            "llama2-70b" => m("llama2-70b", 8192, 28672, 64, 8, 80, 32000, None),
            "llama8b" | "llama3-8b" | "llama-3.1-8b" => {
                m("llama8b", 4096, 14336, 32, 8, 32, 128256, None)
            }
            "mistral7b" => m("mistral7b", 4096, 14336, 32, 8, 32, 32000, None),
            "mixtral8x7b" => m("mixtral8x7b", 4096, 14336, 32, 8, 32, 32000, Some((8, 2))),
            _ => return None,
        })
    }

    /// Reads a Hugging Face `config.json`; missing or contradictory fields are named.
    pub fn from_config_json(path: &Path) -> Result<Model> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage(format!("cannot read model config {}: {e}", path.display())))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| usage(format!("{} is not valid JSON: {e}", path.display())))?;
        let int = |key: &str| -> Result<Option<usize>> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .filter(|&n| n > 0)
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| {
                        usage(format!(
                            "{}: field `{key}` must be a positive integer, found {x}",
                            path.display()
                        ))
                    }),
            }
        };
        let required = [
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_hidden_layers",
            "vocab_size",
        ];
        let missing: Vec<&str> = required
            .iter()
            .copied()
            .filter(|k| v.get(*k).is_none_or(Value::is_null))
            .collect();
        if !missing.is_empty() {
            return Err(usage(format!(
                "{}: missing required field(s) {}; a decoder-only config.json needs {}",
                path.display(),
                missing.join(", "),
                required.join(", ")
            )));
        }
        let hidden = int("hidden_size")?.unwrap();
        let q_heads = int("num_attention_heads")?.unwrap();
        let kv_heads = int("num_key_value_heads")?.unwrap_or(q_heads);
        if q_heads % kv_heads != 0 {
            return Err(usage(format!(
                "{}: num_attention_heads = {q_heads} is not a multiple of num_key_value_heads = {kv_heads}",
                path.display()
            )));
        }
        let head_dim = match int("head_dim")? {
            Some(d) => d,
            None if hidden % q_heads == 0 => hidden / q_heads,
            None => {
                return Err(usage(format!(
                    "{}: no head_dim, and hidden_size = {hidden} is not a multiple of num_attention_heads = {q_heads}",
                    path.display()
                )))
            }
        };
        let experts = match (int("num_local_experts")?, int("num_experts_per_tok")?) {
            (Some(e), Some(a)) if a <= e => Some((e, a)),
            (Some(e), Some(a)) => {
                return Err(usage(format!(
                    "{}: num_experts_per_tok = {a} exceeds num_local_experts = {e}",
                    path.display()
                )))
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(usage(format!(
                    "{}: a mixture of experts needs both num_local_experts and num_experts_per_tok",
                    path.display()
                )))
            }
            (None, None) => None,
        };
        let dtype = match v.get("torch_dtype").and_then(Value::as_str) {
            Some("float32") => DType::F32,
            Some("float16") => DType::F16,
            _ => DType::Bf16,
        };
        let name = v
            .get("_name_or_path")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| path.display().to_string());
        Ok(Model {
            name,
            hidden,
            intermediate: int("intermediate_size")?.unwrap(),
            q_heads,
            kv_heads,
            head_dim,
            layers: int("num_hidden_layers")?.unwrap(),
            vocab: int("vocab_size")?.unwrap(),
            experts,
            dtype,
        })
    }

    /// Weight bytes of the whole model at its dtype.
    pub fn weight_bytes(&self) -> f64 {
        let attn = self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim
            + self.q_heads * self.head_dim * self.hidden;
        let mlp = 3 * self.hidden * self.intermediate * self.experts.map_or(1, |e| e.0);
        let per_layer = (attn + mlp) as f64;
        (per_layer * self.layers as f64 + 2.0 * (self.vocab * self.hidden) as f64)
            * self.dtype.size() as f64
    }
}
