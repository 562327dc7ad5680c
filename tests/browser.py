"""A real browser for the tests: Debian's chromium, headless, driven over the DevTools protocol
(a websocket on a loopback port): open a page, collect its console errors, take screenshots."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import numpy as np

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """``with Browser() as b: b.open(url); png = b.screenshot()``; ``b.errors``: the console's errors
    and uncaught exceptions so far. WebGL runs on SwiftShader (no GPU)."""

    def __init__(self, width: int = 800, height: int = 600):
        assert CHROMIUM, "chromium is not installed (apt-get install chromium)"
        self.port, self.profile = _free_port(), tempfile.mkdtemp(prefix="legion-chromium-")
        self.process = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--no-first-run", "--disable-extensions",
             "--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--allow-file-access-from-files",
             f"--window-size={width},{height}", f"--remote-debugging-port={self.port}",
             "--remote-debugging-address=127.0.0.1", f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "TMPDIR": self.profile})  # its temporary files go with the profile
        self.loop = asyncio.new_event_loop()
        self.errors: list[str] = []
        self._id = 0
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("chromium did not open its DevTools port in 30 s")
            time.sleep(0.2)
        self.ws = self.loop.run_until_complete(self._connect(pages[0]["webSocketDebuggerUrl"]))
        self.call("Runtime.enable")
        self.call("Log.enable")
        self.call("Page.enable")

    async def _connect(self, url: str):
        import websockets

        return await websockets.connect(url, max_size=2**28)

    def call(self, method: str, timeout: float = 30.0, **params) -> dict:
        """One DevTools command; events that arrive meanwhile are scanned for errors."""
        self._id += 1
        message_id = self._id

        async def roundtrip():
            await self.ws.send(json.dumps({"id": message_id, "method": method, "params": params}))
            while True:
                message = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
                if message.get("id") == message_id:
                    if "error" in message:
                        raise RuntimeError(f"{method}: {message['error']}")
                    return message.get("result", {})
                self._event(message)

        return self.loop.run_until_complete(roundtrip())

    def _event(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description", details.get("text", "")))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"]["text"])

    def open(self, url: str, settle: float = 3.0) -> None:
        self.call("Page.navigate", url=url)
        self.wait(settle)

    def wait(self, seconds: float) -> None:
        """Lets the page run for ``seconds``, collecting its events."""
        self.call("Runtime.evaluate", expression=f"new Promise(r => setTimeout(r, {int(seconds * 1000)}))",
                  awaitPromise=True, timeout=seconds + 30)

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, until=bool, timeout: float = 60.0, what: str = ""):
        """Evaluates ``expression`` every half second until ``until(value)`` holds and returns the value:
        pages on a loaded machine take their time, so a test waits for what it needs, not a fixed while."""
        deadline = time.time() + timeout
        while not until(value := self.evaluate(expression)):
            if time.time() > deadline:
                raise AssertionError(f"{what or expression} (waited {timeout:.0f} s; the page's errors: {self.errors})")
            self.wait(0.5)
        return value

    def screenshot(self) -> np.ndarray:
        """(H, W, 3) uint8 of the page (a software-rendered WebGL frame can take tens of seconds)."""
        import base64

        import imageio.v3 as iio

        data = base64.b64decode(self.call("Page.captureScreenshot", timeout=180.0, format="png")["data"])
        return iio.imread(io.BytesIO(data))[..., :3]

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.ws.close())
        finally:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.loop.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
