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


def test_a_flood_is_refused_cleanly_and_loses_no_admitted_audio(server):
    """More requests at once than the queue holds: the excess gets 429 with Retry-After, every
    admitted request still receives all its audio with a finish reason, and the server stays up."""
    from concurrent.futures import ThreadPoolExecutor

    host = server.removeprefix("http://")

    def one(i: int):
        conn = http.client.HTTPConnection(host, timeout=300)
        body = json.dumps({"model": "drama-3", "input": f"Flood request {i}.", "response_format": "pcm",
                           "max_frames": 24, "seed": i, "stream": False})
        conn.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, resp.getheader("Retry-After"), resp.getheader("X-Finish-Reason"), len(data)

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(one, range(32)))
    admitted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 429]
    assert len(admitted) + len(refused) == len(results), results
    assert admitted and refused, "the default queue (16) admits some of 32 and refuses the rest"
    assert all(r[1] and int(r[1]) >= 1 for r in refused)
    for _, _, reason, size in admitted:
        assert reason in ("stop", "length") and size > 0 and size % 2 == 0
    conn = http.client.HTTPConnection(host, timeout=10)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    conn.close()
    assert open_stream(server, 4).read()
