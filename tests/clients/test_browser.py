"""The browser example (clients/typescript/examples/browser) in Debian's headless Chromium: the page
loads the demo draft in ONNX Runtime Web (WASM) and generates over the WebSocket transport against
a real Serve verifier; its greedy output equals the Python SDK's on held-out prompts. The page is
served from its own origin, which the verifier's allow-list names (a foreign Origin is refused).

Node, the package's node_modules (playwright-core) and chromium come from set-up; nothing skips.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, ModelPair, free_port, held_out_ids, start_server, stop_server

from edgespec.edge.client import EdgeClient

pytestmark = pytest.mark.slow

PACKAGE = REPO / "clients" / "typescript"
DEMO = REPO / "models" / "demo"
NEW_TOKENS = 32
HELD_OUT = 3
NODE_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def page_server():
    """The example built and served on a free port: (its URL, its origin)."""
    assert shutil.which("chromium"), "chromium is missing: the project's set-up installs it (apt-get install chromium)"
    built = subprocess.run(["node", "examples/browser/build.mjs"], cwd=PACKAGE, capture_output=True, text=True, timeout=NODE_TIMEOUT_S)
    assert built.returncode == 0, built.stderr[-3000:]
    port = free_port()
    server = subprocess.Popen(["node", "examples/browser/serve.mjs", "--port", str(port), "--draft", str(DEMO / "draft")],
                              cwd=PACKAGE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # "serving http://127.0.0.1:PORT/" once it listens
        assert re.match(r"serving http://127\.0\.0\.1:\d+/", line), line
        yield f"http://127.0.0.1:{port}/", f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def verifier(page_server):
    _, origin = page_server
    srv = start_server(ModelPair(DEMO / "target", DEMO / "draft-hf", DEMO / "draft"), torch_threads=1, allowed_origins=(origin,))
    try:
        yield srv
    finally:
        stop_server()


@pytest.fixture(scope="module")
def held_out(tmp_path_factory) -> Path:
    return held_out_ids(DEMO / "draft", slice(-HELD_OUT, None), tmp_path_factory.mktemp("prompts") / "heldout.jsonl")


def browser_generate(page: str, server: str, prompts: Path, k: str) -> dict[str, dict]:
    done = subprocess.run(["npx", "tsx", "test/browser/generate.ts", "--page", page, "--server", server, "--prompts", str(prompts),
                           "--max-new-tokens", str(NEW_TOKENS), "--k", k],
                          cwd=PACKAGE, capture_output=True, text=True, timeout=NODE_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return {row["id"]: row for row in map(json.loads, done.stdout.splitlines())}


@pytest.mark.parametrize("k", ["auto", "4"])
def test_browser_greedy_output_equals_the_python_sdks(page_server, verifier, held_out, k):
    page, _ = page_server
    rows = [json.loads(line) for line in held_out.read_text().splitlines()]
    with EdgeClient(verifier.address, DEMO / "draft", timeout=60) as client:
        expected = {row["id"]: client.generate(row["prompt_ids"], max_new_tokens=NEW_TOKENS, stop_token_ids=()) for row in rows}
    browser = browser_generate(page, f"ws://127.0.0.1:{verifier.http_port}", held_out, k)
    assert set(browser) == set(expected)
    for prompt_id, result in expected.items():
        assert browser[prompt_id]["token_ids"] == result.token_ids, prompt_id
        assert browser[prompt_id]["text"] == result.text, prompt_id
        assert browser[prompt_id]["finish_reason"] == "length"
    if k == "4":
        assert all(row["rounds"] < NEW_TOKENS for row in browser.values())  # the browser's drafts were accepted


def test_a_page_from_a_foreign_origin_is_refused(page_server, verifier, held_out, tmp_path):
    """The same page served from another port is another origin: the verifier refuses it (Info
    without CORS headers, which the browser then hides from the page; a session closed with 4007)."""
    port = free_port()
    other = subprocess.Popen(["node", "examples/browser/serve.mjs", "--port", str(port), "--draft", str(DEMO / "draft")],
                             cwd=PACKAGE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and "serving" in other.stdout.readline()
        one = tmp_path / "one.jsonl"
        one.write_text(held_out.read_text().splitlines()[0] + "\n")
        done = subprocess.run(["npx", "tsx", "test/browser/generate.ts", "--page", f"http://127.0.0.1:{port}/",
                               "--server", f"ws://127.0.0.1:{verifier.http_port}", "--prompts", str(one), "--max-new-tokens", "4"],
                              cwd=PACKAGE, capture_output=True, text=True, timeout=NODE_TIMEOUT_S)
    finally:
        other.terminate()
        other.wait(timeout=30)
    assert done.returncode != 0 and done.stdout.strip() == ""  # not one token
    assert "not allowed" in done.stderr or "GET /v1/info: Failed to fetch" in done.stderr, done.stderr[-3000:]
