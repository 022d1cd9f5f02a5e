"""The proxy command of `flexai training debug-ssh`: ``ssh`` speaks through our stdin and
stdout, and this passes every byte to and from the control plane over a WebSocket (which
relays them to the job's node). SSH runs end to end: the control plane sees ciphertext only.
"""

from __future__ import annotations

import json
import os
import sys
import threading

READ_BYTES = 64 * 1024


def run_proxy(url: str, headers: dict[str, str], ca_file: str | None = None) -> int:
    """Pipe stdin and stdout to the WebSocket at ``url`` until either side ends (``wss://``
    verified as every call to the control plane is: :mod:`common.tls`)."""
    from websockets.exceptions import InvalidStatus, WebSocketException
    from websockets.sync.client import connect

    from common.tls import client_context

    secure = client_context(ca_file) if url.startswith("wss:") else None
    try:
        websocket = connect(url, additional_headers=headers, max_size=None, compression=None,
                            open_timeout=15, ssl=secure)  # fmt: skip
    except InvalidStatus as refused:
        return _say(f"the control plane refused the session: {_detail(refused)}")
    except (OSError, TimeoutError, WebSocketException) as error:
        return _say(f"cannot reach the control plane for the session: {error}")

    def upstream() -> None:
        try:
            while data := os.read(sys.stdin.fileno(), READ_BYTES):
                websocket.send(data)
        except (OSError, WebSocketException):
            pass
        finally:
            websocket.close()

    threading.Thread(target=upstream, name="ssh-to-server", daemon=True).start()
    out = sys.stdout.fileno()
    try:
        for message in websocket:
            data = message if isinstance(message, bytes) else message.encode()
            while data:
                data = data[os.write(out, data) :]
    except (OSError, WebSocketException):
        pass
    finally:
        websocket.close()
    return 0


def _detail(refused: object) -> str:
    response = getattr(refused, "response", None)
    body = getattr(response, "body", None) or b""
    try:
        problem = json.loads(body)
    except ValueError:
        problem = None
    if isinstance(problem, dict) and problem.get("detail"):
        return str(problem["detail"])
    return f"HTTP {getattr(response, 'status_code', '?')}"


def _say(message: str) -> int:
    sys.stderr.write(f"flexai: {message}\n")
    return 1
