#!/usr/bin/env python3
"""A test endpoint: ClickHouse's HTTP interface (the part spate uses) in
front of a current ClickHouse engine embedded by chdb-core.

THE ENGINE IS REAL, THE HTTP LAYER IS OURS. This is not a ClickHouse server
and not a spate component: it exists so spate's writer, schema probe and
insert tokens meet a current engine on a machine whose only server is 18.16.
Whatever it shows about the engine (types, deduplication, settings) is the
engine's own behaviour; whatever it shows about HTTP (status codes, headers,
keep-alive, how query and body are joined) is this script's imitation and
proves nothing about a real server.

    python3 ci/chdb_server.py --port 28123 [--port 28124 ...] --data DIR
        [--user U --password P]

One chdb session (data directory DIR) serves every port; requests are
serialized through one lock (a chdb session is not thread-safe), so two
ports are two "replicas" that share one table: a retry on the other port
meets the first attempt's deduplication state. When every port answers
`/ping`, their URLs are printed on stdout, one a line.

Served:
- `GET|HEAD /ping` and `/`: `Ok.`
- `GET|POST /?query=SQL` with the rest of the SQL (or the data) as the POST
  body; URL parameters other than query/user/password/database/
  default_format/query_id/session_id are settings. Answers in
  TabSeparated unless the SQL names a FORMAT (or `default_format`).
- `INSERT INTO db.t [(cols)] FORMAT F` in `query` with the data as body:
  the body (gzip/deflate `Content-Encoding` decoded) is written to a temp
  file and run as `INSERT INTO db.t (cols) SELECT * FROM file(tmp, 'F',
  structure) SETTINGS <the request's settings>`, the structure being the
  table's types of those columns (`Native` is read without a structure:
  the block carries its types).
- Settings on other queries: `SET k = v` before, `SET k = DEFAULT` after.
- Not served: `compress=1` / `decompress=1` (ClickHouse's compressed-block
  framing): refused with code 1000, never read as data.
- User and password: `X-ClickHouse-User`/`X-ClickHouse-Key` headers, HTTP
  Basic auth, or `user`/`password` URL parameters (two methods at once are
  refused, as ClickHouse does); wrong ones: code 516.
- Engine errors: HTTP 500, header `X-ClickHouse-Exception-Code: N`, body the
  engine's `Code: N. DB::Exception: ...` text.

`--discard-inserts`: every INSERT is checked as above (table, columns,
switches) and its body read, then dropped unexecuted with a 200 reply
(outcome "discarded" in the insert log): an endpoint whose cost per insert
is near nothing, for measuring a client's own CPU per row
(ci/peer-bench.sh). Nothing lands, so nothing about the rows is checked.

Test-only switches (also the CLI flags --drop-replies N, --refuse N,
--delay-ms MS):
- `GET|POST /_chdb/fault?[table=db.t&]drop=N&refuse=N&delay_ms=MS`: the
  next N INSERTs into `db.t` (every table without `table`) are executed and
  then the connection is closed without a reply (the ambiguous write); the
  next N are refused with code 252 (TOO_MANY_PARTS, retryable) without
  executing; every request waits MS first. Answers the switches as JSON.
- `GET /_chdb/inserts`: every INSERT seen, as JSON lines (port, table,
  settings, outcome: ok / dropped / refused / error).
"""

import argparse
import base64
import gzip
import json
import os
import re
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chdb_venv  # noqa: E402

# URL parameters that are not settings (ClickHouse's HTTP handler reads these itself).
NOT_SETTINGS = {
    "query", "user", "password", "database", "default_format", "query_id",
    "session_id", "session_timeout", "session_check", "compress", "decompress",
    "buffer_size", "wait_end_of_query", "quota_key",
}
INSERT_RE = re.compile(
    r"^\s*INSERT\s+INTO\s+(?P<target>(?:`(?:[^`\\]|\\.)*`|[\w]+)(?:\s*\.\s*(?:`(?:[^`\\]|\\.)*`|[\w]+))?)"
    r"\s*(?:\((?P<cols>.*)\))?\s*FORMAT\s+(?P<fmt>\w+)\s*$",
    re.IGNORECASE | re.DOTALL,
)
IDENT_RE = re.compile(r"`((?:[^`\\]|\\.)*)`|([\w]+)")
CODE_RE = re.compile(r"Code:\s*(\d+)")


def unquote_ident(m):
    quoted, bare = m.group(1), m.group(2)
    if quoted is not None:
        return re.sub(r"\\(.)", r"\1", quoted)
    return bare


def quote_ident(name):
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def quote_literal(s):
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


class EngineError(Exception):
    """An error with a ClickHouse code and the engine's text."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code
        self.text = text


class Engine:
    """One chdb session, its lock, the test switches and the insert log."""

    def __init__(self, chdb, data, user, password):
        from chdb import session  # noqa: PLC0415

        os.makedirs(data, exist_ok=True)
        self.chdb_error = getattr(chdb, "ChdbError", Exception)
        self.session = session.Session(data)
        self.tmp = tempfile.mkdtemp(prefix="chdb-server-")
        self.lock = threading.Lock()
        self.user = user
        self.password = password
        # Test switches per table ("db.t"), "*" for every table.
        self.faults = {}
        self.delay_ms = 0
        self.inserts = []
        self.discard = False

    def run(self, sql, fmt="TabSeparated"):
        """Runs `sql` (caller holds the lock); raises EngineError."""
        try:
            return self.session.query(sql, fmt).bytes()
        except Exception as e:  # chdb's ChdbError carries the engine's text
            text = str(e).strip()
            m = CODE_RE.search(text)
            raise EngineError(int(m.group(1)) if m else 1001, text) from None

    def take_fault(self, table, kind):
        """Consumes one `kind` switch for `table` (or "*"); caller holds the lock."""
        for key in (table, "*"):
            f = self.faults.get(key)
            if f and f.get(kind, 0) > 0:
                f[kind] -= 1
                return True
        return False

    def columns(self, db, table):
        rows = self.run(
            f"SELECT name, type, default_kind FROM system.columns WHERE database = "
            f"{quote_literal(db)} AND table = {quote_literal(table)} ORDER BY position",
            "JSONEachRow",
        )
        return [json.loads(line) for line in rows.decode().splitlines() if line.strip()]


def settings_clause(settings):
    return ", ".join(f"{k} = {quote_literal(v)}" for k, v in settings)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine = None  # set by main()

    def log_message(self, fmt, *args):  # quiet; errors go to the reply
        if os.environ.get("CHDB_SERVER_VERBOSE"):
            sys.stderr.write("chdb_server: " + (fmt % args) + "\n")

    # -- replies -------------------------------------------------------

    def reply(self, status, body, headers=()):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "text/plain; charset=UTF-8")
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def reply_error(self, code, text, status=500):
        body = text if text.startswith("Code:") else f"Code: {code}. DB::Exception: {text}"
        self.reply(status, (body + "\n").encode(), [("X-ClickHouse-Exception-Code", str(code))])

    def drop_connection(self):
        """Closes the connection without a reply (the ambiguous write)."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- request parsing -----------------------------------------------

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            body = b"".join(chunks)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        enc = self.headers.get("Content-Encoding", "").lower().strip()
        if enc == "gzip":
            body = gzip.decompress(body)
        elif enc == "deflate":
            body = zlib.decompress(body)
        elif enc not in ("", "identity"):
            raise EngineError(1000, f"Code: 1000. DB::Exception: Unknown Content-Encoding {enc}")
        return body

    def check_auth(self, params):
        """ClickHouse's three ways to say who you are; exactly one at a time."""
        ways = []
        if "X-ClickHouse-User" in self.headers or "X-ClickHouse-Key" in self.headers:
            ways.append((self.headers.get("X-ClickHouse-User", "default"), self.headers.get("X-ClickHouse-Key", "")))
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("basic "):
            user, _, pw = base64.b64decode(auth[6:].strip()).decode().partition(":")
            ways.append((user, pw))
        if "user" in params or "password" in params:
            ways.append((params.get("user", "default"), params.get("password", "")))
        if len(ways) > 1:
            raise EngineError(
                194,
                "Code: 194. DB::Exception: Invalid authentication: it is not allowed to use "
                "several authentication methods at once. (REQUIRED_PASSWORD)",
            )
        user, pw = ways[0] if ways else ("default", "")
        if user != self.engine.user or pw != self.engine.password:
            raise EngineError(
                516,
                f"Code: 516. DB::Exception: {user}: Authentication failed: password is "
                "incorrect, or there is no user with such name. (AUTHENTICATION_FAILED)",
            )

    # -- verbs ---------------------------------------------------------

    def do_HEAD(self):
        self.handle_any()

    def do_GET(self):
        self.handle_any()

    def do_POST(self):
        self.handle_any()

    def handle_any(self):
        url = urllib.parse.urlsplit(self.path)
        pairs = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
        params = dict(pairs)
        try:
            body = self.read_body() if self.command == "POST" else b""
        except EngineError as e:
            return self.reply_error(e.code, e.text)
        if url.path in ("/ping", "/") and "query" not in params and not body:
            return self.reply(200, b"Ok.\n")
        if url.path == "/_chdb/fault":
            return self.fault(params)
        if url.path == "/_chdb/inserts":
            with self.engine.lock:
                lines = "".join(json.dumps(i) + "\n" for i in self.engine.inserts)
            return self.reply(200, lines.encode())
        if url.path != "/":
            return self.reply(404, b"There is no handle " + url.path.encode() + b"\n")
        if self.engine.delay_ms:
            time.sleep(self.engine.delay_ms / 1000)
        settings = [(k, v) for k, v in pairs if k not in NOT_SETTINGS]
        query = params.get("query", "")
        try:
            self.check_auth(params)
            if params.get("decompress", "0") not in ("", "0") or params.get("compress", "0") not in ("", "0"):
                # ClickHouse's own compressed-block framing (CityHash128
                # checksum, method byte, LZ4/ZSTD block) is not imitated:
                # refuse it rather than read a compressed body as data.
                raise EngineError(
                    1000,
                    "Code: 1000. DB::Exception: chdb_server.py does not implement the compress=1 / "
                    "decompress=1 block framing of ClickHouse's HTTP interface; send the body plain "
                    "or with Content-Encoding gzip/deflate",
                )
            m = INSERT_RE.match(query) if body else None
            if m:
                return self.insert(m, body, settings, params)
            sql = query + ("\n" if query and body else "") + body.decode()
            if not sql.strip():
                raise EngineError(62, "Code: 62. DB::Exception: Empty query. (SYNTAX_ERROR)")
            out = self.select(sql, settings, params)
        except EngineError as e:
            return self.reply_error(e.code, e.text)
        self.reply(200, out)

    def fault(self, params):
        e = self.engine
        with e.lock:
            f = e.faults.setdefault(params.get("table", "*"), {})
            for key in ("drop", "refuse"):
                if key in params:
                    f[key] = int(params[key])
            if "delay_ms" in params:
                e.delay_ms = int(params["delay_ms"])
            state = {"faults": e.faults, "delay_ms": e.delay_ms}
        self.reply(200, (json.dumps(state) + "\n").encode())

    def select(self, sql, settings, params):
        e = self.engine
        fmt = params.get("default_format", "TabSeparated")
        with e.lock:
            if "database" in params:
                e.run(f"USE {quote_ident(params['database'])}")
            applied = []
            try:
                for k, v in settings:
                    e.run(f"SET {k} = {quote_literal(v)}")
                    applied.append(k)
                return e.run(sql, fmt)
            finally:
                for k in applied:
                    e.run(f"SET {k} = DEFAULT")
                if "database" in params:
                    e.run("USE default")

    def insert(self, m, body, settings, params):
        e = self.engine
        names = [unquote_ident(i) for i in IDENT_RE.finditer(m.group("target"))]
        db, table = (names if len(names) == 2 else [params.get("database", "default"), names[0]])
        fmt = m.group("fmt")
        record = {"port": self.server.server_address[1], "table": f"{db}.{table}",
                  "format": fmt, "settings": dict(settings), "bytes": len(body)}
        with e.lock:
            try:
                cols = e.columns(db, table)
                if not cols:
                    raise EngineError(60, f"Code: 60. DB::Exception: Table {db}.{table} does not exist. (UNKNOWN_TABLE)")
                types = {c["name"]: c["type"] for c in cols}
                if m.group("cols") is not None:
                    wanted = [unquote_ident(i) for i in IDENT_RE.finditer(m.group("cols"))]
                else:
                    wanted = [c["name"] for c in cols if c["default_kind"] in ("", "DEFAULT")]
                for c in wanted:
                    if c not in types:
                        raise EngineError(16, f"Code: 16. DB::Exception: No such column {c} in table {db}.{table}. (NO_SUCH_COLUMN_IN_TABLE)")
                if e.take_fault(f"{db}.{table}", "refuse"):
                    record["outcome"] = "refused"
                    raise EngineError(252, "Code: 252. DB::Exception: Too many parts (refused by chdb_server's test switch). (TOO_MANY_PARTS)")
                if e.discard:
                    record["outcome"] = "discarded"
                    drop = False
                    return self.reply(200, b"")
                path = os.path.join(e.tmp, "body.bin")
                with open(path, "wb") as f:
                    f.write(body)
                if fmt.lower() == "native":
                    source = f"file({quote_literal(path)}, 'Native')"
                else:
                    structure = ", ".join(f"{quote_ident(c)} {types[c]}" for c in wanted)
                    source = f"file({quote_literal(path)}, {quote_literal(fmt)}, {quote_literal(structure)})"
                sql = (f"INSERT INTO {quote_ident(db)}.{quote_ident(table)} "
                       f"({', '.join(quote_ident(c) for c in wanted)}) SELECT * FROM {source}")
                if settings:
                    sql += " SETTINGS " + settings_clause(settings)
                e.run(sql)
                drop = e.take_fault(f"{db}.{table}", "drop")
                record["outcome"] = "dropped" if drop else "ok"
            except EngineError as err:
                record.setdefault("outcome", "error")
                record["error"] = err.text
                raise
            finally:
                e.inserts.append(record)
        if drop:
            return self.drop_connection()
        self.reply(200, b"")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, action="append", required=True,
                    help="repeat for more replicas; 0 picks a free port")
    ap.add_argument("--data", required=True, help="the chdb session's data directory")
    ap.add_argument("--user", default="default")
    ap.add_argument("--password", default="")
    ap.add_argument("--drop-replies", type=int, default=0)
    ap.add_argument("--refuse", type=int, default=0)
    ap.add_argument("--delay-ms", type=int, default=0)
    ap.add_argument("--discard-inserts", action="store_true",
                    help="answer INSERTs without executing them (nothing lands)")
    args = ap.parse_args()
    chdb = chdb_venv.ensure_chdb(__file__, sys.argv[1:], tag="chdb_server")
    engine = Engine(chdb, os.path.abspath(args.data), args.user, args.password)
    engine.faults["*"] = {"drop": args.drop_replies, "refuse": args.refuse}
    engine.delay_ms = args.delay_ms
    engine.discard = args.discard_inserts
    Handler.engine = engine
    servers = []
    for port in args.port:
        srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    # Port 0: the system picks a free one; the printed URL says which.
    urls = [f"http://127.0.0.1:{srv.server_address[1]}" for srv in servers]
    for u in urls:
        for _ in range(100):
            try:
                with urllib.request.urlopen(u + "/ping", timeout=2) as r:
                    if r.read().startswith(b"Ok."):
                        break
            except OSError:
                time.sleep(0.05)
        else:
            print(f"chdb_server: {u} does not answer /ping", file=sys.stderr)
            return 1
    version = engine.run("SELECT version()").decode().strip()
    print(f"chdb_server: ClickHouse {version} (chdb-core) behind our HTTP layer on {', '.join(urls)}", file=sys.stderr)
    for u in urls:
        print(u, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
