#!/usr/bin/env python3
"""Reference B for the tower golden: sglang-omni 0.1.9's own `AudioDecoder` on the CPU (called by tower.py).

What runs is S1's code, unmodified, from the unzipped wheel: `audio_decoder.py` (frame embeddings, the unseen-codes
sum `shared_input`, `prefill`, `run_shared_layers`, `run_layer`, the codebook heads), `decoder_layers.py` (the layer:
masked/clamped embedding, enorm/hnorm/eh_proj, the fused qkv split, q/k norm, its CPU interleaved-RoPE path, the
sigmoid gate, SwiGLU), `weights.py` (the checkpoint renames and its re-interleaving of wqkv rows) and
`model_inputs.next_frame_labels` (the placeholder label of the last prompt row).

RESTATEMENTS (PyTorch written from the named source, because sglang's serving runtime cannot run here):
- `GemmaRMSNorm` and `SiluAndMul`: the `forward_native` bodies of sglang 0.5.22 `srt/layers/layernorm.py` and
  `srt/layers/activation.py` (the versions S1 0.1.9 pins), as small stub modules;
- the `DecoderAttention` callee (S1 hands its tower attention to sglang's paged KV pool): a per-layer KV store
  indexed by position that writes this call's rows (overwriting a slot that is written again, as the pool does),
  then causal GQA softmax attention with scale 1/sqrt(head_dim) over positions 0..p;
- the decode step without sampling: the body of `AudioDecoder.decode_step` with the sampled codes replaced by given
  ones (same calls: `is_semantic(main)`, `run_shared_layers(..., shared_input(input_frames), ...)`, then per
  residual layer `run_layer` and `codebook_heads[r]`).
Triton is hidden, so every S1 module takes its plain-torch path; the config is a namespace with the fields S1 reads
(its `rotary_dim` is S1's own property formula, int(head_dim * rotary_percent)).
"""

import argparse
import importlib.metadata as md
import json
import math
import os
import sys
import types
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open

torch.set_num_threads(1)  # deterministic reductions


def install_stubs():
    sys.modules["triton"] = None  # `import triton` raises ImportError: S1's kernels fall back to torch

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    class GemmaRMSNorm(torch.nn.Module):
        """Restatement of sglang 0.5.22 GemmaRMSNorm.forward_native."""

        def __init__(self, hidden_size, eps=1e-6):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(hidden_size))
            self.variance_epsilon = eps

        def forward(self, x, residual=None):
            orig_dtype = x.dtype
            if residual is not None:
                x = x + residual
                residual = x
            x = x.float()
            variance = x.pow(2).mean(dim=-1, keepdim=True)
            x = x * torch.rsqrt(variance + self.variance_epsilon)
            x = x * (1.0 + self.weight.float())
            x = x.to(orig_dtype)
            return x if residual is None else (x, residual)

    class SiluAndMul(torch.nn.Module):
        """Restatement of sglang 0.5.22 SiluAndMul.forward_native."""

        def forward(self, x):
            d = x.shape[-1] // 2
            return F.silu(x[..., :d]) * x[..., d:]

    class ForwardMode:
        EXTEND = "extend"
        DECODE = "decode"

    for name in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.model_executor", "sglang.srt.mem_cache"):
        module(name)
    module("sglang.srt.layers.layernorm", GemmaRMSNorm=GemmaRMSNorm)
    module("sglang.srt.layers.activation", SiluAndMul=SiluAndMul)
    module("sglang.srt.model_executor.forward_batch_info", ForwardMode=ForwardMode)
    module("sglang.srt.mem_cache.memory_pool", HybridLinearKVPool=object)
    # No fused RoPE kernel: decoder_layers takes its own CPU path.
    module("sglang_omni.platforms", current_platform=SimpleNamespace(get_joint_rope_inplace_kernel=lambda: None))
    module("sglang_omni.platforms.interface", JointRopeInplaceKernel=object)
    # The HF config classes are only type annotations in the modules used here.
    module("sglang_omni.models.fishaudio_drama3.hf_config", FishOmniConfig=object, FishOmniAudioDecoderConfig=object)


class KvStore:
    """RESTATEMENT of the DecoderAttention callee (sglang's paged KV pool + attention backend)."""

    def __init__(self, layers, heads, kv_heads, head_dim, capacity):
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.k = torch.full((layers, capacity, kv_heads, head_dim), float("nan"))
        self.v = torch.full((layers, capacity, kv_heads, head_dim), float("nan"))
        self.positions = None

    def __call__(self, layer_index, query, key, value):
        rows = query.shape[0]
        pos = self.positions
        self.k[layer_index, pos] = key.reshape(rows, self.kv_heads, self.head_dim)
        self.v[layer_index, pos] = value.reshape(rows, self.kv_heads, self.head_dim)
        q = query.reshape(rows, self.heads, self.head_dim)
        group = self.heads // self.kv_heads
        out = torch.empty(rows, self.heads, self.head_dim)
        for i in range(rows):
            p = int(pos[i])
            keys = self.k[layer_index, : p + 1].repeat_interleave(group, dim=1)  # [p+1, heads, hd]
            values = self.v[layer_index, : p + 1].repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,thd->ht", q[i], keys) / math.sqrt(self.head_dim)
            out[i] = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), values)
        return out.reshape(rows, self.heads * self.head_dim)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sglang-omni", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    sys.path.insert(0, args.sglang_omni)
    install_stubs()
    from sglang_omni.models.fishaudio_drama3.audio_decoder import AudioDecoder
    from sglang_omni.models.fishaudio_drama3.model_inputs import next_frame_labels
    from sglang_omni.models.fishaudio_drama3.weights import checkpoint_part, load_audio_decoder_weights

    cfg = json.load(open(os.path.join(args.ckpt, "config.json")))
    a = cfg["audio_decoder_config"]
    decoder_config = SimpleNamespace(**a, rotary_dim=int(a["head_dim"] * a["rotary_percent"]))
    config = SimpleNamespace(
        audio_decoder_config=decoder_config,
        text_config=SimpleNamespace(max_position_embeddings=cfg["text_config"]["max_position_embeddings"]),
        semantic_start_token_id=cfg["semantic_start_token_id"],
        semantic_end_token_id=cfg["semantic_end_token_id"],
        eos_token_id=cfg["eos_token_id"],
    )
    decoder = AudioDecoder(config).float().eval()

    index = json.load(open(os.path.join(args.ckpt, "model.safetensors.index.json")))

    def decoder_tensors():
        for shard in sorted(set(index["weight_map"].values())):
            with safe_open(os.path.join(args.ckpt, shard), framework="pt") as f:
                for name in f.keys():
                    if checkpoint_part(name) == "audio_decoder":
                        yield name, f.get_tensor(name)

    load_audio_decoder_weights(decoder, decoder_tensors())

    data = np.load(args.inputs)
    rows = torch.from_numpy(data["rows"].astype(np.int64))
    hidden = torch.from_numpy(data["hidden"])
    prompt = int(data["prompt_len"][0])
    steps = rows.shape[0] - prompt

    layers = list(decoder.shared_layers) + list(decoder.residual_layers)
    outputs = [[] for _ in layers]
    for i, layer in enumerate(layers):
        layer.register_forward_hook(lambda _m, _a, out, i=i: outputs[i].append(out.detach().clone()))
    head_count = decoder.shared_layers[0].self_attn.head_count
    kv = KvStore(len(layers), head_count, decoder.shared_layers[0].self_attn.kv_head_count,
                 decoder.shared_layers[0].self_attn.head_dim, rows.shape[0])
    heads = [[] for _ in decoder.codebook_heads]
    shared = len(decoder.shared_layers)

    with torch.no_grad():
        # S1's prefill: every prompt row, the last labelled by the EOS placeholder (overwritten below).
        frames = rows[:prompt]
        kv.positions = torch.arange(prompt)
        decoder.prefill(hidden[:prompt], kv.positions, frames,
                        next_frame_labels(frames.clone(), torch.tensor([prompt - 1]), cfg["eos_token_id"]), kv)
        for r, head in enumerate(decoder.codebook_heads):
            heads[r].append(head(outputs[shared + r][0][: prompt - 1]))
        for i in range(len(layers)):
            outputs[i][0] = outputs[i][0][: prompt - 1]  # row T-1's placeholder output is not part of the tower
        # RESTATEMENT of decode_step's body with given codes instead of sampled ones.
        for step in range(steps):
            t = prompt - 1 + step
            target = rows[t + 1]
            main = target[:1]
            kv.positions = torch.tensor([t])
            label = decoder.is_semantic(main)
            codebook_zero = (main - decoder.semantic_begin_id).clamp(0, decoder.codebook_size - 1)
            h = decoder.run_shared_layers(hidden[t:t + 1], codebook_zero, label, decoder.shared_input(rows[t:t + 1]),
                                          kv.positions, kv, True)
            codes = [codebook_zero]
            for r, (layer, head) in enumerate(zip(decoder.residual_layers, decoder.codebook_heads)):
                h = decoder.run_layer(layer, shared + r, h, codes[-1], label, None, kv.positions, kv, True)
                heads[r].append(head(h))
                codes.append(target[2 + r:3 + r])

    layer_out = torch.stack([torch.cat(o) for o in outputs]).numpy()
    head_out = torch.stack([torch.cat(h) for h in heads]).numpy()
    versions = {"python_torch": sys.version.split()[0], "torch": torch.__version__, "numpy_torch": np.__version__,
                "sglang-omni": "0.1.9 (unzipped wheel; sglang_omni/__init__.py __version__ "
                + __import__("sglang_omni").__version__ + ")",
                "safetensors_torch": md.version("safetensors")}
    np.savez(args.out, layers=layer_out, heads=head_out, versions=json.dumps(versions))


if __name__ == "__main__":
    main()
