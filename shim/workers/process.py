"""One worker's process as the kernel sees it, whoever its parent is now (the zygote, or the daemon after the
zygote died): its death from its pidfd, its exit status from the zygote or from waitid, a kill that can never hit
a process that reused the pid. The daemon is a child subreaper (`set_child_subreaper`), so orphaned workers become
its own children.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal

from probe_api.zygote_protocol import WorkerExit, exit_from_waitid
from shim.workers.zygote_handle import SpawnedWorker

EXIT_GRACE_S = 2.0  # after EOF, how long the exit status may take to arrive before a kill
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37

_libc = ctypes.CDLL(None, use_errno=True)


def set_child_subreaper(value: int) -> int:
    """PR_SET_CHILD_SUBREAPER for this process; returns the previous value."""
    previous = ctypes.c_int(0)
    if _libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0 \
            or _libc.prctl(PR_SET_CHILD_SUBREAPER, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
    return previous.value


class WorkerProcess:
    """A worker's process as the kernel sees it, whoever its parent is now.

    Its death is its pidfd turning readable: true while the zygote lives and after it
    died. Its exit status comes from the zygote while the zygote is its parent, and from
    waitid here once this process adopted it (it is then ours to reap, too)."""

    def __init__(self, worker: SpawnedWorker) -> None:
        self._loop = asyncio.get_running_loop()
        self.worker = worker
        self.gone: asyncio.Future[None] = self._loop.create_future()
        if worker.pidfd is None:  # no pidfd came with it: the zygote's word is all there is
            worker.exited.add_done_callback(lambda _: self._mark_gone())
        else:
            self._loop.add_reader(worker.pidfd, self._mark_gone)

    def _mark_gone(self) -> None:
        if self.worker.pidfd is not None:
            self._loop.remove_reader(self.worker.pidfd)
        if not self.gone.done():
            self.gone.set_result(None)

    def kill(self) -> None:
        """SIGKILL through the pidfd (never a process that reused the pid), even after the zygote died."""
        if self.worker.pidfd is None:
            self.worker.kill()
        elif not self.gone.done():
            try:
                signal.pidfd_send_signal(self.worker.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def exit_reason(self) -> str | None:
        """How the (gone) worker ended, reaping it if it is ours; None if nobody knows."""
        status = self._reap()
        if status is None:
            # The zygote's child: the zygote reaps it and reports in a moment.
            await asyncio.wait([self.worker.exited], timeout=EXIT_GRACE_S)
            reported = self.worker.exited.result() if self.worker.exited.done() else None
            if reported is not None and (reported.exit_code is not None or reported.signal):
                return reported.describe()
            status = self._reap()  # the zygote died first: its zombie was passed on to us
        return status.describe() if status is not None else None

    def _reap(self) -> WorkerExit | None:
        if self.worker.pidfd is None or not self.gone.done():
            return None
        try:
            result = os.waitid(os.P_PIDFD, self.worker.pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            return None  # not our child: the zygote's, or already reaped by it
        if result is None:
            return None
        return exit_from_waitid(result.si_pid, result.si_code, result.si_status)

    def close(self) -> None:
        if self.worker.pidfd is not None and not self.gone.done():
            self._loop.remove_reader(self.worker.pidfd)
        self.worker.close()
