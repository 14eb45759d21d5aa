//! Tencent's Hunyuan (`hunyuan_v1_moe`, `hunyuan_v1_dense`; Hunyuan-A13B and Hunyuan-Large),
//! whose config gives its experts per layer and under names of its own, read as vLLM's
//! `hunyuan_v1.py` reads them: `moe_topk`, `moe_intermediate_size` and `num_shared_expert`
//! may be a list with a value for each layer; the shared MLP, where `use_mixed_mlp_moe` is
//! set, is `intermediate_size` times `num_shared_expert` wide; a model of one expert runs a
//! dense MLP; `attention_head_dim` is the head size where `head_dim` is not given.

use serde_json::{Map, Value};

/// The per-layer fields kerntune reads as one value for every layer.
const PER_LAYER: [&str; 4] = [
    "num_experts",
    "moe_topk",
    "moe_intermediate_size",
    "num_shared_expert",
];

/// Hunyuan's `config` under the names the rest of the reading takes; an error names a field
/// whose layers differ, which one derived shape per GEMM cannot describe.
pub fn hunyuan_fields(config: &Map<String, Value>) -> Result<Map<String, Value>, String> {
    let mut out = config.clone();
    for key in PER_LAYER {
        if let Some(Value::Array(values)) = config.get(key) {
            match values.first() {
                Some(first) if values.iter().all(|v| v == first) => {
                    out.insert(key.into(), first.clone());
                }
                _ => {
                    return Err(format!(
                        "`{key}` differs between layers ({}): kerntune derives one shape for each of a model's expert GEMMs, the same in every layer; tune the layers' shapes as explicit problems (--shapes gemm:m=...,n=...,k=...)",
                        Value::Array(values.clone())
                    ))
                }
            }
        }
    }
    let int = |out: &Map<String, Value>, key: &str| out.get(key).and_then(Value::as_u64);
    let shared = out.remove("num_shared_expert");
    if int(&out, "num_experts").unwrap_or(0) <= 1 {
        // vLLM's `_is_moe`: one expert is the dense HunYuanMLP of `intermediate_size`.
        for key in ["num_experts", "moe_topk", "moe_intermediate_size"] {
            out.remove(key);
        }
    } else {
        if let Some(top_k) = out.remove("moe_topk") {
            out.entry("num_experts_per_tok").or_insert(top_k);
        }
        let mixed = match config.get("use_mixed_mlp_moe") {
            Some(Value::Bool(b)) => *b,
            Some(v) => v.as_f64().is_some_and(|x| x > 0.0),
            None => false,
        };
        let count = shared.as_ref().and_then(Value::as_u64);
        match (mixed, count, int(&out, "intermediate_size")) {
            (true, Some(n), Some(width)) => {
                out.insert("shared_expert_intermediate_size".into(), (n * width).into());
            }
            (true, Some(_), None) | (true, None, _) => {
                return Err(
                    "use_mixed_mlp_moe runs a shared MLP beside the experts, intermediate_size × num_shared_expert wide, which needs both as integers"
                        .into(),
                )
            }
            (false, _, _) => {}
        }
    }
    let head_dim_given = int(&out, "head_dim").is_some_and(|d| d > 0);
    if let (false, Some(d)) = (head_dim_given, config.get("attention_head_dim")) {
        out.insert("head_dim".into(), d.clone());
    }
    Ok(out)
}

/// Why the GEMMs are not derived where Hunyuan shares keys and values across layers
/// (`use_cla`, Hunyuan-Large): all but the first of every `cla_share_factor` layers project
/// only their queries (a `q_proj` of `hidden_size` outputs) and attend over the first's keys
/// and values (vLLM's `HunYuanCrossAttention`). Their attention has the shapes of the others'.
pub fn cross_layer_attention(config: &Map<String, Value>) -> Option<String> {
    let on = config.get("use_cla").and_then(Value::as_bool) == Some(true);
    let factor = config.get("cla_share_factor").and_then(Value::as_u64)?;
    (on && factor > 1).then(|| {
        format!(
            "cross-layer attention (use_cla, cla_share_factor = {factor}): all but the first of every {factor} layers project only their queries and attend over the first's keys and values, a q_proj GEMM kerntune does not derive"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(json: &str) -> Result<Map<String, Value>, String> {
        hunyuan_fields(&serde_json::from_str(json).unwrap())
    }

    #[test]
    fn lists_of_one_value_are_that_value_and_the_mixed_mlp_is_the_shared_width() {
        let out = read(
            r#"{"intermediate_size": 3072, "num_experts": 64, "moe_topk": [8, 8],
            "moe_intermediate_size": [3072, 3072], "num_shared_expert": [2, 2],
            "use_mixed_mlp_moe": true, "attention_head_dim": 128}"#,
        )
        .unwrap();
        assert_eq!(out["num_experts_per_tok"], 8);
        assert_eq!(out["moe_intermediate_size"], 3072);
        assert_eq!(out["shared_expert_intermediate_size"], 6144);
        assert_eq!(out["head_dim"], 128);
        assert!(!out.contains_key("moe_topk") && !out.contains_key("num_shared_expert"));
        // Without the mixed MLP, no shared one; a head_dim given wins.
        let out = read(
            r#"{"intermediate_size": 3072, "num_experts": 64, "moe_topk": 8,
            "num_shared_expert": 1, "use_mixed_mlp_moe": false, "head_dim": 64,
            "attention_head_dim": 128}"#,
        )
        .unwrap();
        assert!(!out.contains_key("shared_expert_intermediate_size"));
        assert_eq!(out["head_dim"], 64);
    }

    #[test]
    fn one_expert_is_dense_and_layers_that_differ_are_named() {
        let out = read(
            r#"{"intermediate_size": 3072, "num_experts": 1, "moe_topk": 1,
            "moe_intermediate_size": 3072, "num_shared_expert": 1, "use_mixed_mlp_moe": true}"#,
        )
        .unwrap();
        for key in [
            "num_experts",
            "moe_topk",
            "moe_intermediate_size",
            "num_shared_expert",
        ] {
            assert!(!out.contains_key(key), "{key}");
        }
        let err = read(r#"{"num_experts": 64, "moe_topk": [8, 4]}"#).unwrap_err();
        assert!(
            err.contains("`moe_topk` differs between layers ([8,4])"),
            "{err}"
        );
        let err = read(
            r#"{"num_experts": 64, "moe_topk": 8, "use_mixed_mlp_moe": 1, "intermediate_size": 8}"#,
        )
        .unwrap_err();
        assert!(err.contains("num_shared_expert"), "{err}");
        let err = read(
            r#"{"num_experts": 64, "moe_topk": 8, "use_mixed_mlp_moe": 1,
            "num_shared_expert": 1, "intermediate_size": [8, 16]}"#,
        )
        .unwrap_err();
        assert!(
            err.contains("intermediate_size × num_shared_expert"),
            "{err}"
        );
    }

    #[test]
    fn cross_layer_attention_is_named_where_layers_share_keys() {
        let config = |json: &str| serde_json::from_str::<Map<String, Value>>(json).unwrap();
        let why = cross_layer_attention(&config(r#"{"use_cla": true, "cla_share_factor": 2}"#));
        assert!(why.unwrap().contains("cla_share_factor = 2"));
        for off in [
            r#"{"use_cla": false, "cla_share_factor": 2}"#,
            r#"{"use_cla": true, "cla_share_factor": 1}"#,
            r#"{"use_cla": true}"#,
        ] {
            assert_eq!(cross_layer_attention(&config(off)), None, "{off}");
        }
    }
}
