"""The `curl` examples in README.md run as written against `limelight serve --demo` (only the
address is pointed at the test server), and what they save is audio ffprobe can read."""

import json
import re
import subprocess
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def server(limelight_server):
    yield from limelight_server()


def readme_curl_commands() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    commands = []
    for block in blocks:
        for command in block.replace("\\\n", " ").splitlines():
            if command.strip().startswith("curl "):
                commands.append(command.strip())
    return commands


def test_readme_has_curl_examples():
    assert len(readme_curl_commands()) >= 4


@pytest.mark.parametrize("command", readme_curl_commands())
def test_readme_curl_example_runs(server, tmp_path, command):
    command = command.replace("http://127.0.0.1:8080", server)
    out = subprocess.run(["bash", "-c", "set -o pipefail; " + command + " --fail-with-body"],
                         cwd=tmp_path, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode() + out.stdout.decode()
    saved = list(tmp_path.iterdir())
    for path in saved:
        probe = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_name,channels",
                                "-of", "json", str(path)], capture_output=True, text=True, check=True)
        assert json.loads(probe.stdout)["streams"][0]["channels"] == 1
    if "/ready" in command or "/v1/models" in command:
        assert out.stdout
    if "sse" in command:
        assert b"speech.audio.done" in out.stdout
