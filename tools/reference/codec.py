#!/usr/bin/env python3
"""Golden codec decodes from sglang-omni 0.1.9's own Fish modded-DAC module (`codec.md` §1–2).

Independent reference: the codec modules shipped in the sglang-omni 0.1.9 wheel
(`sglang_omni/models/fishaudio_s2_pro/fish_speech/models/dac/{modded_dac,rvq}.py`) with the
`dac` package (descript-audio-codec 1.0.0) they import, instantiated exactly as
`configs/modded_dac_vq.yaml` builds the real codec but at the tiny checkpoint's widths (read from
the tensor shapes of our `codec.pth`). Our writer's `codec.pth` is read with
`torch.load(weights_only=True)` and loaded with `load_state_dict(strict=True)`; the only keys
dropped first are the six persistent buffers older codec checkpoints carry (`codec.md` §3.3):
the module of 0.1.9 registers `freqs_cis` as non-persistent and has no `causal_mask` at all.
Any other mismatch aborts the script.

The float64 run is `model.double()`; the module itself still rounds to f32 inside RMSNorm
(`x.float()`) and RoPE (`x.float()`, bf16 table), so it is float64 everywhere else.

What is stubbed, and why: `modded_dac.py` subclasses `audiotools.ml.BaseModel` and imports
`dac.model.base` (whose module imports `audiotools` and `tqdm`); descript-audiotools drags in
librosa, soundfile and more. Stubs: `audiotools.ml.BaseModel` = a plain `nn.Module`
subclass (the real one only adds save/load helpers), `audiotools.AudioSignal` and `tqdm`
placeholders (used only by compress/decompress, never by decode). `dac/__init__.py` and
`dac/nn/__init__.py` are bypassed (they import the training losses and CLI utilities); the real
`dac/nn/layers.py`, `dac/nn/quantize.py` and `dac/model/base.py` are loaded from the installed
package.

Writes `tests/fixtures/codec/decode.safetensors`:
- `codes` [10, T] int32 (T = 40; a few codes above the codebook sizes, so clamping is exercised)
  and, for the float32 run (`f32.*`) and the float64 run (`f64.*`, stored rounded to f32):
  `rvq` [T, latent] (input of post_module), `post_module` [T, latent], `upsample` [4T, latent],
  `pcm` [2048·T], and for the float64 run `pre_tanh` [2048·T, 1] (the final conv's output:
  with random weights tanh saturates most samples, so this is the sharper check);
- `long.codes` [10, 160], `long.rvq`, `long.post_module` (float64 run): longer than the
  128-frame attention window;
- `rope.positions` [P] int32 and `rope.table` [P, 32, 2] bf16: rows of post_module's own
  `freqs_cis` buffer (f32 math rounded to bf16) at those absolute positions.
Tensors are channels-last (time-major), as the Rust backend stores activations.

Usage (from the repository root; tools/reference/setup.sh makes .cache/reference/venv (torch 2.11, CPU is enough,
and `descript-audio-codec==1.0.0` with --no-deps, einops, safetensors) and unzips the sglang-omni 0.1.9 wheel into
.cache/reference/sglang, where --sglang-dac points by default; tools/reference/regenerate.sh runs every generator):
    cargo build --bin limelight
    .cache/reference/venv/bin/python tools/reference/codec.py \
        --bin target/debug/limelight --out tests/fixtures/codec
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch
from torch import nn

SEED = 7  # checkpoint seed; tests/common/mod.rs SEED
CODES_SEED = 20260
FRAMES = 40
LONG_FRAMES = 160
# In the unzipped sglang-omni 0.1.9 wheel (`pip download --no-deps sglang-omni==0.1.9`, then unzip; setup.sh puts it in
# .cache/reference/sglang).
SGLANG_DAC = str(Path(__file__).resolve().parents[2] / ".cache/reference/sglang"
                 / "sglang_omni/models/fishaudio_s2_pro/fish_speech/models/dac")
IGNORED_BUFFERS = [
    "quantizer.pre_module.causal_mask",
    "quantizer.pre_module.freqs_cis",
    "quantizer.post_module.causal_mask",
    "quantizer.post_module.freqs_cis",
    "encoder.block.4.block.5.causal_mask",
    "encoder.block.4.block.5.freqs_cis",
]


def install_stubs(sglang_dac):
    """Minimal stand-ins for the heavy imports; see the module docstring."""
    import importlib.util

    audiotools = types.ModuleType("audiotools")
    ml = types.ModuleType("audiotools.ml")

    class BaseModel(nn.Module):
        INTERN = []
        EXTERN = []

    class AudioSignal:  # only referenced by compress/decompress
        pass

    ml.BaseModel = BaseModel
    audiotools.ml = ml
    audiotools.AudioSignal = AudioSignal
    sys.modules["audiotools"] = audiotools
    sys.modules["audiotools.ml"] = ml
    sys.modules["tqdm"] = types.ModuleType("tqdm")

    spec = importlib.util.find_spec("dac")
    root = os.path.dirname(spec.origin)
    for name, sub in [("dac", ""), ("dac.nn", "nn"), ("dac.model", "model")]:
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(root, sub) if sub else root]
        sys.modules[name] = pkg
    sys.path.insert(0, sglang_dac)


def infer_dims(sd):
    sem = sd["quantizer.semantic_quantizer.quantizers.0.codebook.weight"].shape
    res = sd["quantizer.quantizer.quantizers.0.codebook.weight"].shape
    w1 = sd["quantizer.post_module.layers.0.feed_forward.w1.weight"].shape
    n_res = sum(1 for k in sd if k.startswith("quantizer.quantizer.quantizers.") and k.endswith("codebook.weight"))
    layers = sum(1 for k in sd if k.startswith("quantizer.post_module.layers.") and k.endswith("wqkv.weight"))
    return dict(
        latent=w1[1],
        inter=w1[0],
        codebook_dim=sem[1],
        semantic_size=sem[0],
        residual_size=res[0],
        residual_books=n_res,
        layers=layers,
        encoder_dim=sd["encoder.block.0.conv.parametrizations.weight.original0"].shape[0],
        decoder_dim=sd["decoder.model.0.conv.parametrizations.weight.original0"].shape[0],
    )


def build_codec(d):
    """`modded_dac_vq.yaml`, with the widths of the checkpoint at hand."""
    import functools

    import modded_dac
    import rvq

    general = functools.partial(
        modded_dac.ModelArgs,
        block_size=8192,
        n_local_heads=-1,
        head_dim=64,
        rope_base=10000,
        norm_eps=1e-5,
        dropout_rate=0.1,
        attn_dropout_rate=0.1,
        channels_first=True,
    )

    def transformer():
        cfg = modded_dac.ModelArgs(
            block_size=2048,
            n_layer=d["layers"],
            n_head=d["latent"] // 64,
            dim=d["latent"],
            intermediate_size=d["inter"],
            n_local_heads=-1,
            head_dim=64,
            rope_base=10000,
            norm_eps=1e-5,
            dropout_rate=0.1,
            attn_dropout_rate=0.1,
            channels_first=True,
        )
        return modded_dac.WindowLimitedTransformer(causal=True, window_size=128, input_dim=d["latent"], config=cfg)

    quantizer = rvq.DownsampleResidualVectorQuantize(
        input_dim=d["latent"],
        n_codebooks=d["residual_books"],
        codebook_size=d["residual_size"],
        codebook_dim=d["codebook_dim"],
        quantizer_dropout=0.5,
        downsample_factor=[2, 2],
        post_module=transformer(),
        pre_module=transformer(),
        semantic_codebook_size=d["semantic_size"],
    )
    return modded_dac.DAC(
        sample_rate=44100,
        encoder_dim=d["encoder_dim"],
        encoder_rates=[2, 4, 8, 8],
        decoder_dim=d["decoder_dim"],
        decoder_rates=[8, 8, 4, 2],
        encoder_transformer_layers=[0, 0, 0, 4],
        decoder_transformer_layers=[4, 0, 0, 0],
        transformer_general_config=general,
        quantizer=quantizer,
    )


def load_codec(d, sd):
    """A fresh module with our tensors; refuses any key mismatch beyond the known buffers."""
    model = build_codec(d)
    want, have = set(model.state_dict().keys()), set(sd.keys())
    extra, missing = sorted(have - want), sorted(want - have)
    if extra != sorted(IGNORED_BUFFERS) or missing:
        sys.exit(f"codec.pth layout mismatch: unexpected {extra}, missing {missing}")
    model.load_state_dict({k: v for k, v in sd.items() if k not in IGNORED_BUFFERS}, strict=True)
    return model.eval()


def decode_with_stages(model, codes):
    """Runs the module's own `from_indices`, capturing stage outputs with forward hooks."""
    seen = {}
    q = model.quantizer
    hooks = [
        q.post_module.register_forward_hook(
            lambda m, inp, out: seen.update(rvq=inp[0].detach().clone(), post_module=out.detach().clone())
        ),
        q.upsample.register_forward_hook(lambda m, inp, out: seen.update(upsample=out.detach().clone())),
        # decoder.model[6]: the final conv, whose output tanh maps to PCM.
        model.decoder.model[6].register_forward_hook(lambda m, inp, out: seen.update(pre_tanh=out.detach().clone())),
    ]
    with torch.no_grad():
        pcm = model.from_indices(codes.clone())  # decode clamps its argument in place
    for h in hooks:
        h.remove()
    # [1, C, T] -> [T, C]; pcm [1, 1, N] -> [N]
    out = {k: v[0].transpose(0, 1).contiguous() for k, v in seen.items()}
    out["pcm"] = pcm[0, 0].contiguous()
    return out


def random_codes(g, d, frames, out_of_range):
    sizes = [d["semantic_size"]] + [d["residual_size"]] * d["residual_books"]
    rows = [torch.randint(0, s, (frames,), generator=g) for s in sizes]
    codes = torch.stack(rows)[None]
    if out_of_range:
        # Above the codebook sizes: the reference clamps them to size - 1 (`codec.md` §1.1).
        codes[0, 0, 3] = d["semantic_size"] + 17
        codes[0, 1, 5] = d["residual_size"]
        codes[0, 9, 6] = 4095
        codes[0, 4, 11] = d["residual_size"] + 1000
    return codes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/debug/limelight")
    ap.add_argument("--out", default="tests/fixtures/codec")
    ap.add_argument("--sglang-dac", default=SGLANG_DAC, help="folder holding sglang-omni's modded_dac.py and rvq.py")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    install_stubs(args.sglang_dac)
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        ck = os.path.join(tmp, "tiny")
        subprocess.run(
            [args.bin, "checkpoint", "synth", "--preset", "tiny", "--seed", str(SEED), "--out", ck],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        sd = torch.load(os.path.join(ck, "codec.pth"), weights_only=True)
    d = infer_dims(sd)
    model = load_codec(d, sd)

    g = torch.Generator().manual_seed(CODES_SEED)
    codes = random_codes(g, d, FRAMES, out_of_range=True)
    long_codes = random_codes(g, d, LONG_FRAMES, out_of_range=False)

    tensors = {"codes": codes[0].to(torch.int32).contiguous()}
    f32 = decode_with_stages(model, codes)
    model64 = load_codec(d, sd).double()
    f64 = decode_with_stages(model64, codes)
    report = {}
    for name in ["rvq", "post_module", "upsample", "pcm"]:
        tensors[f"f32.{name}"] = f32[name].float()
        tensors[f"f64.{name}"] = f64[name].float()
        diff = (f32[name].double() - f64[name]).norm() / f64[name].norm()
        report[name] = float(diff)
    assert tensors["f32.pcm"].numel() == 2048 * FRAMES

    long = decode_with_stages(model64, long_codes)
    tensors["f64.pre_tanh"] = f64["pre_tanh"].float()
    report["pre_tanh"] = float((f32["pre_tanh"].double() - f64["pre_tanh"]).norm() / f64["pre_tanh"].norm())
    tensors["long.codes"] = long_codes[0].to(torch.int32).contiguous()
    tensors["long.rvq"] = long["rvq"].float()
    tensors["long.post_module"] = long["post_module"].float()

    table = model.quantizer.post_module.freqs_cis  # [327680, 32, 2] bf16
    positions = list(range(256)) + list(range(256, table.shape[0], 1021)) + [table.shape[0] - 1]
    tensors["rope.positions"] = torch.tensor(positions, dtype=torch.int32)
    tensors["rope.table"] = table[positions].contiguous()

    os.makedirs(args.out, exist_ok=True)
    save_file(tensors, os.path.join(args.out, "decode.safetensors"))
    versions = {
        "decode.safetensors": {
            "command": "cargo build --bin limelight && .cache/reference/venv/bin/python tools/reference/codec.py "
            "--bin target/debug/limelight --out tests/fixtures/codec",
            "reference": "sglang-omni 0.1.9 fish_speech/models/dac/{modded_dac,rvq}.py (wheel), "
            "DAC.from_indices, stage outputs by forward hooks",
            "checkpoint": f"limelight checkpoint synth --preset tiny --seed {SEED}",
            "codes_seed": CODES_SEED,
            "torch": torch.__version__,
            "descript-audio-codec": "1.0.0",
            "einops": __import__("einops").__version__,
            "safetensors": __import__("safetensors").__version__,
            "python": sys.version.split()[0],
            "threads": 1,
            "stubbed": "audiotools (BaseModel = nn.Module, AudioSignal placeholder), tqdm; dac/__init__.py and "
            "dac/nn/__init__.py bypassed",
            "f32_vs_f64_relative_l2": report,
        }
    }
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump(versions, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
