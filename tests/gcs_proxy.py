"""A fault proxy for storage tests: HTTP on 127.0.0.1 in front of the GCS emulator.

This is the one hand-written GCS fake the tests keep. Storage semantics (objects,
generations, preconditions, uploads, listing) come from a real emulator, fake-gcs-server
(tests/fake_gcs.py); the proxy adds only what no emulator does: 429/5xx answers, dropped
connections, outages and a throttled link (latency). It forwards every other request
unchanged, so it stands in front of whichever emulator the tests run.

Point a client at ``proxy.url`` instead of the emulator (``proxy.env()`` gives the two env
vars: ``STORAGE_EMULATOR_HOST`` for google-cloud-storage/gcsfs, ``TENSORSTORE_GCS_HTTP_URL``
for TensorStore) and shape what it sees:

* ``throttle(bytes_per_s)``: one shared budget for request and response bodies (uploads and
  downloads of every connection), like a host's NIC or a bucket's per-host throughput;
* ``outage(seconds, mode)``: for a time window every request is answered 503 (``"503"``) or
  its connection is closed without an answer (``"drop"``, what a client sees as a reset);
* ``fail(status, count, method=..., match=...)``: the next ``count`` requests whose method and
  decoded URL (path and query: object names are in ``name=``) match get ``status`` (403, 429,
  500, 503, ...) with the JSON API's error body (``{"error": {"code", "message", "errors"}}``,
  what google-api-core's ``from_http_response`` and TensorStore's GCS driver read), never
  reaching the emulator. TensorStore retries 429/5xx with backoff and fails at once on 403.

Bounded: it serves at most ``lifetime_s`` seconds and then stops by itself; ``stop()`` ends it
earlier. ``stats`` counts requests, bytes and injected faults; ``requests`` lists them.
"""

from __future__ import annotations

import http.client
import http.server
import json
import re
import socketserver
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
              "trailer", "upgrade", "content-length"}


@dataclass
class Rule:
    status: int
    count: int
    method: str | None = None
    match: re.Pattern | None = None
    hits: int = 0

    def takes(self, method: str, url: str) -> bool:
        if self.hits >= self.count:
            return False
        if self.method and self.method != method:
            return False
        return not (self.match and not self.match.search(url))


@dataclass
class Stats:
    requests: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    injected: dict[int, int] = field(default_factory=dict)
    outage_hits: int = 0


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    proxy: GCSProxy

    def handle_error(self, request, client_address) -> None:
        """A client that hung up (TensorStore drops connections it no longer needs) is not
        an error worth a traceback; anything else is."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:  # quiet
        pass

    def _handle(self) -> None:
        proxy = self.server.proxy
        if proxy._server is None:
            # Stopped: shutdown() only stops accepting, so a client's kept-alive connection
            # would still be served here, bypassing the next test's proxy (the kernel may give
            # it the same port) and reaching the emulator after the session stopped it.
            self.close_connection = True
            return
        url = urllib.parse.unquote(self.path)
        proxy.stats.requests += 1
        if len(proxy.requests) < 100_000:
            proxy.requests.append((self.command, self.path))
        body = self._read_body(proxy)
        fault = proxy._fault(self.command, url)
        if fault == "drop":
            self.close_connection = True
            self.connection.close()
            return
        if fault is not None:
            payload = json.dumps({"error": {"code": fault, "message": f"injected {fault}",
                                            "errors": [{"reason": "injected"}]}}).encode()
            self.send_response(fault)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=120)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                for i in range(0, len(data), proxy.chunk):
                    piece = data[i:i + proxy.chunk]
                    proxy._spend(len(piece))
                    self.wfile.write(piece)
                    proxy.stats.bytes_down += len(piece)
        finally:
            conn.close()

    def _read_body(self, proxy: GCSProxy) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                parts.append(self._read(proxy, size))
                self.rfile.readline()
            return b"".join(parts)
        return self._read(proxy, int(self.headers.get("Content-Length") or 0))

    def _read(self, proxy: GCSProxy, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            piece = self.rfile.read(min(proxy.chunk, n - len(out)))
            if not piece:
                break
            proxy._spend(len(piece))
            out += piece
            proxy.stats.bytes_up += len(piece)
        return bytes(out)

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _handle


class GCSProxy:
    """The proxy; ``start()`` it (or use the ``gcs_proxy`` fixture), then shape faults."""

    def __init__(self, upstream: str, lifetime_s: float = 600.0, chunk: int = 64 << 10):
        parsed = urllib.parse.urlparse(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.lifetime_s, self.chunk = lifetime_s, chunk
        self.stats = Stats()
        # (method, raw path and query) of every request, in order (the first 100,000): what a
        # test asserts a client asked (a listing's startOffset, how many requests a poll made).
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._rate: float | None = None
        self._next_free = 0.0
        self._outage: tuple[float, str] | None = None  # (until, mode)
        self._armed: tuple[re.Pattern, float, str] | None = None  # outage_when's trigger
        self._armed_at: float | None = None
        self._rules: list[Rule] = []
        self._server: _Server | None = None
        self._timer: threading.Timer | None = None

    # --- lifecycle
    def start(self) -> GCSProxy:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        threading.Thread(target=self._server.serve_forever, name="gcs-proxy",
                         daemon=True).start()
        self._timer = threading.Timer(self.lifetime_s, self.stop)  # bounded: stops by itself
        self._timer.daemon = True
        self._timer.start()
        return self

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._server is not None:
            server, self._server = self._server, None
            server.shutdown()
            server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def env(self) -> dict[str, str]:
        """What a subprocess needs to talk to storage through this proxy."""
        return {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url}

    # --- faults
    def throttle(self, bytes_per_s: float | None) -> None:
        """Shared body budget in bytes/s for both directions; None: unthrottled."""
        with self._lock:
            self._rate = bytes_per_s
            self._next_free = time.monotonic()

    def outage(self, seconds: float, mode: str = "503") -> None:
        """From now for ``seconds``: answer every request 503, or ``"drop"`` its connection."""
        if mode not in ("503", "drop"):
            raise ValueError(f"outage mode: 503 or drop, got {mode!r}")
        with self._lock:
            self._outage = (time.monotonic() + seconds, mode)

    def outage_when(self, match: str, seconds: float, mode: str = "503") -> None:
        """Arm an outage: the first request whose decoded path+query matches the regex
        ``match`` starts ``outage(seconds, mode)`` and is its first victim (e.g. the first
        write of a checkpoint step: an outage that begins with a save in flight)."""
        if mode not in ("503", "drop"):
            raise ValueError(f"outage mode: 503 or drop, got {mode!r}")
        with self._lock:
            self._armed = (re.compile(match), seconds, mode)

    @property
    def outage_started(self) -> float | None:
        """monotonic() when an armed outage began (None: not yet)."""
        return self._armed_at

    def fail(self, status: int, count: int, *, method: str | None = None,
             match: str | None = None) -> Rule:
        """The next ``count`` requests matching ``method`` and the regex ``match`` (searched in
        the decoded path+query) are answered ``status``."""
        rule = Rule(status, count, method.upper() if method else None,
                    re.compile(match) if match else None)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self._outage = self._armed = None
            self._rate = None

    # --- used by the handler
    def _fault(self, method: str, url: str) -> int | str | None:
        with self._lock:
            if self._armed is not None and self._armed[0].search(url):
                _, seconds, mode = self._armed
                self._armed, self._armed_at = None, time.monotonic()
                self._outage = (self._armed_at + seconds, mode)
            if self._outage is not None:
                until, mode = self._outage
                if time.monotonic() < until:
                    self.stats.outage_hits += 1
                    return "drop" if mode == "drop" else 503
                self._outage = None
            for rule in self._rules:
                if rule.takes(method, url):
                    rule.hits += 1
                    self.stats.injected[rule.status] = self.stats.injected.get(rule.status, 0) + 1
                    return rule.status
        return None

    def _spend(self, n: int) -> None:
        """Block until ``n`` more bytes fit the shared budget."""
        with self._lock:
            if not self._rate:
                return
            now = time.monotonic()
            start = max(now, self._next_free)
            self._next_free = start + n / self._rate
            wait = self._next_free - now
        if wait > 0:
            time.sleep(wait)
