"""HubStandIn: a stand-in for the Hugging Face Hub (which this machine cannot reach), serving on 127.0.0.1 just the
endpoints huggingface_hub's real client calls for `create_commit(..., create_pr=True)`, `create_repo`,
`dataset_info` and README validation. It records every commit (files decoded, PR flag) and can fail on purpose."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

_REPO = r"/api/(models|datasets|spaces)/([^/]+/[^/]+)"
DATASET_SHA = "d" * 40


@dataclass
class Commit:
    """One commit the client sent: where, with which flag, and the files it added (decoded)."""

    repo_type: str
    repo_id: str
    revision: str
    create_pr: bool
    summary: str
    files: dict[str, bytes]


@dataclass
class HubStandIn:
    """Start with `start()`, point HF_ENDPOINT at `url`, stop with `stop()`."""

    commits: list[Commit] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    created: list[dict] = field(default_factory=list)
    # Status codes the next commit requests get, one per request (e.g. [500] fails once, then succeeds).
    fail_commits: list[int] = field(default_factory=list)

    def start(self) -> "HubStandIn":
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                stand_in._get(self)

            def do_POST(self):
                stand_in._post(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _reply(handler, status: int, data: dict) -> None:
        body = json.dumps(data).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        if status >= 400:
            handler.send_header("X-Error-Message", data.get("error", "error"))
        handler.end_headers()
        handler.wfile.write(body)

    def _get(self, handler) -> None:
        path = urlparse(handler.path).path
        self.requests.append(f"GET {path}")
        match = re.fullmatch(_REPO + r"(?:/revision/[^/]+)?", path)
        if match:
            return self._reply(handler, 200, {"id": match.group(2), "sha": DATASET_SHA, "private": False,
                                              "siblings": [], "tags": []})
        self._reply(handler, 404, {"error": f"HubStandIn: no GET {path}"})

    def _post(self, handler) -> None:
        parsed = urlparse(handler.path)
        path, query = parsed.path, parse_qs(parsed.query)
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        self.requests.append(f"POST {path}")
        if path == "/api/validate-yaml":
            return self._reply(handler, 200, {"errors": [], "warnings": []})
        if path == "/api/repos/create":
            data = json.loads(body)
            self.created.append(data)
            kind = {"space": "spaces/", "dataset": "datasets/"}.get(data.get("type"), "")
            return self._reply(handler, 200, {"url": f"{self.url}/{kind}{data['organization']}/{data['name']}"})
        match = re.fullmatch(_REPO + r"/preupload/(.+)", path)
        if match:
            files = json.loads(body)["files"]
            return self._reply(handler, 200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                         "shouldIgnore": False, "oid": None} for f in files]})
        match = re.fullmatch(_REPO + r"/commit/(.+)", path)
        if match:
            return self._commit(handler, match, query, body)
        self._reply(handler, 404, {"error": f"HubStandIn: no POST {path}"})

    def _commit(self, handler, match, query, body: bytes) -> None:
        if self.fail_commits:
            status = self.fail_commits.pop(0)
            return self._reply(handler, status, {"error": f"HubStandIn: commit refused with {status}"})
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header = next(item["value"] for item in lines if item["key"] == "header")
        files = {item["value"]["path"]: base64.b64decode(item["value"]["content"])
                 for item in lines if item["key"] == "file"}
        repo_type, repo_id = match.group(1)[:-1], match.group(2)
        create_pr = query.get("create_pr") == ["1"]
        self.commits.append(Commit(repo_type, repo_id, unquote(match.group(3)), create_pr, header["summary"], files))
        oid = hashlib.sha1(body).hexdigest()
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        number = len(self.commits)
        reply = {"commitUrl": f"{self.url}/{prefix}{repo_id}/commit/{oid}", "commitOid": oid}
        if create_pr:
            reply["pullRequestUrl"] = f"{self.url}/{prefix}{repo_id}/discussions/{number}"
        self._reply(handler, 200, reply)
