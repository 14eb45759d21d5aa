//! Mamba-2 hybrids whose layers kerntune derives exactly, as vLLM builds them on its Mamba-2
//! mixer: Bamba and Granite 4.0-H, where every layer runs a Mamba-2 or an attention mixer and
//! then an MLP; Nemotron-H, where each layer is one of a Mamba-2 mixer, attention or an MLP;
//! and Falcon-H1, where every layer runs a Mamba-2 mixer and attention side by side, then an
//! MLP. Nemotron-H's expert layers (E, Nemotron 3) run its experts where others run the MLP.
//! A mixer's GEMMs are its input projection (gate, x, B, C and the step sizes in one) and
//! its output projection; its convolution and state-space scan are not GEMMs. Hybrids of other
//! families stay refused (`hybrid.rs`).

use serde_json::{Map, Value};

/// The Mamba-2 mixers of a hybrid and how its layers divide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mamba2 {
    pub heads: usize,
    pub head_dim: usize,
    /// Groups of heads sharing their B and C projections.
    pub groups: usize,
    /// State size per head channel.
    pub state: usize,
    /// Layers whose mixer is Mamba-2, layers with attention, layers with an MLP or experts.
    pub mixer_layers: usize,
    pub attention_layers: usize,
    pub mlp_layers: usize,
    /// Where the schedule names expert layers (Nemotron-H's E), the layers among
    /// `mlp_layers` with a dense MLP instead; `None` where the experts' fields say it.
    pub dense_mlp_layers: Option<usize>,
}

impl Mamba2 {
    /// The mixer's inner width (heads × head size).
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// N of one shard's input projection at `tp` shards. Where `tp` does not divide the groups
    /// (vLLM allows that for one group only), each shard holds a copy of the group its heads
    /// read.
    pub fn in_proj(&self, tp: usize) -> usize {
        let groups = match self.groups.is_multiple_of(tp) {
            true => self.groups,
            false => tp,
        };
        (2 * self.width() + 2 * groups * self.state + self.heads) / tp
    }

    /// Weights of one mixer's projections, in elements.
    pub fn weights(&self, hidden: usize) -> usize {
        hidden * (self.in_proj(1) + self.width())
    }

    /// Why `tp` shards cannot split the mixers as vLLM does, if they cannot.
    pub fn tp_refusal(&self, tp: usize) -> Option<String> {
        if !self.heads.is_multiple_of(tp) {
            return Some(format!(
                "its {} Mamba-2 heads are not a multiple of it",
                self.heads
            ));
        }
        (!self.groups.is_multiple_of(tp) && self.groups != 1).then(|| {
            format!(
                "it does not divide its {} Mamba-2 groups (vLLM splits groups evenly, or copies a single one)",
                self.groups
            )
        })
    }
}

/// The field names of a family's Mamba-2 mixer: heads, head size, groups, state size.
struct Names {
    heads: &'static str,
    head_dim: &'static str,
    groups: &'static str,
    state: &'static str,
}

const GRANITE: Names = Names {
    heads: "mamba_n_heads",
    head_dim: "mamba_d_head",
    groups: "mamba_n_groups",
    state: "mamba_d_state",
};

const NEMOTRON_H: Names = Names {
    heads: "mamba_num_heads",
    head_dim: "mamba_head_dim",
    groups: "n_groups",
    state: "ssm_state_size",
};

/// Each layer's kind: a Mamba-2 mixer, attention, or (Nemotron-H) an MLP alone.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Mamba,
    Attention,
    Mlp,
    Experts,
}

/// How a family's layers divide: the kind of each (an MLP after each mixer, or not), or
/// Falcon-H1's layers that each run a Mamba-2 mixer, attention and an MLP side by side.
enum Schedule {
    Kinds(Vec<Kind>, bool),
    Parallel,
}

/// The Mamba-2 layers of `config` where its `model_type` is a family derived here and its
/// layers are all of the kinds read; `Ok(None)` otherwise, which leaves the model to
/// `hybrid.rs`. Errors say what in the config contradicts itself.
pub fn mixer(
    config: &Map<String, Value>,
    model_type: Option<&str>,
    hidden: usize,
    layers: usize,
) -> Result<Option<Mamba2>, String> {
    let field = |key: &str| -> Result<Option<usize>, String> {
        match config.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n as usize)),
                _ => Err(format!("`{key}` must be a positive integer, found {v}")),
            },
        }
    };
    let need = |key: &str| -> Result<usize, String> {
        field(key)?.ok_or_else(|| format!("its Mamba-2 layers need `{key}`"))
    };
    // Bamba, Granite and Falcon-H1 size the mixer by `mamba_expand` × hidden_size (Falcon-H1
    // by `mamba_d_ssm` where it is set), Nemotron-H by its heads alone.
    let expanded =
        || -> Result<Option<usize>, String> { Ok(field("mamba_expand")?.map(|e| e * hidden)) };
    let (names, schedule, width) = match model_type {
        Some("bamba") => (GRANITE, bamba_layers(config, layers)?, expanded()?),
        Some("granitemoehybrid") => {
            let kinds = listed_layers(config, "layer_types");
            (
                GRANITE,
                kinds.map(|k| Schedule::Kinds(k, true)),
                expanded()?,
            )
        }
        Some("falcon_h1") => {
            let width = match field("mamba_d_ssm")? {
                Some(w) => Some(w),
                None => expanded()?,
            };
            (GRANITE, Some(Schedule::Parallel), width)
        }
        Some("nemotron_h") => {
            let kinds = nemotron_layers(config);
            (NEMOTRON_H, kinds.map(|k| Schedule::Kinds(k, false)), None)
        }
        _ => return Ok(None),
    };
    let Some(schedule) = schedule else {
        return Ok(None);
    };
    let (mixer_layers, attention_layers, mlp_layers, dense_mlp_layers) = match &schedule {
        Schedule::Parallel => (layers, layers, layers, None),
        Schedule::Kinds(kinds, every_layer_mlp) => {
            if kinds.len() != layers {
                return Err(format!(
                    "its layer schedule names {} layers, but num_hidden_layers = {layers}",
                    kinds.len()
                ));
            }
            let count = |kind| kinds.iter().filter(|&&k| k == kind).count();
            let mlps = match every_layer_mlp {
                true => layers,
                false => count(Kind::Mlp) + count(Kind::Experts),
            };
            let dense = (count(Kind::Experts) > 0).then(|| count(Kind::Mlp));
            (count(Kind::Mamba), count(Kind::Attention), mlps, dense)
        }
    };
    let heads = need(names.heads)?;
    let head_dim = match (width, field(names.head_dim)?) {
        (Some(width), head_dim) => {
            let derived = width / heads;
            if derived * heads != width || head_dim.is_some_and(|d| d != derived) {
                return Err(format!(
                    "its Mamba-2 width {width} (mamba_expand × hidden_size, or mamba_d_ssm) is not {} × {}",
                    names.heads, names.head_dim
                ));
            }
            derived
        }
        (None, _) => need(names.head_dim)?,
    };
    let mamba = Mamba2 {
        heads,
        head_dim,
        groups: need(names.groups)?,
        state: need(names.state)?,
        mixer_layers,
        attention_layers,
        mlp_layers,
        dense_mlp_layers,
    };
    if !heads.is_multiple_of(mamba.groups) {
        return Err(format!(
            "{} = {heads} is not a multiple of {} = {}",
            names.heads, names.groups, mamba.groups
        ));
    }
    // A Nemotron-H without MLP layers would need a model without an MLP, which the
    // derivation does not have; none is published.
    Ok((mamba.mlp_layers > 0).then_some(mamba))
}

/// Bamba's attention layers by index, the rest Mamba-2.
fn bamba_layers(config: &Map<String, Value>, layers: usize) -> Result<Option<Schedule>, String> {
    let Some(Value::Array(indices)) = config.get("attn_layer_indices") else {
        return Ok(None);
    };
    let indices: Vec<usize> = indices
        .iter()
        .map(|v| v.as_u64().map(|n| n as usize).filter(|&n| n < layers))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            format!(
                "`attn_layer_indices` must list layer indices below num_hidden_layers = {layers}"
            )
        })?;
    let kinds = (0..layers)
        .map(|i| match indices.contains(&i) {
            true => Kind::Attention,
            false => Kind::Mamba,
        })
        .collect();
    Ok(Some(Schedule::Kinds(kinds, true)))
}

/// A list of layer kinds (`layer_types`, `layers_block_type`): `None` where it names a kind
/// other than Mamba-2, attention or an MLP.
fn listed_layers(config: &Map<String, Value>, key: &str) -> Option<Vec<Kind>> {
    let Some(Value::Array(items)) = config.get(key) else {
        return None;
    };
    items
        .iter()
        .map(|kind| match kind.as_str() {
            Some("mamba") => Some(Kind::Mamba),
            Some("attention") => Some(Kind::Attention),
            Some("mlp") => Some(Kind::Mlp),
            Some("moe") => Some(Kind::Experts),
            _ => None,
        })
        .collect()
}

/// Nemotron-H's schedule: `hybrid_override_pattern` (M Mamba-2, * attention, - MLP, E experts)
/// or, as newer transformers write it, `layers_block_type`; `None` where it names another kind.
fn nemotron_layers(config: &Map<String, Value>) -> Option<Vec<Kind>> {
    let Some(pattern) = config
        .get("hybrid_override_pattern")
        .and_then(Value::as_str)
    else {
        return listed_layers(config, "layers_block_type");
    };
    pattern
        .chars()
        .map(|c| match c {
            'M' => Some(Kind::Mamba),
            '*' => Some(Kind::Attention),
            '-' => Some(Kind::Mlp),
            'E' => Some(Kind::Experts),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_input_projection_copies_a_single_group_to_each_shard() {
        let m = Mamba2 {
            heads: 48,
            head_dim: 64,
            groups: 1,
            state: 128,
            mixer_layers: 36,
            attention_layers: 4,
            mlp_layers: 40,
            dense_mlp_layers: None,
        };
        // gate and x (2 × 3072), B and C (2 × 128), 48 step sizes.
        assert_eq!(m.in_proj(1), 6448);
        // Each of 4 shards: 1536 + 256 (its copy of the group) + 12.
        assert_eq!(m.in_proj(4), 1804);
        assert_eq!(m.tp_refusal(4), None);
        assert!(m.tp_refusal(5).unwrap().contains("48 Mamba-2 heads"));
        let eight = Mamba2 { groups: 8, ..m };
        assert_eq!(eight.in_proj(4), (6144 + 2 * 8 * 128 + 48) / 4);
        assert!(eight.tp_refusal(16).unwrap().contains("8 Mamba-2 groups"));
    }

    #[test]
    fn families_and_schedules_not_read_are_left_to_the_hybrid_refusal() {
        let nemotron = r#"{"mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8,
            "ssm_state_size": 128, "hybrid_override_pattern": "M-M*-"}"#;
        let m = mixer(&map(nemotron), Some("nemotron_h"), 4096, 5)
            .unwrap()
            .unwrap();
        assert_eq!(
            (m.mixer_layers, m.attention_layers, m.mlp_layers),
            (2, 1, 2)
        );
        assert_eq!(m.dense_mlp_layers, None);
        // Expert layers (E) beside a dense one: the schedule says which is which.
        let experts = nemotron.replace("M-M*-", "MEM*-");
        let m = mixer(&map(&experts), Some("nemotron_h"), 4096, 5)
            .unwrap()
            .unwrap();
        assert_eq!((m.mlp_layers, m.dense_mlp_layers), (2, Some(1)));
        // A kind not read, another family, a count that disagrees.
        let other = nemotron.replace("M-M*-", "MXM*-");
        assert_eq!(mixer(&map(&other), Some("nemotron_h"), 4096, 5), Ok(None));
        assert_eq!(mixer(&map(nemotron), Some("jamba"), 4096, 5), Ok(None));
        let err = mixer(&map(nemotron), Some("nemotron_h"), 4096, 6).unwrap_err();
        assert!(
            err.contains("names 5 layers, but num_hidden_layers = 6"),
            "{err}"
        );
        // Granite's width from mamba_expand must agree with its heads.
        let granite = r#"{"mamba_n_heads": 48, "mamba_d_head": 32, "mamba_n_groups": 1,
            "mamba_d_state": 128, "mamba_expand": 2, "layer_types": ["mamba", "attention"]}"#;
        let err = mixer(&map(granite), Some("granitemoehybrid"), 1536, 2).unwrap_err();
        assert!(err.contains("Mamba-2 width 3072"), "{err}");
    }
}
