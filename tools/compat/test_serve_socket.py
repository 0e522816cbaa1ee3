"""`limelight serve --demo` over a real socket: audio arrives while generation is still running,
and a client that disconnects mid-stream frees the engine at once for the next request."""

import http.client
import json
import time

import pytest

LONG = 2048  # frames (the reference cap): seconds of CPU generation for the tiny model


@pytest.fixture(scope="module")
def server(limelight_server):
    yield from limelight_server("--max-frames", str(LONG))


def open_stream(base: str, max_frames: int, seed: int = 1) -> http.client.HTTPResponse:
    host = base.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=120)
    body = json.dumps({"model": "drama-3", "input": "Streaming over a socket.", "response_format": "pcm",
                       "max_frames": max_frames, "seed": seed})
    conn.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json", "TE": "trailers"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    assert resp.getheader("Transfer-Encoding") == "chunked"
    assert resp.getheader("Trailer", "").lower() == "x-finish-reason"
    return resp


def test_audio_arrives_before_generation_ends(server):
    start = time.monotonic()
    resp = open_stream(server, LONG, seed=2)
    first = resp.read1(65536)
    first_at = time.monotonic() - start
    total = len(first) + len(resp.read())
    done_at = time.monotonic() - start
    assert first and total > len(first)
    # The first frame is decoded alone: it reaches the client long before the whole reply ends.
    assert first_at < done_at / 2, (first_at, done_at)


def test_disconnect_frees_the_engine_for_the_next_request(server):
    # How long a short request takes on an idle server.
    start = time.monotonic()
    open_stream(server, 8).read()
    alone = time.monotonic() - start

    long = open_stream(server, LONG, seed=3)
    assert long.read1(65536)
    long.close()  # hang up mid-stream: the job must be cancelled, not finished
    start = time.monotonic()
    short = open_stream(server, 8).read()
    after = time.monotonic() - start
    assert len(short) > 0
    # Had the long job kept the engine, the short one would wait for all its frames.
    assert after < alone + 2.0, (alone, after)
