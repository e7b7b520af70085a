#!/usr/bin/env python3
"""TEST FIXTURE, NOT A SCHEMA REGISTRY: a small in-memory server that speaks
the subset of the Confluent Schema Registry REST API that spate and its tests
use, for the end-to-end tests (engine/spate/tests/it/avro.rs) and local trials.

Why a fixture (issue 21, part 5): no real registry could be started here.
Apicurio Registry's Maven artifact `io.apicurio:apicurio-registry-app` is a
library jar (packaging `jar`, no Quarkus runner); building it into an
application with `quarkus-maven-plugin` needs its own modules
(`apicurio-registry-schema-util-provider`, `-contracts-rules`,
`-config-definitions`, `-config-index`, `-utils-import-export`,
`-schema-util-{common,avro,protobuf,json}`, `-protobuf-schema-utilities`,
all 3.3.3) and Quarkus 3.33.3.1, none of which the Maven registry reachable
here serves (2.6.13.Final likewise lacks `apicurio-common-app-components-*`
0.2.7.Final); Karapace is not installable from PyPI here. The README's
"Schema registry" section says the same.

Served (https://docs.confluent.io/platform/current/schema-registry/develop/api.html):

  POST /subjects/{subject}/versions     {"schema": TEXT, "schemaType"?: "AVRO"|
                                        "PROTOBUF"|"JSON", "references"?: [...]}
                                        -> {"id": N}; the same schema text and
                                        type get the same global id in every
                                        subject, and registering it again in a
                                        subject returns its id (no new version)
  GET  /schemas/ids/{id}                -> {"schema": TEXT} (+ "schemaType" when
                                        not AVRO, + "references" when any), as
                                        Confluent answers; 404 error_code 40403
  GET  /subjects                        -> ["subject", ...]
  GET  /subjects/{subject}/versions     -> [1, 2, ...]; 404 error_code 40401
  GET  /subjects/{subject}/versions/{v} -> {"subject", "version", "id",
       (v: a number or `latest`)          "schema", "schemaType"?}; 404 40401/40402

Errors are Confluent's shape: {"error_code": N, "message": "..."}, content
type application/vnd.schemaregistry.v1+json. An AVRO schema must be JSON
(422, error_code 42201, otherwise); nothing else about it is checked (a real
registry parses it and checks compatibility: this one does not).

Options: --port P (0: any free port; the URL is printed on stdout once the
socket listens), --user USER:PASSWORD (then every request but the control
ones needs that HTTP Basic auth, else 401 error_code 401), --exit-with-stdin
(exit when standard input closes: tests keep a pipe to it, so a test
process that dies does not leave a fixture behind).

Control endpoints for the outage tests (not part of the Confluent API):
  POST /_fixture/fail?status=503   every registry request answers that status
                                   (error_code 50001) until /_fixture/recover
  POST /_fixture/recover
  GET  /_fixture/requests          -> {"schema_gets": N}: GET /schemas/ids/*
                                   requests served so far (cache tests)
ci/registry.sh wraps these (`fail`, `recover`) and `stop` kills the process
for a registry that is down altogether.
"""

import argparse
import base64
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SCHEMA_TYPES = ("AVRO", "PROTOBUF", "JSON")


class Store:
    """All state, behind one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}  # id -> (type, text, references)
        self.ids = {}  # (type, text, references json) -> id
        self.subjects = {}  # subject -> [id of version 1, 2, ...]
        self.fail_status = None
        self.schema_gets = 0


class Handler(BaseHTTPRequestHandler):
    server_version = "spate-registry-fixture/1"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("registry_fixture: %s\n" % (fmt % args))

    # -- replies -------------------------------------------------------
    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status, code, message):
        self.reply(status, {"error_code": code, "message": message})

    # -- plumbing ------------------------------------------------------
    @property
    def store(self):
        return self.server.store

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def authorized(self):
        want = self.server.basic
        if want is None:
            return True
        got = self.headers.get("Authorization", "")
        return got == "Basic " + want

    def route(self, method):
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        if parts[:1] == ["_fixture"]:
            return self.control(method, parts[1:], parse_qs(url.query))
        if not self.authorized():
            return self.error(401, 401, "Unauthorized")
        with self.store.lock:
            failing = self.store.fail_status
        if failing is not None:
            return self.error(failing, 50001, "registry fixture: failing on purpose")
        if method == "GET" and len(parts) == 3 and parts[:2] == ["schemas", "ids"]:
            return self.get_schema(parts[2])
        if method == "GET" and parts == ["subjects"]:
            with self.store.lock:
                return self.reply(200, sorted(self.store.subjects))
        if len(parts) >= 3 and parts[0] == "subjects" and parts[2] == "versions":
            subject = parts[1]
            if method == "POST" and len(parts) == 3:
                return self.register(subject)
            if method == "GET" and len(parts) == 3:
                return self.versions(subject)
            if method == "GET" and len(parts) == 4:
                return self.version(subject, parts[3])
        return self.error(404, 404, "registry fixture: no route %s %s" % (method, url.path))

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    # -- the API -------------------------------------------------------
    def get_schema(self, raw_id):
        try:
            sid = int(raw_id)
        except ValueError:
            return self.error(404, 40403, "Schema %s not found" % raw_id)
        with self.store.lock:
            self.store.schema_gets += 1
            entry = self.store.by_id.get(sid)
        if entry is None:
            return self.error(404, 40403, "Schema %d not found" % sid)
        return self.reply(200, schema_body(entry))

    def register(self, subject):
        try:
            req = json.loads(self.body() or b"{}")
        except ValueError as e:
            return self.error(422, 42201, "Invalid request body: %s" % e)
        text = req.get("schema")
        kind = req.get("schemaType", "AVRO")
        refs = req.get("references") or []
        if not isinstance(text, str):
            return self.error(422, 42201, "Invalid schema: `schema` must be a string")
        if kind not in SCHEMA_TYPES:
            return self.error(422, 42201, "Invalid schemaType %r" % kind)
        if kind in ("AVRO", "JSON"):
            try:
                json.loads(text)
            except ValueError as e:
                return self.error(422, 42201, "Invalid schema: not JSON: %s" % e)
        key = (kind, text, json.dumps(refs, sort_keys=True))
        with self.store.lock:
            sid = self.store.ids.get(key)
            if sid is None:
                sid = len(self.store.by_id) + 1
                self.store.ids[key] = sid
                self.store.by_id[sid] = (kind, text, refs)
            versions = self.store.subjects.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
        return self.reply(200, {"id": sid})

    def versions(self, subject):
        with self.store.lock:
            versions = self.store.subjects.get(subject)
        if versions is None:
            return self.error(404, 40401, "Subject '%s' not found." % subject)
        return self.reply(200, list(range(1, len(versions) + 1)))

    def version(self, subject, raw):
        with self.store.lock:
            versions = self.store.subjects.get(subject)
            if versions is None:
                return self.error(404, 40401, "Subject '%s' not found." % subject)
            if raw == "latest":
                n = len(versions)
            else:
                try:
                    n = int(raw)
                except ValueError:
                    return self.error(422, 42202, "Invalid version %s" % raw)
            if not 1 <= n <= len(versions):
                return self.error(404, 40402, "Version %s not found." % raw)
            sid = versions[n - 1]
            entry = self.store.by_id[sid]
        body = schema_body(entry)
        body.update({"subject": subject, "version": n, "id": sid})
        return self.reply(200, body)

    # -- control -------------------------------------------------------
    def control(self, method, parts, query):
        if method == "POST" and parts == ["fail"]:
            status = int(query.get("status", ["503"])[0])
            with self.store.lock:
                self.store.fail_status = status
            return self.reply(200, {"failing": status})
        if method == "POST" and parts == ["recover"]:
            with self.store.lock:
                self.store.fail_status = None
            return self.reply(200, {"failing": None})
        if method == "GET" and parts == ["requests"]:
            with self.store.lock:
                return self.reply(200, {"schema_gets": self.store.schema_gets})
        return self.error(404, 404, "registry fixture: no control %s" % "/".join(parts))


def schema_body(entry):
    kind, text, refs = entry
    body = {"schema": text}
    if kind != "AVRO":
        body["schemaType"] = kind
    if refs:
        body["references"] = refs
    return body


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--user", help="USER:PASSWORD for HTTP Basic auth")
    ap.add_argument(
        "--exit-with-stdin",
        action="store_true",
        help="exit when standard input closes (a test that starts the fixture "
        "keeps a pipe to it, so a test process that dies takes the fixture along)",
    )
    args = ap.parse_args()
    if args.exit_with_stdin:

        def watch():
            sys.stdin.buffer.read()
            os._exit(0)

        threading.Thread(target=watch, daemon=True).start()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.store = Store()
    server.basic = base64.b64encode(args.user.encode()).decode() if args.user else None
    print("http://%s:%d" % (args.host, server.server_address[1]), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
