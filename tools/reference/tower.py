#!/usr/bin/env python3
"""Golden tensors for the Codebook-MTP tower (shared/spec/model.md §5, §6, §8.1), from mlx-audio 0.6.2 and sglang-omni 0.1.9.

What it does, for vq_backbone_codebooks k = 1 (`backbone_partial`, the default) and k = 0 (`mtp_shared_pre`):
1. Synthesizes the tiny checkpoint with our binary (`limelight checkpoint synth --preset tiny --seed 7
   --vq-backbone-codebooks k`).
2. Draws the inputs with a fixed numpy seed: a 20-row prompt mixing text and audio rows (text->text, text->audio,
   audio->audio, audio->text transitions; codes include 0 and V-1), 4 generated frames (3 audio, then an EOS frame),
   and fixed random "backbone final-norm" rows standing in for the backbone (the tower golden does not depend on the
   backbone's own golden).
3. Reference A (the golden), mlx-audio's own `fish_drama3` tower: its converter `convert(src, dst, codec=False)`,
   its strict loader, `set_dtype(float32)`, CPU. `Tower.prefill` teacher-forces prompt rows [0, T-1) (row p labelled
   by row p+1), then `Tower.residual_codes` runs one frame per step at rows T-1 .. T+2 with a sampler that records
   each head's logits and returns the given code. Every tower layer's output is recorded by wrapping
   `TowerLayer.__call__`; prefill head logits are mlx-audio's own `codebook_heads[r]` applied to the recorded
   residual-layer outputs (its prefill computes no heads).
4. Reference B, sglang-omni 0.1.9's own `AudioDecoder` (tools/reference/tower_s1.py, run under a torch interpreter;
   see its docstring for the three small labelled restatements it needs off the sglang runtime). It follows S1's own
   last-row handling (prefill all T rows with the EOS placeholder label, the first decode step overwrites row T-1),
   so agreement with A also checks that S1's and S2's last-row handling give the same tower.
5. Checks A against B per tensor (relative L2) and writes tests/fixtures/tower/tower_k{k}.safetensors plus
   versions.json (package versions, the exact command, the measured agreement).

Fixture tensors (R = 23 tower rows: prompt rows 0..18 teacher-forced, rows 19..22 one decode step each):
  rows        i32 [24, 11]  prompt rows 0..19, then the 4 generated frames [main, c0..c9] (rows 20..23)
  prompt_len  i32 [1]       20
  hidden      f32 [23, D]   backbone final-norm rows fed to the tower at rows 0..22
  layers      f32 [13, 23, D]  reference A: every tower layer's output (shared 0..3, then residual 0..8)
  heads       f32 [9, 23, V]   reference A: head r's logits (predicting codebook r+1)
  s1_heads    f32 [9, 23, V]   reference B's head logits
  s1_last     f32 [23, D]      reference B's last tower layer output
Row p < 19 is labelled by row p+1; row 19+s (decode step s) predicts frame 20+s. The files carry no safetensors
metadata (its map is written in hash order, which would break byte-identical regeneration); versions.json says
which reference wrote which tensor.

Usage (from the repository root; the mlx-audio venv made by tools/python-env.sh, plus the torch interpreter and the
unzipped sglang-omni 0.1.9 wheel that tools/reference/setup.sh puts in .cache/reference; tools/reference/regenerate.sh
runs every generator):
    cargo build --bin limelight
    .venv/bin/python tools/reference/tower.py --bin target/debug/limelight \\
        --torch-python .cache/reference/venv/bin/python --sglang-omni .cache/reference/sglang --out tests/fixtures/tower
"""

import argparse
import importlib.metadata as md
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest.mock import patch

import numpy as np

SEED = 7  # checkpoint seed, the same as tests/common::SEED
INPUT_SEED = 3103
PROMPT_ROWS = 20
DECODE_STEPS = 4
KS = (1, 0)
AGREEMENT_BOUND = 2e-5  # mlx-audio vs sglang-omni, both float32 on the CPU (measured ~9e-6 at the last layer)
HERE = Path(__file__).resolve().parent


def synth(binary, out_dir, k):
    subprocess.run(
        [binary, "checkpoint", "synth", "--preset", "tiny", "--seed", str(SEED), "--out", out_dir,
         "--vq-backbone-codebooks", str(k)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def make_inputs(config):
    """Prompt rows, generated frames and backbone rows; the same for every k (drawn before k matters)."""
    rng = np.random.default_rng(INPUT_SEED)
    start, eos = config["semantic_start_token_id"], config["eos_token_id"]
    tower = config["audio_decoder_config"]
    n, vocab, dim = tower["num_codebooks"], tower["vocab_size"], tower["dim"]
    width = n + 1

    def text():
        return [int(rng.integers(0, 900))] + [0] * n

    def audio():
        codes = rng.integers(0, vocab, n)
        codes[rng.integers(0, n)] = 0 if rng.random() < 0.5 else vocab - 1  # the table's edge rows
        return [start + int(codes[0])] + [int(c) for c in codes]

    # text x5, audio x8, text x3, audio x2, text x2 (the last is where generation starts).
    kinds = "t" * 5 + "a" * 8 + "t" * 3 + "a" * 2 + "t" * 2
    assert len(kinds) == PROMPT_ROWS
    rows = [text() if kind == "t" else audio() for kind in kinds]
    rows += [audio() for _ in range(DECODE_STEPS - 1)]
    # A generated EOS frame: main = EOS (not semantic), so every layer's embedding is masked out; its codes are
    # whatever the heads would have sampled (S1 still runs the whole tower for it).
    rows.append([eos] + [int(c) for c in rng.integers(0, vocab, n)])
    rows = np.array(rows, dtype=np.int32)
    assert rows.shape == (PROMPT_ROWS + DECODE_STEPS, width)
    hidden = rng.standard_normal((PROMPT_ROWS - 1 + DECODE_STEPS, dim)).astype(np.float32)
    return rows, hidden


def run_mlx(ckpt, work, rows, hidden):
    """Reference A: mlx-audio 0.6.2's own tower, teacher-forced, float32 on the CPU."""
    import mlx.core as mx
    from mlx_audio.tts.models.fish_drama3.convert import convert
    from mlx_audio.tts.models.fish_drama3.tower import TowerLayer
    from mlx_audio.tts.utils import load_model

    dst = Path(work) / "mlx"
    convert(Path(ckpt), dst, codec=False)
    # The codec is not converted (codec=False); the loader would otherwise read codec.safetensors.
    with patch("mlx_audio.codec.models.fish_s1_dac.DAC.from_pretrained", return_value=None):
        model = load_model(dst)  # strict=True, then its tokenizer/config agreement checks
    model.set_dtype(mx.float32)
    tower = model.tower
    layers = list(tower.shared_layers) + list(tower.residual_layers)
    index = {id(layer): i for i, layer in enumerate(layers)}
    outputs = [[] for _ in layers]
    original = TowerLayer.__call__

    def recording(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        outputs[index[id(self)]].append(np.array(out.astype(mx.float32)).reshape(-1, out.shape[-1]))
        return out

    n_prefill = PROMPT_ROWS - 1
    caches = tower.make_cache()
    frames = mx.array(rows[None])
    heads = [[] for _ in tower.codebook_heads]
    with patch.object(TowerLayer, "__call__", recording):
        tower.prefill(mx.array(hidden[None, :n_prefill]), frames[:, :n_prefill], frames[:, 1:n_prefill + 1], caches)
        shared = len(tower.shared_layers)
        for r, head in enumerate(tower.codebook_heads):
            out = mx.array(outputs[shared + r][0])[None]
            heads[r].append(np.array(head(out).astype(mx.float32))[0])
        for step in range(DECODE_STEPS):
            t = n_prefill + step
            target = rows[t + 1]
            main = mx.array([int(target[0])])
            c0 = mx.clip(main - model.semantic_begin, 0, tower.vocab_size - 1)
            semantic = tower.is_semantic(main)[:, None]
            r_step = [0]

            def sample(logits, target=target, r_step=r_step):
                r = r_step[0]
                heads[r].append(np.array(logits.astype(mx.float32)).reshape(1, -1))
                r_step[0] += 1
                return mx.array([[int(target[2 + r])]], dtype=mx.int32)

            codes = tower.residual_codes(
                mx.array(hidden[None, t:t + 1]), c0[:, None], semantic, frames[:, t:t + 1], caches, sample
            )
            mx.eval(codes)
            got = [int(np.array(c).reshape(-1)[0]) for c in codes]
            assert got[1:] == [int(x) for x in target[2:]], (got, target)
    layer_out = np.stack([np.concatenate(o) for o in outputs])
    head_out = np.stack([np.concatenate(h) for h in heads])
    return layer_out, head_out


def run_s1(torch_python, sglang_root, ckpt, work, rows, hidden):
    """Reference B: sglang-omni 0.1.9's own AudioDecoder, in a torch interpreter."""
    inputs = Path(work) / "s1_in.npz"
    out = Path(work) / "s1_out.npz"
    np.savez(inputs, rows=rows, hidden=hidden, prompt_len=np.array([PROMPT_ROWS]))
    subprocess.run(
        [torch_python, str(HERE / "tower_s1.py"), "--sglang-omni", sglang_root, "--ckpt", ckpt,
         "--inputs", str(inputs), "--out", str(out)],
        check=True,
    )
    got = np.load(out)
    return got["layers"], got["heads"], json.loads(str(got["versions"]))


def rel_l2(a, b):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a64 - b64) / np.linalg.norm(b64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="the limelight binary")
    ap.add_argument("--torch-python", required=True, help="a Python with torch, numpy and safetensors")
    ap.add_argument("--sglang-omni", required=True, help="directory holding the unzipped sglang_omni 0.1.9 package")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from safetensors.numpy import save_file

    os.makedirs(args.out, exist_ok=True)
    agreement, s1_versions = {}, {}
    for k in KS:
        with tempfile.TemporaryDirectory() as work:
            ckpt = os.path.join(work, "ckpt")
            synth(args.bin, ckpt, k)
            config = json.load(open(os.path.join(ckpt, "config.json")))
            assert config["audio_decoder_config"]["vq_backbone_codebooks"] == k
            rows, hidden = make_inputs(config)
            layers, heads = run_mlx(ckpt, work, rows, hidden)
            s1_layers, s1_heads, s1_versions = run_s1(args.torch_python, args.sglang_omni, ckpt, work, rows, hidden)
        assert layers.shape == s1_layers.shape and heads.shape == s1_heads.shape, (layers.shape, s1_layers.shape)
        errors = {f"layer{i}": rel_l2(s1_layers[i], layers[i]) for i in range(len(layers))}
        errors.update({f"head{r}": rel_l2(s1_heads[r], heads[r]) for r in range(len(heads))})
        worst = max(errors.values())
        print(f"k={k}: sglang-omni vs mlx-audio, worst relative L2 {worst:.3e}")
        assert worst <= AGREEMENT_BOUND, errors
        agreement[f"k{k}"] = {"worst_rel_l2": worst, "per_tensor": errors}
        save_file(
            {
                "rows": rows,
                "prompt_len": np.array([PROMPT_ROWS], dtype=np.int32),
                "hidden": hidden,
                "layers": np.ascontiguousarray(layers, dtype=np.float32),
                "heads": np.ascontiguousarray(heads, dtype=np.float32),
                "s1_heads": np.ascontiguousarray(s1_heads, dtype=np.float32),
                "s1_last": np.ascontiguousarray(s1_layers[-1], dtype=np.float32),
            },
            # No metadata: safetensors writes its map in hash order, which would break byte-identical regeneration.
            os.path.join(args.out, f"tower_k{k}.safetensors"),
        )

    versions = {
        "command": "cargo build --bin limelight && .venv/bin/python tools/reference/tower.py "
                   "--bin target/debug/limelight --torch-python .cache/reference/venv/bin/python "
                   "--sglang-omni .cache/reference/sglang --out tests/fixtures/tower",
        "python_mlx": sys.version.split()[0],
        "mlx": md.version("mlx"),
        "mlx-audio": md.version("mlx-audio"),
        "numpy_mlx": md.version("numpy"),
        "safetensors": md.version("safetensors"),
        **s1_versions,
        "checkpoint": f"limelight checkpoint synth --preset tiny --seed {SEED} --vq-backbone-codebooks K (K = 1, 0)",
        "input_seed": INPUT_SEED,
        "fixtures": {
            f"tower_k{k}.safetensors": f"tiny seed {SEED}, vq_backbone_codebooks {k}: layers/heads from mlx-audio's "
            "fish_drama3 Tower, s1_heads/s1_last from sglang-omni's AudioDecoder"
            for k in KS
        },
        "s1_vs_mlx_bound": AGREEMENT_BOUND,
        "s1_vs_mlx": agreement,
    }
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump(versions, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
