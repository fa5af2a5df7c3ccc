"""A fault proxy in front of the real kube-apiserver (tests/cluster/up.sh): HTTPS on
127.0.0.1, forwarding every request to the API server with the cluster's admin certificate
and streaming the answer back (watches and followed logs included), except where a test
asked for a fault.

It is the hand-written part kept for what the session's real API server cannot be made to
do on demand:

* 5xx answers (``fail``) and a slow link (``delay``);
* another server version (``git_version``): the built one is v1.36.3, and a server before
  1.29 (no native sidecars) would need another Kubernetes built and started;
* an API group not installed (``hide_group``): the session's one cluster cannot lose
  JobSet's or Kueue's CRDs (deleting a CRD deletes every object of it, other tests' runs
  included). The group's paths answer 404 as the real server does for an unserved resource
  (a ``NotFound`` Status with no ``details.name``), its CRDs 404 naming them, and ``/apis``
  lists the other groups;
* one version of a group not served (``hide_version``): e.g. a Kueue whose visibility API
  serves v1beta2 only. Its paths answer 404 and ``/apis`` lists the group without it.

Everything else the client sees is the real server's answer. Clients use
``proxy.kubeconfig(path)`` (context ``xrun-test``, our CA).
"""

from __future__ import annotations

import http.client
import http.server
import json
import re
import socketserver
import ssl
import threading
from pathlib import Path

import yaml
from gcs_proxy import HOP_BY_HOP, Rule


def status_body(code: int, reason: str, message: str) -> bytes:
    """A ``Status`` as kube-apiserver writes one (apimachinery pkg/apis/meta/v1 Status)."""
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code}).encode()


class KubeFaultProxy:
    def __init__(self, cluster, lifetime_s: float = 600.0):
        self.cluster = cluster
        self.upstream = cluster.state["ports"]["apiserver"]
        pki = cluster.root / "pki"
        self.client_ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.client_ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(str(pki / "server.crt"), str(pki / "server.key"))
        self.rules: list[Rule] = []
        self.delays: list[tuple[float, re.Pattern | None]] = []
        self.seen: list[tuple[str, str]] = []
        self.bodies: list[tuple[str, str, object]] = []  # (method, path, JSON body) as sent
        self.hidden: set[str] = set()
        self.hidden_versions: set[tuple[str, str]] = set()
        self.version: str | None = None
        self.lock = threading.Lock()
        self.lifetime_s = lifetime_s
        self.server: socketserver.ThreadingTCPServer | None = None
        self.timer = threading.Timer(0, lambda: None)
        self.stopped = threading.Event()

    # --- what a test asks for ---------------------------------------------------------
    def fail(self, status: int, count: int, method: str | None = None, match: str | None = None) -> None:
        """The next ``count`` requests matching get ``status`` with a Status body, never
        reaching the API server."""
        with self.lock:
            self.rules.append(Rule(status, count, method, re.compile(match) if match else None))

    def delay(self, seconds: float, match: str | None = None) -> None:
        """Hold each matching request ``seconds`` before forwarding it."""
        with self.lock:
            self.delays.append((seconds, re.compile(match) if match else None))

    def sent(self, method: str, match: str) -> list[object]:
        """The JSON bodies of the ``method`` requests whose path matches, in order."""
        with self.lock:
            return [b for m, u, b in self.bodies if m == method and re.search(match, u.split("?", 1)[0])]

    def hide_group(self, group: str) -> None:
        """Answer as a cluster where API group ``group`` (its CRDs) is not installed."""
        with self.lock:
            self.hidden.add(group)

    def hide_version(self, group: str, version: str) -> None:
        """Answer as a cluster whose ``group`` does not serve ``version``."""
        with self.lock:
            self.hidden_versions.add((group, version))

    def git_version(self, version: str | None) -> None:
        """``/version`` says ``version`` (None: the real one)."""
        with self.lock:
            self.version = version

    def _hidden(self, url: str) -> bytes | None:
        """The 404 body a server without a hidden group sends, or None."""
        path = url.split("?", 1)[0]
        with self.lock:
            hidden = set(self.hidden)
            versions = set(self.hidden_versions)
        for group, version in versions:
            if path.startswith(f"/apis/{group}/{version}/") or path == f"/apis/{group}/{version}":
                return status_body(404, "NotFound", "the server could not find the requested resource")
        for group in hidden:
            if path.startswith(f"/apis/{group}/") or path == f"/apis/{group}":
                return status_body(404, "NotFound", "the server could not find the requested resource")
            crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
            if path.startswith(crds) and path[len(crds):].endswith("." + group):
                name = path[len(crds):]
                body = json.loads(status_body(404, "NotFound", f'customresourcedefinitions.apiextensions.k8s.io '
                                                                  f'"{name}" not found'))
                body["details"] = {"name": name, "group": "apiextensions.k8s.io",
                                   "kind": "customresourcedefinitions"}
                return json.dumps(body).encode()
        return None

    def _rewrite(self, url: str, data: bytes) -> bytes:
        """The real answer, with hidden groups left out of discovery and the version's."""
        path = url.split("?", 1)[0].rstrip("/")
        with self.lock:
            hidden, version, versions = set(self.hidden), self.version, set(self.hidden_versions)
        if path == "/apis" and (hidden or versions):
            body = json.loads(data)
            body["groups"] = [g for g in body.get("groups") or [] if g["name"] not in hidden]
            for g in body["groups"]:
                g["versions"] = [v for v in g.get("versions") or [] if (g["name"], v["version"]) not in versions]
                if (g["name"], (g.get("preferredVersion") or {}).get("version")) in versions and g["versions"]:
                    g["preferredVersion"] = g["versions"][0]
            return json.dumps(body).encode()
        if path == "/version" and version:
            body = json.loads(data)
            minor = version.lstrip("v").split(".")[1]
            body.update(gitVersion=version, minor=minor)
            return json.dumps(body).encode()
        return data

    def kubeconfig(self, path: Path) -> str:
        cfg = yaml.safe_load(Path(self.cluster.kubeconfig).read_text())
        cfg["clusters"][0]["cluster"]["server"] = self.url
        path.write_text(yaml.safe_dump(cfg))
        return str(path)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"https://127.0.0.1:{self.server.server_address[1]}"

    # --- serving ----------------------------------------------------------------------
    def _fault(self, method: str, url: str) -> int | None:
        with self.lock:
            self.seen.append((method, url))
            for rule in self.rules:
                if rule.takes(method, url):
                    rule.hits += 1
                    return rule.status
            return None

    def _delay(self, url: str) -> float:
        with self.lock:
            return sum(s for s, m in self.delays if m is None or m.search(url))

    def start(self) -> KubeFaultProxy:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if body:
                    with proxy.lock:
                        proxy.bodies.append((self.command, self.path, json.loads(body)))
                code = proxy._fault(self.command, self.path)
                data = None
                if code is not None:
                    data = status_body(code, "ServiceUnavailable" if code == 503 else "InternalError",
                                       f"injected by the test's fault proxy ({code})")
                elif (data := proxy._hidden(self.path)) is not None:
                    code = 404
                if data is not None:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                # A held request the proxy stops under is dropped, not forwarded: its client
                # gave up long ago, and the API server would see it in a later test's window.
                if (wait := proxy._delay(self.path)) and proxy.stopped.wait(wait):
                    self.close_connection = True
                    return
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
                conn = http.client.HTTPSConnection("127.0.0.1", proxy.upstream, context=proxy.client_ctx,
                                                   timeout=600)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    if self.path.split("?", 1)[0].rstrip("/") in ("/apis", "/version") and resp.status == 200:
                        data = proxy._rewrite(self.path, resp.read())
                        self.send_response(resp.status)
                        for k, v in resp.getheaders():
                            if k.lower() not in HOP_BY_HOP:
                                self.send_header(k, v)
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in HOP_BY_HOP:
                            self.send_header(k, v)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    while chunk := resp.read1(65536):  # watches and followed logs: as they come
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    self.close_connection = True
                finally:
                    conn.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

            def get_request(self):
                sock, addr = super().get_request()
                return proxy.server_ctx.wrap_socket(sock, server_side=True), addr

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.timer = threading.Timer(self.lifetime_s, self.stop)  # bounded, even if not stopped
        self.timer.daemon = True
        self.timer.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.timer.cancel()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
