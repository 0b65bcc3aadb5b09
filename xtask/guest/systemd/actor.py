#!/usr/bin/python3
"""A listener with a one-slot backlog and the clients that overflow it, run inside a
network namespace of its own (`ip netns exec NS python3 actor.py`), so that namespace's
TcpExt ListenOverflows counts this listener's drops and nothing else.

Commands on stdin, one per line, each answered with one line on stdout:
  fill N  N clients complete their handshakes one at a time (queued, never accepted)
  drop N  N clients send a SYN to the full listener and are closed at once
"""

import os
import socket
import sys

listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.bind(("127.0.0.1", 0))
# backlog 1: the accept queue is full with 2 connections (full means more than the backlog).
listener.listen(1)
port = listener.getsockname()[1]
inode = os.fstat(listener.fileno()).st_ino
print(f"ready {port} {inode}", flush=True)

held = []
for line in sys.stdin:
    words = line.split()
    if not words:
        continue
    cmd, n = words[0], int(words[1])
    if cmd == "fill":
        # One handshake at a time: each final ACK finds room in the queue, so no drop is a
        # final-ACK overflow; every later drop happens at the SYN (accept queue full).
        for _ in range(n):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        print("ok", flush=True)
    elif cmd == "drop":
        clients = []
        for _ in range(n):
            c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            clients.append(c)
        # Closed in SYN_SENT: nothing is sent, and no retransmitted SYN adds drops later.
        for c in clients:
            c.close()
        print("ok", flush=True)
    else:
        print(f"unknown command {cmd!r}", flush=True)
