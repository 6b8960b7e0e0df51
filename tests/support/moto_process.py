"""
moto's SQS server in a process of its own, whose HTTP server can be stopped and started again.

The reliability rig (tests/reliability/brokers.py) used to serve moto from a thread of the
process that also runs the triggerer under test. moto is pure Python and, in 5.2, each
``ReceiveMessage`` computes the queue's attributes by scanning every message several times
(``is_message_valid_based_on_retention_period`` calls ``get_queue_attributes``): on a queue of
1,000 messages that took about two thirds of the process's CPU (py-spy, 2026-11-24), under the
same GIL as the stream it was serving, so the broker's cost was charged to the stream's pace and
the SQS runs took several times as long as the others. Here moto has a core of its own.

moto keeps queues and messages in module-level backends of the process that serves them: a new
HTTP server on the same port in this process serves the same state, as a restarted SQS endpoint
would. The parent writes ``stop`` or ``start`` on stdin and reads ``ok``; end of input ends it.

Run: ``python -m tests.support.moto_process PORT``; prints ``ready`` once it serves. Started by
:class:`~tests.support.brokers.MotoServer` with ``own_process``, and serves one of its own.
"""

from __future__ import annotations

import sys


def serve(port: int) -> None:
    from tests.support.brokers import MotoServer

    server = MotoServer(port)
    server.start()
    print("ready", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "stop":
            server.stop()
        elif command == "start":
            server.start()
        else:
            print(f"unknown command {command!r}", flush=True)
            continue
        print("ok", flush=True)
    server.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
