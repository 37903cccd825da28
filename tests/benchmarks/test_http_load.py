"""benchmarks/http_load.py against a small in-process stdlib HTTP/1.1 server: counts are exact,
statuses are counted by code, chunked bodies are read, dropped connections are survived and
counted, and bad arguments or a refused connection give a clear error."""

import collections
import importlib.util
import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "http_load.py"
_spec = importlib.util.spec_from_file_location("http_load", _PATH)
http_load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(http_load)

BODY = b'{"data": [1, 2, 3]}'


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless a route closes
    disable_nagle_algorithm = True  # head and body are separate writes: no delayed-ACK stalls
    counts: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def _count(self, key: str) -> int:
        with self.lock:
            self.counts[key] += 1
            return self.counts[key]

    def _answer(self, status: int, headers=()):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(BODY)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        route = self.path
        n = self._count(route)
        if route == "/ok":
            self._answer(200)
        elif route == "/missing":
            self._answer(404)
        elif route == "/mixed":
            self._answer(200 if n % 2 else 503)
        elif route == "/close":
            self._answer(200, [("Connection", "close")])
        elif route == "/drop":  # every third request: close without answering
            if n % 3 == 0:
                self._count("dropped")
                self.close_connection = True
            else:
                self._count("answered")
                self._answer(200)
        elif route == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b'{"data": ', b"[1, 2, 3]", b"}"):
                self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\nX-Trailer: yes\r\n\r\n")


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def fresh_counts():
    Handler.counts.clear()


def load(url: str, concurrency: int = 4, duration: float = 0.4):
    return http_load.run(url, '{"input": "a b c"}', concurrency=concurrency, warmup=0.1, duration=duration,
                         timeout=3.0)


def test_counts_are_exact(server):
    r = load(server + "/ok")
    assert r["conn_errors"] == 0 and r["non_2xx"] == {}
    assert 0 < r["requests"] <= r["total"]["responses"]
    assert r["total"]["sent"] == r["total"]["responses"] == Handler.counts["/ok"]
    assert r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] <= r["max_ms"]


def test_non_2xx_are_counted_by_status(server):
    r = load(server + "/missing")
    assert r["requests"] == 0 and set(r["non_2xx"]) == {"404"}
    assert r["total"]["404"] == r["total"]["responses"] == Handler.counts["/missing"]
    r = load(server + "/mixed")
    assert set(r["non_2xx"]) == {"503"} and r["requests"] > 0
    assert r["total"]["responses"] == Handler.counts["/mixed"]
    assert r["total"]["503"] == Handler.counts["/mixed"] // 2


def test_chunked_responses_are_read(server):
    r = load(server + "/chunked")
    assert r["conn_errors"] == 0 and r["requests"] > 0
    assert r["total"]["responses"] == Handler.counts["/chunked"]


def test_chunked_body_parsed_in_any_split():
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    msg = head + b"4;x=y\r\nabcd\r\n10\r\n0123456789abcdef\r\n0\r\nT: 1\r\n\r\n"
    for k in range(len(head), len(msg)):
        end, pos = http_load._chunked_end(msg[:k], len(head))
        assert end == -1
        assert http_load._chunked_end(msg, pos)[0] == len(msg)


def test_connection_close_header_reconnects_without_errors(server):
    r = load(server + "/close")
    assert r["conn_errors"] == 0 and r["requests"] > 0
    assert r["total"]["responses"] == r["total"]["reconnects"] == Handler.counts["/close"]


def test_dropped_connections_are_reopened_and_counted(server):
    r = load(server + "/drop")
    c = Handler.counts
    assert c["dropped"] > 0 and r["requests"] > 0
    assert r["conn_errors"] == r["total"]["lost"] == c["dropped"]
    assert r["total"]["responses"] == c["answered"]
    assert r["total"]["sent"] == c["/drop"] and r["total"]["reconnects"] >= c["dropped"]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_at_start_is_a_clear_error(capsys):
    port = closed_port()
    with pytest.raises(ConnectionError, match=f"cannot connect to 127.0.0.1:{port}"):
        load(f"http://127.0.0.1:{port}/ok")
    assert http_load.main(["--url", f"http://127.0.0.1:{port}/ok", "--duration", "0.2"]) == 2
    assert "refused" in capsys.readouterr().err.lower()


@pytest.mark.parametrize("args, message", [
    (["--url", "https://127.0.0.1:1/x"], "plain HTTP"),
    (["--url", "127.0.0.1:8000/x"], "expected http://"),
    (["--url", "http://127.0.0.1:70000/x"], "port"),
    (["--body", "{not json"], "not valid JSON"),
])
def test_bad_arguments_are_named(server, capsys, args, message):
    argv = ["--url", server + "/ok", "--duration", "0.2"] + args
    assert http_load.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("http_load: error:") and message in err


def test_command_line_with_two_processes(server, tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(_PATH), "--url", server + "/ok", "--procs", "2", "--concurrency", "4",
                        "--warmup", "0.2", "--duration", "0.5", "--check-first", "--json", str(out)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[0].startswith("check-first: HTTP 200")
    assert "req/s" in lines[-1] and "2 procs" in lines[-1]
    r = json.loads(out.read_text())
    assert r["procs"] == 2 and len(r["client_cpu_s"]) == 2 and r["requests"] > 0
    assert r["total"]["sent"] == r["total"]["responses"] == Handler.counts["/ok"] - 1  # less check-first's
