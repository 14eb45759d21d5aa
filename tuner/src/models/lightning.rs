//! MiniMax-Text-01 and MiniMax-M1: most layers' attention is lightning attention (linear
//! attention with a per-head decay), every few layers softmax attention, as `attn_type_list`
//! says (0 lightning, 1 softmax), then experts in every layer. vLLM's
//! `MiniMaxText01LinearAttention` runs a lightning layer's GEMMs as its query, key and value
//! projection (`qkv_proj`, each heads × head size wide), its output gate (`output_gate`) and
//! its output projection, all split over the shards by heads; the recurrence over the decayed
//! state is not a GEMM.

use serde_json::{Map, Value};

use super::mixers::{Hybrid, Mixer};

/// The lightning-attention layers of a hybrid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lightning {
    pub heads: usize,
    pub head_dim: usize,
}

impl Lightning {
    fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// One shard's (role, N, K) GEMMs of a lightning layer at `tp` shards.
    pub fn projections(&self, hidden: usize, tp: usize) -> [(&'static str, usize, usize); 3] {
        [
            ("lightning_qkv", 3 * self.width() / tp, hidden),
            ("lightning_gate", self.width() / tp, hidden),
            ("lightning_out", hidden, self.width() / tp),
        ]
    }

    /// Why `tp` shards cannot split the heads, if they cannot.
    pub fn tp_refusal(&self, tp: usize) -> Option<String> {
        (!self.heads.is_multiple_of(tp)).then(|| {
            format!(
                "its lightning-attention layers' {} heads are not a multiple of it",
                self.heads
            )
        })
    }
}

/// The lightning layers `attn_type_list` names, where it names any (MiniMax-M2 writes 1, softmax
/// attention, for every layer: `Ok(None)`).
pub fn lightning(
    config: &Map<String, Value>,
    heads: usize,
    head_dim: usize,
    layers: usize,
) -> Result<Option<Hybrid>, String> {
    let Some(list) = config.get("attn_type_list") else {
        return Ok(None);
    };
    let kinds = list
        .as_array()
        .ok_or_else(|| format!("`attn_type_list` must list each layer's 0 or 1, found {list}"))?;
    if kinds.len() != layers {
        return Err(format!(
            "`attn_type_list` names {} layers, but num_hidden_layers = {layers}",
            kinds.len()
        ));
    }
    let mut linear = 0;
    for (i, kind) in kinds.iter().enumerate() {
        match kind.as_u64() {
            Some(0) => linear += 1,
            Some(1) => {}
            _ => {
                return Err(format!(
                    "attn_type_list[{i}] = {kind}: 0 is lightning attention, 1 softmax attention"
                ))
            }
        }
    }
    let mixer = Mixer::Lightning(Lightning { heads, head_dim });
    Ok((linear > 0).then(|| Hybrid::mixer_or_attention(mixer, linear, layers)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_list_divides_lightning_and_softmax_layers() {
        let config = map(r#"{"attn_type_list": [0, 0, 0, 1, 0, 0, 0, 1]}"#);
        let h = lightning(&config, 64, 128, 8).unwrap().unwrap();
        assert_eq!(
            (h.mixer_layers, h.attention_layers, h.mlp_layers),
            (6, 2, 8)
        );
        // All softmax (MiniMax-M2), or no list at all: a plain decoder.
        assert_eq!(
            lightning(&map(r#"{"attn_type_list": [1, 1]}"#), 64, 128, 2),
            Ok(None)
        );
        assert_eq!(lightning(&map("{}"), 64, 128, 2), Ok(None));
    }

    #[test]
    fn lists_that_do_not_fit_are_named() {
        let cases = [
            (r#"{"attn_type_list": [0, 1, 1]}"#, "names 3 layers"),
            (r#"{"attn_type_list": [0, 2]}"#, "attn_type_list[1] = 2"),
            (r#"{"attn_type_list": "0,1"}"#, "must list each layer's"),
        ];
        for (config, needle) in cases {
            let err = lightning(&map(config), 64, 128, 2).unwrap_err();
            assert!(err.contains(needle), "{config}: {err}");
        }
    }

    #[test]
    fn projections_split_the_heads() {
        // MiniMax-Text-01: 64 heads of 128 on a hidden size of 6144, 8 shards.
        let l = Lightning {
            heads: 64,
            head_dim: 128,
        };
        assert_eq!(
            l.projections(6144, 8),
            [
                ("lightning_qkv", 3072, 6144),
                ("lightning_gate", 1024, 6144),
                ("lightning_out", 6144, 1024)
            ]
        );
        assert!(l.tp_refusal(3).is_some());
    }
}
