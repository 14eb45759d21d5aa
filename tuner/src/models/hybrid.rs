//! Hybrid decoders: configs whose layers are not all attention followed by an MLP (Mamba or
//! other state-space mixers, linear attention, short convolutions), and the field that says
//! so. kerntune derives the GEMMs of attention and MLP layers, and of the Mamba hybrids in
//! `mamba.rs` and Qwen's delta-net hybrids in `delta_net.rs`; other hybrids' layers run projections it does not derive, and their MLP may
//! not be the one it assumes, so their GEMMs are refused rather than guessed. Their attention
//! layers are plain softmax attention and keep their problems.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// The lists that name each layer's kind: transformers' `layer_types` (Qwen3-Next, Granite
/// 4.0-H, LFM2, and attention-only ones such as Gemma 3's), Zamba2's and Nemotron's
/// `layers_block_type`, RecurrentGemma's `block_types`.
const KIND_LISTS: [&str; 3] = ["layer_types", "layers_block_type", "block_types"];

/// Fields that schedule other layers between the attention layers: Jamba's period, Bamba's
/// indices, Qwen3-Next's interval, MiniMax's per-layer switch, Kimi Linear's config.
const SCHEDULES: [&str; 5] = [
    "attn_layer_period",
    "attn_layer_indices",
    "full_attention_interval",
    "attn_type_list",
    "linear_attn_config",
];

/// Fields of a state-space mixer, in models that list no layer kinds (Mamba, Mamba 2,
/// Falcon-H1's parallel mixers).
fn is_state_space_field(key: &str) -> bool {
    key.starts_with("mamba_")
        || key.starts_with("ssm_")
        || matches!(key, "state_size" | "d_state" | "time_step_rank")
}

/// A layer kind that is softmax attention (`full_attention`, `sliding_attention`,
/// `chunked_attention`, `attention`), as opposed to `linear_attention`, `mamba`, `conv`, ...
fn is_attention(kind: &str) -> bool {
    kind == "attention" || (kind.ends_with("_attention") && kind != "linear_attention")
}

/// What in `config` says that some layers are neither attention nor MLP, or `None` for a
/// plain decoder.
pub fn other_layers(config: &Map<String, Value>) -> Option<String> {
    for key in KIND_LISTS {
        let Some(Value::Array(kinds)) = config.get(key) else {
            continue;
        };
        let mut others: BTreeMap<&str, usize> = BTreeMap::new();
        for kind in kinds.iter().filter_map(Value::as_str) {
            if !is_attention(kind) {
                *others.entry(kind).or_default() += 1;
            }
        }
        if others.is_empty() {
            // An explicit list of attention layers only: a plain decoder, whatever other
            // fields its family carries.
            return None;
        }
        let counts: Vec<String> = others
            .iter()
            .map(|(kind, n)| format!("{n} \"{kind}\""))
            .collect();
        return Some(format!(
            "`{key}` lists {} of its {} layers",
            counts.join(", "),
            kinds.len()
        ));
    }
    if let Some(pattern) = config
        .get("hybrid_override_pattern")
        .and_then(Value::as_str)
    {
        return Some(format!(
            "`hybrid_override_pattern` = \"{pattern}\" mixes Mamba (M), attention (*), MLP (-) and expert (E) layers"
        ));
    }
    if let Some(Value::Array(kinds)) = config.get("attn_type_list") {
        // MiniMax's switch: 0 is a lightning (linear) attention layer, 1 softmax attention
        // (vLLM's MiniMaxText01); MiniMax-M2 writes every layer 1.
        let linear = kinds.iter().filter(|k| k.as_u64() != Some(1)).count();
        return (linear > 0).then(|| {
            format!(
                "`attn_type_list` makes {linear} of its {} layers lightning (linear) attention",
                kinds.len()
            )
        });
    }
    if let Some(key) = SCHEDULES.into_iter().find(|k| config.contains_key(*k)) {
        return Some(format!("`{key}` interleaves other layers with attention"));
    }
    let mut state = config.keys().filter(|k| is_state_space_field(k));
    state
        .next()
        .map(|key| format!("`{key}` describes a state-space mixer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn attention_only_layer_lists_are_plain() {
        for config in [
            r#"{"layer_types": ["sliding_attention", "full_attention"]}"#,
            r#"{"layer_types": ["chunked_attention", "full_attention"]}"#,
            r#"{"hidden_size": 4096, "sliding_window": 4096}"#,
            // MiniMax-M2: softmax attention in every layer.
            r#"{"attn_type_list": [1, 1, 1]}"#,
        ] {
            assert_eq!(other_layers(&map(config)), None, "{config}");
        }
    }

    #[test]
    fn other_layers_are_named_with_the_field_that_says_so() {
        let cases = [
            (
                r#"{"layer_types": ["mamba", "mamba", "attention", "mamba"]}"#,
                "`layer_types` lists 3 \"mamba\" of its 4 layers",
            ),
            (
                r#"{"layer_types": ["conv", "full_attention", "linear_attention"]}"#,
                "1 \"conv\", 1 \"linear_attention\" of its 3 layers",
            ),
            (
                r#"{"layers_block_type": ["mamba", "hybrid"]}"#,
                "`layers_block_type` lists 1 \"hybrid\", 1 \"mamba\"",
            ),
            (
                r#"{"hybrid_override_pattern": "M-M*-"}"#,
                "\"M-M*-\" mixes Mamba (M)",
            ),
            (
                r#"{"full_attention_interval": 4, "linear_num_key_heads": 16}"#,
                "`full_attention_interval` interleaves",
            ),
            (
                r#"{"attn_type_list": [0, 0, 0, 1]}"#,
                "makes 3 of its 4 layers lightning",
            ),
            (
                r#"{"attn_layer_period": 8, "mamba_d_state": 16}"#,
                "`attn_layer_period`",
            ),
            (
                r#"{"state_size": 16, "expand": 2}"#,
                "`state_size` describes",
            ),
        ];
        for (config, needle) in cases {
            let why = other_layers(&map(config)).unwrap_or_default();
            assert!(why.contains(needle), "{config}: {why}");
        }
    }
}
