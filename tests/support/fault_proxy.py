#!/usr/bin/env python3
"""An HTTP/1.1 proxy on 127.0.0.1 that injects faults, for ferry's remote-shard tests (issue 29).

    python3 fault_proxy.py --upstream 127.0.0.1:PORT --plan PLANFILE --log LOGFILE

The client talks to it as if it were the server (plain HTTP, no CONNECT). Each request is sent on
to the upstream byte for byte (request line, headers, body), Host and Authorization included, so
SigV4 signatures made for the proxy's address still verify upstream; the response comes back byte
for byte unless a fault applies. Client connections are kept alive; each request gets a fresh
upstream connection. Prints one line, "listening 127.0.0.1 PORT", once it accepts connections.
Stops on SIGTERM, on SIGINT and when stdin reaches end of file: the test holds the write end of a
pipe to our stdin, so a test killed with SIGKILL leaves no proxy behind.

PLANFILE (JSON) is read afresh for each request; a missing file means no faults. Write it
atomically (a temp file, then rename) while the proxy runs: a half-written plan is read again a
few times over 100 ms, then answered with 500 FaultPlanError.

    {"faults": [
      {"match": "shard-000001", "method": "GET", "times": 2, "reset_after": 1000},
      {"status": 503, "code": "SlowDown"},
      ...
    ]}

The first fault whose filters fit and whose uses are not used up is applied to the request:
  match      substring of the request target (path and query as sent); absent: every request
  method     the request method, exactly ("GET", "HEAD", ...); absent: every method
  range      the request's Range header, exactly ("bytes=0-99"); "" for a request without one;
             absent: every request
  times      how many requests it applies to (default 1; negative: all of them); counted in
             memory by this proxy process, per fault (its position and its JSON text)
Its action is named by "action" or, without it, by the first of these keys present:
  "stall_after": N, "stall": S   send the headers and N body bytes, wait S seconds, send the rest
  "reset_after": N               send the headers (full Content-Length) and N body bytes, then
                                 reset the connection (RST: SO_LINGER 0)
  "truncate": N                  send the headers (full Content-Length) and N body bytes, then
                                 close cleanly (FIN)
  "drop": true                   read the request, answer nothing, reset the connection
  "status": CODE                 answer itself, without the upstream: CODE with an S3 XML error
                                 body, Content-Type application/xml, connection kept alive;
                                 "code" (default by status: 403 AccessDenied, 404 NoSuchKey,
                                 500 InternalError, 503 SlowDown, else Fault) and "message"
                                 (default: S3's message for that code) fill in
                                 <Error><Code>..</Code><Message>..</Message></Error>
  "stall": S                     wait S seconds before sending the request on, then forward
Body bytes are counted as they go on the wire after the header block (with chunked framing, for
a chunked response).

LOGFILE gets one JSON line per request, appended and flushed before the first byte of the
response goes to the client (for "stall", after the wait; for "drop", before the reset):
    {"method": "GET", "path": "/bucket/key?x=1", "range": "bytes=0-99" or null,
     "action": "reset_after" or null, "fault": index in the plan or null,
     "status": upstream status, or its own, or null (drop; upstream unreachable: 502)}
"""

import argparse
import json
import os
import signal
import socket
import socketserver
import struct
import sys
import threading
import time

MAX_HEAD = 64 * 1024
CHUNK = 64 * 1024
ACTIONS = ("stall_after", "reset_after", "truncate", "drop", "status", "stall")
DEFAULT_CODES = {403: "AccessDenied", 404: "NoSuchKey", 500: "InternalError", 503: "SlowDown"}
MESSAGES = {
    "AccessDenied": "Access Denied",
    "InternalError": "We encountered an internal error. Please try again.",
    "NoSuchKey": "The specified key does not exist.",
    "ServiceUnavailable": "Please reduce your request rate.",
    "SlowDown": "Please reduce your request rate.",
}
REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    416: "Range Not Satisfiable",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class Stop(Exception):
    """Raised by the signal handlers: unwinds to the exit in main()."""


class PlanError(Exception):
    pass


class ClientGone(Exception):
    """The request could not be read whole: the client closed, or sent something not HTTP/1.x."""


class Reader:
    """Buffered reads from a socket without makefile(), whose references would keep the socket
    open after close() and turn an intended reset into nothing."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def _fill(self):
        data = self.sock.recv(CHUNK)
        if not data:
            return False
        self.buf += data
        return True

    def line(self):
        """One line with its CRLF; b"" at end of stream before any byte."""
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                out = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                return out
            if len(self.buf) > MAX_HEAD:
                raise ClientGone("line longer than 64 KiB")
            if not self._fill():
                out = bytes(self.buf)
                self.buf.clear()
                return out

    def exact(self, n):
        while len(self.buf) < n:
            if not self._fill():
                raise ClientGone(f"stream ended {n - len(self.buf)} bytes early")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def some(self):
        """Up to CHUNK bytes; b"" at end of stream."""
        if not self.buf and not self._fill():
            return b""
        out = bytes(self.buf[:CHUNK])
        del self.buf[:CHUNK]
        return out


class Message:
    """A request or response head as received, with the header fields it needs."""

    def __init__(self, reader):
        first = reader.line()
        while first in (b"\r\n", b"\n"):  # stray CRLF between requests is allowed (RFC 9112)
            first = reader.line()
        if not first:
            raise EOFError()
        raw = bytearray(first)
        self.headers = {}
        while True:
            line = reader.line()
            if not line:
                raise ClientGone("stream ended inside a header block")
            raw += line
            if len(raw) > MAX_HEAD:
                raise ClientGone("header block longer than 64 KiB")
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.decode("latin-1").partition(":")
            self.headers.setdefault(name.strip().lower(), value.strip())
        self.raw = bytes(raw)
        self.first = first.decode("latin-1").rstrip("\r\n")

    def header(self, name):
        return self.headers.get(name)

    def chunked(self):
        return "chunked" in (self.header("transfer-encoding") or "").lower()

    def connection_tokens(self):
        return [t.strip().lower() for t in (self.header("connection") or "").split(",")]


def chunked_body(reader):
    """Yields a chunked body's raw bytes (sizes, data, trailers) up to its end."""
    while True:
        size_line = reader.line()
        if not size_line:
            raise ClientGone("stream ended inside a chunked body")
        yield size_line
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:
                trailer = reader.line()
                if not trailer:
                    raise ClientGone("stream ended inside chunked trailers")
                yield trailer
                if trailer in (b"\r\n", b"\n"):
                    return
        data = size + 2
        while data:
            piece = reader.exact(min(data, CHUNK))
            data -= len(piece)
            yield piece


def sized_body(reader, length):
    while length:
        piece = reader.exact(min(length, CHUNK))
        length -= len(piece)
        yield piece


def body_until_close(reader):
    while True:
        piece = reader.some()
        if not piece:
            return
        yield piece


class Plan:
    """The fault plan file and the uses of its faults so far."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.used = {}

    def _load(self):
        last = None
        for _ in range(5):
            try:
                with open(self.path, "rb") as f:
                    text = f.read()
            except FileNotFoundError:
                return []
            try:
                plan = json.loads(text)
                faults = plan.get("faults", []) if isinstance(plan, dict) else None
                if not isinstance(faults, list) or not all(isinstance(f, dict) for f in faults):
                    raise PlanError(
                        f'{self.path}: expected {{"faults": [{{...}}, ...]}}, got {text[:200]!r}'
                    )
                return faults
            except ValueError as e:
                last = e
                time.sleep(0.02)
        raise PlanError(f"{self.path}: not JSON ({last}); write the plan atomically (rename)")

    @staticmethod
    def action_of(index, fault, path):
        action = fault.get("action")
        if action is None:
            action = next((a for a in ACTIONS if a in fault), None)
        if action not in ACTIONS:
            raise PlanError(
                f"{path}: faults[{index}]: no action in {json.dumps(fault)}; "
                f"give one of {', '.join(ACTIONS)}"
            )
        if not isinstance(fault.get("times", 1), int):
            raise PlanError(
                f"{path}: faults[{index}]: times must be an integer, got {json.dumps(fault)}"
            )
        if action in ("reset_after", "truncate", "stall_after", "stall", "status"):
            key = "stall" if action == "stall_after" else action
            if not isinstance(fault.get(action), (int, float)) or not isinstance(
                fault.get(key), (int, float)
            ):
                raise PlanError(
                    f"{path}: faults[{index}]: {action} needs a number in "
                    + (f'"{action}" and "stall"' if action == "stall_after" else f'"{action}"')
                    + f", got {json.dumps(fault)}"
                )
        return action

    def pick(self, method, target, range_header):
        """(index, fault, action) of the fault to apply, counted as used, or (None, None, None)."""
        faults = self._load()
        with self.lock:
            for index, fault in enumerate(faults):
                if "match" in fault and str(fault["match"]) not in target:
                    continue
                if "method" in fault and fault["method"] != method:
                    continue
                if "range" in fault and fault["range"] != (range_header or ""):
                    continue
                action = self.action_of(index, fault, self.path)
                key = (index, json.dumps(fault, sort_keys=True))
                times = fault.get("times", 1)
                if times >= 0 and self.used.get(key, 0) >= times:
                    continue
                self.used[key] = self.used.get(key, 0) + 1
                return index, fault, action
        return None, None, None


class Log:
    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.lock = threading.Lock()

    def write(self, **entry):
        line = (json.dumps(entry) + "\n").encode()
        with self.lock:
            os.write(self.fd, line)


def error_response(status, code, message, head_only):
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        "<RequestId>FERRYFAULTPROXY</RequestId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Fault')}\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        "x-amz-request-id: FERRYFAULTPROXY\r\n"
        "Server: ferry-fault-proxy\r\n"
        "\r\n"
    ).encode()
    return head if head_only else head + body


def reset(sock):
    """Closes with RST instead of FIN: the client sees ECONNRESET, as from a dropped server."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = Reader(sock)
        try:
            while self.one_exchange(sock, reader):
                pass
        except (EOFError, ClientGone, ConnectionError, TimeoutError):
            pass
        except OSError:
            pass

    def one_exchange(self, sock, reader):
        """Serves one request; returns whether the client connection stays open."""
        server = self.server
        request = Message(reader)
        parts = request.first.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise ClientGone(f"not an HTTP/1.x request line: {request.first!r}")
        method, target, version = parts
        keep_alive = "close" not in request.connection_tokens() and (
            version != "HTTP/1.0" or "keep-alive" in request.connection_tokens()
        )

        # The body is read whole before anything goes upstream, so an own answer (a "status"
        # fault) never leaves half a body on the connection. curl and libcurl wait for
        # "100 Continue" before a large body: we send it, and drop the upstream's own.
        if "100-continue" in (request.header("expect") or "").lower():
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if request.chunked():
            body = b"".join(chunked_body(reader))
        else:
            body = reader.exact(int(request.header("content-length") or 0))

        entry = {"method": method, "path": target, "range": request.header("range")}
        try:
            index, fault, action = server.plan.pick(method, target, request.header("range"))
        except PlanError as e:
            print(f"fault_proxy.py: {e}", file=sys.stderr, flush=True)
            server.log.write(**entry, action="plan_error", fault=None, status=500)
            sock.sendall(error_response(500, "FaultPlanError", str(e), method == "HEAD"))
            return keep_alive
        entry.update(action=action, fault=index)

        if action == "drop":
            server.log.write(**entry, status=None)
            reset(sock)
            return False
        if action == "status":
            status = int(fault["status"])
            code = fault.get("code") or DEFAULT_CODES.get(status, "Fault")
            message = fault.get("message") or MESSAGES.get(code, f"fault_proxy: injected {status}")
            server.log.write(**entry, status=status)
            sock.sendall(error_response(status, code, message, method == "HEAD"))
            return keep_alive
        if action == "stall":
            time.sleep(float(fault["stall"]))

        try:
            upstream = socket.create_connection(server.upstream, timeout=10)
        except OSError as e:
            server.log.write(**entry, status=502)
            sock.sendall(
                error_response(
                    502, "BadGateway", f"fault_proxy: upstream {server.upstream}: {e}",
                    method == "HEAD",
                )
            )
            return keep_alive
        try:
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up = Reader(upstream)
            try:
                upstream.sendall(request.raw + body)
                while True:
                    response = Message(up)
                    status = int(response.first.split(" ")[1])
                    if not 100 <= status < 200 or status == 101:
                        break
            except (EOFError, ClientGone, OSError, ValueError, IndexError) as e:
                server.log.write(**entry, status=502)
                sock.sendall(
                    error_response(
                        502, "BadGateway",
                        f"fault_proxy: no response from upstream {server.upstream}: {e!r}",
                        method == "HEAD",
                    )
                )
                return False
            server.log.write(**entry, status=status)

            close_after = "close" in response.connection_tokens()
            if method == "HEAD" or status in (204, 304):
                pieces = iter(())
            elif response.chunked():
                pieces = chunked_body(up)
            elif response.header("content-length") is not None:
                pieces = sized_body(up, int(response.header("content-length")))
            else:
                pieces = body_until_close(up)
                close_after = True

            sock.sendall(response.raw)
            limit = None
            if action in ("reset_after", "truncate", "stall_after"):
                limit = int(fault[action])
            sent = 0
            for piece in pieces:
                if limit is not None and sent + len(piece) >= limit:
                    sock.sendall(piece[: limit - sent])
                    if action == "reset_after":
                        reset(sock)
                        return False
                    if action == "truncate":
                        sock.shutdown(socket.SHUT_WR)
                        sock.close()
                        return False
                    time.sleep(float(fault["stall"]))  # stall_after
                    piece = piece[limit - sent :]
                    sent = limit
                    limit = None
                sock.sendall(piece)
                sent += len(piece)
            if limit is not None:  # the body was shorter than N: cut at its end
                if action == "reset_after":
                    reset(sock)
                    return False
                if action == "truncate":
                    sock.shutdown(socket.SHUT_WR)
                    sock.close()
                    return False
                time.sleep(float(fault["stall"]))
            return keep_alive and not close_after
        finally:
            upstream.close()


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def parse_upstream(text):
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def on_signal(signum, frame):
    raise Stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, type=parse_upstream, help="HOST:PORT")
    parser.add_argument("--plan", required=True, help="JSON fault plan, read at each request")
    parser.add_argument("--log", required=True, help="one JSON line appended per request")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server = Server(("127.0.0.1", 0), Handler)
        server.upstream = args.upstream
        server.plan = Plan(args.plan)
        server.log = Log(args.log)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        sys.stdout.write(f"listening 127.0.0.1 {server.server_address[1]}\n")
        sys.stdout.flush()
        # Blocks until the test closes our stdin (or dies); a signal raises Stop out of the read.
        while sys.stdin.buffer.read1(65536):
            pass
    except Stop:
        pass
    # Threads stalled or mid-transfer end with the process: a test that stops the proxy is done
    # with its connections, and the log is written with unbuffered os.write.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
