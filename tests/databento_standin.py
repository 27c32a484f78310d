"""A local stand-in for Databento's Historical API (HTTPS on 127.0.0.1), for the real `databento` client.

The client forces `https://` onto any gateway (`validate_gateway`), so the stand-in serves TLS with a throwaway
self-signed certificate that `REQUESTS_CA_BUNDLE` makes trusted. It speaks the endpoints `alpha fetch` calls, in
the shapes the client parses (databento 0.88 source; docs.databento.com "Historical API"):

- `POST /v0/metadata.get_cost` -> a JSON number (USD); `POST /v0/metadata.get_billable_size` -> a JSON integer.
- `POST /v0/timeseries.get_range` -> the DBN bytes of the requested schema (zstd), streamed.
- `POST /v0/batch.submit_job` -> the job (`id`, `state` "queued", the request's fields, `cost_usd`).
- `GET /v0/batch.list_jobs?states=&since=` -> the jobs in those states; each listing moves a job on
  (queued -> processing -> done, or -> expired when `expire_jobs` is set).
- `GET /v0/batch.list_files?job_id=` -> `[{filename, size, hash: "sha256:<hex>", urls: {https, ftp}}]`, the DBN file
  plus a `metadata.json` as real jobs have.
- `GET /v0/batch/download/<job>/<file>` -> the file, or the rest of it for a `Range: bytes=N-M` request (206).
- Every endpoint checks HTTP Basic auth (the key as user name): a wrong key gets 401 `{"detail": ...}`.
- Faults on demand (`fail`): any status with headers (429 + Retry-After, 402, 403, 5xx) for the next n requests to
  an endpoint; `cut_download` ends a download body halfway; `hang_download` sends half and waits (a kill test).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def self_signed_cert(folder: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem) for 127.0.0.1, valid for a day."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@dataclass
class Fault:
    status: int
    times: int
    headers: dict = field(default_factory=dict)
    detail: str = ""


class Standin:
    """The server and what it serves and saw. `data[schema]` (or `data[(schema, start)]`) holds DBN bytes."""

    def __init__(self, key: str, data: dict, folder: Path) -> None:
        self.key, self.data = key, data
        self.costs = {"mbp-10": 3.0, "ohlcv-1m": 0.5, "definition": 0.1}
        self.requests: list[tuple[str, str, dict, dict]] = []  # (method, endpoint, params, headers)
        self.faults: dict[str, list[Fault]] = {}
        self.jobs: dict[str, dict] = {}
        self.expire_jobs = False
        self.wrong_hash = False  # list_files announces a sha256 the file does not have
        self.cut_download = False
        self.hang_download = threading.Event()  # set: the next download sends half and waits for `release`
        self.hanging = threading.Event()  # a download is waiting
        self.release = threading.Event()
        self.cert, key_path = self_signed_cert(folder)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.standin = self
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, key_path)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def gateway(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def fail(self, endpoint: str, status: int, times: int = 1, headers: dict | None = None, detail: str = "") -> None:
        self.faults.setdefault(endpoint, []).append(Fault(status, times, headers or {}, detail))

    def calls(self, endpoint: str) -> list[tuple[str, str, dict, dict]]:
        return [r for r in self.requests if r[1] == endpoint]

    def bytes_for(self, schema: str, start: str) -> bytes:
        return self.data.get((schema, start[:10])) or self.data[schema]

    def file_name(self, schema: str, start: str, end: str) -> str:
        last = dt.date.fromisoformat(end[:10]) - dt.timedelta(days=1)
        return f"glbx-mdp3-{start[:10].replace('-', '')}-{last:%Y%m%d}.{schema}.dbn.zst"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: ThreadingHTTPServer

    def log_message(self, *args) -> None:  # quiet
        return

    @property
    def standin(self) -> Standin:
        return self.server.standin

    def _reply(self, status: int, body: bytes, ctype: str = "application/json", headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, obj, status: int = 200, headers: dict | None = None) -> None:
        self._reply(status, json.dumps(obj).encode(), headers=headers)

    def _handle(self, method: str) -> None:
        s = self.standin
        url = urllib.parse.urlsplit(self.path)
        params = dict(urllib.parse.parse_qsl(url.query))
        if method == "POST":
            length = int(self.headers.get("Content-Length", 0))
            params.update(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
        endpoint = url.path.removeprefix("/v0/")
        if endpoint.startswith("batch/download/"):
            endpoint = "batch/download"
        s.requests.append((method, endpoint, params, {"Range": self.headers.get("Range")}))
        expected = "Basic " + base64.b64encode(f"{s.key}:".encode()).decode()
        if self.headers.get("Authorization") != expected:
            return self._json({"detail": "Authentication failed."}, 401)
        queue = s.faults.get(endpoint, [])
        if queue:
            fault = queue[0]
            fault.times -= 1
            if fault.times <= 0:
                queue.pop(0)
            return self._json({"detail": fault.detail or f"stand-in fault {fault.status}"}, fault.status, fault.headers)
        route = {
            "metadata.get_cost": self._cost,
            "metadata.get_billable_size": self._size,
            "timeseries.get_range": self._get_range,
            "batch.submit_job": self._submit,
            "batch.list_jobs": self._list_jobs,
            "batch.list_files": self._list_files,
            "batch/download": self._download,
        }.get(endpoint)
        if route is None:
            return self._json({"detail": f"no endpoint {url.path}"}, 404)
        route(params, url.path)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _cost(self, p: dict, _: str) -> None:
        self._json(self.standin.costs[p["schema"]])

    def _size(self, p: dict, _: str) -> None:
        self._json(len(self.standin.bytes_for(p["schema"], p["start"])))

    def _get_range(self, p: dict, _: str) -> None:
        assert p["stype_in"] == "parent" and p["encoding"] == "dbn" and p["compression"] == "zstd", p
        self._reply(200, self.standin.bytes_for(p["schema"], p["start"]), "application/octet-stream")

    def _submit(self, p: dict, _: str) -> None:
        s = self.standin
        job_id = f"GLBX-20260101-{len(s.jobs) + 1:010d}"
        job = {
            "id": job_id,
            "state": "queued",
            "dataset": p["dataset"],
            "symbols": p["symbols"],
            "stype_in": p["stype_in"],
            "schema": p["schema"],
            "start": p["start"],
            "end": p["end"],
            "encoding": p["encoding"],
            "compression": p["compression"],
            "split_duration": p["split_duration"],
            "delivery": p["delivery"],
            "cost_usd": s.costs[p["schema"]],
            "ts_received": dt.datetime.now(dt.UTC).isoformat(),
        }
        s.jobs[job_id] = job
        self._json(job)

    def _list_jobs(self, p: dict, _: str) -> None:
        s = self.standin
        states = p.get("states", "queued,processing,done").split(",")
        for job in s.jobs.values():
            job["state"] = {"queued": "processing", "processing": "expired" if s.expire_jobs else "done"}.get(
                job["state"], job["state"]
            )
        self._json([j for j in s.jobs.values() if j["state"] in states])

    def _list_files(self, p: dict, _: str) -> None:
        s = self.standin
        job = s.jobs[p["job_id"]]
        body = s.bytes_for(job["schema"], job["start"])
        name = s.file_name(job["schema"], job["start"], job["end"])
        meta = json.dumps({"query": {k: job[k] for k in ("dataset", "schema", "start", "end")}}).encode()
        files = [(name, body), ("metadata.json", meta)]
        base = f"{s.gateway}/v0/batch/download/{job['id']}"
        self._json(
            [
                {
                    "filename": n,
                    "size": len(b),
                    "hash": "sha256:" + hashlib.sha256(b + (b"x" if s.wrong_hash else b"")).hexdigest(),
                    "urls": {"https": f"{base}/{n}", "ftp": ""},
                }
                for n, b in files
            ]
        )

    def _download(self, _: dict, path: str) -> None:
        s = self.standin
        job_id, name = path.split("/")[-2:]
        job = s.jobs[job_id]
        body = s.bytes_for(job["schema"], job["start"])
        start = 0
        rng = self.headers.get("Range")
        if rng:
            start = int(rng.removeprefix("bytes=").split("-")[0])
        part = body[start:]
        self.send_response(206 if rng else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(part)))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        if s.cut_download or s.hang_download.is_set():
            self.wfile.write(part[: len(part) // 2])
            self.wfile.flush()
            if s.hang_download.is_set():
                s.hang_download.clear()
                s.hanging.set()
                s.release.wait(60)
            else:
                s.cut_download = False
            self.close_connection = True
            return
        self.wfile.write(part)
