//! Decoder families whose config.json names a Llama's fields its own way, copied under the
//! Llama names as vLLM's model for each family reads them, so the rest of the reading is one:
//! GPT-2, GPT-J and GPTBigCode (StarCoder, SantaCoder) with `n_embd`, `n_head`, `n_layer`,
//! `n_inner`; Falcon with `ffn_hidden_size`, `num_kv_heads` and its multi-query switch; Bloom;
//! MPT and DBRX with `d_model`, `n_heads`, `n_layers` and their nested `attn_config` (and
//! DBRX's experts in `ffn_config`); ChatGLM and GLM-4 (`model_type chatglm`) with
//! `num_layers`, `ffn_hidden_size`, `multi_query_group_num` and `padded_vocab_size`; OPT's
//! `ffn_dim`; EXAONE's `num_layers`; ERNIE 4.5's experts (`moe_num_experts`, `moe_k`,
//! `moe_num_shared_experts`). Which of them run an ungated MLP is `UNGATED_MLP` in
//! `config_json.rs`, which run ALiBi attention `ALIBI_FAMILIES` there.

use serde_json::{Map, Value};

/// `config` with the Llama-named fields its family leaves out filled in from its own (a
/// dotted name reads a nested object: `attn_config.kv_n_heads`), or `None` where the family
/// names them as Llama does (or is not one of these).
pub fn llama_names(
    model_type: Option<&str>,
    config: &Map<String, Value>,
) -> Option<Map<String, Value>> {
    let family = model_type?;
    let renames: &[(&str, &str)] = match family {
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
        // Bloom's first configs wrote `n_embed`.
        "bloom" => &[
            ("hidden_size", "n_embed"),
            ("num_attention_heads", "n_head"),
            ("num_hidden_layers", "n_layer"),
        ],
        "mpt" => &[
            ("hidden_size", "d_model"),
            ("num_attention_heads", "n_heads"),
            ("num_hidden_layers", "n_layers"),
            ("num_key_value_heads", "attn_config.kv_n_heads"),
        ],
        // Every DBRX layer is a mixture of GLU experts of `ffn_hidden_size`.
        "dbrx" => &[
            ("hidden_size", "d_model"),
            ("num_attention_heads", "n_heads"),
            ("num_hidden_layers", "n_layers"),
            ("num_key_value_heads", "attn_config.kv_n_heads"),
            ("num_local_experts", "ffn_config.moe_num_experts"),
            ("num_experts_per_tok", "ffn_config.moe_top_k"),
            ("moe_intermediate_size", "ffn_config.ffn_hidden_size"),
        ],
        "chatglm" => &[
            ("num_hidden_layers", "num_layers"),
            ("intermediate_size", "ffn_hidden_size"),
        ],
        "opt" => &[("intermediate_size", "ffn_dim")],
        "exaone" => &[("num_hidden_layers", "num_layers")],
        // ERNIE 4.5's experts; its MoE layer schedule (`moe_layer_start_index`, `_end_index`,
        // `_interval`) is read where the experts are.
        "ernie4_5_moe" => &[
            ("num_local_experts", "moe_num_experts"),
            ("num_experts_per_tok", "moe_k"),
            ("n_shared_experts", "moe_num_shared_experts"),
        ],
        _ => return None,
    };
    let mut out = config.clone();
    let given = |key: &str| nested(config, key).is_some_and(|v| !v.is_null());
    for (llama, own) in renames {
        if !given(llama) && given(own) {
            out.insert(llama.to_string(), nested(config, own).unwrap().clone());
            // Read under its Llama name only: the checks for fields not read (experts under
            // other names) look at what is left.
            out.remove(*own);
        }
    }
    // ChatGLM's embedding and head are `padded_vocab_size` rows (vLLM's ChatGLMModel), which
    // a `vocab_size` beside it does not change.
    if family == "chatglm" && given("padded_vocab_size") {
        out.insert("vocab_size".into(), config["padded_vocab_size"].clone());
    }
    // Unset widths are four times the hidden size (transformers' and vLLM's default), MPT's
    // `expansion_ratio` times.
    // What the renames filled counts as given from here on.
    let filled = |out: &Map<String, Value>, key: &str| out.get(key).is_some_and(|v| !v.is_null());
    let four_times = matches!(family, "gpt2" | "gptj" | "gpt_bigcode" | "falcon" | "bloom");
    if !filled(&out, "intermediate_size") && (four_times || family == "mpt") {
        let ratio = match family {
            "mpt" => config
                .get("expansion_ratio")
                .and_then(Value::as_u64)
                .unwrap_or(4),
            _ => 4,
        };
        if let Some(hidden) = out.get("hidden_size").and_then(Value::as_u64) {
            out.insert("intermediate_size".into(), Value::from(ratio * hidden));
        }
    }
    if !filled(&out, "num_key_value_heads") {
        let heads = out.get("num_attention_heads").cloned();
        let flag =
            |key: &str, default: bool| config.get(key).and_then(Value::as_bool).unwrap_or(default);
        let kv_heads = match family {
            // Multi-query attention is on unless switched off (GPTBigCodeConfig, FalconConfig).
            "gpt_bigcode" if flag("multi_query", true) => Some(Value::from(1)),
            "falcon" if flag("new_decoder_architecture", false) => config
                .get("num_kv_heads")
                .filter(|v| !v.is_null())
                .cloned()
                .or(heads),
            "falcon" if flag("multi_query", true) => Some(Value::from(1)),
            "chatglm" if flag("multi_query_attention", false) => config
                .get("multi_query_group_num")
                .filter(|v| !v.is_null())
                .cloned()
                .or(Some(Value::from(1))),
            // DbrxAttentionConfig's default.
            "dbrx" => Some(Value::from(1)),
            _ => heads,
        };
        if let Some(kv) = kv_heads {
            out.insert("num_key_value_heads".into(), kv);
        }
    }
    Some(out)
}

/// The value at a dotted path of nested objects.
fn nested<'a>(config: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut keys = path.split('.');
    let first = config.get(keys.next()?)?;
    keys.try_fold(first, |value, key| value.as_object()?.get(key))
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
        // MPT's in its attn_config; DBRX's default is one; ChatGLM's group count when
        // multi-query, else every head.
        let mpt = r#"{"d_model": 7168, "n_heads": 64, "attn_config": {"kv_n_heads": 8}}"#;
        assert_eq!(kv(&renamed("mpt", mpt)), 8);
        assert_eq!(
            kv(&renamed("mpt", r#"{"n_heads": 32, "attn_config": {}}"#)),
            32
        );
        assert_eq!(
            kv(&renamed("dbrx", r#"{"n_heads": 48, "attn_config": {}}"#)),
            1
        );
        let glm = r#"{"num_attention_heads": 32, "multi_query_attention": true,
            "multi_query_group_num": 2}"#;
        assert_eq!(kv(&renamed("chatglm", glm)), 2);
        let glm_mha = r#"{"num_attention_heads": 32, "multi_query_group_num": 2}"#;
        assert_eq!(kv(&renamed("chatglm", glm_mha)), 32);
    }

    #[test]
    fn a_familys_own_width_is_kept_and_only_a_missing_one_defaults() {
        let width = |m: &Map<String, Value>| m["intermediate_size"].as_u64().unwrap();
        assert_eq!(
            width(&renamed("gpt2", r#"{"n_embd": 768, "n_inner": 1000}"#)),
            1000
        );
        let falcon = r#"{"hidden_size": 4544, "ffn_hidden_size": 5000}"#;
        assert_eq!(width(&renamed("falcon", falcon)), 5000);
        assert_eq!(width(&renamed("bloom", r#"{"n_embed": 1024}"#)), 4096);
        let mpt = r#"{"d_model": 1024, "expansion_ratio": 3}"#;
        assert_eq!(width(&renamed("mpt", mpt)), 3072);
        // ChatGLM's is its own field, never a multiple of the width.
        let glm = renamed("chatglm", r#"{"hidden_size": 4096, "num_layers": 40}"#);
        assert!(!glm.contains_key("intermediate_size"));
        assert_eq!(glm["num_hidden_layers"], 40);
    }

    #[test]
    fn dbrx_experts_and_chatglm_vocabulary_come_from_their_own_fields() {
        let dbrx = renamed(
            "dbrx",
            r#"{"d_model": 6144, "n_heads": 48, "n_layers": 40,
            "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4}}"#,
        );
        assert_eq!(dbrx["num_local_experts"], 16);
        assert_eq!(dbrx["num_experts_per_tok"], 4);
        assert_eq!(dbrx["moe_intermediate_size"], 10752);
        assert_eq!(dbrx["hidden_size"], 6144);
        // The padded vocabulary is the head's, whatever `vocab_size` says.
        let glm = renamed(
            "chatglm",
            r#"{"vocab_size": 151329, "padded_vocab_size": 151552}"#,
        );
        assert_eq!(glm["vocab_size"], 151552);
        let config: Map<String, Value> =
            serde_json::from_str(r#"{"a": {"b": {"c": 3}}, "d": 1}"#).unwrap();
        assert_eq!(nested(&config, "a.b.c"), Some(&Value::from(3)));
        assert_eq!(nested(&config, "d.e"), None);
        assert_eq!(nested(&config, "a.x"), None);
    }
}
