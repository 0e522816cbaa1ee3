#!/usr/bin/env python3
"""Golden prompt rows (model.md §7) from two independent builders, on the tiny checkpoint's tokenizer.

Reference A (the golden): sglang-omni 0.1.9's own `prompt.py` (`build_prompt_rows`, `validate_caller_text`,
`with_speaker_tag`), loaded by file path from the unzipped wheel and run unmodified in a torch interpreter.
Reference B: mlx-audio 0.6.2's `fish_drama3` `Model.build_frames` (with its `_check_codes`, `chunking.validate_text`,
`reference_transcript`, `with_speaker_tag`), called on a stand-in `self` that holds only the attributes it reads,
in the mlx interpreter. No restatement: both are the projects' own code.

Steps:
1. `limelight checkpoint synth --preset tiny --seed 7` into a temporary directory; its tokenizer.json is copied
   to tests/fixtures/prompt/tokenizer.json, so the fixture does not depend on later changes to the synthesizer.
2. Every case (text + references with seeded random codes) is built by both references; refusal cases record
   each reference's error message.
3. Writes tests/fixtures/prompt/golden.json (reference A's rows; whether B agreed) and versions.json.

Usage (from the repository root, after tools/reference/setup.sh; tools/reference/regenerate.sh runs every generator):
    cargo build --bin limelight
    .cache/reference/venv/bin/python tools/reference/prompt.py --bin target/debug/limelight --out tests/fixtures/prompt
(the same script is re-invoked with --engine s1 / --engine mlx inside each reference's interpreter: by default
.cache/reference/venv/bin/python with .cache/reference/sglang, and .venv/bin/python from tools/python-env.sh).
"""

import argparse
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent  # the repository root
SEED = 7  # the tiny checkpoint's seed
CODE_SEED = 20240607  # reference codes
CODEBOOK_SIZE = 256  # tiny preset audio_decoder_config.vocab_size
NUM_CODEBOOKS = 10


def codes(rng, frames):
    return [[rng.randrange(CODEBOOK_SIZE) for _ in range(frames)] for _ in range(NUM_CODEBOOKS)]


def cases():
    """(name, text, [(transcript, codes)]) built, and (name, text, refs, expected kind) refused."""
    rng = random.Random(CODE_SEED)
    built = [
        ("plain", "Hello, world. This is a test of the speech system.", []),
        ("inline_tags", "[sighs] I can't believe it's Monday again. [laughing] Oh well, [whispering] let's go.", []),
        ("speaker_at_start", "<|speaker:1|>Good morning, everyone!", []),
        ("speaker_after_white_space", " \t<|speaker:2|> Hi there.", []),
        ("speaker_mid", "Hello. <|speaker:3|> And hello to you.", []),
        ("two_speakers", "<|speaker:0|> Are you ready? <|speaker:15|> Always.", []),
        ("cjk", "今天天气很好，我们一起去公园散步吧。", []),
        ("japanese_korean", "こんにちは、世界。안녕하세요!", []),
        ("emoji", "Great job! 🎉👍 See you soon 😀", []),
        ("white_space_and_lines", "Line one.\nLine two.\tTabbed.  Two spaces.\r\n", []),
        ("paired_and_bracketed", "<whisper>don't tell anyone</whisper> [nervous, barely holding it together] okay", []),
        ("other_special_tokens_are_content", "Say <|endoftext|> and <|pad|> and <|speaker:4|> aloud.", []),
        ("nfc", "Cafe\u0301 de\u0301ja\u0300 vu", []),
        ("one_reference", "Nice to meet you.", [("This is my voice.", codes(rng, 7))]),
        ("reference_tagged_after_white_space", "Again, please.", [("  <|speaker:0|>Leading white space.", codes(rng, 4))]),
        ("two_references", "<|speaker:1|>第二个说话人。", [("First clip, in English.", codes(rng, 5)),
                                                      ("第二段参考音频。", codes(rng, 3))]),
        ("short_text_with_reference", "a", [("Short.", codes(rng, 2))]),
    ]
    refused = [
        ("empty", "", [], "empty"),
        ("white_space_only", " \u3000\n\t", [], "empty"),
        ("im_start", "hi <|im_start|> there", [], "structural:<|im_start|>"),
        ("im_end", "hi <|im_end|>", [], "structural:<|im_end|>"),
        ("voice", "<|voice|>", [], "structural:<|voice|>"),
        ("text_token", "a<|text|>b", [], "structural:<|text|>"),
        ("interleave", "a<|interleave|>b", [], "structural:<|interleave|>"),
        ("semantic", "a <|semantic:12|> b", [], "structural:<|semantic:"),
        ("semantic_prefix_only", "a <|semantic: b", [], "structural:<|semantic:"),
        ("speaker_16", "<|speaker:16|> hi", [], "speaker"),
        ("speaker_leading_zero", "hi <|speaker:01|>", [], "speaker"),
        ("speaker_unclosed", "hi <|speaker:1", [], "speaker"),
        ("speaker_no_digits", "hi <|speaker:|>", [], "speaker"),
        ("reference_empty_transcript", "fine", [("   ", codes(rng, 2))], "empty@references.0"),
        ("reference_structural", "fine", [("ok", codes(rng, 2)), ("<|im_end|>", codes(rng, 2))],
         "structural:<|im_end|>@references.1"),
        ("reference_code_out_of_range", "fine", [("ok", [[CODEBOOK_SIZE] * 2] + codes(rng, 2)[1:])],
         "code_range@references.0"),
        ("reference_wrong_codebooks", "fine", [("ok", codes(rng, 2)[:9])], "codes_shape@references.0"),
        ("reference_no_frames", "fine", [("ok", [[] for _ in range(NUM_CODEBOOKS)])], "codes_shape@references.0"),
    ]
    return built, refused


def run_s1(sglang_root, tokenizer_path, work):
    """Reference A, in a torch interpreter: sglang-omni's prompt.py loaded by file path."""
    import tokenizers
    import torch

    spec = importlib.util.spec_from_file_location(
        "s1_prompt", os.path.join(sglang_root, "sglang_omni/models/fishaudio_drama3/prompt.py"))
    prompt = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = prompt  # dataclasses look their module up while the file runs
    spec.loader.exec_module(prompt)
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    built, refused = cases()

    def build(text, refs):
        parts = [prompt.ReferencePart(transcript=t, audio_codes=torch.tensor(c, dtype=torch.int64))
                 for t, c in refs]
        return prompt.build_prompt_rows(text, parts, tok, num_codebooks=NUM_CODEBOOKS, codebook_size=CODEBOOK_SIZE)

    out = {"built": {}, "refused": {}, "versions": {"torch": torch.__version__, "tokenizers": tokenizers.__version__}}
    for name, text, refs in built:
        out["built"][name] = build(text, refs).tolist()
    for name, text, refs, _ in refused:
        try:
            build(text, refs)
            out["refused"][name] = None
        except ValueError as e:
            out["refused"][name] = str(e)
    json.dump(out, open(os.path.join(work, "s1.json"), "w"))


def run_mlx(tokenizer_path, work):
    """Reference B, in the mlx interpreter: mlx-audio's Model.build_frames on a stand-in self."""
    from importlib.metadata import version
    from types import SimpleNamespace

    import mlx.core as mx
    import tokenizers
    from mlx_audio.tts.models.fish_drama3.drama3 import Model

    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    this = SimpleNamespace(tokenizer=tok, num_codebooks=NUM_CODEBOOKS, semantic_begin=tok.token_to_id("<|semantic:0|>"),
                           tower=SimpleNamespace(vocab_size=CODEBOOK_SIZE))
    this._check_codes = lambda c, location: Model._check_codes(this, c, location)
    built, refused = cases()

    def build(text, refs):
        parts = [(t, mx.array(c, dtype=mx.int32)) for t, c in refs]
        frames, _system_rows = Model.build_frames(this, parts, [], text)
        return [[int(v) for v in row] for row in frames.tolist()]

    out = {"built": {}, "refused": {}, "versions": {"mlx": version("mlx"), "mlx-audio": version("mlx-audio")}}
    for name, text, refs in built:
        out["built"][name] = build(text, refs)
    for name, text, refs, _ in refused:
        try:
            build(text, refs)
            out["refused"][name] = None
        except ValueError as e:
            out["refused"][name] = str(e)
    json.dump(out, open(os.path.join(work, "mlx.json"), "w"))


def write_golden(path, tokenizer_ids, built_cases, refused_cases, a, b):
    """One case per line (rows one per line), so diffs of the fixture stay readable."""
    lines = ["{", f' "special_tokens": {json.dumps(tokenizer_ids)},', ' "built": [']
    for i, (name, text, refs) in enumerate(built_cases):
        head = {"name": name, "text": text, "references": [{"transcript": t, "codes": c} for t, c in refs],
                "mlx_audio_agrees": a["built"][name] == b["built"][name]}
        rows = ",\n".join("   " + json.dumps(r) for r in a["built"][name])
        lines.append(f"  {json.dumps(head, ensure_ascii=False)[:-1]}, \"rows\": [\n{rows}\n  ]}}"
                     + ("," if i + 1 < len(built_cases) else ""))
    lines.append(" ],")
    lines.append(' "refused": [')
    for i, (name, text, refs, kind) in enumerate(refused_cases):
        case = {"name": name, "text": text, "references": [{"transcript": t, "codes": c} for t, c in refs],
                "kind": kind, "s1_message": a["refused"][name], "mlx_audio_message": b["refused"][name]}
        lines.append("  " + json.dumps(case, ensure_ascii=False) + ("," if i + 1 < len(refused_cases) else ""))
    lines.append(" ]")
    lines.append("}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="target/debug/limelight", help="the limelight binary")
    ap.add_argument("--out", default="tests/fixtures/prompt", help="fixture directory")
    ap.add_argument("--sglang-omni", default=str(ROOT / ".cache/reference/sglang"),
                    help="the unzipped sglang-omni 0.1.9 wheel (default: from tools/reference/setup.sh)")
    ap.add_argument("--torch-python", default=str(ROOT / ".cache/reference/venv/bin/python"),
                    help="interpreter with torch (default: from tools/reference/setup.sh)")
    ap.add_argument("--mlx-python", default=str(ROOT / ".venv/bin/python"),
                    help="interpreter with mlx-audio (default: from tools/python-env.sh)")
    ap.add_argument("--engine", choices=["s1", "mlx"], help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine == "s1":
        return run_s1(args.sglang_omni, args.tokenizer, args.work)
    if args.engine == "mlx":
        return run_mlx(args.tokenizer, args.work)

    os.makedirs(args.out, exist_ok=True)
    tokenizer = os.path.join(args.out, "tokenizer.json")
    with tempfile.TemporaryDirectory() as work:
        ckpt = os.path.join(work, "tiny")
        subprocess.run([os.path.abspath(args.bin), "checkpoint", "synth", "--preset", "tiny", "--seed", str(SEED),
                        "--out", ckpt], check=True, stdout=subprocess.DEVNULL)
        shutil.copyfile(os.path.join(ckpt, "tokenizer.json"), tokenizer)
        config = json.load(open(os.path.join(ckpt, "config.json")))
        for python, engine in ((args.torch_python, "s1"), (args.mlx_python, "mlx")):
            subprocess.run([python, __file__, "--engine", engine, "--sglang-omni", args.sglang_omni, "--tokenizer",
                            tokenizer, "--work", work], check=True)
        a = json.load(open(os.path.join(work, "s1.json")))
        b = json.load(open(os.path.join(work, "mlx.json")))

    assert config["audio_decoder_config"]["vocab_size"] == CODEBOOK_SIZE
    assert config["audio_decoder_config"]["num_codebooks"] == NUM_CODEBOOKS
    built, refused = cases()
    for name, _, _, kind in refused:
        assert a["refused"][name] is not None, f"S1 accepted refusal case {name}"
        assert b["refused"][name] is not None, f"mlx-audio accepted refusal case {name}"
    disagreements = [name for name, _, _ in built if a["built"][name] != b["built"][name]]
    ids = {"semantic_start": config["semantic_start_token_id"], "eos": config["eos_token_id"]}
    write_golden(os.path.join(args.out, "golden.json"), ids, built, refused, a, b)
    versions = {
        "generator": "tools/reference/prompt.py",
        "command": "cargo build --bin limelight && .cache/reference/venv/bin/python tools/reference/prompt.py "
                   "--bin target/debug/limelight --out tests/fixtures/prompt",
        "checkpoint": f"limelight checkpoint synth --preset tiny --seed {SEED} (tokenizer.json copied here)",
        "reference_a": "sglang-omni 0.1.9 sglang_omni/models/fishaudio_drama3/prompt.py (unmodified, from the wheel)",
        "reference_b": "mlx-audio 0.6.2 mlx_audio/tts/models/fish_drama3/drama3.py Model.build_frames (unmodified)",
        "python": sys.version.split()[0],
        **a["versions"],
        **{f"mlx_side_{k}": v for k, v in b["versions"].items()},
        "cases_built": len(built),
        "cases_refused": len(refused),
        "reference_b_disagrees_on": disagreements,
    }
    with open(os.path.join(args.out, "versions.json"), "w") as f:
        json.dump(versions, f, indent=2)
        f.write("\n")
    print(f"wrote {args.out}: {len(built)} built, {len(refused)} refused; mlx-audio disagrees on {disagreements}")


if __name__ == "__main__":
    main()
