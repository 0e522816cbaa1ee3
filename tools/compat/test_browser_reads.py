"""A browser's `<audio>` and Web Audio play what limelight serves (issue 16, "every file any common
reader can open"): headless Chromium loads each format, whole (`"stream": false`) and streamed
(the bytes as a streaming client collects them), as a web app plays a reply it fetched: into an
`<audio>` element from a blob URL (its metadata must load without a media error, and a whole
file's duration must be its length) and through `decodeAudioData` (the request's audio must
decode, at its length). `pcm` is headerless, so no browser plays it as a file: a web client
feeds it to Web Audio at the `x-sample-rate` it is told (docs/api.md)."""

import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

import conftest

MAX_FRAMES = 12
SECONDS = MAX_FRAMES * 2048 / 44100
FORMATS = ["wav", "mp3", "opus", "flac"]

PAGE = """<!doctype html><html><body>waiting<script>
const files = %s;
function settle(el) {
  return new Promise(res => {
    el.onloadedmetadata = () => res("metadata");
    el.onerror = () => res("error");
    setTimeout(() => res("timeout"), 10000);
  });
}
async function probe(f) {
  const out = {};
  // As a web app plays a POST's reply: its bytes as a blob, the blob's URL as the source.
  const blob = await (await fetch(f)).blob();
  const el = new Audio();
  el.preload = "auto";
  const settled = settle(el);
  el.src = URL.createObjectURL(blob);
  out.element = await settled;
  out.element_error = el.error ? el.error.code : null;
  out.element_duration = String(el.duration);
  try {
    const bytes = await blob.arrayBuffer();
    const decoded = await new OfflineAudioContext(1, 1, 48000).decodeAudioData(bytes);
    out.decoded_seconds = decoded.duration;
  } catch (e) { out.decode_error = String(e); }
  return out;
}
(async () => {
  const results = {};
  for (const f of files) results[f] = await probe(f);
  await fetch("results", {method: "POST", body: JSON.stringify(results)});
})();
</script></body></html>"""


class Files(http.server.ThreadingHTTPServer):
    """Serves a folder to the browser and takes the page's results (`POST /results`)."""

    def __init__(self, folder: Path):
        self.results = None
        self.posted = threading.Event()
        super().__init__(("127.0.0.1", 0), functools.partial(Handler, directory=str(folder)))
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Handler(http.server.SimpleHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.results = json.loads(body)
        self.send_response(204)
        self.end_headers()
        self.server.posted.set()

    def log_message(self, *args):
        pass


def probe_in_chromium(browser: str, folder: Path, names: list[str]) -> dict:
    """Loads the probe page over `names` (files in `folder`) in headless Chromium; its results."""
    (folder / "index.html").write_text(PAGE % json.dumps(names))
    files = Files(folder)
    page = f"http://127.0.0.1:{files.server_address[1]}/index.html"
    proc = subprocess.Popen(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={folder / 'profile'}", page],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        assert files.posted.wait(timeout=120), "the page posted no results"
        return files.results
    finally:
        proc.kill()
        proc.wait()
        files.shutdown()


def chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.environ.get("LIMELIGHT_REQUIRE_TOOLS"):
        pytest.fail("chromium is missing (tools/test.sh installs it)")
    return found


@pytest.fixture(scope="module")
def server(limelight_server):
    yield from limelight_server("--max-frames", str(MAX_FRAMES))


def speak(base: str, fmt: str, stream: bool) -> bytes:
    return conftest.speak(base, fmt, stream, 'Browsers everywhere.', 9, MAX_FRAMES)


def test_every_format_whole_and_streamed_plays_in_chromium(server, tmp_path):
    browser = chromium()
    if browser is None:
        pytest.skip("no chromium on this machine")
    names = []
    for fmt in FORMATS:
        for stream in (False, True):
            name = f"{'streamed' if stream else 'whole'}.{fmt}"
            (tmp_path / name).write_bytes(speak(server, fmt, stream))
            names.append(name)
    results = probe_in_chromium(browser, tmp_path, names)
    for name in names:
        got = results[name]
        assert got["element"] == "metadata" and got["element_error"] is None, f"{name}: <audio> {got}"
        assert "decode_error" not in got, f"{name}: {got}"
        # Lossy codecs may pad a frame's worth (an MP3 frame is 26 ms, an Opus frame 20 ms).
        assert abs(got["decoded_seconds"] - SECONDS) < 0.06, f"{name}: {got}"
        if name.startswith("whole"):
            assert abs(float(got["element_duration"]) - SECONDS) < 0.06, f"{name}: {got}"


def test_the_probe_reports_a_file_it_cannot_play(tmp_path):
    """The probe itself: a file that is not audio is reported as a media error, not as audio."""
    browser = chromium()
    if browser is None:
        pytest.skip("no chromium on this machine")
    (tmp_path / "bad.mp3").write_bytes(b"not audio at all" * 64)
    got = probe_in_chromium(browser, tmp_path, ["bad.mp3"])["bad.mp3"]
    assert got["element"] == "error" and got["element_error"] is not None and "decode_error" in got, got
