//! Decoder families whose config.json names a Llama's fields its own way: GPT-2, GPT-J and
//! GPTBigCode (StarCoder, SantaCoder) with `n_embd`, `n_head`, `n_layer`, `n_inner`; Falcon with
//! `ffn_hidden_size`, `num_kv_heads` and its multi-query switch. Their fields are copied under
//! the Llama names, as vLLM's models for them read them, so the rest of the reading is one.
//! All four run one up projection without a gate (`UNGATED_MLP` in `config_json.rs`).

use serde_json::{Map, Value};

/// `config` with the Llama-named fields its family leaves out filled in from its own, or
/// `None` where the family names them as Llama does (or is not one of these).
pub fn llama_names(
    model_type: Option<&str>,
    config: &Map<String, Value>,
) -> Option<Map<String, Value>> {
    let renames: &[(&str, &str)] = match model_type? {
        "gpt2" | "gptj" | "gpt_bigcode" => &[
            ("hidden_size", "n_embd"),
            ("num_attention_heads", "n_head"),
            ("num_hidden_layers", "n_layer"),
            ("intermediate_size", "n_inner"),
        ],
        // Falcon's first configs (RW) named its layers and heads GPT-style.
        "falcon" => &[
            ("num_attention_heads", "n_head"),
            ("num_hidden_layers", "n_layer"),
            ("intermediate_size", "ffn_hidden_size"),
        ],
        _ => return None,
    };
    let mut out = config.clone();
    let given = |key: &str| config.get(key).is_some_and(|v| !v.is_null());
    for (llama, own) in renames {
        if !given(llama) && given(own) {
            out.insert(llama.to_string(), config[*own].clone());
        }
    }
    // Unset widths are four times the hidden size (transformers' and vLLM's default).
    if !given("intermediate_size") {
        if let Some(hidden) = out.get("hidden_size").and_then(Value::as_u64) {
            out.insert("intermediate_size".into(), Value::from(4 * hidden));
        }
    }
    if !given("num_key_value_heads") {
        let heads = out.get("num_attention_heads").cloned();
        let flag =
            |key: &str, default: bool| config.get(key).and_then(Value::as_bool).unwrap_or(default);
        let kv_heads = match model_type? {
            // Multi-query attention is on unless switched off (GPTBigCodeConfig, FalconConfig).
            "gpt_bigcode" if flag("multi_query", true) => Some(Value::from(1)),
            "falcon" if flag("new_decoder_architecture", false) => config
                .get("num_kv_heads")
                .filter(|v| !v.is_null())
                .cloned()
                .or(heads),
            "falcon" if flag("multi_query", true) => Some(Value::from(1)),
            _ => heads,
        };
        if let Some(kv) = kv_heads {
            out.insert("num_key_value_heads".into(), kv);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn renamed(model_type: &str, json: &str) -> Map<String, Value> {
        llama_names(Some(model_type), &serde_json::from_str(json).unwrap()).unwrap()
    }

    #[test]
    fn kv_heads_follow_each_familys_switches() {
        let kv = |m: &Map<String, Value>| m["num_key_value_heads"].as_u64().unwrap();
        let falcon = r#"{"hidden_size": 4544, "num_attention_heads": 71}"#;
        assert_eq!(kv(&renamed("falcon", falcon)), 1);
        let mha = r#"{"hidden_size": 4544, "num_attention_heads": 71, "multi_query": false}"#;
        assert_eq!(kv(&renamed("falcon", mha)), 71);
        let new = r#"{"hidden_size": 8192, "num_attention_heads": 128,
            "new_decoder_architecture": true, "num_kv_heads": 8}"#;
        assert_eq!(kv(&renamed("falcon", new)), 8);
        let bigcode = r#"{"n_embd": 6144, "n_head": 48}"#;
        assert_eq!(kv(&renamed("gpt_bigcode", bigcode)), 1);
        assert_eq!(kv(&renamed("gpt2", bigcode)), 48);
        // n_inner null: four times the width.
        let gpt2 = renamed("gpt2", r#"{"n_embd": 768, "n_inner": null}"#);
        assert_eq!(gpt2["intermediate_size"], 3072);
        assert_eq!(llama_names(Some("llama"), &Map::new()), None);
    }
}
