//! LFM2 and LFM2-MoE (Liquid): most layers' mixer is a gated short convolution, a few are
//! attention, then an MLP (or, past LFM2-MoE's first dense layers, experts) in every layer.
//! vLLM's `ShortConv` runs a convolution layer's GEMMs as its input projection (the B, C and x
//! streams fused, `in_proj`, split over the shards) and its output projection; the
//! convolution over the last few tokens is not a GEMM. LFM2's MLP width is derived from
//! `intermediate_size` as its `Lfm2MLP` does (`block_auto_adjust_ff_dim`).

use serde_json::{Map, Value};

use super::mixers::{Hybrid, Mixer};

/// The short-convolution mixers of a hybrid: `width` channels (LFM2's hidden size).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShortConv {
    pub width: usize,
}

impl ShortConv {
    /// One shard's (role, N, K) GEMMs of a convolution mixer at `tp` shards.
    pub fn projections(&self, hidden: usize, tp: usize) -> [(&'static str, usize, usize); 2] {
        [
            ("conv_in", 3 * self.width / tp, hidden),
            ("conv_out", hidden, self.width / tp),
        ]
    }

    /// Why `tp` shards cannot split the convolution's channels, if they cannot.
    pub fn tp_refusal(&self, tp: usize) -> Option<String> {
        (!self.width.is_multiple_of(tp)).then(|| {
            format!(
                "its convolution layers' {} channels are not a multiple of it",
                self.width
            )
        })
    }
}

/// Whether `model_type` is an LFM2 family (`lfm2`, `lfm2_moe`, and their vision-language
/// wrappers, whose decoder is one).
pub fn is_lfm2(model_type: Option<&str>) -> bool {
    model_type.is_some_and(|t| t.starts_with("lfm2"))
}

/// The convolution layers of an LFM2 config, scheduled by `layer_types` (`conv`,
/// `full_attention`) or `full_attn_idxs`; `Ok(None)` for other families.
pub fn short_conv(
    config: &Map<String, Value>,
    model_type: Option<&str>,
    hidden: usize,
    layers: usize,
) -> Result<Option<Hybrid>, String> {
    if !is_lfm2(model_type) {
        return Ok(None);
    }
    let attention_layers = match (config.get("layer_types"), config.get("full_attn_idxs")) {
        (Some(Value::Array(kinds)), _) => {
            if kinds.len() != layers {
                return Err(format!(
                    "`layer_types` names {} layers, but num_hidden_layers = {layers}",
                    kinds.len()
                ));
            }
            let mut attention = 0;
            for (i, kind) in kinds.iter().enumerate() {
                match kind.as_str() {
                    Some("full_attention") => attention += 1,
                    Some("conv") => {}
                    _ => {
                        return Err(format!(
                            "layer_types[{i}] = {kind}: LFM2's layers are \"conv\" or \"full_attention\""
                        ))
                    }
                }
            }
            attention
        }
        (_, Some(Value::Array(indices))) => {
            let mut listed: Vec<usize> = Vec::with_capacity(indices.len());
            for v in indices {
                match v.as_u64().map(|i| i as usize) {
                    Some(i) if i < layers => listed.push(i),
                    _ => {
                        return Err(format!(
                            "full_attn_idxs must list layer indices below num_hidden_layers = {layers}, found {v}"
                        ))
                    }
                }
            }
            listed.sort_unstable();
            listed.dedup();
            listed.len()
        }
        _ => {
            return Err(
                "an LFM2 config names its attention layers in `layer_types` or `full_attn_idxs`, and neither is given"
                    .into(),
            )
        }
    };
    // vLLM's convolution takes and gives the hidden size whatever `conv_dim` says.
    let width = match config.get("conv_dim").and_then(Value::as_u64) {
        Some(w) if w as usize != hidden => {
            return Err(format!(
                "conv_dim = {w} differs from hidden_size = {hidden}, and LFM2's convolution maps the hidden state to itself"
            ))
        }
        _ => hidden,
    };
    Ok(Some(Hybrid::mixer_or_attention(
        Mixer::ShortConv(ShortConv { width }),
        layers - attention_layers,
        layers,
    )))
}

/// LFM2's MLP width for `intermediate_size`: with `block_auto_adjust_ff_dim` (the default),
/// two thirds of it (truncated), times `block_ffn_dim_multiplier` where set, rounded up to a
/// multiple of `block_multiple_of` (256 by default), as vLLM's `Lfm2MLP` (LFM2-1.2B: 12288 →
/// 8192). LFM2-MoE's dense layers take `intermediate_size` as it is.
pub fn lfm2_mlp_width(config: &Map<String, Value>, intermediate: usize) -> Result<usize, String> {
    if config.get("block_auto_adjust_ff_dim") == Some(&Value::Bool(false)) {
        return Ok(intermediate);
    }
    let mut width = 2 * intermediate / 3;
    match config.get("block_ffn_dim_multiplier") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_f64() {
            Some(m) if m > 0.0 => width = (m * width as f64) as usize,
            _ => {
                return Err(format!(
                    "field `block_ffn_dim_multiplier` must be a positive number, found {v}"
                ))
            }
        },
    }
    let multiple = match config.get("block_multiple_of") {
        None | Some(Value::Null) => 256,
        Some(v) => match v.as_u64() {
            Some(m) if m > 0 => m as usize,
            _ => {
                return Err(format!(
                    "field `block_multiple_of` must be a positive integer, found {v}"
                ))
            }
        },
    };
    Ok(width.div_ceil(multiple) * multiple)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn schedules_count_the_convolution_layers() {
        let kinds = map(r#"{"layer_types": ["conv", "conv", "full_attention", "conv"]}"#);
        let h = short_conv(&kinds, Some("lfm2"), 2048, 4).unwrap().unwrap();
        assert_eq!(
            (h.mixer_layers, h.attention_layers, h.mlp_layers),
            (3, 1, 4)
        );
        let indices = map(r#"{"full_attn_idxs": [2, 5, 5], "conv_dim": 2048}"#);
        let h = short_conv(&indices, Some("lfm2_moe"), 2048, 8)
            .unwrap()
            .unwrap();
        assert_eq!((h.mixer_layers, h.attention_layers), (6, 2));
        assert_eq!(short_conv(&kinds, Some("llama"), 2048, 4), Ok(None));
    }

    #[test]
    fn schedules_and_widths_that_do_not_fit_are_named() {
        let cases = [
            (r#"{"layer_types": ["conv"]}"#, "names 1 layers"),
            (
                r#"{"layer_types": ["conv", "mamba"]}"#,
                "layer_types[1] = \"mamba\"",
            ),
            (r#"{"full_attn_idxs": [9]}"#, "below num_hidden_layers = 2"),
            (r#"{}"#, "neither is given"),
            (
                r#"{"layer_types": ["conv", "conv"], "conv_dim": 1024}"#,
                "conv_dim = 1024 differs",
            ),
        ];
        for (config, needle) in cases {
            let err = short_conv(&map(config), Some("lfm2"), 2048, 2).unwrap_err();
            assert!(err.contains(needle), "{config}: {err}");
        }
    }

    #[test]
    fn mlp_widths_follow_the_auto_adjustment() {
        // LFM2-1.2B and LFM2-350M.
        assert_eq!(lfm2_mlp_width(&map("{}"), 12288), Ok(8192));
        assert_eq!(lfm2_mlp_width(&map("{}"), 6656), Ok(4608));
        let off = map(r#"{"block_auto_adjust_ff_dim": false}"#);
        assert_eq!(lfm2_mlp_width(&off, 6656), Ok(6656));
        let scaled = map(r#"{"block_ffn_dim_multiplier": 1.5, "block_multiple_of": 128}"#);
        // 2 × 6656 / 3 = 4437, × 1.5 = 6655, up to 6656.
        assert_eq!(lfm2_mlp_width(&scaled, 6656), Ok(6656));
        assert!(lfm2_mlp_width(&map(r#"{"block_multiple_of": 0}"#), 6656).is_err());
    }

    #[test]
    fn projections_split_the_channels() {
        let conv = ShortConv { width: 2048 };
        assert_eq!(
            conv.projections(2048, 2),
            [("conv_in", 3072, 2048), ("conv_out", 2048, 1024)]
        );
        assert!(conv.tp_refusal(3).is_some());
        assert_eq!(conv.tp_refusal(8), None);
    }
}
