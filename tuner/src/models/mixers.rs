//! The mixers of the hybrid decoders whose GEMMs kerntune derives, behind one type: Mamba-2 and
//! Mamba-1 (`mamba.rs`), Qwen's gated delta nets (`delta_net.rs`), LFM2's short
//! convolutions (`short_conv.rs`), MiniMax's lightning attention (`lightning.rs`) and Kimi
//! Linear's delta attention (`kimi_delta.rs`), and how a hybrid's layers divide between its
//! mixers, attention and MLPs.

use super::delta_net::GatedDeltaNet;
use super::kimi_delta::KimiDelta;
use super::lightning::Lightning;
use super::mamba::{Mamba1, Mamba2};
use super::short_conv::ShortConv;

/// A non-attention mixer whose projections vLLM runs as GEMMs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mixer {
    Mamba2(Mamba2),
    Mamba1(Mamba1),
    DeltaNet(GatedDeltaNet),
    ShortConv(ShortConv),
    Lightning(Lightning),
    KimiDelta(KimiDelta),
}

impl Mixer {
    /// One shard's (role, N, K) GEMMs of one mixer at `tp` shards.
    pub fn projections(&self, hidden: usize, tp: usize) -> Vec<(&'static str, usize, usize)> {
        match self {
            Mixer::Mamba2(m) => m.projections(hidden, tp).to_vec(),
            Mixer::Mamba1(m) => m.projections(hidden, tp).to_vec(),
            Mixer::DeltaNet(d) => d.projections(hidden, tp).to_vec(),
            Mixer::ShortConv(c) => c.projections(hidden, tp).to_vec(),
            Mixer::Lightning(l) => l.projections(hidden, tp).to_vec(),
            Mixer::KimiDelta(k) => k.projections(hidden, tp).to_vec(),
        }
    }

    /// Weights of one mixer's projections, in elements.
    pub fn weights(&self, hidden: usize) -> usize {
        self.projections(hidden, 1)
            .iter()
            .map(|(_, n, k)| n * k)
            .sum()
    }

    /// Why `tp` shards cannot split the mixers as vLLM does, if they cannot.
    pub fn tp_refusal(&self, tp: usize) -> Option<String> {
        match self {
            Mixer::Mamba2(m) => m.tp_refusal(tp),
            Mixer::Mamba1(m) => m.tp_refusal(tp),
            Mixer::DeltaNet(d) => d.tp_refusal(tp),
            Mixer::ShortConv(c) => c.tp_refusal(tp),
            Mixer::Lightning(l) => l.tp_refusal(tp),
            Mixer::KimiDelta(k) => k.tp_refusal(tp),
        }
    }
}

/// A hybrid's mixer and how its layers divide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hybrid {
    pub mixer: Mixer,
    /// Layers with the mixer, layers with attention, layers with an MLP or experts (a layer
    /// may have several: Falcon-H1 runs mixer and attention side by side).
    pub mixer_layers: usize,
    pub attention_layers: usize,
    pub mlp_layers: usize,
    /// Where the schedule names expert layers (Nemotron-H's E), the layers among
    /// `mlp_layers` with a dense MLP instead; `None` where the experts' fields say it.
    pub dense_mlp_layers: Option<usize>,
}

impl Hybrid {
    /// `mixer_layers` of `layers` run `mixer`, the rest attention, and every layer an MLP
    /// or experts after it (Qwen3-Next, LFM2, MiniMax-Text-01, Kimi Linear).
    pub fn mixer_or_attention(mixer: Mixer, mixer_layers: usize, layers: usize) -> Hybrid {
        Hybrid {
            mixer,
            mixer_layers,
            attention_layers: layers - mixer_layers,
            mlp_layers: layers,
            dense_mlp_layers: None,
        }
    }
}
