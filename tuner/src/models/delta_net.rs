//! Qwen3-Next and Qwen3.5: most layers' mixer is a gated delta net (linear attention), every
//! few layers full attention whose query projection also carries an output gate, then an MLP
//! or experts in every layer. vLLM runs a delta-net mixer's GEMMs as its fused query, key,
//! value and gate projection (`in_proj_qkvz`), its fused beta and alpha projection
//! (`in_proj_ba`), both split over the shards by heads, and its output projection; its
//! convolution and recurrence are not GEMMs.

use serde_json::{Map, Value};

use super::mixers::{Hybrid, Mixer};

/// The delta-net mixers of a hybrid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GatedDeltaNet {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
}

impl GatedDeltaNet {
    fn value_width(&self) -> usize {
        self.value_heads * self.value_head_dim
    }

    /// One shard's (role, N, K) GEMMs of a delta-net mixer at `tp` shards.
    pub fn projections(&self, hidden: usize, tp: usize) -> [(&'static str, usize, usize); 3] {
        let key_width = self.key_heads * self.key_head_dim;
        [
            (
                "linear_qkvz",
                (2 * key_width + 2 * self.value_width()) / tp,
                hidden,
            ),
            ("linear_ba", 2 * self.value_heads / tp, hidden),
            ("linear_out", hidden, self.value_width() / tp),
        ]
    }

    /// Why `tp` shards cannot split the mixers' heads, if they cannot.
    pub fn tp_refusal(&self, tp: usize) -> Option<String> {
        (!self.key_heads.is_multiple_of(tp) || !self.value_heads.is_multiple_of(tp)).then(|| {
            format!(
                "its delta-net layers' {} key and {} value heads are not both multiples of it",
                self.key_heads, self.value_heads
            )
        })
    }
}

/// The delta-net layers of a Qwen3-Next or Qwen3.5 config (`model_type` `qwen3_next*` or
/// `qwen3_5*`), scheduled by `layer_types` (`linear_attention`, `full_attention`) or
/// `full_attention_interval`; `Ok(None)` for other families or schedules, which leaves the
/// model to `hybrid.rs`.
pub fn delta_net(
    config: &Map<String, Value>,
    model_type: Option<&str>,
    layers: usize,
) -> Result<Option<Hybrid>, String> {
    if !model_type.is_some_and(|t| t.starts_with("qwen3_next") || t.starts_with("qwen3_5")) {
        return Ok(None);
    }
    let linear_layers = match (
        config.get("layer_types"),
        config.get("full_attention_interval"),
    ) {
        (Some(Value::Array(kinds)), _) => {
            if kinds.len() != layers {
                return Err(format!(
                    "`layer_types` names {} layers, but num_hidden_layers = {layers}",
                    kinds.len()
                ));
            }
            let mut linear = 0;
            for kind in kinds {
                match kind.as_str() {
                    Some("linear_attention") => linear += 1,
                    Some("full_attention") => {}
                    _ => return Ok(None),
                }
            }
            linear
        }
        // Every interval-th layer (counting from one) is full attention.
        (_, Some(v)) => match v.as_u64() {
            Some(n) if n > 0 => layers - layers / n as usize,
            _ => {
                return Err(format!(
                    "`full_attention_interval` must be a positive integer, found {v}"
                ))
            }
        },
        _ => return Ok(None),
    };
    let need = |key: &str| -> Result<usize, String> {
        match config.get(key).and_then(Value::as_u64) {
            Some(n) if n > 0 => Ok(n as usize),
            _ => Err(format!(
                "its linear-attention layers need `{key}`, a positive integer"
            )),
        }
    };
    let net = GatedDeltaNet {
        key_heads: need("linear_num_key_heads")?,
        value_heads: need("linear_num_value_heads")?,
        key_head_dim: need("linear_key_head_dim")?,
        value_head_dim: need("linear_value_head_dim")?,
    };
    if !net.value_heads.is_multiple_of(net.key_heads) {
        return Err(format!(
            "linear_num_value_heads = {} is not a multiple of linear_num_key_heads = {}",
            net.value_heads, net.key_heads
        ));
    }
    Ok(Some(Hybrid::mixer_or_attention(
        Mixer::DeltaNet(net),
        linear_layers,
        layers,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    const HEADS: &str = r#""linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128"#;

    #[test]
    fn schedules_count_the_delta_net_layers() {
        let interval = map(&format!(r#"{{{HEADS}, "full_attention_interval": 4}}"#));
        let hybrid = delta_net(&interval, Some("qwen3_next"), 48)
            .unwrap()
            .unwrap();
        assert_eq!((hybrid.mixer_layers, hybrid.attention_layers), (36, 12));
        let net = hybrid.mixer;
        // q and k 2 × 2048, v and z 2 × 4096, over 4 shards; beta and alpha 2 × 32 / 4.
        assert_eq!(
            net.projections(2048, 4),
            [
                ("linear_qkvz", 3072, 2048),
                ("linear_ba", 16, 2048),
                ("linear_out", 2048, 1024)
            ]
        );
        assert!(net
            .tp_refusal(32)
            .unwrap()
            .contains("16 key and 32 value heads"));
        let listed = map(&format!(
            r#"{{{HEADS}, "layer_types": ["linear_attention", "full_attention"]}}"#
        ));
        assert_eq!(
            delta_net(&listed, Some("qwen3_5_moe_text"), 2)
                .unwrap()
                .unwrap()
                .mixer_layers,
            1
        );
        // Another family, or a kind not read, is left to the hybrid refusal.
        assert_eq!(delta_net(&listed, Some("kimi_linear"), 2), Ok(None));
        let conv = map(&format!(
            r#"{{{HEADS}, "layer_types": ["conv", "full_attention"]}}"#
        ));
        assert_eq!(delta_net(&conv, Some("qwen3_next"), 2), Ok(None));
        let err = delta_net(&listed, Some("qwen3_next"), 3).unwrap_err();
        assert!(err.contains("names 2 layers"), "{err}");
    }
}
