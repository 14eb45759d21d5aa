//! Kimi Linear: most layers' mixer is Kimi delta attention (KDA, a gated delta rule over short
//! convolutions), the rest multi-head latent attention, as `linear_attn_config.kda_layers`
//! lists them (counted from 1), then experts or an MLP. vLLM's `KimiDeltaAttention` runs a KDA
//! layer's GEMMs as its query, key and value projections (each heads × head size wide, split
//! over the shards), the gate's low-rank pair (`f_a_proj`, whole on every shard, then
//! `f_b_proj`), the beta projection, the output gate's low-rank pair (`g_a_proj`,
//! `g_b_proj`) and the output projection; the convolutions and the recurrence are not GEMMs.

use serde_json::{Map, Value};

use super::mixers::{Hybrid, Mixer};

/// The KDA layers of a hybrid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KimiDelta {
    pub heads: usize,
    pub head_dim: usize,
}

impl KimiDelta {
    /// One shard's (role, N, K) GEMMs of a KDA layer at `tp` shards.
    pub fn projections(&self, hidden: usize, tp: usize) -> [(&'static str, usize, usize); 9] {
        let width = self.heads * self.head_dim / tp;
        let d = self.head_dim;
        [
            ("kda_q", width, hidden),
            ("kda_k", width, hidden),
            ("kda_v", width, hidden),
            ("kda_f_a", d, hidden),
            ("kda_f_b", width, d),
            ("kda_beta", self.heads / tp, hidden),
            ("kda_g_a", d, hidden),
            ("kda_g_b", width, d),
            ("kda_o", hidden, width),
        ]
    }

    /// Why `tp` shards cannot split the heads, if they cannot (vLLM asserts they divide).
    pub fn tp_refusal(&self, tp: usize) -> Option<String> {
        (!self.heads.is_multiple_of(tp)).then(|| {
            format!(
                "its KDA layers' {} heads are not a multiple of it",
                self.heads
            )
        })
    }
}

/// The KDA layers of a Kimi Linear config (`linear_attn_config` with `kda_layers`, counted
/// from 1, as transformers' and vLLM's `is_kda_layer`); `Ok(None)` where the config has none.
pub fn kimi_delta(config: &Map<String, Value>, layers: usize) -> Result<Option<Hybrid>, String> {
    let Some(linear) = config.get("linear_attn_config").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let linear = linear
        .as_object()
        .ok_or_else(|| format!("`linear_attn_config` must be an object, found {linear}"))?;
    let Some(listed) = linear.get("kda_layers").and_then(Value::as_array) else {
        return Ok(None);
    };
    let mut kda: Vec<usize> = Vec::with_capacity(listed.len());
    for v in listed {
        match v.as_u64().map(|n| n as usize) {
            Some(n @ 1..) if n <= layers => kda.push(n),
            _ => {
                return Err(format!(
                    "linear_attn_config.kda_layers counts layers from 1 to num_hidden_layers = {layers}, found {v}"
                ))
            }
        }
    }
    kda.sort_unstable();
    kda.dedup();
    if kda.is_empty() {
        return Ok(None);
    }
    let need = |key: &str| -> Result<usize, String> {
        match linear.get(key).and_then(Value::as_u64) {
            Some(n) if n > 0 => Ok(n as usize),
            _ => Err(format!(
                "its KDA layers need linear_attn_config.{key}, a positive integer"
            )),
        }
    };
    let kda_attention = KimiDelta {
        heads: need("num_heads")?,
        head_dim: need("head_dim")?,
    };
    Ok(Some(Hybrid::mixer_or_attention(
        Mixer::KimiDelta(kda_attention),
        kda.len(),
        layers,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn kda_layers_are_counted_from_one() {
        let config = map(
            r#"{"linear_attn_config": {"kda_layers": [1, 2, 3, 5, 6, 7], "num_heads": 32,
            "head_dim": 128, "full_attn_layers": [4, 8]}}"#,
        );
        let h = kimi_delta(&config, 8).unwrap().unwrap();
        assert_eq!(
            (h.mixer_layers, h.attention_layers, h.mlp_layers),
            (6, 2, 8)
        );
        assert_eq!(kimi_delta(&map("{}"), 8), Ok(None));
        let none = map(r#"{"linear_attn_config": {"kda_layers": []}}"#);
        assert_eq!(kimi_delta(&none, 8), Ok(None));
    }

    #[test]
    fn lists_and_sizes_that_do_not_fit_are_named() {
        let cases = [
            (
                r#"{"linear_attn_config": {"kda_layers": [0], "num_heads": 32, "head_dim": 128}}"#,
                "counts layers from 1",
            ),
            (
                r#"{"linear_attn_config": {"kda_layers": [9], "num_heads": 32, "head_dim": 128}}"#,
                "found 9",
            ),
            (
                r#"{"linear_attn_config": {"kda_layers": [1], "head_dim": 128}}"#,
                "linear_attn_config.num_heads",
            ),
            (r#"{"linear_attn_config": [1]}"#, "must be an object"),
        ];
        for (config, needle) in cases {
            let err = kimi_delta(&map(config), 8).unwrap_err();
            assert!(err.contains(needle), "{config}: {err}");
        }
    }

    #[test]
    fn projections_split_the_heads_but_not_the_low_rank_down_projections() {
        // Kimi-Linear-48B-A3B's KDA: 32 heads of 128 on a hidden size of 2304, 4 shards.
        let kda = KimiDelta {
            heads: 32,
            head_dim: 128,
        };
        let p = kda.projections(2304, 4);
        assert!(p.contains(&("kda_q", 1024, 2304)));
        assert!(p.contains(&("kda_f_a", 128, 2304)));
        assert!(p.contains(&("kda_f_b", 1024, 128)));
        assert!(p.contains(&("kda_beta", 8, 2304)));
        assert!(p.contains(&("kda_o", 2304, 1024)));
        assert!(kda.tp_refusal(3).is_some());
    }
}
