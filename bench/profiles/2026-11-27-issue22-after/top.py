#!/usr/bin/env python3
"""Shares of a py-spy raw (collapsed) profile, idle samples left out: `top.py FILE [N]`.

A sample is idle when one of its innermost frames waits in the kernel (epoll_wait, a lock's wait): py-spy --native
keeps those, and they are not CPU. Prints the busy samples' count, then the top N frames by inclusive share.
"""

import collections
import sys

IDLE_MARKS = ("epoll_wait", "acquire_lock", "uv__io_poll (linux.c:1452)")


def shares(path: str) -> tuple[int, collections.Counter]:
    inclusive: collections.Counter = collections.Counter()
    busy = 0
    for line in open(path):
        stack, _, count = line.rstrip().rpartition(" ")
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if any(mark in frame for frame in frames[-4:] for mark in IDLE_MARKS):
            continue
        busy += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
    return busy, inclusive


if __name__ == "__main__":
    busy, inclusive = shares(sys.argv[1])
    print("busy samples", busy)
    for frame, count in inclusive.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
        print(f"{100 * count / busy:5.1f}% {frame[:150]}")
