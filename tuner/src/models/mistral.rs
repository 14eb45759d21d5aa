//! Mistral's native `params.json` (what `vllm serve --config-format mistral` reads, and the
//! only config of some Mistral releases): its fields renamed to the Hugging Face ones as
//! vLLM's `adapt_config_dict` renames them, so the rest of the reading is one. `dim`,
//! `n_layers`, `n_heads`, `n_kv_heads` and `hidden_dim` are the hidden size, layers, heads,
//! KV heads and MLP width; `moe` holds Mixtral's experts, or, with shared experts, Mistral
//! Large 3's DeepSeek-V3-style ones; `quantization` says FP8 weights; a `sliding_window` list
//! gives each layer's window (`null`: full attention).

use serde_json::{Map, Value};

/// Whether `config` is a `params.json` rather than a Hugging Face config.
pub fn is_params_json(config: &Map<String, Value>) -> bool {
    !config.contains_key("hidden_size")
        && config.contains_key("dim")
        && config.contains_key("n_layers")
}

/// `params` with its fields under the Hugging Face names vLLM gives them.
pub fn hf_fields(params: &Map<String, Value>) -> Result<Map<String, Value>, String> {
    let mut config = params.clone();
    for (own, hf) in [
        ("dim", "hidden_size"),
        ("n_layers", "num_hidden_layers"),
        ("n_heads", "num_attention_heads"),
        ("n_kv_heads", "num_key_value_heads"),
        ("hidden_dim", "intermediate_size"),
    ] {
        if let Some(v) = config.remove(own) {
            config.insert(hf.into(), v);
        }
    }
    // One window for every layer that has one (vLLM asserts there is at most one size).
    if let Some(Value::Array(windows)) = config.get("sliding_window") {
        let sizes: Vec<&Value> = windows.iter().filter(|w| !w.is_null()).collect();
        match sizes.first() {
            Some(&first) if sizes.iter().all(|w| *w == first) => {
                let first = first.clone();
                config.insert("sliding_window".into(), first);
            }
            Some(_) => {
                return Err(format!(
                    "`sliding_window` lists windows of several sizes, {windows:?}; vLLM takes one"
                ))
            }
            None => {
                config.remove("sliding_window");
            }
        }
    }
    if let Some(q) = config.remove("quantization").filter(|q| !q.is_null()) {
        // vLLM's reading: FP8 weights under per-tensor scales, static ones for activations.
        let quantization = match q.get("qformat_weight").and_then(Value::as_str) {
            Some("fp8_e4m3") => {
                serde_json::json!({ "quant_method": "fp8", "activation_scheme": "static" })
            }
            _ => serde_json::json!({
                "quant_method": q.get("quant_method").and_then(Value::as_str).unwrap_or("unnamed")
            }),
        };
        config.insert("quantization_config".into(), quantization);
    }
    if let Some(moe) = config.remove("moe").filter(|m| !m.is_null()) {
        let moe = moe
            .as_object()
            .ok_or_else(|| format!("`moe` must be an object, found {moe}"))?;
        let shared = moe
            .get("num_shared_experts")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        // Mistral Large 3 runs as DeepSeek-V3 (vLLM's `MistralLarge3ForCausalLM`), Mixtral's
        // experts at the MLP's width.
        let names: &[(&str, &str)] = if shared > 0 {
            config.insert("model_type".into(), "deepseek_v3".into());
            &[
                ("num_experts", "n_routed_experts"),
                ("num_experts_per_tok", "num_experts_per_tok"),
                ("expert_hidden_dim", "moe_intermediate_size"),
                ("num_shared_experts", "n_shared_experts"),
                ("first_k_dense_replace", "first_k_dense_replace"),
                ("route_every_n", "moe_layer_freq"),
            ]
        } else {
            &[
                ("num_experts", "num_local_experts"),
                ("num_experts_per_tok", "num_experts_per_tok"),
            ]
        };
        for (own, hf) in names {
            if let Some(v) = moe.get(*own) {
                config.insert(hf.to_string(), v.clone());
            }
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn fields_take_their_hugging_face_names() {
        let params = map(
            r#"{"dim": 5120, "n_layers": 40, "head_dim": 128, "hidden_dim": 32768,
            "n_heads": 32, "n_kv_heads": 8, "vocab_size": 131072,
            "sliding_window": [null, 4096, null], "quantization": {"qformat_weight": "fp8_e4m3"}}"#,
        );
        assert!(is_params_json(&params));
        let hf = hf_fields(&params).unwrap();
        assert_eq!(hf["hidden_size"], 5120);
        assert_eq!(hf["num_hidden_layers"], 40);
        assert_eq!(hf["intermediate_size"], 32768);
        assert_eq!(hf["num_key_value_heads"], 8);
        assert_eq!(hf["sliding_window"], 4096);
        assert_eq!(hf["quantization_config"]["quant_method"], "fp8");
        assert!(!is_params_json(&hf));
        let all_full = hf_fields(&map(
            r#"{"dim": 1, "n_layers": 1, "sliding_window": [null]}"#,
        ));
        assert!(!all_full.unwrap().contains_key("sliding_window"));
        let two = hf_fields(&map(
            r#"{"dim": 1, "n_layers": 1, "sliding_window": [1024, 4096]}"#,
        ));
        assert!(two.unwrap_err().contains("several sizes"));
    }

    #[test]
    fn experts_are_mixtrals_or_with_shared_ones_deepseeks() {
        let mixtral = map(
            r#"{"dim": 4096, "n_layers": 32, "moe": {"num_experts": 8, "num_experts_per_tok": 2}}"#,
        );
        let hf = hf_fields(&mixtral).unwrap();
        assert_eq!(hf["num_local_experts"], 8);
        assert!(!hf.contains_key("model_type"));
        let large = map(
            r#"{"dim": 7168, "n_layers": 61, "moe": {"num_experts": 128, "num_experts_per_tok": 4,
            "expert_hidden_dim": 4096, "num_shared_experts": 1, "first_k_dense_replace": 3,
            "route_every_n": 1}}"#,
        );
        let hf = hf_fields(&large).unwrap();
        assert_eq!(hf["model_type"], "deepseek_v3");
        assert_eq!(hf["n_routed_experts"], 128);
        assert_eq!(hf["moe_intermediate_size"], 4096);
        assert_eq!(hf["first_k_dense_replace"], 3);
    }
}
