"""python-soundfile (libsndfile), the most common Python audio reader, opens what limelight
serves (issue 16, finding 5 and "every file any common reader can open"): every format it
reads, whole (`"stream": false`) and streamed, with the expected rate, one channel and the
frames the server says it generated. A streamed FLAC is the one exception, as docs/api.md
states: its STREAMINFO must say "total samples unknown" (0, the FLAC spec's value for a stream
whose length is not known when its header leaves), which libsndfile cannot read; the same
request whole is complete and reads. ffmpeg reads every file, streamed or whole
(test_openai_sdk.py)."""

import io

import numpy as np
import pytest
import soundfile as sf

import conftest

MAX_FRAMES = 12
SAMPLES_PER_FRAME = 2048
# (format, the rate served)
FORMATS = [("wav", 44100), ("flac", 44100), ("mp3", 44100), ("opus", 48000)]


@pytest.fixture(scope="module")
def server(limelight_server):
    yield from limelight_server("--max-frames", str(MAX_FRAMES))


def speak(base: str, fmt: str, stream: bool) -> bytes:
    return conftest.speak(base, fmt, stream, 'Readers everywhere.', 5, MAX_FRAMES)


@pytest.mark.parametrize("fmt,rate", FORMATS)
def test_whole_files_read_in_soundfile(server, fmt, rate):
    audio, got_rate = sf.read(io.BytesIO(speak(server, fmt, False)))
    assert got_rate == rate and audio.ndim == 1
    if fmt in ("wav", "flac", "mp3"):
        # A whole MP3 is gapless (its LAME Info tag trims the codec's delay and padding).
        assert len(audio) == MAX_FRAMES * SAMPLES_PER_FRAME
    else:
        # Opus at 48 kHz: the frames' duration at 48 kHz, within one 20 ms Opus frame.
        want = MAX_FRAMES * SAMPLES_PER_FRAME * 48000 / 44100
        assert abs(len(audio) - want) <= 960
    assert np.isfinite(audio).all() and np.abs(audio).max() > 0


@pytest.mark.parametrize("fmt,rate", [f for f in FORMATS if f[0] != "flac"])
def test_streamed_files_read_in_soundfile(server, fmt, rate):
    streamed, _ = sf.read(io.BytesIO(speak(server, fmt, True)))
    whole, _ = sf.read(io.BytesIO(speak(server, fmt, False)))
    if fmt == "wav":
        assert np.array_equal(streamed, whole)
    else:
        # Lossy codecs: the same audio, give or take the streamed MP3's untrimmed delay/padding.
        assert abs(len(streamed) - len(whole)) <= 3 * 1152


def test_a_streamed_flac_declares_its_length_unknown_and_the_whole_one_reads(server):
    streamed = speak(server, "flac", True)
    assert streamed[:4] == b"fLaC"
    info = streamed[8:8 + 34]  # STREAMINFO's body
    total = ((info[13] & 0x0F) << 32) | int.from_bytes(info[14:18], "big")
    assert total == 0, "a streamed FLAC cannot know its length when its header is sent"
    whole = speak(server, "flac", False)
    info = whole[8:8 + 34]
    total = ((info[13] & 0x0F) << 32) | int.from_bytes(info[14:18], "big")
    assert total == MAX_FRAMES * SAMPLES_PER_FRAME
    # The audio frames are the same bytes: only STREAMINFO (frame sizes, length, MD5) differs.
    assert streamed[8 + 34:] == whole[8 + 34:]
    audio, _ = sf.read(io.BytesIO(whole))
    assert len(audio) == total
