#!/usr/bin/env python3
"""Serves a folder over HTTP/1.1 on 127.0.0.1 with nginx, for ferry's remote-shard tests (issue 29).

    python3 http_server.py --dir DIR

Runs Debian's nginx (/usr/sbin/nginx, package nginx-light) with a config generated into a temp
folder: one process (no master, no daemon), keep-alive, byte ranges (nginx's own: "bytes=A-B",
"bytes=A-", "bytes=-N", and several ranges as multipart/byteranges), ETag ("MTIME-SIZE" in hex),
every file served as application/octet-stream, nothing listed for folders. Prints one line,
"listening 127.0.0.1 PORT", once nginx answers there.

Stops nginx and removes the temp folder on SIGTERM, on SIGINT and when stdin reaches end of file:
the test holds the write end of a pipe to our stdin, so a test killed with SIGKILL leaves no
server behind. nginx also gets SIGKILL if this script dies first (PR_SET_PDEATHSIG). Run by hand,
keep stdin open (a terminal; Ctrl-D stops it).

Exit 77 (the tests' skip code) when nginx is missing; 1 when it does not start (its error log
follows on stderr); 2 on wrong arguments.
"""

import argparse
import ctypes
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

NGINX = "/usr/sbin/nginx"
# nginx cannot listen on port 0 and tell us which port it got, so we pick a free one and close it
# before nginx binds it; another process may take it in between, and then we try another.
BIND_ATTEMPTS = 5
START_SECONDS = 20.0

CONFIG = """\
daemon off;
master_process off;
worker_processes 1;
pid "{tmp}/nginx.pid";
error_log "{tmp}/error.log" warn;
events {{
    worker_connections 1024;
}}
http {{
    access_log "{tmp}/access.log";
    # Debian's defaults live under /var/lib/nginx, which a test may not write.
    client_body_temp_path "{tmp}/client_body";
    proxy_temp_path "{tmp}/proxy";
    fastcgi_temp_path "{tmp}/fastcgi";
    uwsgi_temp_path "{tmp}/uwsgi";
    scgi_temp_path "{tmp}/scgi";
    types {{ }}
    default_type application/octet-stream;
    sendfile on;
    keepalive_timeout 75s;
    keepalive_requests 100000;
    etag on;
    server {{
        listen 127.0.0.1:{port};
        server_name localhost;
        # A link to DIR, so DIR's name needs no quoting in this file.
        root "{tmp}/root";
        location / {{
        }}
    }}
}}
"""


class Stop(Exception):
    """Raised by the signal handlers: unwinds to the cleanup in main()."""


def on_signal(signum, frame):
    raise Stop()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    # Runs in the child between fork and exec: nginx gets SIGKILL when this script dies, even by
    # SIGKILL, so nginx never outlives the server that the test knows about.
    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def answers_as_nginx(port):
    """Whether nginx, not some other process that took the port, answers on it."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("HEAD", "/")
            server = conn.getresponse().getheader("Server") or ""
        finally:
            conn.close()
        return server.startswith("nginx")
    except (OSError, http.client.HTTPException):
        return False


def start_nginx(tmp):
    """Starts nginx on a free port; returns (process, port). Raises RuntimeError with the log."""
    conf = os.path.join(tmp, "nginx.conf")
    error_log = os.path.join(tmp, "error.log")
    last_log = ""
    for _ in range(BIND_ATTEMPTS):
        port = free_port()
        with open(conf, "w") as f:
            f.write(CONFIG.format(tmp=tmp, port=port))
        if os.path.exists(error_log):
            os.remove(error_log)
        proc = subprocess.Popen(
            [NGINX, "-p", tmp, "-c", conf, "-e", error_log],
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,
            stderr=sys.stderr,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if answers_as_nginx(port):
                if proc.poll() is None:
                    return proc, port
                break
            time.sleep(0.02)
        else:
            proc.kill()
            proc.wait()
            raise RuntimeError(
                f"nginx did not answer on 127.0.0.1:{port} within {START_SECONDS:.0f} s; "
                f"its error log:\n{read_text(error_log)}"
            )
        proc.wait()
        last_log = read_text(error_log)
        if "Address already in use" not in last_log:
            raise RuntimeError(
                f"nginx exited with code {proc.returncode} on start; its error log:\n{last_log}"
            )
    raise RuntimeError(
        f"nginx found its port taken {BIND_ATTEMPTS} times in a row; last error log:\n{last_log}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="the folder to serve")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    root = os.path.abspath(args.dir)
    if not os.path.isdir(root):
        print(f"http_server.py: --dir {root}: not a folder; create it first", file=sys.stderr)
        return 2
    if not os.access(NGINX, os.X_OK):
        print(
            f"http_server.py: {NGINX} not found; Debian: apt-get install nginx-light",
            file=sys.stderr,
        )
        return 77

    tmp = tempfile.mkdtemp(prefix="ferry-http-")
    proc = None
    try:
        os.symlink(root, os.path.join(tmp, "root"))
        try:
            proc, port = start_nginx(tmp)
        except RuntimeError as e:
            print(f"http_server.py: {e}", file=sys.stderr)
            return 1
        sys.stdout.write(f"listening 127.0.0.1 {port}\n")
        sys.stdout.flush()
        # Blocks until the test closes our stdin (or dies); a signal raises Stop out of the read.
        while sys.stdin.buffer.read1(65536):
            pass
        return 0
    except Stop:
        return 0
    finally:
        # Signals from here on would interrupt the cleanup that they ask for.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if proc is not None and proc.poll() is None:
            proc.terminate()  # nginx's fast shutdown
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
