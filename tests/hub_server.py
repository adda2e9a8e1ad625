"""A Hugging Face Hub on loopback, for the tests: the endpoints the real huggingface_hub client and the role call.

No Hub is reachable here, so this serves model repositories from local files with the
Hub's own API shapes: ``/api/models/ID/revision/REV`` (the commit and its files),
``/api/models/ID/tree/REV`` (paths, sizes, Git blob ids and LFS SHA-256s), and
``/ID/resolve/REV/PATH`` (HEAD and GET, with the Hub's ``X-Repo-Commit``,
``X-Linked-Etag`` and ``X-Linked-Size`` headers and byte ranges). A gated repository
answers 401 without a token and 403 with one that has no access, with the Hub's
``X-Error-Code``. It counts every file it sends, and can send slowly.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """A model repository: commits in order (the last is ``main``), each a mapping of paths to bytes."""

    def __init__(self, repo_id: str, token: str | None = None):
        self.repo_id, self.token = repo_id, token
        self.commits: list[tuple[str, dict[str, bytes]]] = []
        self.tags: dict[str, str] = {}

    def commit(self, files: dict[str, bytes], tag: str | None = None) -> str:
        sha = hashlib.sha1(json.dumps(sorted((p, hashlib.sha256(d).hexdigest()) for p, d in files.items())).encode()).hexdigest()
        self.commits.append((sha, dict(files)))
        if tag:
            self.tags[tag] = sha
        return sha

    def resolve(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        if revision == "main" and self.commits:
            return self.commits[-1]
        revision = self.tags.get(revision, revision)
        return next((c for c in self.commits if c[0] == revision), None)


class Hub:
    def __init__(self, rate: int = 0):
        self.repos: dict[str, Repo] = {}
        self.rate = rate  # bytes/s for file bodies; 0: as fast as it can
        self.sent: dict[tuple[str, str], int] = {}
        self.requests: list[str] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    def add(
        self, repo_id: str, folder: Path | None = None, files: dict[str, bytes] | None = None, token: str | None = None
    ) -> Repo:
        repo = self.repos.setdefault(repo_id, Repo(repo_id, token))
        content = dict(files or {})
        if folder:
            content = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()} | content
        repo.commit(content)
        return repo

    def gets(self, repo_id: str, path: str) -> int:
        with self.lock:
            return self.sent.get((repo_id, path), 0)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self, port: int = 0) -> Hub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.route(body=True)

            def do_HEAD(self):
                self.route(body=False)

            def answer(self, status: int, payload=None, headers: dict | None = None, body: bool = True):
                data = json.dumps(payload).encode() if payload is not None else b""
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def refuse(self, status: int, code: str, message: str, body: bool):
                self.answer(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message}, body)

            def repo(self, repo_id: str, body: bool) -> Repo | None:
                repo = hub.repos.get(repo_id)
                auth = self.headers.get("Authorization", "")
                given = auth[7:] if auth.startswith("Bearer ") else ""
                if repo is None:
                    status = 404 if given else 401
                    self.refuse(status, "RepoNotFound", f"Repository Not Found for url: {self.path}.", body)
                    return None
                if repo.token and not given:
                    self.refuse(
                        401,
                        "GatedRepo",
                        f"Access to model {repo_id} is restricted. You must be authenticated to access it.",
                        body,
                    )
                    return None
                if repo.token and given != repo.token:
                    self.refuse(
                        403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the authorized list.", body
                    )
                    return None
                return repo

            def route(self, body: bool):
                path = unquote(urlparse(self.path).path)
                with hub.lock:
                    hub.requests.append(f"{self.command} {path}")
                api = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)", path)
                resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                match = api or resolve
                if not match:
                    self.answer(404, {"error": "not found"}, body=body)
                    return
                repo = self.repo(match.group(1), body)
                if repo is None:
                    return
                revision = match.group(3) if api else match.group(2)
                found = repo.resolve(revision)
                if found is None:
                    self.refuse(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
                    return
                sha, files = found
                if api and api.group(2) == "revision":
                    siblings = [{"rfilename": p} for p in sorted(files)]
                    self.answer(
                        200,
                        {
                            "id": repo.repo_id,
                            "modelId": repo.repo_id,
                            "sha": sha,
                            "siblings": siblings,
                            "gated": "manual" if repo.token else False,
                            "private": False,
                        },
                        body=body,
                    )
                elif api:
                    self.answer(200, [self.entry(p, d) for p, d in sorted(files.items())], body=body)
                else:
                    self.file(repo.repo_id, sha, resolve.group(3), files, body)

            @staticmethod
            def entry(path: str, data: bytes) -> dict:
                entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
                if path.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                return entry

            def file(self, repo_id: str, sha: str, path: str, files: dict, body: bool):
                if path not in files:
                    self.refuse(404, "EntryNotFound", f"{path} does not exist on {sha}", body)
                    return
                data = files[path]
                entry = self.entry(path, data)
                etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
                start = 0
                ranged = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
                if ranged and body:
                    start = min(int(ranged.group(1)), len(data))
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", sha)
                self.send_header("ETag", f'"{etag}"')
                if "lfs" in entry:
                    self.send_header("X-Linked-Etag", f'"{etag}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("Accept-Ranges", "bytes")
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if not body:
                    return
                with hub.lock:
                    hub.sent[(repo_id, path)] = hub.sent.get((repo_id, path), 0) + 1
                chunk = 16384
                for offset in range(start, len(data), chunk):
                    try:
                        self.wfile.write(data[offset : offset + chunk])
                    except (BrokenPipeError, ConnectionResetError):
                        return
                    if hub.rate:
                        time.sleep(chunk / hub.rate)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
