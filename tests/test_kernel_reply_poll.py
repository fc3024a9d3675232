"""book/_ext/kernel_reply_poll.py: a reply the socket failed to announce costs one slice, not
the cell timeout (nbclient#312), and every caller still gets its message or ``Empty``."""

from __future__ import annotations

import asyncio
import time
from queue import Empty

import pytest
from helpers import load_book_module
from jupyter_client.channels import AsyncZMQSocketChannel


def _load():
    return load_book_module("book/_ext/kernel_reply_poll.py")


class _SilentSocket:
    """Stands in for the unpatched ``get_msg`` on a socket whose reply arrived at ``ready_at``
    but whose wake-up was lost: a poll that began before the reply sleeps its whole timeout and
    only then sees it; a poll that begins after it sees it at once."""

    def __init__(self, ready_at: float) -> None:
        self.ready_at = ready_at
        self.polls: list[float | None] = []

    async def get_msg(self, channel, timeout=None):
        self.polls.append(timeout)
        now = time.monotonic()
        if now >= self.ready_at:
            return {"msg_type": "execute_reply"}
        if timeout is None:
            await asyncio.sleep(3600)
        await asyncio.sleep(timeout)  # the lost wake-up: nothing until the timeout
        if time.monotonic() >= self.ready_at:
            return {"msg_type": "execute_reply"}
        raise Empty


@pytest.fixture
def sliced(monkeypatch):
    """Patch a fresh copy of the channel's ``get_msg`` over the silent socket."""
    module = _load()
    monkeypatch.setattr(module, "SLICE", 0.05)
    socket = _SilentSocket(ready_at=time.monotonic() + 0.1)
    monkeypatch.setattr(AsyncZMQSocketChannel, "get_msg", socket.get_msg)
    assert module.patch() is True
    assert module.patch() is False, "patching twice must not nest the slices"
    return socket


def test_a_reply_with_a_lost_wakeup_costs_one_slice_not_the_timeout(sliced):
    start = time.monotonic()
    reply = asyncio.run(AsyncZMQSocketChannel.get_msg(None, timeout=5.0))
    waited = time.monotonic() - start
    assert reply == {"msg_type": "execute_reply"}
    assert waited < 1.0, (
        f"expected the reply within ~0.15 s (slices of 0.05 s), waited {waited:.2f} s"
    )
    assert all(t is not None and t <= 0.05 + 1e-9 for t in sliced.polls), sliced.polls


def test_without_the_patch_the_same_reply_waits_for_the_whole_timeout(monkeypatch):
    socket = _SilentSocket(ready_at=time.monotonic() + 0.1)
    monkeypatch.setattr(AsyncZMQSocketChannel, "get_msg", socket.get_msg)
    start = time.monotonic()
    asyncio.run(AsyncZMQSocketChannel.get_msg(None, timeout=0.8))
    waited = time.monotonic() - start
    assert waited >= 0.75, f"the stand-in should reproduce the stall (waited {waited:.2f} s)"


def test_the_caller_still_gets_empty_at_its_own_timeout(monkeypatch):
    module = _load()
    monkeypatch.setattr(module, "SLICE", 0.05)
    socket = _SilentSocket(ready_at=time.monotonic() + 60)  # no reply comes
    monkeypatch.setattr(AsyncZMQSocketChannel, "get_msg", socket.get_msg)
    module.patch()
    start = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(AsyncZMQSocketChannel.get_msg(None, timeout=0.3))
    waited = time.monotonic() - start
    assert 0.29 <= waited < 1.0, (
        f"expected Empty after the caller's 0.3 s, got it after {waited:.2f} s"
    )


def test_a_real_kernel_answers_through_the_patched_channel(monkeypatch):
    """End to end: a kernel started by jupyter_client replies to kernel_info through the
    sliced ``get_msg``."""
    from jupyter_client.manager import start_new_async_kernel

    original = AsyncZMQSocketChannel.get_msg
    monkeypatch.setattr(AsyncZMQSocketChannel, "get_msg", original)  # restored afterwards
    module = _load()
    assert module.patch() is not getattr(original, "_sliced", False)
    assert AsyncZMQSocketChannel.get_msg._sliced

    async def ask() -> dict:
        manager, client = await start_new_async_kernel(kernel_name="python3", startup_timeout=60)
        try:
            msg_id = client.kernel_info()
            while True:
                reply = await client.shell_channel.get_msg(timeout=30)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return reply
        finally:
            client.stop_channels()
            await manager.shutdown_kernel(now=True)

    reply = asyncio.run(ask())
    assert reply["msg_type"] == "kernel_info_reply"
    assert reply["content"]["language_info"]["name"] == "python"


def test_an_older_jupyter_client_is_left_alone(monkeypatch):
    import jupyter_client.channels

    monkeypatch.delattr(jupyter_client.channels, "AsyncZMQSocketChannel")
    assert _load().patch() is False
