//! Mamba hybrids whose layers kerntune derives exactly, as vLLM builds them on its Mamba
//! mixers: Bamba and Granite 4.0-H, where every layer runs a Mamba-2 or an attention mixer and
//! then an MLP; Nemotron-H, where each layer is one of a Mamba-2 mixer, attention, an MLP or
//! (Nemotron 3) experts; Falcon-H1, where every layer runs a Mamba-2 mixer and attention side
//! by side, then an MLP; and Jamba, whose Mamba-1 or attention mixer is followed by experts or
//! an MLP. A Mamba-2 mixer's GEMMs are its input projection (gate, x, B, C and the step sizes
//! in one) and its output projection; a Mamba-1 mixer's its input, x (step rank, B and C),
//! step and output projections; convolutions and scans are not GEMMs. Hybrids of other
//! families stay refused (`hybrid.rs`).

use serde_json::{Map, Value};

use super::mixers::{Hybrid, Mixer};

/// A Mamba-2 mixer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mamba2 {
    pub heads: usize,
    pub head_dim: usize,
    /// Groups of heads sharing their B and C projections.
    pub groups: usize,
    /// State size per head channel.
    pub state: usize,
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

    /// One shard's (role, N, K) GEMMs at `tp` shards.
    pub fn projections(&self, hidden: usize, tp: usize) -> [(&'static str, usize, usize); 2] {
        [
            ("mamba_in", self.in_proj(tp), hidden),
            ("mamba_out", hidden, self.width() / tp),
        ]
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

/// A Mamba-1 mixer (Jamba's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mamba1 {
    /// Inner width (`mamba_expand` × hidden size).
    pub width: usize,
    /// Rank of the step-size projection.
    pub dt_rank: usize,
    pub state: usize,
}

impl Mamba1 {
    /// One shard's (role, N, K) GEMMs at `tp` shards: the x projection's output (step rank, B
    /// and C) is whole on every shard, its input split.
    pub fn projections(&self, hidden: usize, tp: usize) -> [(&'static str, usize, usize); 4] {
        let width = self.width / tp;
        [
            ("mamba_in", 2 * width, hidden),
            ("mamba_x", self.dt_rank + 2 * self.state, width),
            ("mamba_dt", width, self.dt_rank),
            ("mamba_out", hidden, width),
        ]
    }

    pub fn tp_refusal(&self, tp: usize) -> Option<String> {
        (!self.width.is_multiple_of(tp))
            .then(|| format!("its Mamba width {} is not a multiple of it", self.width))
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

/// Jamba's Mamba-1 reads its state size alone from these.
const JAMBA: Names = GRANITE;

const NEMOTRON_H: Names = Names {
    heads: "mamba_num_heads",
    head_dim: "mamba_head_dim",
    groups: "n_groups",
    state: "ssm_state_size",
};

/// Each layer's kind: a Mamba mixer, attention, or (Nemotron-H) an MLP or experts alone.
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

/// The Mamba layers of `config` where its `model_type` is a family derived here and its
/// layers are all of the kinds read; `Ok(None)` otherwise, which leaves the model to
/// `hybrid.rs`. Errors say what in the config contradicts itself.
pub fn mamba(
    config: &Map<String, Value>,
    model_type: Option<&str>,
    hidden: usize,
    layers: usize,
) -> Result<Option<Hybrid>, String> {
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
        field(key)?.ok_or_else(|| format!("its Mamba layers need `{key}`"))
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
        Some("jamba") => (JAMBA, jamba_layers(config, layers)?, expanded()?),
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
    let hybrid = |mixer| Hybrid {
        mixer,
        mixer_layers,
        attention_layers,
        mlp_layers,
        dense_mlp_layers,
    };
    if model_type == Some("jamba") {
        let width = width.ok_or("its Mamba layers need `mamba_expand`")?;
        // Jamba's step rank may be "auto": hidden_size / 16, rounded up (JambaConfig).
        let dt_rank = match config.get("mamba_dt_rank") {
            Some(Value::String(auto)) if auto == "auto" => hidden.div_ceil(16),
            _ => need("mamba_dt_rank")?,
        };
        let state = need(names.state)?;
        return Ok(Some(hybrid(Mixer::Mamba1(Mamba1 {
            width,
            dt_rank,
            state,
        }))));
    }
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
    };
    if !heads.is_multiple_of(mamba.groups) {
        return Err(format!(
            "{} = {heads} is not a multiple of {} = {}",
            names.heads, names.groups, mamba.groups
        ));
    }
    // A Nemotron-H without MLP layers would need a model without an MLP, which the
    // derivation does not have; none is published.
    Ok((mlp_layers > 0).then(|| hybrid(Mixer::Mamba2(mamba))))
}

/// Jamba's attention layers, every `attn_layer_period`-th from `attn_layer_offset`
/// (JambaConfig's `layers_block_type`), the rest Mamba-1, each followed by experts or an MLP.
fn jamba_layers(config: &Map<String, Value>, layers: usize) -> Result<Option<Schedule>, String> {
    let number = |key: &str| config.get(key).and_then(Value::as_u64).map(|n| n as usize);
    let (Some(period @ 1..), Some(offset)) =
        (number("attn_layer_period"), number("attn_layer_offset"))
    else {
        return Err(
            "its layer schedule needs `attn_layer_period` (positive) and `attn_layer_offset`"
                .into(),
        );
    };
    let kinds = (0..layers)
        .map(|i| match i % period == offset {
            true => Kind::Attention,
            false => Kind::Mamba,
        })
        .collect();
    Ok(Some(Schedule::Kinds(kinds, true)))
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
        let m = mamba(&map(nemotron), Some("nemotron_h"), 4096, 5)
            .unwrap()
            .unwrap();
        assert_eq!(
            (m.mixer_layers, m.attention_layers, m.mlp_layers),
            (2, 1, 2)
        );
        assert_eq!(m.dense_mlp_layers, None);
        // Expert layers (E) beside a dense one: the schedule says which is which.
        let experts = nemotron.replace("M-M*-", "MEM*-");
        let m = mamba(&map(&experts), Some("nemotron_h"), 4096, 5)
            .unwrap()
            .unwrap();
        assert_eq!((m.mlp_layers, m.dense_mlp_layers), (2, Some(1)));
        // A kind not read, another family, a count that disagrees.
        let other = nemotron.replace("M-M*-", "MXM*-");
        assert_eq!(mamba(&map(&other), Some("nemotron_h"), 4096, 5), Ok(None));
        assert_eq!(mamba(&map(nemotron), Some("zamba2"), 4096, 5), Ok(None));
        let err = mamba(&map(nemotron), Some("nemotron_h"), 4096, 6).unwrap_err();
        assert!(
            err.contains("names 5 layers, but num_hidden_layers = 6"),
            "{err}"
        );
        // Granite's width from mamba_expand must agree with its heads.
        let granite = r#"{"mamba_n_heads": 48, "mamba_d_head": 32, "mamba_n_groups": 1,
            "mamba_d_state": 128, "mamba_expand": 2, "layer_types": ["mamba", "attention"]}"#;
        let err = mamba(&map(granite), Some("granitemoehybrid"), 1536, 2).unwrap_err();
        assert!(err.contains("Mamba-2 width 3072"), "{err}");
    }

    #[test]
    fn jamba_runs_mamba1_mixers_on_its_attention_period() {
        let jamba = r#"{"mamba_d_state": 16, "mamba_expand": 2, "mamba_dt_rank": "auto",
            "attn_layer_period": 8, "attn_layer_offset": 4}"#;
        let h = mamba(&map(jamba), Some("jamba"), 4096, 32)
            .unwrap()
            .unwrap();
        assert_eq!((h.mixer_layers, h.attention_layers), (28, 4));
        // Step rank "auto": 4096 / 16; x projection's output whole on every shard.
        assert_eq!(
            h.mixer.projections(4096, 2),
            [
                ("mamba_in", 8192, 4096),
                ("mamba_x", 256 + 32, 4096),
                ("mamba_dt", 4096, 256),
                ("mamba_out", 4096, 4096)
            ]
        );
    }
}
