"""Chunked bodies whose chunk sizes a server must not wait for.

Sends, each on its own connection to a running horde, a chunked submit
whose chunk size is ``ffffffffffffffffffff``, one byte past
server.max_body_bytes (36 MiB by default), or a chunk-size line of leading
zeros, and prints what each got and how soon (a strict wire answers each
at once; "no answer" means the connection waits for bytes that never come).

    .venv/bin/python bench/hostile_chunks.py --port 7001
"""

from __future__ import annotations

import argparse
import socket
import time

HEAD = (
    b"POST /api/v2/generate/text/async HTTP/1.1\r\nHost: t\r\napikey: 0000000000\r\n"
    b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)
CASES = [
    ("20 hex digits", b"ffffffffffffffffffff\r\nabc"),
    ("max_body_bytes + 1", b"2400001\r\n"),
    ("1000 leading zeros, then CRLF", b"0" * 1000 + b"5\r\nhello\r\n0\r\n\r\n"),
    ("5000 leading zeros, no CRLF", b"0" * 5000),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=7001)
    parser.add_argument("--patience", type=float, default=5.0)
    args = parser.parse_args()
    for label, body in CASES:
        with socket.create_connection(("127.0.0.1", args.port)) as conn:
            conn.settimeout(args.patience)
            conn.sendall(HEAD + body)
            started = time.monotonic()
            try:
                data = conn.recv(4096)
            except TimeoutError:
                print(f"{label}: no answer within {args.patience:g} s (the connection waits)")
                continue
            status = data.split(b"\r\n", 1)[0].decode("latin-1")
            print(f"{label}: {status!r} after {time.monotonic() - started:.2f} s")


if __name__ == "__main__":
    main()
