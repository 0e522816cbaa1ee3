#!/usr/bin/env python3
"""Golden tensors for the Qwen3.5-MoE backbone (shared/spec/backbone.md, model.md §4-5), from transformers.

What it does:
1. Synthesizes the tiny checkpoint with our binary (`limelight checkpoint synth --preset tiny --seed 7`).
2. Builds transformers' `Qwen3_5MoeTextConfig` + `Qwen3_5MoeForCausalLM` from that `config.json` (this script reads
   the JSON itself; nothing of our Rust is used beyond the written checkpoint), loads the backbone weights by name
   (`model.language_model.X` -> `model.X`, `lm_head.weight` as is; block-FP8 experts dequantised
   `fp8 x weight_scale_inv[r/128][c/128]` in float64 and fused into HF's `gate_up_proj` [E, 2I, H] / `down_proj`
   [E, H, I]). Every HF parameter must be assigned exactly once and every backbone tensor of the checkpoint used:
   anything unmapped or missing is a failure.
3. Runs the model in float32 on the CPU (one thread, TF32 off, eager attention, eager experts, no fla /
   causal-conv1d kernels, so the GDN layers run transformers' pure-torch chunked and recurrent paths) over a
   70-row prompt of text and audio rows, then 4 single-row decode steps through the HF cache.
4. Writes tests/fixtures/backbone/golden.safetensors and versions.json.

The backbone input embedding is NOT computed by transformers: `embed_backbone` below is a PyTorch re-statement of
sglang-omni 0.1.9 `AudioDecoder.embed_backbone` / `codebook_embedding_sum` (model.md §5), labelled as such.

Usage (from the repository root; tools/reference/setup.sh makes .cache/reference/venv with the pinned torch and
transformers==5.17.0; tools/reference/regenerate.sh runs every generator):
    cargo build --bin limelight
    .cache/reference/venv/bin/python tools/reference/backbone.py --bin target/debug/limelight --out tests/fixtures/backbone
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_num_threads(1)  # deterministic reductions, so regeneration is byte-identical

import safetensors  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig  # noqa: E402

SEED = 7  # checkpoint seed, the same as tests/common::SEED
ROWS_SEED = 2026
PROMPT_ROWS = 70  # > 64: the GDN chunked prefill crosses a chunk boundary
DECODE_STEPS = 4
EMBED_KS = (0, 1, 3)  # vq_backbone_codebooks values for the embedding re-statement (0 = mtp_shared_pre)
PREFIX = "model.language_model."


def save_safetensors(tensors, path, metadata):
    """A safetensors file with a sorted header: `safetensors.torch.save_file` orders `__metadata__` by hash, so
    its bytes change from run to run. Readable by any safetensors reader."""
    dtypes = {torch.float32: "F32", torch.int64: "I64"}
    header, blobs, offset = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.numpy().tobytes()  # little-endian on every platform torch supports
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def synth(binary, out_dir):
    subprocess.run(
        [binary, "checkpoint", "synth", "--preset", "tiny", "--seed", str(SEED), "--out", out_dir],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def read_checkpoint(ckpt):
    """Every tensor of every shard the index names, as stored (fp8 stays float8_e4m3fn)."""
    index = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(os.path.join(ckpt, shard), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def hf_config(cfg):
    """transformers' config from our config.json `text_config` (only keys transformers defines)."""
    t = cfg["text_config"]
    rope = dict(t["rope_parameters"])
    return Qwen3_5MoeTextConfig(
        vocab_size=t["vocab_size"],
        hidden_size=t["hidden_size"],
        num_hidden_layers=t["num_hidden_layers"],
        num_attention_heads=t["num_attention_heads"],
        num_key_value_heads=t["num_key_value_heads"],
        head_dim=t["head_dim"],
        hidden_act=t["hidden_act"],
        max_position_embeddings=t["max_position_embeddings"],
        rms_norm_eps=t["rms_norm_eps"],
        rope_parameters=rope,
        attention_bias=False,
        linear_conv_kernel_dim=t["linear_conv_kernel_dim"],
        linear_key_head_dim=t["linear_key_head_dim"],
        linear_value_head_dim=t["linear_value_head_dim"],
        linear_num_key_heads=t["linear_num_key_heads"],
        linear_num_value_heads=t["linear_num_value_heads"],
        moe_intermediate_size=t["moe_intermediate_size"],
        shared_expert_intermediate_size=t["shared_expert_intermediate_size"],
        num_experts_per_tok=t["num_experts_per_tok"],
        num_experts=t["num_experts"],
        layer_types=t["layer_types"],
        tie_word_embeddings=t["tie_word_embeddings"],
        eos_token_id=cfg["eos_token_id"],
    )


def dequant_fp8(w, scale, block):
    """dense[r, c] = fp8[r, c] * scale_inv[r // 128, c // 128], exact in float64."""
    bo, bi = block
    s = scale.to(torch.float64).repeat_interleave(bo, 0).repeat_interleave(bi, 1)[: w.shape[0], : w.shape[1]]
    return w.to(torch.float64) * s


def hf_state_dict(tensors, cfg):
    """Maps checkpoint names to HF parameter names; returns (state dict, checkpoint names used)."""
    t = cfg["text_config"]
    block = cfg["quantization_config"]["weight_block_size"]
    experts = t["num_experts"]
    sd, used = {}, set()

    def take(name):
        used.add(name)
        return tensors[name]

    for name in tensors:
        if name == "lm_head.weight":
            sd["lm_head.weight"] = take(name)
        elif name.startswith(PREFIX) and ".mlp.experts." not in name:
            sd["model." + name[len(PREFIX) :]] = take(name)
    for layer in range(t["num_hidden_layers"]):
        p = f"{PREFIX}layers.{layer}.mlp.experts"

        def dense(e, proj):
            return dequant_fp8(take(f"{p}.{e}.{proj}.weight"), take(f"{p}.{e}.{proj}.weight_scale_inv"), block)

        gate_up = [torch.cat([dense(e, "gate_proj"), dense(e, "up_proj")], 0) for e in range(experts)]
        sd[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        sd[f"model.layers.{layer}.mlp.experts.down_proj"] = torch.stack([dense(e, "down_proj") for e in range(experts)])
    return sd, used


def load_into(model, tensors, cfg):
    sd, used = hf_state_dict(tensors, cfg)
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(sd))
    unmapped_hf = sorted(set(sd) - set(params))
    unused = sorted(n for n in tensors if (n.startswith(PREFIX) or n.startswith("lm_head.")) and n not in used)
    if missing or unmapped_hf or unused:
        sys.exit(f"name mapping failed:\n  HF params without a checkpoint tensor: {missing}\n"
                 f"  mapped names HF does not have: {unmapped_hf}\n  backbone tensors not used: {unused}")
    with torch.no_grad():
        for name, p in params.items():
            src = sd[name]
            if tuple(src.shape) != tuple(p.shape):
                sys.exit(f"{name}: checkpoint shape {tuple(src.shape)} != HF shape {tuple(p.shape)}")
            p.copy_(src.to(torch.float64).to(p.dtype))
    return sorted(params)


def make_rows(cfg):
    """Prompt + decode rows [token, c0..c9]: text rows, audio rows with random codes, a few out-of-range codes."""
    n_cb = cfg["audio_decoder_config"]["num_codebooks"]
    v = cfg["audio_decoder_config"]["vocab_size"]
    start = cfg["semantic_start_token_id"]
    g = torch.Generator().manual_seed(ROWS_SEED)
    total = PROMPT_ROWS + DECODE_STEPS
    rows = torch.zeros(total, 1 + n_cb, dtype=torch.int64)
    is_text = torch.zeros(total, dtype=torch.bool)
    is_text[:12] = True  # a text prompt, then mostly audio with a few text rows mixed in
    is_text[[30, 31, 47, 66, PROMPT_ROWS + 2]] = True
    for r in range(total):
        if is_text[r]:
            rows[r, 0] = torch.randint(0, start, (1,), generator=g)
        else:
            codes = torch.randint(0, v, (n_cb,), generator=g)
            rows[r, 1:] = codes
            rows[r, 0] = start + codes[0]
    # Codes past the codebook are clamped to V-1 before the lookup (model.md §5).
    rows[20, 3] = v + 5
    rows[40, 1 + n_cb - 1] = 65535
    return rows


def embed_backbone(rows, embed_tokens, codebook_embeddings, k, cfg):
    """PyTorch RE-STATEMENT (not a reference run) of sglang-omni 0.1.9 `AudioDecoder.embed_backbone`:
    semantic rows get (E_text[tok] + sum_{i=1..k} CB[clamp(c_i) + i*V]) * (1/sqrt(1+k)); other rows E_text[tok]."""
    v = cfg["audio_decoder_config"]["vocab_size"]
    start, end = cfg["semantic_start_token_id"], cfg["semantic_end_token_id"]
    text = embed_tokens[rows[:, 0]]
    if k == 0:
        codes_sum = torch.zeros_like(text)
    else:
        idx = rows[:, 2 : 2 + k].clamp(0, v - 1) + torch.arange(1, 1 + k) * v
        codes_sum = torch.nn.functional.embedding_bag(idx, codebook_embeddings, mode="sum")
    mixed = (text + codes_sum) * (1.0 / math.sqrt(1.0 + k))
    semantic = (rows[:, 0] >= start) & (rows[:, 0] <= end)
    return torch.where(semantic.unsqueeze(-1), mixed, text)


def restricted_ids(cfg):
    """Index i < V -> semantic_start + i; index V -> EOS (the order src/model/backbone.rs documents)."""
    v = cfg["audio_decoder_config"]["vocab_size"]
    return torch.cat([torch.arange(v) + cfg["semantic_start_token_id"], torch.tensor([cfg["eos_token_id"]])])


def run(model, embeds, cfg, out):
    """Prefill then single-row decode steps; records every layer's output, final norm and restricted logits."""
    layers = model.model.layers
    captured = {}
    hooks = [layers[i].register_forward_hook(lambda m, a, o, i=i: captured.__setitem__(i, o)) for i in range(len(layers))]
    hooks.append(model.model.norm.register_forward_hook(lambda m, a, o: captured.__setitem__("norm", o)))
    ids = restricted_ids(cfg)

    def record(tag, o, inp):
        hs = o.hidden_states
        # hidden_states = (inputs_embeds, layer 0 .. layer L-2 outputs, final-norm output): transformers ties the
        # last entry to last_hidden_state, so the last layer's raw output comes from the forward hook.
        assert len(hs) == len(layers) + 1
        # The first entry is the input itself; asserted equal to the embedding rather than stored twice.
        assert torch.equal(hs[0][0], inp)
        for i in range(len(layers)):
            if i + 1 < len(layers):
                assert torch.equal(hs[i + 1], captured[i])
            out[f"{tag}.layer.{i}"] = captured[i][0]
        assert torch.equal(hs[-1], captured["norm"])
        out[f"{tag}.final_norm"] = captured["norm"][0]
        out[f"{tag}.logits"] = o.logits[0][:, ids]

    with torch.no_grad():
        o = model(inputs_embeds=embeds[None, :PROMPT_ROWS], use_cache=True, output_hidden_states=True)
        record("prefill", o, embeds[:PROMPT_ROWS])
        cache = o.past_key_values
        for s in range(DECODE_STEPS):
            r = PROMPT_ROWS + s
            o = model(inputs_embeds=embeds[None, r : r + 1], past_key_values=cache, use_cache=True,
                      output_hidden_states=True)
            record(f"decode.{s}", o, embeds[r : r + 1])
            cache = o.past_key_values
        # The cache is really used: a no-cache forward of all rows must agree with prefill + decode.
        full = model(inputs_embeds=embeds[None], use_cache=False).logits[0][:, ids]
        stepped = torch.cat([out["prefill.logits"]] + [out[f"decode.{s}.logits"] for s in range(DECODE_STEPS)])
        err = ((full - stepped).norm() / full.norm()).item()
        assert err < 1e-5, f"HF prefill+decode disagrees with a full forward: {err}"
    for h in hooks:
        h.remove()
    return err


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="target/debug/limelight", help="the limelight binary")
    ap.add_argument("--out", default="tests/fixtures/backbone", help="fixture directory")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    for mod in ("fla", "causal_conv1d", "kernels"):
        try:
            __import__(mod)
            sys.exit(f"`{mod}` is installed: transformers would use its kernels instead of the torch reference paths")
        except ImportError:
            pass

    with tempfile.TemporaryDirectory() as ckpt:
        synth(os.path.abspath(args.bin), ckpt)
        cfg = json.load(open(os.path.join(ckpt, "config.json")))
        tensors = read_checkpoint(ckpt)

    config = hf_config(cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(0)  # HF init; every parameter is overwritten below
    model = Qwen3_5MoeForCausalLM(config).to(dtype).eval()
    model.set_attn_implementation("eager")
    model.set_experts_implementation("eager")
    names = load_into(model, tensors, cfg)

    rows = make_rows(cfg)
    e_text = tensors[PREFIX + "embed_tokens.weight"].to(dtype)
    cb = tensors["audio_decoder.codebook_embeddings.weight"].to(dtype)
    k = cfg["audio_decoder_config"]["vq_backbone_codebooks"]
    out = {"rows": rows.to(torch.int64)}
    for kk in EMBED_KS:
        out[f"embed.k{kk}"] = embed_backbone(rows, e_text, cb, kk, cfg)
    embeds = out[f"embed.k{k}"]
    err = run(model, embeds, cfg, out)

    fixture = {n: t.detach().to(torch.float32).contiguous() if t.is_floating_point() else t.contiguous()
               for n, t in out.items()}
    os.makedirs(args.out, exist_ok=True)
    meta = {
        "seed": str(SEED),
        "prompt_rows": str(PROMPT_ROWS),
        "decode_steps": str(DECODE_STEPS),
        "vq_backbone_codebooks": str(k),
        "dtype": args.dtype,
        "restricted_order": "semantic band ascending, then EOS",
    }
    save_safetensors(fixture, os.path.join(args.out, "golden.safetensors"), meta)
    versions = {
        "generator": "tools/reference/backbone.py",
        "command": "cargo build --bin limelight && .cache/reference/venv/bin/python tools/reference/backbone.py "
                   "--bin target/debug/limelight --out tests/fixtures/backbone",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "model_dtype": args.dtype,
        "threads": 1,
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "checkpoint": f"limelight checkpoint synth --preset tiny --seed {SEED} (vq_backbone_codebooks {k})",
        "hf_parameters_mapped": len(names),
        "reference_self_check": {"prefill_plus_decode_vs_full_forward_rel_l2": f"{err:.2e}"},
    }
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump(versions, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}: {len(fixture)} tensors; HF prefill+decode vs full forward rel L2 {err:.2e}")


if __name__ == "__main__":
    main()
