"""A worker's fork: what the zygote does around os.fork(), and what the child does before it becomes the worker.

The child sheds the zygote's state first (its control socket, its epoll set, every descriptor but its two
sockets, the signal handlers the zygote set, the zygote's GC setting), touching as few Python objects as it can:
each object it touches copies the page it is on, and the pages it does not touch stay shared with the zygote and
every other worker (probe_zygote/prefork.py measures and packs them). Before any fork, the zygote runs the child's
first steps and a worker session on loopback itself (`warm_up`), so that the code every child runs is warm.
"""

from __future__ import annotations

import _signal
import ctypes
import gc
import logging
import os
import select
import signal
import socket
import traceback

import probe_worker.main as worker_main  # the preload: every forked worker shares these pages
from cri_proto import probe_worker_pb2 as worker_pb
from probe_worker.channel import BlockingChannel
from probe_zygote.prefork import executed_code, fill_malloc_holes, fill_pool_holes, relocate_code
from probe_zygote.prefork import warm_up as run_worker_once

log = logging.getLogger(__name__)

EXIT_INTERNAL_ERROR = 70  # EX_SOFTWARE: the child failed outside run()
PR_SET_MEMORY_MERGE = 67

_libc = ctypes.CDLL(None, use_errno=True)

# Handlers as the interpreter set them before the zygote touched any, restored in children.
# _signal's raw ints and handlers: signal.signal() would convert through enums in every child.
_STARTUP_HANDLERS = tuple((int(sig), _signal.getsignal(sig))
                          for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE))


def reset_signals() -> None:
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
    for signum, handler in _STARTUP_HANDLERS:
        _signal.signal(signum, handler if handler is not None else _signal.SIG_DFL)


def become_worker(config: worker_pb.WorkerConfig, worker_fd: int, broker_fd: int, *, zygote_pid: int,
                  control: socket.socket | None, poller: select.epoll, max_fd: int, child_gc_threshold: int) -> None:
    """In the forked child: shed the zygote's state, then become the worker. Never returns."""
    code = EXIT_INTERNAL_ERROR
    try:
        # No parent-death signal: a worker whose zygote died ends when its broker channel closes
        # (the daemon, a child subreaper, reaps it and starts it again), and at EOF of its socket
        # when the daemon is gone.
        if os.getppid() != zygote_pid:
            os._exit(EXIT_INTERNAL_ERROR)  # the zygote died before it could hand us over
        # Every Python object the child touches copies the page it is on: this prelude sticks
        # to C functions and ints (closerange also closes the control socket and the pidfds).
        if control is not None:
            control.detach()
        poller.close()  # the zygote's watch list is not the worker's
        # Anything else (the broker's netns descriptors and other workers' channels, or what the zygote
        # inherited by mistake) must not reach a pod's process.
        low, high = min(worker_fd, broker_fd), max(worker_fd, broker_fd)
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, max_fd)
        reset_signals()
        if child_gc_threshold > 0:
            gc.set_threshold(child_gc_threshold)
            gc.enable()
        channel = BlockingChannel(socket.socket(fileno=worker_fd))
        code = worker_main.run(config, channel, socket.socket(fileno=broker_fd), die_with_parent_process=False)
    except BaseException:  # noqa: BLE001  the child must end here, never return into the zygote loop
        traceback.print_exc()
    finally:
        logging.shutdown()
        os._exit(code)


def _warm_up_once() -> None:
    for _ in range(12):
        reset_signals()  # what each child runs first, while the handlers are still the startup ones
    run_worker_once()


def warm_up(relocate: bool) -> None:
    """Runs the worker's code here, before any fork (probe_zygote/prefork.py says why). With
    relocate, a first, profiled run finds the code a worker runs, that code is copied into
    fresh pages, packed (fill the holes first, or the copies would land in them), and the
    second run warms the copies up."""
    if relocate:
        hot = executed_code(_warm_up_once)
        gc.collect()
        fill_pool_holes()
        fill_malloc_holes()
        relocate_code(hot)
    _warm_up_once()


def merge_pages() -> None:
    """Opts this process and every worker forked from it into KSM (Linux >= 6.4). Pages a worker
    copied but left identical (reference counts back where they were) are merged again, if the
    node runs ksmd (/sys/kernel/mm/ksm/run = 1): a node-wide choice, hence off by default."""
    if _libc.prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0:
        log.warning("KSM merging not enabled: prctl(PR_SET_MEMORY_MERGE): %s", os.strerror(ctypes.get_errno()))
