#!/usr/bin/env python3
"""A loopback stand-in for the Hugging Face Hub, for tests/test_hub.cpp.

It speaks the Hub's documented download protocol (huggingface_hub's file_download.py and the Hub's local-cache
documentation), written from that description rather than from clef's client:

  GET  /api/models/{org}/{name}/revision/{revision}   {"id", "sha": commit, "siblings": [{"rfilename"}]}
  HEAD|GET /{org}/{name}/resolve/{revision}/{path}    small files: 200 with the bytes, ETag = git blob SHA-1;
                                                       LFS files: 302 to the CDN path below, X-Linked-Etag =
                                                       SHA-256, X-Linked-Size; both carry X-Repo-Commit
  HEAD|GET /cdn/{sha256}                               the bytes, with Range support (206, 416)
  Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound) as the Hub's do.

The revisions are "main" and the commit, a SHA-1 over the repository's file list and contents (so a restarted
hub with the same files answers the same commit).

Options:
  --repo ORG/NAME=DIR   serve DIR's files (recursively, symlinks followed) as that repository (repeatable)
  --lfs-min BYTES       files this large, and every *.safetensors / *.gguf / *.bin, are LFS files (10 MiB)
  --cdn-host HOST       host name in the CDN redirects (127.0.0.1; "localhost" makes the CDN another origin)
  --token TOKEN         the API and resolve URLs require "Authorization: Bearer TOKEN" (401 otherwise)
  --drop PATH:COUNT     the first COUNT downloads of PATH's bytes stop halfway and the connection is cut
  --corrupt PATH        PATH's bytes are served with one byte changed (its announced SHA-256 stays)
  --log FILE            one JSON line per request: method, path, range, authorization

The port (chosen by the system) is printed on the first line of stdout.
"""

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


class Repo:
    def __init__(self, name, root, lfs_min):
        self.name = name
        self.files = {}  # path -> bytes
        for base, _dirs, names in os.walk(root, followlinks=True):
            for n in names:
                full = os.path.join(base, n)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                with open(full, "rb") as f:
                    self.files[rel] = f.read()
        listing = hashlib.sha1()
        for path in sorted(self.files):
            listing.update(path.encode() + b"\0" + hashlib.sha256(self.files[path]).digest())
        self.commit = listing.hexdigest()
        self.lfs_min = lfs_min

    def is_lfs(self, path):
        return path.endswith(LFS_SUFFIXES) or len(self.files[path]) >= self.lfs_min

    def git_sha1(self, path):
        data = self.files[path]
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Hub:
    def __init__(self, args):
        self.repos = {}
        for spec in args.repo:
            name, _, root = spec.partition("=")
            self.repos[name] = Repo(name, root, args.lfs_min)
        self.blobs = {}  # sha256 -> (repo, path)
        for repo in self.repos.values():
            for path, data in repo.files.items():
                self.blobs[hashlib.sha256(data).hexdigest()] = (repo, path)
        self.cdn_host = args.cdn_host
        self.token = args.token
        self.drops = {}
        for spec in args.drop:
            path, _, count = spec.rpartition(":")
            self.drops[path] = int(count)
        self.corrupt = set(args.corrupt)
        self.log_path = args.log
        self.lock = threading.Lock()

    def log(self, entry):
        if not self.log_path:
            return
        with self.lock, open(self.log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def take_drop(self, path):
        with self.lock:
            if self.drops.get(path, 0) > 0:
                self.drops[path] -= 1
                return True
            return False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub = None  # set in main

    def log_message(self, fmt, *args):  # quiet
        pass

    def do_GET(self):
        self.handle_request(body=True)

    def do_HEAD(self):
        self.handle_request(body=False)

    # --- helpers

    def reply(self, status, headers=None, data=b"", body=True):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def error(self, status, code, message, body):
        headers = {"X-Error-Message": message, "Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        self.reply(status, headers, json.dumps({"error": message}).encode(), body)

    def authorised(self, body):
        if not self.hub.token or self.headers.get("Authorization") == "Bearer " + self.hub.token:
            return True
        self.error(401, None, "Invalid credentials in Authorization header", body)
        return False

    # --- routes

    def handle_request(self, body):
        url = urllib.parse.urlsplit(self.path)
        self.hub.log({"method": self.command, "path": url.path, "range": self.headers.get("Range"),
                      "authorization": self.headers.get("Authorization")})
        parts = url.path.split("/")
        if url.path.startswith("/api/models/") and len(parts) == 7 and parts[5] == "revision":
            return self.revision(parts[3] + "/" + parts[4], urllib.parse.unquote(parts[6]), body)
        if len(parts) >= 6 and parts[3] == "resolve":
            path = urllib.parse.unquote("/".join(parts[5:]))
            return self.resolve(parts[1] + "/" + parts[2], urllib.parse.unquote(parts[4]), path, body)
        if len(parts) == 3 and parts[1] == "cdn":
            return self.cdn(parts[2], body)
        self.error(404, None, "no such route", body)

    def find(self, repo_id, revision, body):
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self.error(404, "RepoNotFound", "Repository not found", body)
        elif revision not in ("main", repo.commit):
            self.error(404, "RevisionNotFound", "Invalid rev id: " + revision, body)
            repo = None
        return repo

    def revision(self, repo_id, revision, body):
        if not self.authorised(body):
            return
        repo = self.find(repo_id, revision, body)
        if repo is None:
            return
        doc = {"id": repo.name, "sha": repo.commit, "siblings": [{"rfilename": p} for p in sorted(repo.files)]}
        self.reply(200, {"Content-Type": "application/json"}, json.dumps(doc).encode(), body)

    def resolve(self, repo_id, revision, path, body):
        if not self.authorised(body):
            return
        repo = self.find(repo_id, revision, body)
        if repo is None:
            return
        if path not in repo.files:
            return self.error(404, "EntryNotFound", "Entry not found", body)
        data = repo.files[path]
        if not repo.is_lfs(path):
            etag = '"%s"' % repo.git_sha1(path)
            return self.reply(200, {"ETag": etag, "X-Repo-Commit": repo.commit}, data, body)
        sha = hashlib.sha256(data).hexdigest()
        port = self.server.server_address[1]
        location = "http://%s:%d/cdn/%s?name=%s" % (self.hub.cdn_host, port, sha, urllib.parse.quote(path))
        redirect_body = ("Found. Redirecting to " + location).encode()
        headers = {
            "Location": location,
            "X-Repo-Commit": repo.commit,
            "X-Linked-Etag": '"%s"' % sha,
            "X-Linked-Size": str(len(data)),
            # The redirect's own ETag is not the file's: a client must prefer X-Linked-Etag.
            "ETag": '"%s"' % hashlib.sha1(b"pointer " + sha.encode()).hexdigest(),
        }
        self.reply(302, headers, redirect_body, body)

    def cdn(self, sha, body):
        entry = self.hub.blobs.get(sha)
        if entry is None:
            return self.error(404, None, "no such blob", body)
        repo, path = entry
        data = repo.files[path]
        if path in self.hub.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start, end, status = 0, len(data), 200
        rng = self.headers.get("Range")
        if rng:
            first, _, last = rng[len("bytes="):].partition("-")
            start = int(first)
            end = int(last) + 1 if last else len(data)
            if start >= len(data):
                return self.reply(416, {"Content-Range": "bytes */%d" % len(data)}, b"", body)
            end = min(end, len(data))
            status = 206
        self.send_response(status)
        self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", '"%s"' % sha)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end - 1, len(data)))
        self.end_headers()
        if not body:
            return
        if self.hub.take_drop(path):
            self.wfile.write(data[start:start + (end - start) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data[start:end])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", action="append", default=[])
    parser.add_argument("--lfs-min", type=int, default=10 << 20)
    parser.add_argument("--cdn-host", default="127.0.0.1")
    parser.add_argument("--token", default="")
    parser.add_argument("--drop", action="append", default=[])
    parser.add_argument("--corrupt", action="append", default=[])
    parser.add_argument("--log", default="")
    args = parser.parse_args()
    Handler.hub = Hub(args)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
