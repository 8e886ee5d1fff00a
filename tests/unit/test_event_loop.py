"""The daemon's choice of event loop (shim/event_loop.py)."""

from __future__ import annotations

import asyncio

import pytest

from shim import event_loop


def test_uvloop_by_default_when_installed():
    uvloop = pytest.importorskip("uvloop")
    factory = event_loop.loop_factory({})
    assert factory is uvloop.new_event_loop
    loop = factory()
    try:
        assert event_loop.loop_name(loop) == "uvloop"
    finally:
        loop.close()


def test_asyncio_when_asked_for():
    assert event_loop.loop_factory({event_loop.VARIABLE: "asyncio"}) is None
    loop = asyncio.new_event_loop()
    try:
        assert event_loop.loop_name(loop) == "asyncio"
    finally:
        loop.close()


def test_an_unknown_loop_is_an_error_that_names_the_choices():
    with pytest.raises(event_loop.UnknownLoop, match="PROBE_SHIM_EVENT_LOOP='trio': expected one of uvloop, asyncio"):
        event_loop.loop_factory({event_loop.VARIABLE: "trio"})
