"""A fault-injecting TCP proxy between real processes and a real server.

A connection reset or refused mid-statement is not the fault a server's own
clean close is (``pg_terminate_backend``, a killed ``redis-server``): the
client sees no goodbye, only an aborted socket or a refused connect, as after
a failover, a pooler restart or a NAT table flush. This proxy reproduces
those on loopback: it accepts on a free port, dials the upstream server for
each client, and pumps bytes both ways until told to break something.

It runs its own asyncio event loop in a daemon thread; every control is a
plain method the test thread calls, and returns once the loop has done it:

- :meth:`reset_all` / :meth:`reset_one`: abort connections, both sides, with
  an RST (``SO_LINGER`` 0 then ``transport.abort()``), never a clean FIN;
- :meth:`stall`: hold traffic both ways for a while, then let it through;
- :meth:`refuse`: for a while, accept new connections and reset them at once
  (optionally resetting the open ones too);
- :meth:`cut_when`: reset the connection that carries a given statement,
  before or after it reaches the server, to cut at a chosen moment;
- :meth:`chaos`: all of these at random for a bounded time, each recorded in
  :attr:`faults` with its monotonic start and end.

The proxy closes itself after ``lifetime`` seconds whatever happens, so a
test that forgets it leaves nothing running; use it as a context manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# Chaos: what a fault may last, and the calm between two faults (seconds).
STALL_SECONDS = (0.5, 3.0)
REFUSE_SECONDS = (1.0, 4.0)
GAP_SECONDS = (2.0, 5.0)


@dataclass
class _Cut:
    """An armed :meth:`FaultProxy.cut_when`: every pattern in one chunk."""

    patterns: tuple[bytes, ...]
    before: bool
    left: int
    refuse_for: float
    fired: asyncio.Event


@dataclass(frozen=True)
class Fault:
    """One fault the proxy injected: ``started``/``ended`` are
    ``time.monotonic()`` instants (equal for a reset, which is instant)."""

    kind: str
    started: float
    ended: float
    detail: str = ""


def _abort(transport: asyncio.BaseTransport | None) -> None:
    """Close ``transport`` with an RST: with ``SO_LINGER`` at 0 the kernel
    drops the socket at once instead of sending FIN, so the peer sees
    "connection reset", as when a middlebox or a dead host forgets it."""
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # type: ignore[attr-defined]


class _Side(asyncio.Protocol):
    """One socket of a proxied pair; what it receives goes to the other side."""

    def __init__(self, pair: _Pair, name: str) -> None:
        self.pair = pair
        self.name = name
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.pair.proxy._stalled:
            transport.pause_reading()  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.pair.forward(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.pair.close()


class _Refused(asyncio.Protocol):
    """A connection accepted during a refusal: reset as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _abort(transport)


class _Pair:
    """A client connection and its upstream connection."""

    def __init__(self, proxy: FaultProxy, number: int) -> None:
        self.proxy = proxy
        self.number = number
        self.client = _Side(self, "client")
        self.upstream = _Side(self, "upstream")
        # What the client said before the upstream connection was up.
        self.early: list[bytes] = []
        self.closed = False

    def forward(self, source: _Side, data: bytes) -> None:
        if source is self.client and self.proxy._cut_hook(self, data, before=True):
            return
        target = self.upstream if source is self.client else self.client
        if target.transport is None:
            self.early.append(data)
            return
        if not target.transport.is_closing():
            target.transport.write(data)
        if source is self.client:
            self.proxy._cut_hook(self, data, before=False)

    def upstream_ready(self) -> None:
        assert self.upstream.transport is not None
        for data in self.early:
            self.upstream.transport.write(data)
        self.early.clear()

    def reset(self) -> None:
        """Both sides get an RST."""
        self.closed = True
        _abort(self.client.transport)
        _abort(self.upstream.transport)
        self.proxy._pairs.discard(self)

    def close(self) -> None:
        """One side went away: end the other side as it ended (a clean close
        stays clean, so only the proxy's own faults are RSTs)."""
        if self.closed:
            return
        self.closed = True
        for side in (self.client, self.upstream):
            if side.transport is not None and not side.transport.is_closing():
                side.transport.close()
        self.proxy._pairs.discard(self)


class FaultProxy:
    """A TCP proxy from ``127.0.0.1:<port>`` to ``upstream_host:upstream_port``
    (loopback only) that injects resets, stalls and refusals on demand."""

    def __init__(self, upstream_host: str, upstream_port: int, *, lifetime: float = 900) -> None:
        address = "127.0.0.1" if upstream_host == "localhost" else upstream_host
        if not ipaddress.ip_address(address).is_loopback:
            raise ValueError(f"the fault proxy only forwards to loopback, not {upstream_host!r}")
        self.upstream = (address, upstream_port)
        self.lifetime = lifetime
        self.port = 0
        self.faults: list[Fault] = []
        self.connections_accepted = 0
        self.connections_refused = 0
        self._pairs: set[_Pair] = set()
        self._stalled = False
        self._stall_until = 0.0
        self._refuse_until = 0.0
        self._cuts: list[_Cut] = []
        self._dials: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._chaos: asyncio.Task[None] | None = None
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._ready = threading.Event()
        self._closed = False

    # -- life ---------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10) or self._server is None:
            raise RuntimeError("the fault proxy did not start listening within 10 s")
        return self

    def close(self) -> None:
        """Reset every connection, stop listening and end the loop's thread."""
        if self._closed:
            return
        self._closed = True
        if self._loop.is_running():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._shutdown)
        self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._server = await self._loop.create_server(
            self._accept, "127.0.0.1", 0, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._done = asyncio.Event()
        self._ready.set()
        # The lifetime bounds a proxy a test forgot to close.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._done.wait(), self.lifetime)
        if self._chaos is not None:
            self._chaos.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._chaos
        self._server.close()
        for pair in list(self._pairs):
            pair.reset()
        await self._server.wait_closed()

    def _shutdown(self) -> None:
        self._done.set()

    # -- the pump -----------------------------------------------------------

    def _accept(self) -> asyncio.Protocol:
        self.connections_accepted += 1
        if time.monotonic() < self._refuse_until:
            self.connections_refused += 1
            return _Refused()
        pair = _Pair(self, self.connections_accepted)
        self._pairs.add(pair)
        # The loop keeps only a weak reference to a task: hold it until done.
        dial = self._loop.create_task(self._dial(pair))
        self._dials.add(dial)
        dial.add_done_callback(self._dials.discard)
        return pair.client

    async def _dial(self, pair: _Pair) -> None:
        try:
            await self._loop.create_connection(lambda: pair.upstream, *self.upstream)
        except OSError:
            pair.reset()  # the server itself is down: the client sees a reset too
            return
        if pair.closed:
            _abort(pair.upstream.transport)
            return
        pair.upstream_ready()

    def _cut_hook(self, pair: _Pair, data: bytes, *, before: bool) -> bool:
        """Reset ``pair`` if ``data`` carries a statement a test asked to cut
        at this moment; True if it was cut before being forwarded."""
        for cut in self._cuts:
            if cut.before != before or cut.left <= 0:
                continue
            if not all(pattern in data for pattern in cut.patterns):
                continue
            cut.left -= 1
            if cut.left == 0:
                self._cuts.remove(cut)
            cut.fired.set()
            now = time.monotonic()
            said = b" ".join(cut.patterns).decode(errors="replace")
            pair.reset()
            if cut.refuse_for > 0:
                said += f", {len(self._pairs)} other connection(s) reset"
                self._refuse(cut.refuse_for, reset_existing=True, record=False)
                said += f", then {cut.refuse_for:.2f} s refused"
            self.faults.append(Fault("cut", now, now + cut.refuse_for, said))
            return True
        return False

    # -- controls, from any thread ------------------------------------------

    def _call(self, work: Callable[[], Awaitable[T]], timeout: float = 10) -> T:
        if self._closed:
            raise RuntimeError("the fault proxy is closed")
        return asyncio.run_coroutine_threadsafe(work(), self._loop).result(timeout)  # type: ignore[arg-type]

    def reset_all(self) -> int:
        """Abort every open connection, both sides (RST); returns how many."""

        async def work() -> int:
            return self._reset_all()

        return self._call(work)

    def reset_one(self, seed: int | None = None) -> bool:
        """Abort one open connection (chosen at random), both sides."""

        async def work() -> bool:
            return self._reset_one(random.Random(seed))

        return self._call(work)

    def stall(self, seconds: float) -> float:
        """Hold traffic both ways for ``seconds`` (bytes wait in the kernel's
        buffers, connections stay open), then let it through. Returns at once
        with the monotonic instant the stall ends."""

        async def work() -> float:
            return self._stall(seconds)

        return self._call(work)

    def refuse(self, seconds: float, *, reset_existing: bool = False) -> float:
        """For ``seconds``, accept each new connection and reset it at once;
        with ``reset_existing`` the open ones are reset too (a failover),
        else they keep working (a full accept queue, a pooler at its limit).
        Returns at once with the monotonic instant refusals end."""

        async def work() -> float:
            return self._refuse(seconds, reset_existing)

        return self._call(work)

    def cut_when(
        self,
        *patterns: bytes,
        before: bool = False,
        times: int = 1,
        refuse_for: float = 0.0,
    ) -> None:
        """Reset the next ``times`` connection(s) whose client sends a chunk
        holding every one of ``patterns`` (a statement's words): ``before``
        the bytes reach the server (the statement never ran), or right after
        (it may have run; its answer is lost). With ``refuse_for``, every
        other connection is reset too and new ones are refused that long: a
        failover while that statement is in flight."""

        async def work() -> None:
            self._cuts.append(_Cut(patterns, before, times, refuse_for, asyncio.Event()))

        self._call(work)

    def chaos(self, duration: float, seed: int, aim: tuple[bytes, ...] = ()) -> None:
        """Start injecting faults at random for ``duration`` seconds (returns
        at once): resets of one or all connections, stalls of 0.5-3 s,
        refusals of 1-4 s (half of them resetting the open connections too),
        2-5 s apart. With ``aim`` (a statement's words, as for
        :meth:`cut_when`) some refusals wait (up to 3 s) for that statement
        to be in flight and start there: a fault at a random instant rarely
        lands inside a statement that takes a millisecond. No fault outlasts
        ``duration``; :meth:`wait_chaos` waits for the end and :attr:`faults`
        says what was done, and when."""

        async def work() -> None:
            if self._chaos is not None and not self._chaos.done():
                raise RuntimeError("chaos is already running")
            self._chaos = self._loop.create_task(
                self._run_chaos(duration, random.Random(seed), aim)
            )

        self._call(work)

    def wait_chaos(self, timeout: float) -> None:
        """Until the chaos started by :meth:`chaos` has ended (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._chaos is not None and self._chaos.done():
                if not self._chaos.cancelled() and self._chaos.exception() is not None:
                    raise RuntimeError("the chaos loop failed") from self._chaos.exception()
                return
            time.sleep(0.1)
        raise TimeoutError(f"the chaos did not end within {timeout} s")

    def chaos_running(self) -> bool:
        return self._chaos is not None and not self._chaos.done()

    def last_fault_end(self) -> float | None:
        """The monotonic instant the last recorded fault ended."""
        return max((fault.ended for fault in self.faults), default=None)

    def open_connections(self) -> int:
        return len(self._pairs)

    # -- the faults, on the loop --------------------------------------------

    def _reset_all(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            pair.reset()
        now = time.monotonic()
        self.faults.append(Fault("reset_all", now, now, f"{len(pairs)} connection(s)"))
        return len(pairs)

    def _reset_one(self, rng: random.Random) -> bool:
        now = time.monotonic()
        if not self._pairs:
            self.faults.append(Fault("reset_one", now, now, "no connection open"))
            return False
        pair = rng.choice(sorted(self._pairs, key=lambda p: p.number))
        pair.reset()
        self.faults.append(Fault("reset_one", now, now, f"connection {pair.number}"))
        return True

    def _stall(self, seconds: float) -> float:
        now = time.monotonic()
        self._stall_until = max(self._stall_until, now + seconds)
        if not self._stalled:
            self._stalled = True
            for pair in self._pairs:
                for side in (pair.client, pair.upstream):
                    if side.transport is not None and not side.transport.is_closing():
                        side.transport.pause_reading()
        self._loop.call_at(self._loop.time() + seconds, self._maybe_release)
        self.faults.append(Fault("stall", now, self._stall_until, f"{seconds:.2f} s"))
        return self._stall_until

    def _maybe_release(self) -> None:
        if not self._stalled or time.monotonic() < self._stall_until - 0.001:
            return
        self._stalled = False
        for pair in list(self._pairs):
            for side in (pair.client, pair.upstream):
                if side.transport is not None and not side.transport.is_closing():
                    side.transport.resume_reading()

    def _refuse(self, seconds: float, reset_existing: bool, record: bool = True) -> float:
        now = time.monotonic()
        self._refuse_until = max(self._refuse_until, now + seconds)
        reset = 0
        if reset_existing:
            reset = len(self._pairs)
            for pair in list(self._pairs):
                pair.reset()
        detail = f"{seconds:.2f} s" + (
            f", {reset} open connection(s) reset" if reset_existing else ""
        )
        if record:  # an aimed cut records itself, refusal included
            self.faults.append(Fault("refuse", now, self._refuse_until, detail))
        return self._refuse_until

    async def _run_chaos(self, duration: float, rng: random.Random, aim: tuple[bytes, ...]) -> None:
        end = time.monotonic() + duration
        kinds = ("reset_one", "reset_all", "stall", "refuse", "refuse")
        while True:
            left = end - time.monotonic()
            if left <= 0.5:
                return
            kind = rng.choice(kinds + (("aimed",) * 2 if aim else ()))
            if kind == "aimed" and left > 4:
                length = rng.uniform(*REFUSE_SECONDS)
                cut = _Cut(aim, False, 1, length, asyncio.Event())
                self._cuts.append(cut)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cut.fired.wait(), min(3.0, left - length - 0.5))
                if not cut.fired.is_set():
                    self._cuts.remove(cut)  # the statement did not pass: no fault
                    continue
                await asyncio.sleep(min(length + rng.uniform(*GAP_SECONDS), end - time.monotonic()))
                continue
            if kind == "aimed":
                kind = "refuse"
            if kind == "reset_one":
                self._reset_one(rng)
                length = 0.0
            elif kind == "reset_all":
                self._reset_all()
                length = 0.0
            elif kind == "stall":
                length = min(rng.uniform(*STALL_SECONDS), left)
                self._stall(length)
            else:
                length = min(rng.uniform(*REFUSE_SECONDS), left)
                self._refuse(length, reset_existing=rng.random() < 0.5)
            gap = rng.uniform(*GAP_SECONDS)
            await asyncio.sleep(min(length + gap, max(0.0, end - time.monotonic())))
