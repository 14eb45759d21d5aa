//! Llama-Nemotron's layers, each its own (`block_configs`: Llama-3.3-Nemotron-Super-49B,
//! Llama-3.1-Nemotron-Ultra-253B and Nano, `model_type nemotron-nas`, vLLM's
//! `DeciLMForCausalLM`): a neural-architecture search left each layer its own number of KV
//! heads or no attention at all, and its own MLP width or none. vLLM builds each layer as
//! Llama's attention and gated MLP at that layer's sizes, so the model runs one QKV GEMM and
//! one attention problem per distinct KV head count, and one MLP per distinct width. Gemma
//! 3n's `intermediate_size`, a list of per-layer widths (its MatFormer slices), reads the same
//! way.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// How a model's layers differ: each distinct KV head count its attention layers have and each
/// distinct width of its dense MLPs, with how many layers have it, in ascending order.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocks {
    pub attention: Vec<(usize, usize)>,
    pub mlp: Vec<(usize, usize)>,
}

/// The layers `block_configs` or a list of per-layer MLP widths describes, or `None` where
/// the config has neither. `q_heads`, `kv_heads` and `hidden` are the model's; errors name
/// the layer and field at fault.
pub fn blocks(
    config: &Map<String, Value>,
    q_heads: usize,
    kv_heads: usize,
    hidden: usize,
    layers: usize,
) -> Result<Option<Blocks>, String> {
    if let Some(Value::Array(widths)) = config.get("intermediate_size") {
        return per_layer_widths(widths, kv_heads, layers).map(Some);
    }
    let Some(list) = config.get("block_configs").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let list = list
        .as_array()
        .ok_or_else(|| format!("field `block_configs` must be a list of layers, found {list}"))?;
    if list.len() != layers {
        return Err(format!(
            "`block_configs` describes {} layers, but num_hidden_layers = {layers}",
            list.len()
        ));
    }
    let mut attention = BTreeMap::new();
    let mut mlp = BTreeMap::new();
    for (i, block) in list.iter().enumerate() {
        let part = |name: &str| -> Result<&Map<String, Value>, String> {
            block
                .get(name)
                .and_then(Value::as_object)
                .ok_or_else(|| format!("block_configs[{i}] has no `{name}` object"))
        };
        let (attn, ffn) = (part("attention")?, part("ffn")?);
        let field = |part: &Map<String, Value>,
                     name: &str,
                     key: &str|
         -> Result<Option<f64>, String> {
            match part.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v.as_f64().filter(|x| *x > 0.0).map(Some).ok_or_else(|| {
                    format!("block_configs[{i}].{name}.{key} must be a positive number, found {v}")
                }),
            }
        };
        for (name, part) in [("attention", attn), ("ffn", ffn)] {
            // transformers' DeciLM can put a linear layer in place of either; vLLM's builds
            // no such layer, so no server runs these weights as it would.
            if part.get("replace_with_linear") == Some(&Value::Bool(true)) {
                return Err(format!(
                    "block_configs[{i}].{name}.replace_with_linear: a linear layer in place of the {name}, which vLLM's DeciLM does not build and kerntune does not derive"
                ));
            }
        }
        if attn.get("no_op") != Some(&Value::Bool(true)) {
            let group = field(attn, "attention", "n_heads_in_group")?.ok_or_else(|| {
                format!("block_configs[{i}].attention needs n_heads_in_group (or no_op: true)")
            })? as usize;
            if group == 0 || !q_heads.is_multiple_of(group) {
                return Err(format!(
                    "block_configs[{i}].attention.n_heads_in_group = {group} does not divide num_attention_heads = {q_heads}"
                ));
            }
            *attention.entry(q_heads / group).or_insert(0) += 1;
        }
        if ffn.get("no_op") != Some(&Value::Bool(true)) {
            let width = match (
                field(ffn, "ffn", "ffn_mult")?,
                field(ffn, "ffn", "intermediate_size")?,
            ) {
                (Some(mult), _) => ffn_mult_width(mult, hidden),
                (None, Some(width)) => width as usize,
                (None, None) => {
                    return Err(format!(
                    "block_configs[{i}].ffn needs ffn_mult or intermediate_size (or no_op: true)"
                ))
                }
            };
            *mlp.entry(width).or_insert(0) += 1;
        }
    }
    Ok(Some(Blocks {
        attention: attention.into_iter().collect(),
        mlp: mlp.into_iter().collect(),
    }))
}

/// Layers alike but for their MLP's width, one per layer.
fn per_layer_widths(widths: &[Value], kv_heads: usize, layers: usize) -> Result<Blocks, String> {
    if widths.len() != layers {
        return Err(format!(
            "`intermediate_size` lists {} widths, but num_hidden_layers = {layers}",
            widths.len()
        ));
    }
    let mut mlp = BTreeMap::new();
    for (i, w) in widths.iter().enumerate() {
        let width = w.as_u64().filter(|&w| w > 0).ok_or_else(|| {
            format!("intermediate_size[{i}] must be a positive integer, found {w}")
        })?;
        *mlp.entry(width as usize).or_insert(0) += 1;
    }
    Ok(Blocks {
        attention: vec![(kv_heads, layers)],
        mlp: mlp.into_iter().collect(),
    })
}

/// DeciLM's MLP width for a multiplier: two thirds of `ffn_mult` times the hidden size (the
/// SwiGLU convention), truncated, then rounded up to a multiple of 256 (vLLM's
/// `_ffn_mult_to_intermediate_size`).
fn ffn_mult_width(mult: f64, hidden: usize) -> usize {
    let width = (2.0 * mult * hidden as f64 / 3.0) as usize;
    width.div_ceil(256) * 256
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str, layers: usize) -> Result<Option<Blocks>, String> {
        blocks(&serde_json::from_str(json).unwrap(), 64, 8, 8192, layers)
    }

    #[test]
    fn multipliers_give_llamas_widths() {
        // 5.25 is Llama-3.1-70B's 28672; 1.3125 its quarter.
        assert_eq!(ffn_mult_width(5.25, 8192), 28672);
        assert_eq!(ffn_mult_width(1.3125, 8192), 7168);
        // 2 × 1.95 × 8192 / 3 = 10649.6: truncated, then up to 10752.
        assert_eq!(ffn_mult_width(1.95, 8192), 10752);
    }

    #[test]
    fn layers_are_counted_by_their_kv_heads_and_widths() {
        let json = r#"{"block_configs": [
            {"attention": {"n_heads_in_group": 8}, "ffn": {"ffn_mult": 5.25}},
            {"attention": {"no_op": true, "n_heads_in_group": null}, "ffn": {"ffn_mult": 1.3125}},
            {"attention": {"n_heads_in_group": 16}, "ffn": {"no_op": true}},
            {"attention": {"n_heads_in_group": 8}, "ffn": {"intermediate_size": 28672}}]}"#;
        let b = parse(json, 4).unwrap().unwrap();
        assert_eq!(b.attention, vec![(4, 1), (8, 2)]);
        assert_eq!(b.mlp, vec![(7168, 1), (28672, 2)]);
        assert_eq!(parse("{}", 4), Ok(None));
        // Gemma 3n's per-layer widths: every layer's attention alike.
        let b = parse(r#"{"intermediate_size": [16384, 8192, 16384]}"#, 3)
            .unwrap()
            .unwrap();
        assert_eq!(b.attention, vec![(8, 3)]);
        assert_eq!(b.mlp, vec![(8192, 1), (16384, 2)]);
        let err = parse(r#"{"intermediate_size": [16384, 0]}"#, 2).unwrap_err();
        assert!(
            err.contains("intermediate_size[1] must be a positive"),
            "{err}"
        );
        let err = parse(r#"{"intermediate_size": [16384]}"#, 2).unwrap_err();
        assert!(err.contains("lists 1 widths"), "{err}");
    }

    #[test]
    fn what_vllm_does_not_build_or_the_config_leaves_out_is_named() {
        let one = |block: &str| parse(&format!(r#"{{"block_configs": [{block}]}}"#), 1);
        let cases = [
            (
                r#"{"attention": {"replace_with_linear": true}, "ffn": {"ffn_mult": 1}}"#,
                "block_configs[0].attention.replace_with_linear",
            ),
            (
                r#"{"attention": {}, "ffn": {"ffn_mult": 1}}"#,
                "needs n_heads_in_group",
            ),
            (
                r#"{"attention": {"n_heads_in_group": 7}, "ffn": {"ffn_mult": 1}}"#,
                "n_heads_in_group = 7 does not divide num_attention_heads = 64",
            ),
            (
                r#"{"attention": {"no_op": true}, "ffn": {}}"#,
                "ffn needs ffn_mult",
            ),
            (r#"{"attention": {"no_op": true}}"#, "has no `ffn` object"),
            (
                r#"{"attention": {"no_op": true}, "ffn": {"ffn_mult": "big"}}"#,
                "ffn.ffn_mult must be a positive number",
            ),
        ];
        for (block, needle) in cases {
            let err = one(block).unwrap_err();
            assert!(err.contains(needle), "{block}: {err}");
        }
        let err = parse(r#"{"block_configs": []}"#, 2).unwrap_err();
        assert!(err.contains("describes 0 layers"), "{err}");
    }
}
