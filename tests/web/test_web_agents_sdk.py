"""An unmodified OpenAI Agents SDK (JS) client over WebRTC, in headless Chromium,
against ``omnitrio run``: only its URL changed.

The SDK's own browser bundle (``@openai/agents-realtime`` ``SDK_VERSION`` from npm,
installed once into the voice cache with ``npm install --ignore-scripts``; or the
package folder ``OMNITRIO_AGENTS_SDK`` names; skipped where neither can be had) is
served to the page under the server's origin (Playwright routes it; the calls go to
the server itself). The page
makes a ``RealtimeAgent`` and a ``RealtimeSession`` on the SDK's
``OpenAIRealtimeWebRTC`` transport with ``baseUrl`` set to omnitrio's
``/v1/realtime/calls`` and an ephemeral key from ``POST /v1/realtime/client_secrets``
(as a browser app gets one from its backend), and connects; Chromium's fake microphone
asks the question, and the turn must complete: the SDK's history holds the user's
transcript and the assistant's answer, and the answer played on the remote track.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import Route

from tests.web.test_web_page import chromium_page, fake_microphone_args
from tests.web.test_web_voice import (
    RAW_MICROPHONE,
    TURN_TIMEOUT_MS,
    _microphone_wav,
    default_server,  # noqa: F401 (the fixture)
    pytestmark,  # noqa: F401 (needs the voice packages and weights)
)

SDK_ENV = "OMNITRIO_AGENTS_SDK"
SDK_PACKAGE = "@openai/agents-realtime"
SDK_VERSION = "0.20.0"
PAGE = """<!doctype html><html><body><audio id="answer" autoplay></audio>
<script type="module">
import { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession }
  from "/agents-sdk/openai-realtime-agents.mjs";
window.seen = { events: [], history: [], errors: [] };
window.talk = async (key) => {
  const agent = new RealtimeAgent({ name: "Assistant", instructions: "Answer briefly." });
  const transport = new OpenAIRealtimeWebRTC({
    baseUrl: location.origin + "/v1/realtime/calls",
    audioElement: document.getElementById("answer"),
  });
  const session = new RealtimeSession(agent, { transport });
  transport.on("*", (event) => window.seen.events.push(event.type));
  session.on("history_updated", (history) => { window.seen.history = history; });
  session.on("error", (error) => window.seen.errors.push(JSON.stringify(error.error ?? error)));
  await session.connect({ apiKey: key });
  window.seen.connected = true;
};
</script></body></html>"""


def _sdk_bundle() -> Path:
    """The SDK's ES module bundle: ``OMNITRIO_AGENTS_SDK``'s, else npm's, installed once."""
    named = os.environ.get(SDK_ENV)
    if named:
        folder = Path(named)
    else:
        from stages.voice.llm_weights import default_cache_dir

        prefix = default_cache_dir() / f"agents-realtime-{SDK_VERSION}"
        folder = prefix / "node_modules" / SDK_PACKAGE
        npm = shutil.which("npm")
        if not (folder / "package.json").is_file() and npm is not None:
            command = [npm, "install", "--ignore-scripts", "--no-audit", "--no-fund"]
            command += ["--prefix", str(prefix), f"{SDK_PACKAGE}@{SDK_VERSION}"]
            subprocess.run(command, check=False, capture_output=True, timeout=300)
    bundle = folder / "dist" / "bundle"
    if not (bundle / "openai-realtime-agents.mjs").is_file():
        pytest.skip(f"no {SDK_PACKAGE} bundle: npm could not install it and {SDK_ENV} is unset")
    return bundle


def _client_secret(base_url: str) -> str:
    request = urllib.request.Request(
        f"{base_url}/v1/realtime/client_secrets",
        data=json.dumps({"session": {"type": "realtime"}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.load(response)["value"])


def test_the_agents_sdk_completes_a_spoken_turn_over_webrtc(
    tmp_path: Path,
    chromium: Path,
    default_server: str,  # noqa: F811
) -> None:
    bundle = _sdk_bundle()
    wav = _microphone_wav(tmp_path)
    args = [*fake_microphone_args(wav), "--allow-loopback-in-peer-connection"]
    key = _client_secret(default_server)

    def sdk(route: Route) -> None:
        name = route.request.url.rsplit("/", 1)[-1]
        path = bundle / name
        if not path.is_file():
            route.fulfill(status=404)
            return
        route.fulfill(body=path.read_bytes(), content_type="text/javascript")

    with chromium_page(chromium, args, TURN_TIMEOUT_MS) as (page, page_errors):
        page.add_init_script(RAW_MICROPHONE)
        page.route(f"{default_server}/agents-sdk/*", sdk)
        page.route(
            f"{default_server}/agents-sdk-test",
            lambda route: route.fulfill(body=PAGE, content_type="text/html"),
        )
        page.goto(f"{default_server}/agents-sdk-test")
        page.wait_for_function("window.talk !== undefined")
        page.evaluate("key => window.talk(key)", key)
        page.wait_for_function(
            "window.seen.events.includes('response.done')"
            " && window.seen.events.includes('output_audio_buffer.stopped')"
        )
        seen = page.evaluate("window.seen")

    assert page_errors == []
    assert seen["errors"] == [], seen["errors"]
    messages = [item for item in seen["history"] if item.get("type") == "message"]
    said = {
        message["role"]: " ".join(
            str(part.get("transcript") or part.get("text") or "")
            for part in message.get("content", [])
        )
        for message in messages
    }
    assert "cat" in said.get("user", "").lower(), messages
    assert said.get("assistant", "").strip(), messages
    assert "output_audio_buffer.started" in seen["events"]
