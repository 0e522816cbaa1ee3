"""Shared fixtures: the limelight binary (built once per session, or $LIMELIGHT_BIN) and tiny
random-weight checkpoints it writes, plus small helpers to read and edit safetensors files."""

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="session")
def limelight_bin() -> Path:
    if os.environ.get("LIMELIGHT_BIN"):
        return Path(os.environ["LIMELIGHT_BIN"]).resolve()
    # The JSON messages name the executable wherever CARGO_TARGET_DIR puts it.
    build = subprocess.run(
        ["cargo", "build", "--bin", "limelight", "--message-format=json-render-diagnostics"],
        cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True,
    )
    for line in build.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("executable"):
            if message["target"]["name"] == "limelight":
                return Path(message["executable"])
    raise RuntimeError("cargo did not report the limelight executable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def limelight_server(limelight_bin, tmp_path_factory):
    """limelight_server(*flags) -> generator yielding the base URL of `limelight serve --demo`
    on a free loopback port; on teardown it is sent SIGTERM and must exit 0."""

    def run(*flags):
        port = free_port()
        env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path_factory.mktemp("cache")))
        proc = subprocess.Popen([limelight_bin, "serve", "--demo", "--port", str(port), *flags],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(base + "/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.2)
        yield base
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0

    return run


@pytest.fixture(scope="session")
def synth(limelight_bin, tmp_path_factory):
    """synth(k) -> directory of a tiny checkpoint with vq_backbone_codebooks=k (cached; read-only)."""
    written = {}

    def make(k: int = 1) -> Path:
        if k not in written:
            out = tmp_path_factory.mktemp(f"drama3-tiny-k{k}")
            subprocess.run(
                [limelight_bin, "checkpoint", "synth", "--preset", "tiny", "--seed", "0",
                 "--out", out, "--vq-backbone-codebooks", str(k)],
                check=True, capture_output=True,
            )
            written[k] = out
        return written[k]

    return make


def read_header(path: Path) -> tuple[dict, int]:
    """The raw safetensors JSON header of a file and the offset where its data starts."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(size)), 8 + size


def copy_checkpoint(src: Path, dst: Path) -> Path:
    """A writable copy of a checkpoint (the synth fixture's directories are shared)."""
    shutil.copytree(src, dst)
    return dst


def drop_tensor(ckpt: Path, name: str) -> None:
    """Remove one tensor from its shard (rewriting the header and the data) and from the index."""
    index = json.loads((ckpt / INDEX).read_text())
    shard = ckpt / index["weight_map"].pop(name)
    header, start = read_header(shard)
    data = shard.read_bytes()[start:]
    removed = header.pop(name)
    body, offset = [], 0
    for key, entry in sorted(
        ((k, v) for k, v in header.items() if k != "__metadata__"),
        key=lambda item: item[1]["data_offsets"][0],
    ):
        begin, end = entry["data_offsets"]
        entry["data_offsets"] = [offset, offset + end - begin]
        body.append(data[begin:end])
        offset += end - begin
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    shard.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(body))
    begin, end = removed["data_offsets"]
    index["metadata"]["total_size"] -= end - begin
    (ckpt / INDEX).write_text(json.dumps(index, indent=2))


def speak(base: str, fmt: str, stream: bool, text: str, seed: int, max_frames: int) -> bytes:
    """One `POST /v1/audio/speech` to the server at `base`; its 200 reply's bytes."""
    body = {"model": "tts-1", "input": text, "response_format": fmt, "stream": stream, "seed": seed,
            "max_frames": max_frames}
    req = urllib.request.Request(base + "/v1/audio/speech", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        return r.read()
