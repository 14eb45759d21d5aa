//! `--shapes config.json` with the configs users bring: the dimensions of published models
//! (Qwen, DeepSeek and Llama 4 mixtures of experts, Gemma's multimodal config and query scale,
//! Granite's attention multiplier, transformers 5's `dtype`, KV heads replicated over shards,
//! DeepSeek's latent attention projections, the hybrids' mixers from Mamba to Kimi's delta
//! attention, families with their own field names, Llama-Nemotron's per-layer blocks, the
//! weight counts the default degree rests on), and clear refusals where the model's kernels
//! are not the ones kerntune tunes (latent attention itself, hybrid layers not read, quantized
//! weights, lengths past a chunk of chunked attention); ALiBi attention; sliding windows
//! derived for the layers that use them, gpt-oss's sinks and Gemma 2's soft-cap on all of
//! them.

mod common;

use common::tune;

/// The (origin, key) pairs `tune shapes` derives from `config` with `extra` arguments.
fn derive(config: &str, extra: &[&str]) -> Vec<(String, String)> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let mut args = vec!["shapes", "--shapes", "config.json", "--json"];
    args.extend_from_slice(extra);
    let out = tune(&args, dir.path());
    assert!(
        out.status.success(),
        "tune {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["origin"].as_str().unwrap().to_string(),
                r["key"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// `tune shapes` on `config` exits 2 with every one of `needles` in its message.
fn refused(config: &str, extra: &[&str], needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let mut args = vec!["shapes", "--shapes", "config.json"];
    args.extend_from_slice(extra);
    let out = tune(&args, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "tune {args:?}: {stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "expected `{needle}` in: {stderr}");
    }
}

/// The keys of the problems whose origin ends with ` role`.
fn keys_of<'a>(rows: &'a [(String, String)], role: &str) -> Vec<&'a str> {
    let suffix = format!(" {role}");
    rows.iter()
        .filter(|(origin, _)| origin.ends_with(&suffix))
        .map(|(_, key)| key.as_str())
        .collect()
}

const LLAMA8B: &str = r#""hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256"#;

#[test]
fn transformers_5_dtype_field_sets_the_input_type() {
    let rows = derive(
        &format!(r#"{{{LLAMA8B}, "dtype": "float16"}}"#),
        &["--tp", "2"],
    );
    assert!(!rows.is_empty());
    for (_, key) in &rows {
        assert!(key.contains("dtype=f16"), "{key}");
    }
}

#[test]
fn an_input_type_the_kernels_lack_needs_the_dtype_flag() {
    let config = format!(r#"{{{LLAMA8B}, "torch_dtype": "float8_e4m3fn"}}"#);
    refused(
        &config,
        &["--tp", "2"],
        &["`torch_dtype` = \"float8_e4m3fn\"", "--dtype"],
    );
    let rows = derive(&config, &["--tp", "2", "--dtype", "bf16"]);
    assert!(rows.iter().all(|(_, key)| key.contains("dtype=bf16")));
}

#[test]
fn multimodal_configs_are_read_from_text_config_with_their_query_scale() {
    // Gemma 3 27B: the decoder's fields under text_config, head_dim 128 given, queries scaled
    // by 1 / sqrt(query_pre_attn_scalar = 168).
    let config = r#"{"model_type": "gemma3", "torch_dtype": "bfloat16",
        "vision_config": {"hidden_size": 1152, "num_attention_heads": 16},
        "text_config": {"hidden_size": 5376, "intermediate_size": 21504,
            "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128,
            "num_hidden_layers": 62, "vocab_size": 262208, "query_pre_attn_scalar": 168,
            "sliding_window": 1024, "sliding_window_pattern": 6}}"#;
    // Five layers in six look back 1024 tokens at most: past that length, their windowed
    // problems beside the sixth layer's full ones.
    let rows = derive(config, &["--tp", "4"]);
    let sliding = keys_of(&rows, "sliding prefill");
    assert!(!sliding.is_empty());
    for key in sliding.iter().chain(&keys_of(&rows, "sliding decode")) {
        assert!(key.ends_with(",window=1024,scale=0.07715168"), "{key}");
        assert!(
            !key.contains("q_len=1024,") && !key.contains("context_len=1024,"),
            "{key}"
        );
    }
    assert!(keys_of(&rows, "tp4 prefill")
        .iter()
        .any(|key| key.contains("q_len=2048,") && !key.contains("window")));
    let within = [
        "--tp",
        "4",
        "--batch-sizes",
        "1",
        "--prefill-lens",
        "512,1024",
        "--context-lens",
        "1024",
    ];
    let rows = derive(config, &within);
    assert_eq!(
        keys_of(&rows, "qkv")[0],
        "gemm:m=1,n=2048,k=5376,dtype=bf16,b=nk"
    );
    assert_eq!(
        keys_of(&rows, "gate_up")[0],
        "gemm:m=1,n=10752,k=5376,dtype=bf16,b=nk"
    );
    let attention: Vec<&str> = keys_of(&rows, "prefill")
        .into_iter()
        .chain(keys_of(&rows, "decode"))
        .collect();
    assert_eq!(attention.len(), 3);
    assert!(keys_of(&rows, "prefill")[0].contains("q_len=512"));
    let expected = 1.0 / 168f32.sqrt();
    for key in attention {
        assert!(key.contains("q_heads=8,kv_heads=4,head_dim=128"), "{key}");
        let scale: f32 = key
            .split(',')
            .find_map(|kv| kv.strip_prefix("scale="))
            .unwrap_or_else(|| panic!("no scale in {key}"))
            .parse()
            .unwrap();
        assert!((scale - expected).abs() < 1e-6, "{key}: {scale}");
    }
}

#[test]
fn qwen3_moe_experts_run_at_their_own_width_and_share_of_tokens() {
    // Qwen3-30B-A3B: 128 experts of width 768, 8 a token, every layer sparse.
    let config = r#"{"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
        "torch_dtype": "bfloat16"}"#;
    let rows = derive(config, &["--tp", "4"]);
    let expert = keys_of(&rows, "expert_gate_up");
    assert!(expert.contains(&"gemm:m=1,n=384,k=2048,dtype=bf16,b=nk"));
    // 2048 prefill tokens, 8 of 128 experts each: 128 rows an expert.
    assert!(expert.contains(&"gemm:m=128,n=384,k=2048,dtype=bf16,b=nk"));
    assert!(keys_of(&rows, "expert_down").contains(&"gemm:m=128,n=2048,k=192,dtype=bf16,b=nk"));
    assert!(keys_of(&rows, "router").contains(&"gemm:m=1,n=128,k=2048,dtype=bf16,b=nk"));
    assert!(
        keys_of(&rows, "gate_up").is_empty(),
        "no layer of Qwen3-30B-A3B has a dense MLP"
    );
    // Expert parallelism: each of the 4 shards holds 32 whole experts, for every token
    // routed to them.
    let rows = derive(config, &["--tp", "4", "--expert-parallel"]);
    let expert = keys_of(&rows, "expert_gate_up");
    assert!(expert.contains(&"gemm:m=1,n=1536,k=2048,dtype=bf16,b=nk"));
    assert!(expert.contains(&"gemm:m=128,n=1536,k=2048,dtype=bf16,b=nk"));
    assert!(keys_of(&rows, "expert_down").contains(&"gemm:m=128,n=2048,k=768,dtype=bf16,b=nk"));
    // The attention is split as before.
    assert_eq!(
        keys_of(&rows, "qkv")[0],
        "gemm:m=1,n=1280,k=2048,dtype=bf16,b=nk"
    );
}

#[test]
fn shared_experts_and_dense_layers_are_derived_too() {
    // Qwen1.5-MoE-A2.7B: a shared expert of width 5632 beside 60 routed ones.
    let qwen = r#"{"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_attention_heads": 16,
        "num_key_value_heads": 16, "num_hidden_layers": 24, "num_experts": 60,
        "num_experts_per_tok": 4, "vocab_size": 151936}"#;
    let rows = derive(qwen, &["--tp", "2", "--batch-sizes", "1"]);
    assert_eq!(
        keys_of(&rows, "shared_gate_up")[0],
        "gemm:m=1,n=5632,k=2048,dtype=bf16,b=nk"
    );
    assert_eq!(
        keys_of(&rows, "expert_gate_up")[0],
        "gemm:m=1,n=1408,k=2048,dtype=bf16,b=nk"
    );
    assert!(keys_of(&rows, "gate_up").is_empty());
    // Its shared expert's output scaled by a gate of one output (vLLM's Qwen2MoeSparseMoeBlock).
    assert_eq!(
        keys_of(&rows, "shared_expert_gate")[0],
        "gemm:m=1,n=1,k=2048,dtype=bf16,b=nk"
    );
    // DeepSeekMoE 16B: the first layer dense (width 10944), two shared experts of width 1408.
    let deepseek = r#"{"hidden_size": 2048, "intermediate_size": 10944,
        "moe_intermediate_size": 1408, "num_attention_heads": 16, "num_key_value_heads": 16,
        "num_hidden_layers": 28, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "first_k_dense_replace": 1, "vocab_size": 102400}"#;
    let rows = derive(deepseek, &["--tp", "2", "--batch-sizes", "1"]);
    assert_eq!(
        keys_of(&rows, "gate_up")[0],
        "gemm:m=1,n=10944,k=2048,dtype=bf16,b=nk"
    );
    assert_eq!(
        keys_of(&rows, "shared_gate_up")[0],
        "gemm:m=1,n=2816,k=2048,dtype=bf16,b=nk"
    );
    assert_eq!(
        keys_of(&rows, "router")[0],
        "gemm:m=1,n=64,k=2048,dtype=bf16,b=nk"
    );
    assert!(keys_of(&rows, "shared_expert_gate").is_empty());
    // Granite's MoE with a shared expert names its width shared_intermediate_size.
    let granite = r#"{"model_type": "granitemoeshared", "hidden_size": 1024,
        "intermediate_size": 512, "shared_intermediate_size": 1536, "num_local_experts": 32,
        "num_experts_per_tok": 8, "num_attention_heads": 16, "num_key_value_heads": 8,
        "num_hidden_layers": 24, "vocab_size": 49155}"#;
    let rows = derive(granite, &["--tp", "1", "--batch-sizes", "1"]);
    assert_eq!(
        keys_of(&rows, "shared_gate_up")[0],
        "gemm:m=1,n=3072,k=1024,dtype=bf16,b=nk"
    );
    // 60 experts do not spread evenly over 8 shards.
    refused(
        qwen,
        &["--tp", "8", "--expert-parallel"],
        &["--expert-parallel over 8 shards", "60 experts"],
    );
    // A degree that splits the dense width but not the experts' is named with both.
    refused(
        deepseek,
        &["--tp", "64"],
        &["--tp 64", "the experts' intermediate size = 1408"],
    );
}

/// DeepSeek-V3's published config, less what does not shape a kernel.
const DEEPSEEK_V3: &str = r#""model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
    "num_key_value_heads": 128, "num_hidden_layers": 61, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_layer_freq": 1,
    "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "torch_dtype": "bfloat16""#;

#[test]
fn latent_attention_runs_its_own_projections() {
    let v3 = format!("{{{DEEPSEEK_V3}}}");
    let one_of_each = ["--tp", "8", "--batch-sizes", "1", "--prefill-lens", "2048"];
    let rows = derive(&v3, &[&one_of_each[..], &["--kernels", "gemm"]].concat());
    // vLLM's fused down projection of queries and latent (1536 + 512 + 64), whole on every
    // shard; 16 of the 128 heads per shard.
    let gemm = |m, n, k| format!("gemm:m={m},n={n},k={k},dtype=bf16,b=nk");
    assert_eq!(
        keys_of(&rows, "qkv_a"),
        [gemm(1, 2112, 7168), gemm(2048, 2112, 7168)]
    );
    assert_eq!(
        keys_of(&rows, "q_b"),
        [gemm(1, 3072, 1536), gemm(2048, 3072, 1536)]
    );
    // Keys and values are projected up from the latent for prompts only.
    assert_eq!(keys_of(&rows, "kv_b"), [gemm(2048, 4096, 512)]);
    assert_eq!(
        keys_of(&rows, "o"),
        [gemm(1, 7168, 2048), gemm(2048, 7168, 2048)]
    );
    assert!(keys_of(&rows, "qkv").is_empty());
    // The experts, the shared one and the three dense layers as for any DeepSeek MoE.
    assert_eq!(keys_of(&rows, "expert_gate_up")[0], gemm(1, 512, 7168));
    assert_eq!(keys_of(&rows, "gate_up")[0], gemm(1, 4608, 7168));
    assert_eq!(keys_of(&rows, "lm_head"), [gemm(1, 16160, 7168)]);
    // Its prefill is flash attention on the keys and values projected up from the latent:
    // the shard's 16 query heads, each on its own keys of 192 values (128 projected, 64
    // rotary) and values of 128, at 1 / sqrt(192) (the keys' default, left out of its key);
    // its decode is paged attention on the
    // latent cache, the 16 query heads on one row of 576 values a token, whose first 512 are
    // the value, at the same scale.
    let all = derive(
        &v3,
        &[&one_of_each[..], &["--context-lens", "4096"]].concat(),
    );
    let scale = 1.0 / 192f32.sqrt();
    assert_eq!(
        keys_of(&all, "prefill"),
        ["flash:batch=1,q_len=2048,kv_len=2048,q_heads=16,kv_heads=16,head_dim=192,causal=true,dtype=bf16,v_head_dim=128"]
    );
    let decode = derive(
        &v3,
        &[
            &one_of_each[..],
            &["--kernels", "gemm,paged", "--context-lens", "4096"],
        ]
        .concat(),
    );
    let latent = "paged:num_seqs=1,context_len=4096,q_heads=16,kv_heads=1,head_dim=576,block_size=16,dtype=bf16,v_head_dim=512";
    assert_eq!(
        keys_of(&decode, "decode"),
        [format!("{latent},scale={scale}")]
    );
    assert_eq!(decode.len(), rows.len() + 1);
    assert_eq!(all.len(), rows.len() + 2);
    // Under YaRN rope scaling vLLM scales the scores by mscale² too (DeepSeek-V3's factor
    // 40 and mscale_all_dim 1: 0.1 · ln 40 + 1 = 1.369); fp8 caches take its format.
    let yarn = format!(
        r#"{{{DEEPSEEK_V3}, "rope_scaling": {{"type": "yarn", "factor": 40, "mscale": 1.0,
        "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}}}}"#
    );
    let scaled = derive(
        &yarn,
        &[
            "--tp",
            "8",
            "--batch-sizes",
            "1",
            "--context-lens",
            "4096",
            "--kernels",
            "paged",
            "--kv-cache-dtype",
            "fp8_e4m3",
        ],
    );
    let mscale = 0.1 * 40f64.ln() + 1.0;
    let scale = (mscale * mscale / 192f64.sqrt()) as f32;
    assert_eq!(
        keys_of(&scaled, "decode"),
        [format!("{latent},kv_dtype=fp8_e4m3,scale={scale}")]
    );
    // Published with FP8 weights scaled per 128 x 128 block: its projections are
    // block-scaled fp8 GEMMs of the same shapes, the LM head and the router unquantized.
    let fp8 = format!(
        r#"{{{DEEPSEEK_V3}, "quantization_config": {{"quant_method": "fp8", "fmt": "e4m3",
        "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}}}"#
    );
    let blocked = derive(
        &fp8,
        &[
            &one_of_each[..],
            &["--kernels", "gemm,paged", "--context-lens", "4096"],
        ]
        .concat(),
    );
    let mut scaled = 0;
    let as_bf16: Vec<(String, String)> = blocked
        .iter()
        .map(|(origin, key)| {
            let plain = key.replace("dtype=fp8_e4m3,b=nk,block=128", "dtype=bf16,b=nk");
            if plain != *key {
                scaled += 1;
            } else if key.starts_with("gemm") {
                let role = origin.rsplit(' ').next().unwrap();
                assert!(["lm_head", "router"].contains(&role), "{origin}: {key}");
            }
            (origin.clone(), plain)
        })
        .collect();
    assert_eq!(as_bf16, decode);
    // All but the router's two and the decode's LM head.
    assert_eq!(scaled, rows.len() - 3, "{blocked:?}");
    // Blocks that are not square are no kernel's, named with advice that succeeds.
    let oblong = fp8.replace("[128, 128]", "[128, 64]");
    refused(
        &oblong,
        &one_of_each,
        &[
            "weight_block_size = [128,64]",
            "--kernels flash,paged",
            "--dtype bf16",
        ],
    );
    let unquantized = derive(
        &fp8,
        &[
            &one_of_each[..],
            &[
                "--kernels",
                "gemm,paged",
                "--dtype",
                "bf16",
                "--context-lens",
                "4096",
            ],
        ]
        .concat(),
    );
    assert_eq!(unquantized, decode);

    // DeepSeek-V3.2's indexer: its own query projection from the queries' latent and a key
    // and head-weight projection, whole on every shard.
    let v32 = format!(
        r#"{{{DEEPSEEK_V3}, "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}}"#
    );
    let rows = derive(&v32, &[&one_of_each[..], &["--kernels", "gemm"]].concat());
    // Its sparse attention (each query over the 2048 keys its indexer picks) is no kernel's.
    refused(
        &v32,
        &[&one_of_each[..], &["--kernels", "paged"]].concat(),
        &["sparse", "index_topk = 2048", "--kernels gemm"],
    );
    assert_eq!(keys_of(&rows, "indexer_q")[0], gemm(1, 8192, 1536));
    assert_eq!(keys_of(&rows, "indexer_k")[0], gemm(1, 192, 7168));

    // DeepSeek-V2-Lite: a full-rank query projection and the latent's down projection apart.
    let lite = r#"{"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
        "moe_intermediate_size": 1408, "num_attention_heads": 16, "num_key_value_heads": 16,
        "num_hidden_layers": 27, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "moe_layer_freq": 1, "first_k_dense_replace": 1,
        "kv_lora_rank": 512, "q_lora_rank": null, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400,
        "torch_dtype": "bfloat16"}"#;
    let rows = derive(
        lite,
        &[
            "--tp",
            "2",
            "--batch-sizes",
            "1",
            "--prefill-lens",
            "512",
            "--kernels",
            "gemm",
        ],
    );
    assert_eq!(keys_of(&rows, "q")[0], gemm(1, 1536, 2048));
    assert_eq!(keys_of(&rows, "kv_a")[0], gemm(1, 576, 2048));
    assert_eq!(keys_of(&rows, "kv_b"), [gemm(512, 2048, 512)]);
    assert_eq!(keys_of(&rows, "o")[0], gemm(1, 2048, 1024));
    assert!(keys_of(&rows, "qkv_a").is_empty());

    // A latent attention config without its head sizes is named, not guessed.
    refused(
        &v3.replace(r#""qk_rope_head_dim": 64,"#, ""),
        &["--kernels", "gemm"],
        &["kv_lora_rank = 512", "`qk_rope_head_dim`"],
    );
}

#[test]
fn deepseek_counts_its_moe_layer_frequency_from_the_first_layer() {
    // Every second layer from layer 0 has experts, so the odd ones run the dense MLP.
    let config = |freq: usize| {
        format!(
            r#"{{"hidden_size": 2048, "intermediate_size": 10944,
            "moe_intermediate_size": 1408, "num_attention_heads": 16, "num_hidden_layers": 4,
            "n_routed_experts": 64, "num_experts_per_tok": 6, "moe_layer_freq": {freq},
            "vocab_size": 102400}}"#
        )
    };
    let args = ["--tp", "2", "--batch-sizes", "1", "--kernels", "gemm"];
    let every = derive(&config(1), &args);
    assert!(keys_of(&every, "gate_up").is_empty());
    let second = derive(&config(2), &args);
    assert_eq!(
        keys_of(&second, "gate_up")[0],
        "gemm:m=1,n=10944,k=2048,dtype=bf16,b=nk"
    );
}

/// FP8 checkpoints whose scales are per tensor, token or channel (llm-compressor's
/// compressed-tensors FP8 and FP8_DYNAMIC, AutoFP8's `fp8`, FBGEMM's) derive fp8 GEMMs for
/// their projections, E4M3 as the device runs it (fnuz on MI300X); the LM head and a
/// mixture's router stay at the model's dtype, as do attention's inputs. `--dtype` asks for
/// unquantized GEMMs; weight-only, int8 and block-scaled schemes are refused by name.
#[test]
fn fp8_checkpoints_derive_fp8_gemms_for_their_projections() {
    let compressed = |weights: &str, activations: &str| {
        format!(
            r#"{{{LLAMA8B}, "torch_dtype": "bfloat16", "quantization_config": {{
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "ignore": ["lm_head"], "config_groups": {{"group_0": {{"targets": ["Linear"],
            "weights": {weights}, "input_activations": {activations}}}}}}}}}"#
        )
    };
    let fp8 = |strategy: &str| {
        format!(
            r#"{{"num_bits": 8, "type": "float", "strategy": "{strategy}", "symmetric": true}}"#
        )
    };
    let llama = compressed(&fp8("channel"), &fp8("token"));
    let args = ["--tp", "1", "--batch-sizes", "4", "--prefill-lens", "512"];
    let rows = derive(&llama, &args);
    for (role, n, k) in [
        ("qkv", 6144, 4096),
        ("o", 4096, 4096),
        ("gate_up", 28672, 4096),
        ("down", 4096, 14336),
    ] {
        assert_eq!(
            keys_of(&rows, role),
            [
                format!("gemm:m=4,n={n},k={k},dtype=fp8_e4m3,b=nk"),
                format!("gemm:m=512,n={n},k={k},dtype=fp8_e4m3,b=nk"),
            ],
            "{role}"
        );
    }
    assert_eq!(
        keys_of(&rows, "lm_head"),
        ["gemm:m=4,n=128256,k=4096,dtype=bf16,b=nk"]
    );
    assert!(rows
        .iter()
        .filter(|(_, key)| !key.starts_with("gemm:"))
        .all(|(_, key)| key.contains("dtype=bf16")));
    // On an MI300X, E4M3 is its hardware's fnuz.
    let mi300x = derive(&llama, &[&args[..], &["--device", "mi300x"]].concat());
    assert_eq!(
        keys_of(&mi300x, "o")[0],
        "gemm:m=4,n=4096,k=4096,dtype=fp8_e4m3fnuz,b=nk"
    );
    // Per-tensor scales, AutoFP8's and FBGEMM's configs: the same problems.
    for quantization in [
        compressed(&fp8("tensor"), &fp8("tensor")),
        format!(
            r#"{{{LLAMA8B}, "quantization_config": {{"quant_method": "fp8",
            "activation_scheme": "static", "ignored_layers": ["lm_head"]}}}}"#
        ),
        format!(
            r#"{{{LLAMA8B}, "quantization_config": {{"quant_method": "fbgemm_fp8",
            "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]}}}}"#
        ),
    ] {
        assert_eq!(derive(&quantization, &args), rows, "{quantization}");
    }
    // A mixture's router stays unquantized; its experts are fp8.
    let moe = llama.replace(
        r#""torch_dtype""#,
        r#""model_type": "qwen3_moe", "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "torch_dtype""#,
    );
    let rows = derive(&moe, &args);
    assert_eq!(
        keys_of(&rows, "router")[0],
        "gemm:m=4,n=128,k=4096,dtype=bf16,b=nk"
    );
    assert_eq!(
        keys_of(&rows, "expert_down")[0],
        "gemm:m=1,n=4096,k=768,dtype=fp8_e4m3,b=nk"
    );
    // --dtype asks for the unquantized GEMMs.
    let dense = derive(&llama, &[&args[..], &["--dtype", "bf16"]].concat());
    assert!(dense.iter().all(|(_, key)| key.contains("dtype=bf16")));
    // Other schemes are named.
    let int8 = r#"{"num_bits": 8, "type": "int", "strategy": "channel"}"#;
    for (config, needle) in [
        (
            compressed(&fp8("channel"), "null"),
            "8-bit float weights, unquantized activations",
        ),
        (
            compressed(int8, int8),
            "8-bit int weights, 8-bit int activations",
        ),
        (compressed(&fp8("block"), &fp8("token")), "scaled per block"),
    ] {
        refused(
            &config,
            &["--tp", "1"],
            &[needle, "--dtype bf16", "--kernels flash,paged"],
        );
    }
    // --dtype fp8 says where fp8 GEMMs come from.
    refused(
        &llama,
        &["--tp", "1", "--dtype", "fp8_e4m3"],
        &["quantization_config", "dtype=fp8_e4m3"],
    );
}

/// 4-bit checkpoints (AWQ, GPTQ, compressed-tensors W4A16) derive int4 GEMMs: the
/// projections' weights in GPTQ's packing (`b=kn`) in groups of the config's `group_size`
/// (all of k for -1 or per channel), the activations at the model's dtype; the LM head stays
/// unquantized. Act-order, other bit widths and grouping no shard's k holds whole are refused
/// by name, as are the schemes kerntune does not compute, unless the flags leave their GEMMs
/// out.
#[test]
fn four_bit_checkpoints_derive_int4_gemms() {
    let with = |quantization: &str| {
        format!(r#"{{{LLAMA8B}, "torch_dtype": "float16", "quantization_config": {quantization}}}"#)
    };
    let args = ["--tp", "2", "--kernels", "gemm", "--batch-sizes", "1"];
    let awq = with(
        r#"{"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}"#,
    );
    let rows = derive(&awq, &args);
    for (role, key) in [
        ("qkv", "gemm:m=1,n=3072,k=4096,dtype=f16,b=kn,int4=128"),
        ("o", "gemm:m=1,n=4096,k=2048,dtype=f16,b=kn,int4=128"),
        ("gate_up", "gemm:m=1,n=14336,k=4096,dtype=f16,b=kn,int4=128"),
        ("down", "gemm:m=1,n=4096,k=7168,dtype=f16,b=kn,int4=128"),
        ("lm_head", "gemm:m=1,n=64128,k=4096,dtype=f16,b=nk"),
    ] {
        assert_eq!(keys_of(&rows, role)[0], key, "{role}: {rows:?}");
    }
    // GPTQ (sym or not: zero points are the call's), one group per column for -1; AWQ's own
    // field names; compressed-tensors' W4A16 by group and by channel.
    let packed = |strategy: &str| {
        with(&format!(
            r#"{{"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {{"group_0": {{"targets": ["Linear"], "input_activations": null, "weights": {{"num_bits": 4, "type": "int", "symmetric": true, {strategy}, "actorder": null}}}}}}, "ignore": ["lm_head"]}}"#
        ))
    };
    for (config, o) in [
        (
            with(
                r#"{"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "sym": true}"#,
            ),
            "gemm:m=1,n=4096,k=2048,dtype=f16,b=kn,int4=128",
        ),
        (
            with(r#"{"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": false}"#),
            "gemm:m=1,n=4096,k=2048,dtype=f16,b=kn,int4=2048",
        ),
        (
            with(r#"{"quant_method": "awq", "w_bit": 4, "q_group_size": 64}"#),
            "gemm:m=1,n=4096,k=2048,dtype=f16,b=kn,int4=64",
        ),
        (
            packed(r#""strategy": "group", "group_size": 32"#),
            "gemm:m=1,n=4096,k=2048,dtype=f16,b=kn,int4=32",
        ),
        (
            packed(r#""strategy": "channel""#),
            "gemm:m=1,n=4096,k=2048,dtype=f16,b=kn,int4=2048",
        ),
    ] {
        assert_eq!(keys_of(&derive(&config, &args), "o")[0], o, "{config}");
    }
    // --dtype asks for unquantized GEMMs of the same shapes.
    let dense = derive(&awq, &[&args[..], &["--dtype", "bf16"]].concat());
    assert!(dense.iter().all(|(_, key)| key.contains("dtype=bf16,b=nk")));
    // What the int4 GEMMs do not compute is named, with the flags that leave it out.
    for (config, needle) in [
        (
            with(r#"{"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true}"#),
            "desc_act = true",
        ),
        (
            with(r#"{"quant_method": "gptq", "bits": 8, "group_size": 128}"#),
            "8-bit gptq",
        ),
        (
            with(r#"{"quant_method": "awq", "bits": 4, "group_size": 100}"#),
            "grouped by 100",
        ),
        (
            with(r#"{"quant_method": "bitsandbytes", "load_in_4bit": true}"#),
            "quant_method = \"bitsandbytes\"",
        ),
        (
            packed(r#""strategy": "group", "group_size": 128, "actorder": "group""#)
                .replace(r#", "actorder": null"#, ""),
            "act-order",
        ),
    ] {
        refused(
            &config,
            &["--tp", "1"],
            &[needle, "--kernels flash,paged", "--dtype bf16"],
        );
    }
    // Groups of 1024 at TP 8: the o projection's shard holds 512 values of k.
    refused(
        &with(r#"{"quant_method": "awq", "bits": 4, "group_size": 1024}"#),
        &["--tp", "8", "--kernels", "gemm"],
        &["tp8 o", "must divide k = 512", "another --tp"],
    );
    let bnb = with(r#"{"quant_method": "bitsandbytes", "load_in_4bit": true}"#);
    let attention = derive(&bnb, &["--tp", "1", "--kernels", "flash,paged"]);
    assert!(!attention.is_empty());
    assert!(attention.iter().all(|(_, key)| !key.starts_with("gemm:")));
}

/// Gemma 2 soft-caps its attention scores at 50: every attention problem carries the cap;
/// Gemma 3's null is none, and a cap that is not positive is named.
#[test]
fn gemma_2_attention_is_soft_capped() {
    // Gemma 2 9B.
    let config = r#"{"hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "num_hidden_layers": 42,
        "vocab_size": 256000, "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0,
        "torch_dtype": "bfloat16"}"#;
    let attention = derive(
        config,
        &[
            "--tp",
            "2",
            "--kernels",
            "flash,paged",
            "--prefill-lens",
            "512",
            "--batch-sizes",
            "4",
            "--context-lens",
            "2048",
        ],
    );
    let mut keys: Vec<&str> = attention.iter().map(|(_, key)| key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "flash:batch=1,q_len=512,kv_len=512,q_heads=8,kv_heads=4,head_dim=256,causal=true,dtype=bf16,softcap=50",
            "paged:num_seqs=4,context_len=2048,q_heads=8,kv_heads=4,head_dim=256,block_size=16,dtype=bf16,softcap=50",
        ]
    );
    let gemma3 = config.replace("50.0", "null");
    assert!(derive(&gemma3, &["--tp", "2"])
        .iter()
        .all(|(_, key)| !key.contains("softcap")));
    refused(
        &config.replace("50.0", "-1"),
        &["--tp", "2"],
        &["attn_logit_softcapping", "must be positive"],
    );
    let rows = derive(
        config,
        &["--tp", "2", "--kernels", "gemm", "--batch-sizes", "1"],
    );
    assert_eq!(
        keys_of(&rows, "qkv")[0],
        "gemm:m=1,n=4096,k=3584,dtype=bf16,b=nk"
    );
}

/// gpt-oss-20b's published config: 64 query heads of 64 dims (wider than its hidden size of
/// 2880) on 8 KV heads, a window of 128 tokens every other layer, a sink per query head in
/// every layer, 32 experts of which a token runs 4, MXFP4 experts.
fn gpt_oss_20b(quantized: bool) -> String {
    let layers = [r#""sliding_attention", "full_attention""#; 12].join(", ");
    let quantization = match quantized {
        true => {
            r#", "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert":
            ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}"#
        }
        false => "",
    };
    format!(
        r#"{{"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "attention_bias": true, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2880, "initial_context_length": 4096, "intermediate_size": 2880,
        "layer_types": [{layers}], "max_position_embeddings": 131072,
        "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
        "num_key_value_heads": 8, "num_local_experts": 32, "rms_norm_eps": 1e-05,
        "rope_scaling": {{"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
            "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false}},
        "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 201088{quantization}}}"#
    )
}

/// gpt-oss: every attention problem carries the sinks, the windowed layers' and the full
/// ones'; its MXFP4 experts leave the GEMMs to `--dtype bf16` or to explicit problems, and
/// `--kernels flash,paged` tunes its attention alone.
#[test]
fn gpt_oss_attention_has_sinks_in_every_layer() {
    let lens = [
        "--tp",
        "2",
        "--prefill-lens",
        "1024",
        "--context-lens",
        "4096",
        "--batch-sizes",
        "8",
    ];
    let rows = derive(&gpt_oss_20b(false), &lens);
    for role in [
        "tp2 prefill",
        "sliding prefill",
        "tp2 decode",
        "sliding decode",
    ] {
        assert_eq!(keys_of(&rows, role).len(), 1, "{role}: {rows:?}");
    }
    assert_eq!(
        keys_of(&rows, "tp2 prefill")[0],
        "flash:batch=1,q_len=1024,kv_len=1024,q_heads=32,kv_heads=4,head_dim=64,causal=true,dtype=bf16,sinks=true"
    );
    assert_eq!(
        keys_of(&rows, "sliding decode")[0],
        "paged:num_seqs=8,context_len=4096,q_heads=32,kv_heads=4,head_dim=64,block_size=16,dtype=bf16,window=128,sinks=true"
    );
    let attention: Vec<&String> = rows
        .iter()
        .map(|(_, key)| key)
        .filter(|key| !key.starts_with("gemm:"))
        .collect();
    assert_eq!(attention.len(), 4);
    assert!(attention.iter().all(|key| key.contains(",sinks=true")));
    // Queries 64 heads of 64 wide, over a hidden size of 2880; 32 experts, 4 a token.
    assert_eq!(
        keys_of(&rows, "qkv")[0],
        "gemm:m=8,n=2560,k=2880,dtype=bf16,b=nk"
    );
    assert_eq!(
        keys_of(&rows, "o")[0],
        "gemm:m=8,n=2880,k=2048,dtype=bf16,b=nk"
    );
    assert_eq!(
        keys_of(&rows, "expert_gate_up")[0],
        "gemm:m=1,n=2880,k=2880,dtype=bf16,b=nk"
    );

    let quantized = gpt_oss_20b(true);
    refused(
        &quantized,
        &lens,
        &["mxfp4", "--kernels flash,paged", "--dtype bf16"],
    );
    let mut alone = lens.to_vec();
    alone.extend(["--kernels", "flash,paged"]);
    let rows = derive(&quantized, &alone);
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert!(rows.iter().all(|(_, key)| key.contains(",sinks=true")));
}

#[test]
fn malformed_expert_fields_are_named() {
    let cases = [
        (
            format!(r#"{{{LLAMA8B}, "num_experts": 8}}"#),
            "num_experts_per_tok",
        ),
        (
            format!(r#"{{{LLAMA8B}, "num_experts": 8, "num_experts_per_tok": 9}}"#),
            "num_experts_per_tok = 9 exceeds num_experts = 8",
        ),
        (
            format!(
                r#"{{{LLAMA8B}, "num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [0, 40]}}"#
            ),
            "mlp_only_layers",
        ),
        ("[1, 2]".to_string(), "a config.json is a JSON object"),
    ];
    for (config, needle) in cases {
        refused(&config, &["--tp", "1"], &[needle]);
    }
}

#[test]
fn kv_heads_are_replicated_beyond_their_count_and_must_split_evenly() {
    // Llama-3.1-70B at TP 16: 4 query heads a shard, its 8 KV heads each on two shards, so a
    // shard's QKV projection has 4 + 2·1 heads of 128.
    let llama70b = r#"{"hidden_size": 8192, "intermediate_size": 28672,
        "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80,
        "vocab_size": 128256}"#;
    let rows = derive(llama70b, &["--tp", "16", "--batch-sizes", "1"]);
    assert_eq!(
        keys_of(&rows, "qkv")[0],
        "gemm:m=1,n=768,k=8192,dtype=bf16,b=nk"
    );
    assert!(keys_of(&rows, "decode")[0].contains("q_heads=4,kv_heads=1,"));
    // Phi-3-medium's 10 KV heads neither split over 4 shards nor replicate evenly.
    let phi3 = r#"{"hidden_size": 5120, "intermediate_size": 17920, "num_attention_heads": 40,
        "num_key_value_heads": 10, "num_hidden_layers": 40, "vocab_size": 32064}"#;
    refused(
        phi3,
        &["--tp", "4"],
        &["--tp 4", "num_key_value_heads = 10"],
    );
    assert!(!derive(phi3, &["--tp", "2"]).is_empty());
    // A server whose KV cache has blocks of 32 tokens.
    let rows = derive(
        phi3,
        &["--tp", "2", "--block-size", "32", "--kernels", "paged"],
    );
    assert!(!rows.is_empty());
    assert!(rows.iter().all(|(_, key)| key.contains(",block_size=32,")));
}

#[test]
fn a_sliding_window_is_derived_for_the_layers_that_use_it() {
    // Mistral 7B v0.1 looks back 4096 tokens on every layer: past that, only the windowed
    // problem; within it, the full one (the window hides nothing).
    let dir = tempfile::tempdir().unwrap();
    let out = tune(
        &[
            "shapes",
            "--shapes",
            "mistral7b",
            "--context-lens",
            "4096,8192",
            "--json",
        ],
        dir.path(),
    );
    assert!(out.status.success());
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let decode: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .filter(|key| key.starts_with("paged:"))
        .collect();
    assert!(!decode.is_empty());
    for key in decode {
        match key.contains("context_len=8192,") {
            true => assert!(key.ends_with(",window=4096"), "{key}"),
            false => assert!(!key.contains("window"), "{key}"),
        }
    }
    // gpt-oss's schedule (its sinks aside): a window of 128 tokens every other layer
    // (`layer_types`), full attention on the rest; Qwen2 with the window on its layers from
    // `max_window_layers` on.
    let alternate = vec![r#""sliding_attention", "full_attention""#; 16].join(", ");
    let gpt_oss = format!(r#"{{{LLAMA8B}, "sliding_window": 128, "layer_types": [{alternate}]}}"#);
    let qwen = format!(
        r#"{{{LLAMA8B}, "sliding_window": 4096, "use_sliding_window": true, "max_window_layers": 28}}"#
    );
    for config in [gpt_oss, qwen] {
        let rows = derive(
            &config,
            &["--tp", "1", "--context-lens", "8192", "--batch-sizes", "1"],
        );
        let full = keys_of(&rows, "tp1 decode");
        let sliding = keys_of(&rows, "sliding decode");
        assert_eq!((full.len(), sliding.len()), (1, 1), "{config}: {rows:?}");
        assert!(!full[0].contains("window"), "{}", full[0]);
        assert!(sliding[0].contains(",window="), "{}", sliding[0]);
    }
    // Every layer of a Qwen2 within `max_window_layers` attends fully: no window.
    let qwen_full = format!(
        r#"{{{LLAMA8B}, "sliding_window": 4096, "use_sliding_window": true, "max_window_layers": 32}}"#
    );
    let rows = derive(&qwen_full, &["--tp", "1", "--context-lens", "8192"]);
    assert!(rows.iter().all(|(_, key)| !key.contains("window")));
    // Qwen2.5 writes a window it leaves off.
    let qwen = format!(r#"{{{LLAMA8B}, "sliding_window": 32768, "use_sliding_window": false}}"#);
    let rows = derive(&qwen, &["--tp", "1", "--context-lens", "65536"]);
    assert!(keys_of(&rows, "decode")
        .iter()
        .all(|key| key.contains("context_len=65536")));
}

#[test]
fn llama4_interleaves_dense_layers_and_runs_a_shared_expert() {
    // Llama 4 Maverick's decoder: experts (width 8192) every other layer beside a shared
    // expert, dense layers of width 16384 between them, attention in chunks of 8192 tokens.
    let config = r#"{"model_type": "llama4", "text_config": {"model_type": "llama4_text",
        "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
        "num_hidden_layers": 48, "num_local_experts": 128, "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2, "attention_chunk_size": 8192, "vocab_size": 202048}}"#;
    let rows = derive(config, &["--tp", "8", "--batch-sizes", "1"]);
    let first = |role: &str| keys_of(&rows, role)[0].to_string();
    assert_eq!(first("qkv"), "gemm:m=1,n=896,k=5120,dtype=bf16,b=nk");
    assert_eq!(
        first("expert_gate_up"),
        "gemm:m=1,n=2048,k=5120,dtype=bf16,b=nk"
    );
    // The shared expert runs every token: 2048 prefill tokens against the routed experts'
    // 16 each (one of 128 experts a token). At one token both are one problem, kept once.
    assert!(keys_of(&rows, "shared_gate_up").contains(&"gemm:m=2048,n=2048,k=5120,dtype=bf16,b=nk"));
    assert!(keys_of(&rows, "expert_gate_up").contains(&"gemm:m=16,n=2048,k=5120,dtype=bf16,b=nk"));
    assert_eq!(first("gate_up"), "gemm:m=1,n=4096,k=5120,dtype=bf16,b=nk");
    assert_eq!(first("down"), "gemm:m=1,n=5120,k=2048,dtype=bf16,b=nk");
    refused(
        config,
        &["--tp", "8", "--context-lens", "16384"],
        &["attention_chunk_size = 8192", "16384 tokens exceed it"],
    );
}

/// Two shards, one batch size, prefill length and context length: a problem per role.
const ONE_BUCKET_EACH: [&str; 8] = [
    "--tp",
    "2",
    "--batch-sizes",
    "1",
    "--prefill-lens",
    "512",
    "--context-lens",
    "1024",
];

#[test]
fn granite_scales_attention_by_its_attention_multiplier() {
    // Granite 3's 8B: queries scaled by attention_multiplier = 1/128, not 1 / sqrt(128).
    let config = r#"{"model_type": "granite", "hidden_size": 4096, "intermediate_size": 12800,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 40,
        "vocab_size": 49155, "attention_multiplier": 0.0078125, "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22, "logits_scaling": 16.0, "torch_dtype": "bfloat16"}"#;
    let args = ONE_BUCKET_EACH;
    let rows = derive(config, &args);
    let attention: Vec<&str> = keys_of(&rows, "prefill")
        .into_iter()
        .chain(keys_of(&rows, "decode"))
        .collect();
    assert_eq!(attention.len(), 2);
    for key in attention {
        assert!(key.ends_with(",scale=0.0078125"), "{key}");
    }
    assert_eq!(
        keys_of(&rows, "qkv")[0],
        "gemm:m=1,n=3072,k=4096,dtype=bf16,b=nk"
    );
    refused(
        &config.replace("0.0078125", "-1"),
        &args,
        &["`attention_multiplier` must be positive"],
    );
}

#[test]
fn hybrid_models_tune_their_attention_layers_alone() {
    let attention_only = [&["--kernels", "flash,paged"], &ONE_BUCKET_EACH[..]].concat();
    // Nemotron-H's schedule string, Granite 4.0-H's layer list, Qwen3-Next's interval of
    // gated-delta-net layers: GEMMs refused naming the field, --dtype no way round it.
    let base = r#""hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 8, "vocab_size": 131072"#;
    let mamba = r#""mamba", "mamba", "mamba", "attention", "mamba", "mamba", "mamba", "mamba""#;
    for (config, field) in [
        (
            format!(r#"{{{base}, "hybrid_override_pattern": "M-M*-M-M"}}"#),
            "`hybrid_override_pattern` = \"M-M*-M-M\"",
        ),
        (
            format!(r#"{{{base}, "layer_types": [{mamba}], "mamba_d_state": 128}}"#),
            "`layer_types` lists 7 \"mamba\" of its 8 layers",
        ),
        (
            format!(r#"{{{base}, "full_attention_interval": 4, "linear_num_key_heads": 16}}"#),
            "`full_attention_interval` interleaves",
        ),
    ] {
        refused(
            &config,
            &["--tp", "2"],
            &[
                field,
                "not every layer is attention",
                "--kernels flash,paged",
            ],
        );
        refused(&config, &["--tp", "2", "--dtype", "bf16"], &[field]);
        let rows = derive(&config, &attention_only);
        assert_eq!(rows.len(), 2, "{rows:?}");
        for (_, key) in &rows {
            assert!(!key.starts_with("gemm:"), "{key}");
            assert!(key.contains("q_heads=16,kv_heads=4,head_dim=128"), "{key}");
        }
    }
    // A state-space model has no attention to tune at all.
    refused(
        r#"{"model_type": "mamba", "hidden_size": 2560, "intermediate_size": 5120,
            "state_size": 16, "num_hidden_layers": 64, "vocab_size": 50280}"#,
        &[],
        &[
            "no attention heads",
            "`state_size` describes a state-space mixer",
        ],
    );
    // Attention-only layer lists (Gemma 3, gpt-oss, Qwen3 under transformers 5) are plain.
    let plain = format!(
        r#"{{{base}, "layer_types": ["full_attention", "full_attention", "full_attention",
            "full_attention", "full_attention", "full_attention", "full_attention",
            "full_attention"]}}"#
    );
    assert!(keys_of(&derive(&plain, &["--tp", "2"]), "qkv").len() > 1);
}

#[test]
fn ungated_mlps_run_one_up_projection() {
    // Phi-2: fc1 (2560 -> 10240), GELU, fc2; no gate beside the up projection.
    let config = r#"{"model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240,
        "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 51200,
        "hidden_act": "gelu_new", "torch_dtype": "float16"}"#;
    let rows = derive(
        config,
        &["--tp", "1", "--batch-sizes", "1", "--prefill-lens", "512"],
    );
    assert!(keys_of(&rows, "gate_up").is_empty(), "{rows:?}");
    assert_eq!(
        keys_of(&rows, "up"),
        [
            "gemm:m=1,n=10240,k=2560,dtype=f16,b=nk",
            "gemm:m=512,n=10240,k=2560,dtype=f16,b=nk"
        ]
    );
    assert_eq!(
        keys_of(&rows, "down")[0],
        "gemm:m=1,n=2560,k=10240,dtype=f16,b=nk"
    );
    // The same fields under a gated family keep the fused gate and up projection.
    let gated = derive(
        &config.replace("\"phi\"", "\"llama\""),
        &["--tp", "1", "--batch-sizes", "1", "--prefill-lens", "512"],
    );
    assert_eq!(
        keys_of(&gated, "gate_up")[0],
        "gemm:m=1,n=20480,k=2560,dtype=f16,b=nk"
    );
    // Apertus (xIELU) and Arcee's AFM (squared ReLU) run no gate either.
    for family in ["apertus", "arcee"] {
        let rows = derive(
            &config.replace("\"phi\"", &format!("\"{family}\"")),
            &["--tp", "1", "--batch-sizes", "1"],
        );
        assert!(keys_of(&rows, "gate_up").is_empty(), "{family}: {rows:?}");
        assert_eq!(
            keys_of(&rows, "up")[0],
            "gemm:m=1,n=10240,k=2560,dtype=f16,b=nk"
        );
    }
}

#[test]
fn encoders_are_refused_naming_what_they_are() {
    refused(
        r#"{"model_type": "bert", "hidden_size": 1024, "intermediate_size": 4096,
            "num_attention_heads": 16, "num_hidden_layers": 24, "vocab_size": 30522}"#,
        &[],
        &[
            "an encoder (model_type bert)",
            "decoder-only",
            "--shapes gemm:",
        ],
    );
    refused(
        r#"{"model_type": "t5", "is_encoder_decoder": true, "d_model": 1024,
            "num_heads": 16, "num_layers": 24, "vocab_size": 32128}"#,
        &[],
        &["an encoder-decoder model (is_encoder_decoder = true"],
    );
}

#[test]
fn experts_under_names_not_read_are_refused_rather_than_derived_dense() {
    // Step-3's text model names its experts its own way; read as a dense model, every layer
    // would run an MLP of intermediate_size its server never runs.
    let step3 = r#"{"model_type": "step3_text", "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 5120, "moe_num_experts": 48, "moe_top_k": 3,
        "share_expert_dim": 5120, "moe_layers_enum": "4,5,6", "num_attention_heads": 64,
        "num_key_value_heads": 8, "num_hidden_layers": 8, "vocab_size": 128815}"#;
    refused(
        step3,
        &["--tp", "1"],
        &[
            "moe_num_experts",
            "moe_top_k",
            "names kerntune does not read",
            "--kernels flash,paged",
        ],
    );
    let attention = derive(step3, &["--tp", "1", "--kernels", "flash,paged"]);
    assert!(!attention.is_empty());
    assert!(attention.iter().all(|(_, key)| !key.starts_with("gemm:")));
    // Experts read, but their shared experts or the schedule of their layers not: a
    // shared-expert count under Hunyuan's name in a config that is not Hunyuan's, Arctic's MoE
    // layer frequency.
    let qwen_moe = r#""hidden_size": 2048, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "num_attention_heads": 32, "num_key_value_heads": 4,
        "num_hidden_layers": 48, "vocab_size": 151936"#;
    for (extra, field) in [
        (r#""num_shared_expert": 1"#, "num_shared_expert"),
        (r#""moe_layer_frequency": 2"#, "moe_layer_frequency"),
    ] {
        refused(
            &format!("{{{qwen_moe}, {extra}}}"),
            &["--tp", "1"],
            &[field, "names kerntune does not read"],
        );
    }
    assert!(!derive(&format!("{{{qwen_moe}}}"), &["--tp", "1"]).is_empty());
    // Expert fields that say "none" leave a dense model dense.
    let dense = format!(r#"{{{LLAMA8B}, "num_local_experts": 0, "moe_k": null}}"#);
    let rows = derive(
        &dense,
        &["--tp", "1", "--batch-sizes", "1", "--kernels", "gemm"],
    );
    assert_eq!(
        keys_of(&rows, "gate_up")[0],
        "gemm:m=1,n=28672,k=4096,dtype=bf16,b=nk"
    );
}

#[test]
fn hunyuan_reads_its_experts_per_layer_and_its_mixed_shared_mlp() {
    // Hunyuan-A13B's shape (vLLM's hunyuan_v1.py): 64 experts of 3072, 8 active, the mixed
    // MLP two experts of intermediate_size wide here, every list one value per layer.
    let lists = |value: u32| format!("[{}]", vec![value.to_string(); 32].join(", "));
    let hunyuan = |topk: &str, extra: &str| {
        format!(
            r#"{{"model_type": "hunyuan_v1_moe", "hidden_size": 4096, "intermediate_size": 3072,
            "moe_intermediate_size": {}, "num_experts": 64, "moe_topk": {topk},
            "num_shared_expert": {}, "use_mixed_mlp_moe": true, "num_attention_heads": 32,
            "num_key_value_heads": 8, "attention_head_dim": 128, "num_hidden_layers": 32,
            "vocab_size": 128167, "use_cla": false, "cla_share_factor": 2{extra}}}"#,
            lists(3072),
            lists(2)
        )
    };
    let a13b = hunyuan(&lists(8), "");
    let rows = derive(
        &a13b,
        &["--tp", "2", "--batch-sizes", "1", "--prefill-lens", "512"],
    );
    assert_eq!(
        keys_of(&rows, "shared_gate_up")[0],
        "gemm:m=1,n=6144,k=4096,dtype=bf16,b=nk"
    );
    // 512 tokens, each to 8 of 64 experts: 64 rows an expert.
    assert!(keys_of(&rows, "expert_gate_up").contains(&"gemm:m=64,n=3072,k=4096,dtype=bf16,b=nk"));
    assert_eq!(
        keys_of(&rows, "router")[0],
        "gemm:m=1,n=64,k=4096,dtype=bf16,b=nk"
    );
    assert!(
        keys_of(&rows, "gate_up").is_empty(),
        "every layer is a MoE layer"
    );
    // Layers that differ, and Hunyuan-Large's cross-layer attention, are named.
    refused(
        &hunyuan("[8, 4]", ""),
        &["--tp", "2"],
        &["`moe_topk` differs between layers", "--shapes gemm:"],
    );
    let cla = hunyuan(&lists(8), "").replace(r#""use_cla": false"#, r#""use_cla": true"#);
    refused(
        &cla,
        &["--tp", "2"],
        &[
            "cross-layer attention",
            "cla_share_factor = 2",
            "--kernels flash,paged",
        ],
    );
    let attention = derive(&cla, &["--tp", "2", "--kernels", "flash,paged"]);
    assert!(!attention.is_empty());
    // One expert is Hunyuan's dense MLP.
    let dense = a13b
        .replace(r#""num_experts": 64"#, r#""num_experts": 1"#)
        .replace(
            r#""intermediate_size": 3072"#,
            r#""intermediate_size": 5120"#,
        );
    let rows = derive(
        &dense,
        &["--tp", "2", "--batch-sizes", "1", "--kernels", "gemm"],
    );
    assert_eq!(
        keys_of(&rows, "gate_up")[0],
        "gemm:m=1,n=5120,k=4096,dtype=bf16,b=nk"
    );
    assert!(keys_of(&rows, "expert_gate_up").is_empty());
}

#[test]
fn the_first_qwen_counts_gate_and_up_together_in_its_intermediate_size() {
    // Qwen-7B: intermediate_size 22016 is its two projections of 11008 each.
    let qwen = |model_type: &str| {
        format!(
            r#"{{"model_type": "{model_type}", "hidden_size": 4096, "intermediate_size": 22016,
            "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 151936}}"#
        )
    };
    let args = ["--tp", "2", "--batch-sizes", "1", "--kernels", "gemm"];
    let rows = derive(&qwen("qwen"), &args);
    assert_eq!(
        keys_of(&rows, "gate_up")[0],
        "gemm:m=1,n=11008,k=4096,dtype=bf16,b=nk"
    );
    assert_eq!(
        keys_of(&rows, "down")[0],
        "gemm:m=1,n=4096,k=5504,dtype=bf16,b=nk"
    );
    // Qwen2 and later count one projection, as Llama does.
    let rows = derive(&qwen("qwen2"), &args);
    assert_eq!(
        keys_of(&rows, "gate_up")[0],
        "gemm:m=1,n=22016,k=4096,dtype=bf16,b=nk"
    );
}

/// The attention problems of `rows`, and whether every one of them (some at least) has ALiBi.
fn attention_with_alibi(rows: &[(String, String)]) -> bool {
    let attention: Vec<&str> = rows
        .iter()
        .map(|(_, key)| key.as_str())
        .filter(|key| key.starts_with("flash:") || key.starts_with("paged:"))
        .collect();
    assert!(!attention.is_empty(), "no attention problems: {rows:?}");
    let biased = attention
        .iter()
        .filter(|k| k.ends_with(",alibi=true"))
        .count();
    assert!(biased == 0 || biased == attention.len(), "{attention:?}");
    biased > 0
}

#[test]
fn alibi_models_derive_their_attention_with_alibi() {
    // Baichuan2-13B biases its logits by distance (ALiBi); the 7B is rotary, as Llama.
    let baichuan = |hidden: usize, heads: usize| {
        format!(
            r#"{{"model_type": "baichuan", "hidden_size": {hidden}, "intermediate_size": 13696,
            "num_attention_heads": {heads}, "num_hidden_layers": 40, "vocab_size": 125696}}"#
        )
    };
    let rows = derive(&baichuan(5120, 40), &["--tp", "8"]);
    assert!(attention_with_alibi(&rows));
    assert!(rows.iter().any(|(_, key)| key.starts_with(
        "flash:batch=1,q_len=512,kv_len=512,q_heads=5,kv_heads=5,head_dim=128,causal=true,dtype=bf16,alibi=true"
    )));
    assert!(!attention_with_alibi(&derive(
        &baichuan(4096, 32),
        &["--tp", "1"]
    )));
    // Falcon's switch, on and off.
    let falcon = |on: bool| format!(r#"{{{LLAMA8B}, "alibi": {on}}}"#);
    assert!(attention_with_alibi(&derive(&falcon(true), &["--tp", "1"])));
    assert!(!attention_with_alibi(&derive(
        &falcon(false),
        &["--tp", "1"]
    )));
}

#[test]
fn mamba2_hybrids_derive_their_mixers_projections() {
    let one_each = ["--batch-sizes", "1", "--prefill-lens", "512"];
    let gemm = |m, n, k| format!("gemm:m={m},n={n},k={k},dtype=bf16,b=nk");
    // In the shape of Nemotron-H 8B: each layer a Mamba-2 mixer (M), attention (*) or a
    // squared-ReLU MLP without a gate (-).
    let pattern = "M-M-M-M*-".repeat(4) + "M-M-M-M-";
    let nemotron = |pattern: &str| {
        format!(
            r#"{{"model_type": "nemotron_h", "hidden_size": 4096, "intermediate_size": 21504,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "num_hidden_layers": {}, "vocab_size": 131072, "mamba_num_heads": 128,
            "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128,
            "hybrid_override_pattern": "{pattern}"}}"#,
            pattern.len()
        )
    };
    let rows = derive(
        &nemotron(&pattern),
        &[&one_each[..], &["--tp", "2"]].concat(),
    );
    // z and x (2 × 8192), B and C (2 × 8 groups × 128), 128 step sizes, over 2 shards.
    assert_eq!(
        keys_of(&rows, "mamba_in"),
        [gemm(1, 9280, 4096), gemm(512, 9280, 4096)]
    );
    assert_eq!(keys_of(&rows, "mamba_out")[0], gemm(1, 4096, 4096));
    assert_eq!(keys_of(&rows, "up")[0], gemm(1, 10752, 4096));
    assert!(keys_of(&rows, "gate_up").is_empty());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(1, 3072, 4096));
    assert!(rows.iter().any(|(_, key)| key.starts_with("flash:")));
    // 16 shards would split 8 groups: vLLM refuses, so does kerntune.
    refused(
        &nemotron(&pattern),
        &["--tp", "16"],
        &["--tp 16", "8 Mamba-2 groups"],
    );
    // Expert layers (E) need the experts' fields.
    refused(
        &nemotron(&pattern.replacen('-', "E", 3)),
        &["--tp", "2"],
        &["names expert layers, but no experts are given"],
    );
    // In the shape of Nemotron 3 Nano: Mamba-2, expert and attention layers, squared-ReLU
    // experts without a gate and a wider shared expert, no dense MLP layer.
    let nano_pattern = "MEMEM*E".repeat(7) + "MEMEMEMEM";
    let nano = |extra: &str| {
        format!(
            r#"{{"model_type": "nemotron_h", "hidden_size": 2688, "intermediate_size": 1856,
            "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
            "num_hidden_layers": {}, "vocab_size": 131072, "mamba_num_heads": 64,
            "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128,
            "hybrid_override_pattern": "{nano_pattern}", "n_routed_experts": 128,
            "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
            "moe_shared_expert_intermediate_size": 3712, "n_shared_experts": 1{extra}}}"#,
            nano_pattern.len()
        )
    };
    let rows = derive(&nano(""), &[&one_each[..], &["--tp", "2"]].concat());
    assert_eq!(keys_of(&rows, "expert_up")[0], gemm(1, 928, 2688));
    assert_eq!(keys_of(&rows, "shared_up")[0], gemm(1, 1856, 2688));
    assert_eq!(keys_of(&rows, "shared_down")[0], gemm(1, 2688, 1856));
    assert_eq!(keys_of(&rows, "mamba_in")[0], gemm(1, 5152, 2688));
    assert!(keys_of(&rows, "expert_gate_up").is_empty());
    assert!(keys_of(&rows, "up").is_empty(), "no dense MLP layer");
    // Nemotron 3 Super's latent experts (moe_latent_size): every token down to 1024 and
    // back, whole on each shard; the experts between at that width.
    let rows = derive(
        &nano(r#", "moe_latent_size": 1024"#),
        &[&one_each[..], &["--tp", "2"]].concat(),
    );
    assert_eq!(keys_of(&rows, "expert_latent_in")[0], gemm(1, 1024, 2688));
    assert_eq!(keys_of(&rows, "expert_latent_out")[0], gemm(1, 2688, 1024));
    assert_eq!(keys_of(&rows, "expert_up")[0], gemm(1, 928, 1024));
    assert_eq!(keys_of(&rows, "expert_down")[0], gemm(1, 1024, 928));
    assert_eq!(keys_of(&rows, "shared_up")[0], gemm(1, 1856, 2688));
    // Two shared experts of moe_shared_expert_intermediate_size are twice as wide.
    let rows = derive(
        &nano("").replace(r#""n_shared_experts": 1"#, r#""n_shared_experts": 2"#),
        &[&one_each[..], &["--tp", "2"]].concat(),
    );
    assert_eq!(keys_of(&rows, "shared_up")[0], gemm(1, 3712, 2688));

    // In the shape of Granite 4.0-H Tiny: Mamba-2 or attention, then experts and a shared
    // MLP, in every layer; its single group of B and C copied to each shard.
    let layer_types = r#""mamba", "mamba", "mamba", "mamba", "mamba", "attention""#;
    let granite = |experts: usize| {
        format!(
            r#"{{"model_type": "granitemoehybrid", "hidden_size": 1536,
            "intermediate_size": 512, "shared_intermediate_size": 1024,
            "num_local_experts": {experts}, "num_experts_per_tok": {}, "num_attention_heads": 12,
            "num_key_value_heads": 4, "num_hidden_layers": 12, "vocab_size": 100352,
            "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128,
            "mamba_expand": 2, "layer_types": [{layer_types}, {layer_types}]}}"#,
            experts.min(6)
        )
    };
    let rows = derive(&granite(64), &[&one_each[..], &["--tp", "4"]].concat());
    assert_eq!(keys_of(&rows, "mamba_in")[0], gemm(1, 1804, 1536));
    assert_eq!(keys_of(&rows, "mamba_out")[0], gemm(1, 1536, 768));
    assert_eq!(keys_of(&rows, "shared_gate_up")[0], gemm(1, 512, 1536));
    assert_eq!(keys_of(&rows, "expert_gate_up")[0], gemm(1, 256, 1536));
    // Without experts (Granite 4.0-H Micro) the shared MLP is its only one.
    let rows = derive(&granite(0), &[&one_each[..], &["--tp", "1"]].concat());
    assert_eq!(keys_of(&rows, "mamba_in")[0], gemm(1, 6448, 1536));
    assert_eq!(keys_of(&rows, "gate_up")[0], gemm(1, 2048, 1536));

    // Falcon-H1: a Mamba-2 mixer and attention side by side in every layer, the mixer's
    // width given by mamba_d_ssm.
    let falcon = r#"{"model_type": "falcon_h1", "hidden_size": 2048, "intermediate_size": 8192,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
        "num_hidden_layers": 24, "vocab_size": 65536, "mamba_d_ssm": 3072, "mamba_n_heads": 48,
        "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4}"#;
    let rows = derive(falcon, &[&one_each[..], &["--tp", "2"]].concat());
    assert_eq!(keys_of(&rows, "mamba_in")[0], gemm(1, 3608, 2048));
    assert_eq!(keys_of(&rows, "mamba_out")[0], gemm(1, 2048, 1536));
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(1, 768, 2048));
    assert_eq!(keys_of(&rows, "gate_up")[0], gemm(1, 8192, 2048));
    refused(
        &falcon.replace(r#""mamba_d_ssm": 3072"#, r#""mamba_d_ssm": 3000"#),
        &["--tp", "2"],
        &["Mamba-2 width 3000", "mamba_n_heads × mamba_d_head"],
    );

    // Jamba v0.1: Mamba-1 mixers with attention every 8th layer from the 4th, experts every
    // 2nd layer from the 1st and a dense MLP between.
    let jamba = r#"{"model_type": "jamba", "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        "vocab_size": 65536, "num_experts": 16, "num_experts_per_tok": 2,
        "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8,
        "attn_layer_offset": 4, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
        "mamba_dt_rank": 256}"#;
    let rows = derive(jamba, &[&one_each[..], &["--tp", "2"]].concat());
    assert_eq!(keys_of(&rows, "mamba_in")[0], gemm(1, 8192, 4096));
    assert_eq!(keys_of(&rows, "mamba_x")[0], gemm(1, 288, 4096));
    assert_eq!(keys_of(&rows, "mamba_dt")[0], gemm(1, 4096, 256));
    assert_eq!(keys_of(&rows, "mamba_out")[0], gemm(1, 4096, 4096));
    // Dense layers' MLP at every token count, the experts' at their share of the tokens.
    assert!(keys_of(&rows, "gate_up").contains(&gemm(512, 14336, 4096).as_str()));
    assert!(keys_of(&rows, "expert_gate_up").contains(&gemm(64, 14336, 4096).as_str()));

    // Bamba names its attention layers by index.
    let bamba = r#"{"model_type": "bamba", "hidden_size": 4096, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        "vocab_size": 128256, "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_n_groups": 1,
        "mamba_d_state": 128, "mamba_expand": 2, "attn_layer_indices": [9, 18, 27]}"#;
    let rows = derive(bamba, &[&one_each[..], &["--tp", "1"]].concat());
    assert_eq!(keys_of(&rows, "mamba_in")[0], gemm(1, 16768, 4096));
    assert_eq!(keys_of(&rows, "gate_up")[0], gemm(1, 28672, 4096));
}

#[test]
fn gpt_style_and_falcon_configs_are_read_under_their_own_names() {
    let args = ["--batch-sizes", "1", "--prefill-lens", "512", "--tp"];
    let gemm = |n, k, dtype| format!("gemm:m=1,n={n},k={k},dtype={dtype},b=nk");
    // StarCoder (GPTBigCode): n_* names, one KV head (multi-query), an ungated MLP.
    let starcoder = r#"{"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48,
        "n_layer": 40, "n_inner": 24576, "multi_query": true, "vocab_size": 49152,
        "torch_dtype": "float32"}"#;
    let rows = derive(starcoder, &[&args[..], &["2"]].concat());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(3328, 6144, "f32"));
    assert_eq!(keys_of(&rows, "up")[0], gemm(12288, 6144, "f32"));
    assert!(rows
        .iter()
        .any(|(_, key)| key.starts_with("flash:") && key.contains("q_heads=24,kv_heads=1")));
    // GPT-J 6B: n_inner null is four times the width.
    let gptj = r#"{"model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28,
        "n_inner": null, "rotary_dim": 64, "vocab_size": 50400}"#;
    let rows = derive(gptj, &[&args[..], &["1"]].concat());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(12288, 4096, "bf16"));
    assert_eq!(keys_of(&rows, "up")[0], gemm(16384, 4096, "bf16"));
    // Falcon-40B: 8 KV heads under the new decoder architecture; Falcon-7B multi-query.
    let falcon40 = r#"{"model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128,
        "num_hidden_layers": 60, "num_kv_heads": 8, "new_decoder_architecture": true,
        "alibi": false, "vocab_size": 65024}"#;
    let rows = derive(falcon40, &[&args[..], &["8"]].concat());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(1152, 8192, "bf16"));
    assert_eq!(keys_of(&rows, "up")[0], gemm(4096, 8192, "bf16"));
    let falcon7 = r#"{"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
        "num_hidden_layers": 32, "multi_query": true, "vocab_size": 65024}"#;
    let rows = derive(falcon7, &[&args[..], &["1"]].concat());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(4672, 4544, "bf16"));
    // 71 heads split over no degree but 1 and 71.
    refused(falcon7, &["--tp", "2"], &["--tp 2", "q_heads = 71"]);
}

#[test]
fn qwen3_next_derives_its_delta_nets_and_gated_attention() {
    let gemm = |m, n, k| format!("gemm:m={m},n={n},k={k},dtype=bf16,b=nk");
    // Qwen3-Next-80B-A3B: three delta-net layers to one full-attention layer, 512 experts.
    let config = |extra: &str| {
        format!(
            r#"{{"model_type": "qwen3_next", "hidden_size": 2048, "intermediate_size": 5120,
            "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
            "num_hidden_layers": 48, "vocab_size": 151936, "full_attention_interval": 4,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128, "num_experts": 512,
            "num_experts_per_tok": 10, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512, "torch_dtype": "bfloat16"{extra}}}"#
        )
    };
    let args = ["--tp", "4", "--batch-sizes", "1", "--prefill-lens", "512"];
    let rows = derive(&config(""), &args);
    // q, k (2 × 2048) and v, z (2 × 4096) over 4 shards; beta and alpha 2 × 32 / 4.
    assert_eq!(keys_of(&rows, "linear_qkvz")[0], gemm(1, 3072, 2048));
    assert_eq!(keys_of(&rows, "linear_ba")[0], gemm(1, 16, 2048));
    assert_eq!(keys_of(&rows, "linear_out")[0], gemm(1, 2048, 1024));
    // The query and its output gate (2 × 4 heads), one KV head replicated, of 256.
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(1, 2560, 2048));
    assert!(rows.iter().any(|(_, key)| key
        .starts_with("flash:batch=1,q_len=512,kv_len=512,q_heads=4,kv_heads=1,head_dim=256")));
    // Without the gate the query is its heads alone.
    let ungated = derive(&config(r#", "attn_output_gate": false"#), &args);
    assert_eq!(keys_of(&ungated, "qkv")[0], gemm(1, 1536, 2048));
}

#[test]
fn dbrx_mpt_bloom_chatglm_opt_and_exaone_are_read_under_their_own_names() {
    let args = ["--batch-sizes", "1", "--prefill-lens", "512", "--tp"];
    let gemm = |n, k| format!("gemm:m=1,n={n},k={k},dtype=bf16,b=nk");
    // DBRX: d_model and nested attn_config/ffn_config; every layer 16 GLU experts, 4 active.
    let dbrx = r#"{"model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40,
        "vocab_size": 100352, "max_seq_len": 32768, "torch_dtype": "bfloat16",
        "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
        "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4}}"#;
    let rows = derive(dbrx, &[&args[..], &["8"]].concat());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(1024, 6144));
    assert_eq!(keys_of(&rows, "expert_gate_up")[0], gemm(2688, 6144));
    assert_eq!(keys_of(&rows, "expert_down")[0], gemm(6144, 1344));
    assert_eq!(keys_of(&rows, "router")[0], gemm(16, 6144));
    assert!(
        keys_of(&rows, "gate_up").is_empty(),
        "no dense MLP: {rows:?}"
    );
    // MPT-7B: ALiBi in vLLM whatever attn_config says; an ungated MLP of expansion_ratio
    // times the width.
    let mpt = r#"{"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32,
        "expansion_ratio": 4, "vocab_size": 50432, "attn_config": {"alibi": true}}"#;
    let rows = derive(mpt, &[&args[..], &["1"]].concat());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(12288, 4096));
    assert_eq!(keys_of(&rows, "up")[0], gemm(16384, 4096));
    assert!(attention_with_alibi(&rows));
    // Bloom-176B: n_head, n_layer, four times the width; ALiBi on its 14 heads a TP8 rank.
    let bloom = r#"{"model_type": "bloom", "hidden_size": 14336, "n_head": 112, "n_layer": 70,
        "vocab_size": 250880}"#;
    let rows = derive(bloom, &[&args[..], &["8"]].concat());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(5376, 14336));
    assert_eq!(keys_of(&rows, "up")[0], gemm(7168, 14336));
    assert!(attention_with_alibi(&rows));
    assert!(rows.iter().any(|(_, key)| key.starts_with(
        "paged:num_seqs=1,context_len=4096,q_heads=14,kv_heads=14,head_dim=128,block_size=16,dtype=bf16"
    ) && key.ends_with(",alibi=true")));
    // GLM-4-9B (model_type chatglm): 2 KV groups, a gated MLP, the padded vocabulary.
    let glm = r#"{"model_type": "chatglm", "hidden_size": 4096, "num_attention_heads": 32,
        "multi_query_attention": true, "multi_query_group_num": 2, "kv_channels": 128,
        "ffn_hidden_size": 13696, "num_layers": 40, "padded_vocab_size": 151552,
        "torch_dtype": "bfloat16"}"#;
    let rows = derive(glm, &[&args[..], &["2"]].concat());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(2304, 4096));
    assert_eq!(keys_of(&rows, "gate_up")[0], gemm(13696, 4096));
    assert_eq!(keys_of(&rows, "lm_head")[0], gemm(75776, 4096));
    assert!(rows
        .iter()
        .any(|(_, key)| key.starts_with("paged:")
            && key.contains("q_heads=16,kv_heads=1,head_dim=128")));
    // OPT-13B: ffn_dim, ungated; OPT-350m's narrower embeddings are refused by name.
    let opt = |hidden: usize, embed: usize| {
        format!(
            r#"{{"model_type": "opt", "hidden_size": {hidden}, "num_attention_heads": 16,
            "ffn_dim": {}, "num_hidden_layers": 24, "vocab_size": 50272,
            "word_embed_proj_dim": {embed}, "torch_dtype": "bfloat16"}}"#,
            4 * hidden
        )
    };
    let rows = derive(&opt(5120, 5120), &[&args[..], &["2"]].concat());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(7680, 5120));
    assert_eq!(keys_of(&rows, "up")[0], gemm(10240, 5120));
    // Its 50272 tokens: the head runs vLLM's padding to 50304 rows, 25152 a shard.
    assert_eq!(keys_of(&rows, "lm_head")[0], gemm(25152, 5120));
    refused(
        &opt(1024, 512),
        &[],
        &["word_embed_proj_dim = 512", "--kernels flash,paged"],
    );
    // EXAONE 3.5: num_layers.
    let exaone = r#"{"model_type": "exaone", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "num_layers": 32,
        "vocab_size": 102400}"#;
    let rows = derive(exaone, &[&args[..], &["1"]].concat());
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(6144, 4096));
    assert_eq!(keys_of(&rows, "gate_up")[0], gemm(28672, 4096));
}

/// MiniMax-M2's published config (shape fields).
const MINIMAX_M2: &str = r#"{"model_type": "minimax_m2", "hidden_size": 3072,
    "intermediate_size": 1536, "num_attention_heads": 48, "num_key_value_heads": 8,
    "head_dim": 128, "num_hidden_layers": 62, "vocab_size": 200064, "num_local_experts": 256,
    "num_experts_per_tok": 8, "shared_intermediate_size": 0, "rotary_dim": 64,
    "use_qk_norm": true, "qk_norm_type": "per_layer", "scoring_func": "sigmoid",
    "attn_type_list": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1], "torch_dtype": "bfloat16"}"#;

#[test]
fn minimax_m2_is_softmax_attention_and_experts_without_a_shared_one() {
    // Every layer's attn_type_list entry is 1 (softmax), and a shared width of 0 is none.
    let rows = derive(
        MINIMAX_M2,
        &["--tp", "8", "--batch-sizes", "1", "--prefill-lens", "512"],
    );
    let gemm = |n, k| format!("gemm:m=1,n={n},k={k},dtype=bf16,b=nk");
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(1024, 3072));
    assert_eq!(keys_of(&rows, "expert_gate_up")[0], gemm(384, 3072));
    assert!(
        !rows.iter().any(|(origin, _)| origin.contains("shared")),
        "{rows:?}"
    );
    assert!(rows.iter().any(|(_, key)| key.starts_with("flash:")));
    assert!(keys_of(&rows, "lightning_qkv").is_empty(), "{rows:?}");
}

#[test]
fn minimax_text_01_runs_its_lightning_attention_layers_projections() {
    // MiniMax-Text-01's shape: seven lightning layers to one softmax layer, 64 heads of 128
    // on a hidden size of 6144, 32 experts of 9216.
    let config = r#"{"model_type": "minimax_text_01", "hidden_size": 6144,
        "intermediate_size": 9216, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 128, "num_hidden_layers": 8, "vocab_size": 200064,
        "num_local_experts": 32, "num_experts_per_tok": 2, "shared_intermediate_size": 0,
        "rotary_dim": 64, "attn_type_list": [0, 0, 0, 0, 0, 0, 0, 1],
        "torch_dtype": "bfloat16"}"#;
    let rows = derive(
        config,
        &["--tp", "8", "--batch-sizes", "1", "--prefill-lens", "512"],
    );
    let gemm = |n, k| format!("gemm:m=1,n={n},k={k},dtype=bf16,b=nk");
    assert_eq!(keys_of(&rows, "lightning_qkv")[0], gemm(3072, 6144));
    assert_eq!(keys_of(&rows, "lightning_gate")[0], gemm(1024, 6144));
    assert_eq!(keys_of(&rows, "lightning_out")[0], gemm(6144, 1024));
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(1280, 6144));
    assert_eq!(keys_of(&rows, "expert_gate_up")[0], gemm(2304, 6144));
    assert!(rows
        .iter()
        .any(|(_, key)| key.starts_with("paged:")
            && key.contains("q_heads=8,kv_heads=1,head_dim=128")));
    // 64 heads do not split over 3 shards.
    refused(config, &["--tp", "3"], &["--tp 3"]);
}

#[test]
fn the_default_degree_splits_the_heads_and_says_when_no_shard_fits() {
    let dir = tempfile::tempdir().unwrap();
    // 48 heads, too large for 16 MI250 shards (64 GiB each): 32 would fit but does not split
    // the heads, so the shapes are 16 shards', with a note.
    let on_mi250 = [
        "shapes",
        "--device",
        "mi250",
        "--shapes",
        "config.json",
        "--batch-sizes",
        "1",
    ];
    let mut big: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(MINIMAX_M2).unwrap();
    big.insert("num_hidden_layers".into(), 400.into());
    big.remove("attn_type_list");
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_string(&big).unwrap(),
    )
    .unwrap();
    let out = tune(&on_mi250, dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no power-of-two tensor-parallel degree both splits it and fits")
            && stderr.contains("--tp 16"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(" tp16 "));
    // The published size fits 8 shards, which split it: no note.
    std::fs::write(dir.path().join("config.json"), MINIMAX_M2).unwrap();
    let out = tune(&on_mi250, dir.path());
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(" tp8 "));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("note:"));
}

#[test]
fn llama_nemotron_layers_each_run_their_own_kv_heads_and_mlp_width() {
    // Llama-3.3-Nemotron-Super-style `block_configs`: layers with 8 or 1 KV heads or no
    // attention, MLPs 5.25, 2.625 or 1.95 times the width (28672, 14336 and 10752) or none.
    let config = |second_attention: &str| {
        format!(
            r#"{{"model_type": "nemotron-nas", "architectures": ["DeciLMForCausalLM"],
            "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": null,
            "intermediate_size": null, "num_hidden_layers": 4, "vocab_size": 128256,
            "torch_dtype": "bfloat16", "block_configs": [
            {{"attention": {{"n_heads_in_group": 8, "no_op": false}}, "ffn": {{"ffn_mult": 5.25}}}},
            {{"attention": {second_attention}, "ffn": {{"ffn_mult": 2.625}}}},
            {{"attention": {{"n_heads_in_group": 64}}, "ffn": {{"no_op": true}}}},
            {{"attention": {{"n_heads_in_group": 8}}, "ffn": {{"ffn_mult": 1.95}}}}]}}"#
        )
    };
    let rows = derive(
        &config(r#"{"no_op": true, "n_heads_in_group": null}"#),
        &["--tp", "2", "--batch-sizes", "1", "--prefill-lens", "512"],
    );
    let gemm = |n, k| format!("gemm:m=1,n={n},k={k},dtype=bf16,b=nk");
    // 32 query heads a shard with 4 KV heads, or with the single one replicated.
    let mut qkv = keys_of(&rows, "qkv");
    qkv.retain(|k| k.starts_with("gemm:m=1,"));
    qkv.sort();
    assert_eq!(qkv, [gemm(4352, 8192), gemm(5120, 8192)]);
    let mut gate_up = keys_of(&rows, "gate_up");
    gate_up.retain(|k| k.starts_with("gemm:m=1,"));
    gate_up.sort();
    assert_eq!(
        gate_up,
        [gemm(10752, 8192), gemm(14336, 8192), gemm(28672, 8192)]
    );
    assert!(keys_of(&rows, "down").contains(&gemm(8192, 5376).as_str()));
    for kv in [1, 4] {
        let flash = format!("q_heads=32,kv_heads={kv},head_dim=128");
        assert!(
            rows.iter()
                .any(|(_, key)| key.starts_with("flash:") && key.contains(&flash)),
            "{flash}: {rows:?}"
        );
        assert!(
            rows.iter()
                .any(|(_, key)| key.starts_with("paged:") && key.contains(&flash)),
            "{flash}: {rows:?}"
        );
    }
    // A linear layer in place of attention is no layer vLLM builds.
    refused(
        &config(r#"{"replace_with_linear": true, "n_heads_in_group": null}"#),
        &[],
        &["block_configs[1].attention.replace_with_linear"],
    );
}

#[test]
fn gemma_3n_attention_is_derived_at_its_scale_and_its_gemms_are_refused() {
    // Gemma 3n E4B's text config: per-layer MLP widths (a list), head size 256, a window of
    // 512 tokens on four layers in five.
    let widths = vec!["16384"; 35].join(", ");
    let kinds = vec![r#""sliding_attention""#; 35].join(", ");
    let config = format!(
        r#"{{"model_type": "gemma3n", "torch_dtype": "bfloat16", "text_config": {{
        "model_type": "gemma3n_text", "hidden_size": 2048, "intermediate_size": [{widths}],
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "num_hidden_layers": 35, "vocab_size": 262400, "sliding_window": 512,
        "layer_types": [{kinds}], "laurel_rank": 64, "altup_num_inputs": 4,
        "hidden_size_per_layer_input": 256, "num_kv_shared_layers": 15}}}}"#
    );
    let lens = [
        "--batch-sizes",
        "1",
        "--prefill-lens",
        "512",
        "--context-lens",
        "512",
    ];
    refused(
        &config,
        &lens,
        &["Gemma 3n", "AltUp", "--kernels flash,paged"],
    );
    let rows = derive(
        &config,
        &[&lens[..], &["--kernels", "flash,paged"]].concat(),
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (_, key) in &rows {
        assert!(
            key.contains("q_heads=8,kv_heads=2,head_dim=256") && key.ends_with(",scale=1"),
            "{key}"
        );
    }
}

#[test]
fn lfm2_derives_its_short_convolutions_and_narrowed_mlp() {
    let gemm = |n, k| format!("gemm:m=1,n={n},k={k},dtype=bf16,b=nk");
    let args = ["--tp", "2", "--batch-sizes", "1", "--prefill-lens", "512"];
    // LFM2-1.2B: ten convolution and six attention layers; its MLP two thirds of 12288.
    let kinds = r#"["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv",
        "conv", "full_attention", "conv", "full_attention", "conv", "full_attention", "conv",
        "full_attention", "conv"]"#;
    let lfm2 = format!(
        r#"{{"model_type": "lfm2", "hidden_size": 2048, "intermediate_size": 12288,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 65536, "conv_L_cache": 3, "block_auto_adjust_ff_dim": true,
        "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256, "layer_types": {kinds},
        "torch_dtype": "bfloat16"}}"#
    );
    let rows = derive(&lfm2, &args);
    assert_eq!(keys_of(&rows, "conv_in")[0], gemm(3072, 2048));
    assert_eq!(keys_of(&rows, "conv_out")[0], gemm(2048, 1024));
    assert_eq!(keys_of(&rows, "qkv")[0], gemm(1536, 2048));
    assert_eq!(keys_of(&rows, "gate_up")[0], gemm(8192, 2048));
    assert_eq!(keys_of(&rows, "down")[0], gemm(2048, 4096));
    assert!(rows.iter().any(|(_, key)| key.starts_with("flash:")));
    // The same schedule as attention-layer indices.
    let indices = lfm2.replace(
        &format!(r#""layer_types": {kinds}"#),
        r#""full_attn_idxs": [2, 5, 8, 10, 12, 14]"#,
    );
    assert_eq!(derive(&indices, &args), rows);
    // LFM2-8B-A1B's shape: two dense layers of intermediate_size as it is, then 32 experts.
    let moe = r#"{"model_type": "lfm2_moe", "hidden_size": 2048, "intermediate_size": 7168,
        "moe_intermediate_size": 1792, "num_experts": 32, "num_experts_per_tok": 4,
        "num_dense_layers": 2, "num_hidden_layers": 4, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 65536,
        "layer_types": ["conv", "conv", "full_attention", "conv"], "torch_dtype": "bfloat16"}"#;
    let rows = derive(moe, &args);
    assert_eq!(keys_of(&rows, "gate_up")[0], gemm(7168, 2048));
    assert_eq!(keys_of(&rows, "expert_gate_up")[0], gemm(1792, 2048));
    assert_eq!(keys_of(&rows, "router")[0], gemm(32, 2048));
    assert_eq!(keys_of(&rows, "conv_in")[0], gemm(3072, 2048));
    // Without its dense layers the dense MLP is not derived.
    let all_moe = derive(
        &moe.replace(r#""num_dense_layers": 2"#, r#""num_dense_layers": 0"#),
        &args,
    );
    assert!(keys_of(&all_moe, "gate_up").is_empty(), "{all_moe:?}");
}

#[test]
fn kimi_linear_derives_its_kda_layers_and_latent_attention_projections() {
    // Kimi-Linear-48B-A3B's shape: KDA in three layers of four (counted from 1), latent
    // attention without a query rank in the rest, experts under Kimi's names.
    let kda: Vec<String> = (1..=27)
        .filter(|n| n % 4 != 0 && *n != 27)
        .map(|n| n.to_string())
        .collect();
    let config = format!(
        r#"{{"model_type": "kimi_linear", "hidden_size": 2304, "intermediate_size": 9216,
        "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 27,
        "vocab_size": 163840, "kv_lora_rank": 512, "q_lora_rank": null,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "mla_use_nope": true, "moe_intermediate_size": 1024, "num_experts": 256,
        "num_experts_per_token": 8, "num_shared_experts": 1, "first_k_dense_replace": 1,
        "moe_layer_freq": 1, "torch_dtype": "bfloat16",
        "linear_attn_config": {{"kda_layers": [{}], "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4}}}}"#,
        kda.join(", ")
    );
    // Latent attention's prefill (keys of 192, values of 128, every head its own) and its
    // decode (on the latent cache).
    let decode = derive(
        &config,
        &[
            "--tp",
            "4",
            "--batch-sizes",
            "8",
            "--context-lens",
            "1024",
            "--prefill-lens",
            "512",
            "--kernels",
            "flash,paged",
        ],
    );
    assert_eq!(
        keys_of(&decode, "decode"),
        ["paged:num_seqs=8,context_len=1024,q_heads=8,kv_heads=1,head_dim=576,block_size=16,dtype=bf16,v_head_dim=512,scale=0.07216878"]
    );
    assert_eq!(
        keys_of(&decode, "prefill"),
        ["flash:batch=1,q_len=512,kv_len=512,q_heads=8,kv_heads=8,head_dim=192,causal=true,dtype=bf16,v_head_dim=128"]
    );
    let rows = derive(
        &config,
        &[
            "--tp",
            "4",
            "--batch-sizes",
            "256",
            "--prefill-lens",
            "512",
            "--kernels",
            "gemm",
        ],
    );
    let gemm = |m, n, k| format!("gemm:m={m},n={n},k={k},dtype=bf16,b=nk");
    assert_eq!(keys_of(&rows, "kda_q")[0], gemm(256, 1024, 2304));
    assert_eq!(keys_of(&rows, "kda_f_a")[0], gemm(256, 128, 2304));
    assert_eq!(keys_of(&rows, "kda_f_b")[0], gemm(256, 1024, 128));
    assert_eq!(keys_of(&rows, "kda_beta")[0], gemm(256, 8, 2304));
    assert_eq!(keys_of(&rows, "kda_o")[0], gemm(256, 2304, 1024));
    // The latent attention's full-rank query and its latent, whole on every shard.
    assert_eq!(keys_of(&rows, "q")[0], gemm(256, 1536, 2304));
    assert_eq!(keys_of(&rows, "kv_a")[0], gemm(256, 576, 2304));
    // 256 experts, 8 a token; one shared expert of their width; the first layer dense.
    assert_eq!(keys_of(&rows, "expert_gate_up")[0], gemm(8, 512, 2304));
    assert_eq!(keys_of(&rows, "shared_gate_up")[0], gemm(256, 512, 2304));
    assert_eq!(keys_of(&rows, "gate_up")[0], gemm(256, 4608, 2304));
}

/// DeepSeek-V3's attention tuned end to end on the CPU from its config.json: its prefill (keys
/// of 192, values of 128) and its decode on the latent cache, each verified and given a
/// winner in the database.
#[test]
fn deepseek_attention_is_tuned_from_its_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), format!("{{{DEEPSEEK_V3}}}")).unwrap();
    let args = [
        "--device",
        "cpu",
        "--shapes",
        "config.json",
        "--tp",
        "8",
        "--kernels",
        "flash,paged",
        "--batch-sizes",
        "2",
        "--prefill-lens",
        "33",
        "--context-lens",
        "70",
        "--db",
        "k.db",
    ];
    let out = tune(&args, dir.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("2 tuned"), "{stdout}");
    assert!(
        stdout.contains("head_dim=192") && stdout.contains("v_head_dim=128"),
        "{stdout}"
    );
    assert!(
        stdout.contains("head_dim=576") && stdout.contains("v_head_dim=512"),
        "{stdout}"
    );
    assert!(stdout.contains("0 without a winner"), "{stdout}");
}

/// A latent cache's decode is derived in the blocks vLLM's MLA backend allocates on the
/// device: 64 tokens on an H200 (FlashMLA) and a B200 (FlashInfer's MLA), said in a note,
/// unless `--block-size` chooses (a size vLLM would raise is noted as one its calls will not
/// find); 16 on an A100 and for other attention.
#[test]
fn latent_decode_blocks_follow_vllms_mla_backend_on_the_device() {
    let v3 = format!("{{{DEEPSEEK_V3}}}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), &v3).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "shapes",
            "--shapes",
            "config.json",
            "--json",
            "--tp",
            "8",
            "--kernels",
            "paged",
            "--batch-sizes",
            "8",
            "--context-lens",
            "4096",
        ];
        args.extend_from_slice(extra);
        let out = tune(&args, dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{args:?}: {stderr}");
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let key = rows[0]["key"].as_str().unwrap().to_string();
        (key, stderr)
    };
    let (key, note) = run(&["--device", "h200"]);
    assert!(key.contains(",block_size=64,"), "{key}");
    assert!(
        note.contains("blocks of 64 tokens") && note.contains("FlashMLA"),
        "{note}"
    );
    let (key, note) = run(&["--device", "h200", "--block-size", "16"]);
    assert!(key.contains(",block_size=16,"), "{key}");
    assert!(
        note.contains("raises to 64") && note.contains("will not find"),
        "{note}"
    );
    let (key, note) = run(&["--device", "h200", "--block-size", "128"]);
    assert!(key.contains(",block_size=128,"), "{key}");
    assert!(!note.contains("note:"), "{note}");
    let (key, note) = run(&["--device", "a100"]);
    assert!(key.contains(",block_size=16,"), "{key}");
    assert!(!note.contains("note:"), "{note}");
    // A B200's default MLA backend, FlashInfer's, takes blocks of 64 too.
    let (key, note) = run(&["--device", "b200"]);
    assert!(key.contains(",block_size=64,"), "{key}");
    assert!(note.contains("(FlashInfer MLA)"), "{note}");
    let rows = derive(
        &format!("{{{LLAMA8B}}}"),
        &[
            "--device",
            "h200",
            "--tp",
            "1",
            "--kernels",
            "paged",
            "--batch-sizes",
            "8",
        ],
    );
    assert!(
        rows.iter().all(|(_, k)| k.contains(",block_size=16,")),
        "{rows:?}"
    );
}

#[test]
fn a_list_of_one_mlp_width_is_that_width() {
    let args = ["--tp", "2", "--batch-sizes", "1", "--prefill-lens", "512"];
    let scalar = format!("{{{LLAMA8B}}}");
    let listed = scalar.replace(
        r#""intermediate_size": 14336"#,
        r#""intermediate_size": [14336]"#,
    );
    assert_ne!(listed, scalar);
    assert_eq!(derive(&listed, &args), derive(&scalar, &args));
}

#[test]
fn ernie_4_5_moe_runs_its_experts_on_their_own_schedule() {
    // ERNIE-4.5-21B-A3B: 64 experts of 1536, 6 a token, two shared of the same width, the
    // first layer dense (moe_layer_start_index 1), the MLP there 12288 wide.
    let ernie = |extra: &str| {
        format!(
            r#"{{"model_type": "ernie4_5_moe", "hidden_size": 2560, "intermediate_size": 12288,
            "moe_intermediate_size": 1536, "moe_num_experts": 64, "moe_k": 6,
            "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 27,
            "moe_layer_interval": 1, "num_attention_heads": 20, "num_key_value_heads": 4,
            "num_hidden_layers": 28, "vocab_size": 103424, "torch_dtype": "bfloat16"{extra}}}"#
        )
    };
    let args = ["--tp", "2", "--batch-sizes", "64", "--prefill-lens", "512"];
    let rows = derive(&ernie(""), &args);
    let gemm = |m, n, k| format!("gemm:m={m},n={n},k={k},dtype=bf16,b=nk");
    assert_eq!(keys_of(&rows, "router")[0], gemm(64, 64, 2560));
    // 64 tokens × 6 of 64 experts: 6 tokens an expert.
    assert_eq!(keys_of(&rows, "expert_gate_up")[0], gemm(6, 1536, 2560));
    assert_eq!(keys_of(&rows, "shared_gate_up")[0], gemm(64, 3072, 2560));
    assert_eq!(keys_of(&rows, "gate_up")[0], gemm(64, 12288, 2560));
    // Every layer an expert layer: no dense MLP.
    let all = derive(
        &ernie("").replace(
            r#""moe_layer_start_index": 1"#,
            r#""moe_layer_start_index": 0"#,
        ),
        &args,
    );
    assert!(keys_of(&all, "gate_up").is_empty(), "{all:?}");
    // Experts every second layer from the first, up to the last: dense layers between.
    let alternate = derive(
        &ernie("").replace(r#""moe_layer_interval": 1"#, r#""moe_layer_interval": 2"#),
        &args,
    );
    assert_eq!(keys_of(&alternate, "gate_up")[0], gemm(64, 12288, 2560));
    assert_eq!(
        keys_of(&alternate, "expert_gate_up")[0],
        gemm(6, 1536, 2560)
    );
}

/// Parameters `Model::weight_bytes` counts for `config`, in billions (every config here is
/// bf16, two bytes a weight).
fn billions(config: &str) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, config).unwrap();
    let model = kerntune_tuner::models::Model::from_config_json(&path).unwrap();
    model.weight_bytes() / 2e9
}

#[test]
fn weight_counts_match_the_published_sizes_the_default_degree_rests_on() {
    let near = |got: f64, published: f64| {
        assert!(
            (got / published - 1.0).abs() < 0.005,
            "{got:.2} B against {published} B"
        )
    };
    let preset = |name| {
        kerntune_tuner::models::Model::preset(name)
            .unwrap()
            .weight_bytes()
            / 2e9
    };
    // Llama-3.1-70B 70.6 B, Mixtral 8x7B 46.7 B, DeepSeek-V3 671 B (untied heads).
    near(preset("llama70b"), 70.6);
    near(preset("mixtral8x7b"), 46.7);
    near(billions(&format!("{{{DEEPSEEK_V3}}}")), 671.0);
    // Llama-3.1-8B's fields under Llama-Nemotron's blocks: the same 8.0 B.
    let blocks = format!(
        r#"{{"model_type": "nemotron-nas", "hidden_size": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "vocab_size": 128256, "block_configs": [{}]}}"#,
        vec![r#"{"attention": {"n_heads_in_group": 4}, "ffn": {"intermediate_size": 14336}}"#; 32]
            .join(", ")
    );
    near(billions(&blocks), billions(&format!("{{{LLAMA8B}}}")));
    near(billions(&blocks), 8.03);
}

#[test]
fn mistrals_params_json_reads_as_the_config_vllm_makes_of_it() {
    let args = ["--tp", "2", "--batch-sizes", "1", "--prefill-lens", "512"];
    // Mistral Small 3.1's params.json against the same model's Hugging Face text config.
    let params = r#"{"dim": 5120, "n_layers": 40, "head_dim": 128, "hidden_dim": 32768,
        "n_heads": 32, "n_kv_heads": 8, "rope_theta": 1000000000.0, "norm_eps": 1e-05,
        "vocab_size": 131072, "vision_encoder": {"hidden_size": 1024, "num_hidden_layers": 24}}"#;
    let hf = r#"{"model_type": "mistral", "hidden_size": 5120, "num_hidden_layers": 40,
        "head_dim": 128, "intermediate_size": 32768, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 131072}"#;
    let strip = |rows: Vec<(String, String)>| -> Vec<String> {
        rows.into_iter().map(|(_, key)| key).collect()
    };
    assert_eq!(strip(derive(params, &args)), strip(derive(hf, &args)));
    // Mixtral's experts in `moe`; FP8 weights in `quantization`.
    let mixtral = r#"{"dim": 4096, "n_layers": 32, "head_dim": 128, "hidden_dim": 14336,
        "n_heads": 32, "n_kv_heads": 8, "vocab_size": 32000,
        "moe": {"num_experts": 8, "num_experts_per_tok": 2}}"#;
    let rows = derive(mixtral, &args);
    assert_eq!(
        keys_of(&rows, "expert_gate_up")[0],
        "gemm:m=1,n=14336,k=4096,dtype=bf16,b=nk"
    );
    let fp8 = mixtral.replace(
        r#""vocab_size": 32000"#,
        r#""vocab_size": 32000, "quantization": {"qformat_weight": "fp8_e4m3"}"#,
    );
    // Per-tensor FP8, as vLLM reads it: the experts' GEMMs in fp8, the router's not.
    let rows = derive(&fp8, &args);
    assert_eq!(
        keys_of(&rows, "expert_gate_up")[0],
        "gemm:m=1,n=14336,k=4096,dtype=fp8_e4m3,b=nk"
    );
    assert_eq!(
        keys_of(&rows, "router")[0],
        "gemm:m=1,n=8,k=4096,dtype=bf16,b=nk"
    );
    let other = mixtral.replace(
        r#""vocab_size": 32000"#,
        r#""vocab_size": 32000, "quantization": {"qformat_weight": "int4"}"#,
    );
    refused(&other, &args, &["quant_method = \"unnamed\""]);
    // A folder holding only params.json is read as vLLM reads it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("model")).unwrap();
    std::fs::write(dir.path().join("model/params.json"), params).unwrap();
    let out = tune(&["shapes", "--shapes", "model", "--tp", "2"], dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
