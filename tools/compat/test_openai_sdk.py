"""The official `openai` Python SDK drives `limelight serve --demo` unchanged: every response
format whole and streamed, and SSE parsed by hand. Every file is decoded by an independent
decoder (ffprobe / ffmpeg) and must have the expected rate, one channel, and a duration of
frames x 2048 / 44100 s within one codec frame (scaled by `speed`)."""

import base64
import json
import subprocess
import urllib.request
from pathlib import Path

import openai
import pytest

MAX_FRAMES = 16
SEED = 11
TEXT = "Hello from limelight."
SECONDS_PER_FRAME = 2048 / 44100
# (format, expected decoder codec name, expected rate, one codec frame in seconds)
FORMATS = [
    ("mp3", "mp3", 44100, 1152 / 44100),
    ("opus", "opus", 48000, 0.02),
    ("flac", "flac", 44100, 4096 / 44100),
    ("wav", "pcm_s16le", 44100, 1 / 44100),
    ("pcm", None, 24000, 1 / 24000),
]


@pytest.fixture(scope="module")
def server(limelight_server):
    yield from limelight_server("--max-frames", str(MAX_FRAMES))


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def probe(path: Path, fmt: str) -> tuple[str, int, int, float]:
    """(codec, sample rate, channels, duration) as ffprobe decodes the file."""
    args = ["-f", "s16le", "-ar", "24000", "-ac", "1"] if fmt == "pcm" else []
    out = subprocess.run(
        ["ffprobe", "-v", "error", *args, "-show_entries", "stream=codec_name,sample_rate,channels",
         "-show_entries", "format=duration", "-of", "json", str(path)],
        check=True, capture_output=True, text=True,
    ).stdout
    info = json.loads(out)
    stream = info["streams"][0]
    # Decode fully: the container's own duration field may be absent for streamed files.
    decoded = subprocess.run(
        ["ffmpeg", "-v", "error", *args, "-i", str(path), "-f", "f32le", "-ac", "1", "-"],
        check=True, capture_output=True,
    ).stdout
    rate = int(stream["sample_rate"])
    return stream["codec_name"], rate, int(stream["channels"]), len(decoded) / 4 / rate


def decode(path: Path, fmt: str) -> bytes:
    args = ["-f", "s16le", "-ar", "24000", "-ac", "1"] if fmt == "pcm" else []
    return subprocess.run(["ffmpeg", "-v", "error", *args, "-i", str(path), "-f", "s16le", "-"],
                          check=True, capture_output=True).stdout


def frames_via_sse(server: str, **extra) -> int:
    """Frames of the seeded request, read from the `usage` of the final SSE event."""
    body = json.dumps({"model": "tts-1", "voice": "alloy", "input": TEXT, "stream_format": "sse",
                       "response_format": "pcm", "seed": SEED, **extra}).encode()
    req = urllib.request.Request(server + "/v1/audio/speech", body, {"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r:
            if line.startswith(b"data:"):
                events.append(json.loads(line[5:]))
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert deltas and all(base64.b64decode(e["audio"]) for e in deltas)
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    return usage["output_tokens"]


@pytest.mark.parametrize("fmt,codec,rate,codec_frame", FORMATS)
def test_every_format_whole_and_streamed(client, server, tmp_path, fmt, codec, rate, codec_frame):
    frames = frames_via_sse(server)
    assert 0 < frames <= MAX_FRAMES
    whole = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format=fmt,
                                       extra_body={"seed": SEED, "stream": False})
    path = tmp_path / f"whole.{fmt}"
    whole.write_to_file(path)
    again = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format=fmt,
                                       extra_body={"seed": SEED, "stream": False})
    assert again.content == path.read_bytes(), "the same seed gives the same bytes"
    got_codec, got_rate, channels, duration = probe(path, fmt)
    if codec:
        assert got_codec == codec
    assert (got_rate, channels) == (rate, 1)
    assert abs(duration - frames * SECONDS_PER_FRAME) <= codec_frame + 1e-3, (duration, frames)

    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format=fmt, extra_body={"seed": SEED},
    ) as response:
        streamed = b"".join(response.iter_bytes())
    spath = tmp_path / f"streamed.{fmt}"
    spath.write_bytes(streamed)
    _, srate, schannels, sduration = probe(spath, fmt)
    assert (srate, schannels) == (rate, 1)
    # A streamed MP3 cannot carry LAME's Info tag (it is written at the end of a seekable file),
    # so decoders keep the encoder delay and padding: up to about three MP3 frames.
    slack = 3 * codec_frame if fmt == "mp3" else codec_frame
    assert abs(sduration - duration) <= slack + 1e-3
    if fmt in ("pcm", "wav", "flac"):
        # Lossless: the same samples, though a streamed header cannot state sizes or checksums.
        assert decode(spath, fmt) == decode(path, fmt), "a streamed reply carries the same audio as a whole one"


def test_speed_scales_duration(client, server, tmp_path):
    frames = frames_via_sse(server)
    fast = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="wav",
                                      speed=2.0, extra_body={"seed": SEED, "stream": False})
    path = tmp_path / "fast.wav"
    fast.write_to_file(path)
    _, _, _, duration = probe(path, "wav")
    assert abs(duration - frames * SECONDS_PER_FRAME / 2) <= 0.05, (duration, frames)


def test_sdk_sees_openai_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model="tts-1", voice="alloy", input="", response_format="mp3")
    assert e.value.body["param"] == "input"
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="no-such-model", voice="alloy", input=TEXT)
