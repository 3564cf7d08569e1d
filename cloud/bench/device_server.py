"""``edgespec bench device-server``: what the OpenAI-compatible device server costs over calling
the SDK directly: the same prompts, greedy, alternating the two arms prompt by prompt, ms/token
of each (an HTTP request to the local server, JSON in and out, and its stop-string scan)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable


def run_device_bench(target: Path, draft: Path, prompts: list[str], max_new_tokens: int, server: str | None = None,
                     progress: Callable[[str], None] = print) -> dict:
    from edgespec.cloud.bench.harness import Harness
    from edgespec.edge.openai_server import DeviceServer

    with Harness(target, draft, server=server, progress=progress) as harness:
        harness.warm_up(prompts[0])
        device = DeviceServer(("127.0.0.1", 0), harness.client, draft)
        thread = threading.Thread(target=device.serve_forever, daemon=True)
        thread.start()
        totals = {"sdk": [0.0, 0], "device_server": [0.0, 0]}
        identical = 0
        try:
            for i, prompt in enumerate(prompts):
                outputs = {}
                for arm in (("sdk", "device_server") if i % 2 == 0 else ("device_server", "sdk")):
                    started = time.perf_counter()
                    if arm == "sdk":
                        result = harness.client.generate(prompt, max_new_tokens=max_new_tokens, stop_token_ids=())
                        text, tokens = result.text, len(result.token_ids)
                    else:
                        body = json.dumps({"prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0}).encode()
                        request = urllib.request.Request(device.url + "/v1/completions", body, {"Content-Type": "application/json"})
                        with urllib.request.urlopen(request, timeout=300) as reply:
                            answer = json.loads(reply.read())
                        text, tokens = answer["choices"][0]["text"], answer["usage"]["completion_tokens"]
                    totals[arm][0] += time.perf_counter() - started
                    totals[arm][1] += tokens
                    outputs[arm] = text
                identical += outputs["sdk"] == outputs["device_server"]
                progress(f"  device-server prompt {i + 1}/{len(prompts)}")
        finally:
            device.shutdown()
            device.server_close()
    ms = {arm: seconds * 1000 / max(tokens, 1) for arm, (seconds, tokens) in totals.items()}
    return {
        "prompts": len(prompts), "max_new_tokens": max_new_tokens,
        "sdk_ms_per_token": ms["sdk"], "device_server_ms_per_token": ms["device_server"],
        "overhead_ms_per_token": ms["device_server"] - ms["sdk"], "ratio": ms["device_server"] / ms["sdk"],
        "identical_text": identical,
    }
