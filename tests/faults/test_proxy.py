"""The fault proxy itself (tests/faults/proxy.py), against an echo server of
the test's own: what each fault looks like from the client's side."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tests.faults.proxy import FaultProxy


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with FaultProxy("127.0.0.1", server.server_address[1], lifetime=60) as proxy:
        yield proxy
    server.shutdown()
    server.server_close()


def connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    return sock


def echo(sock: socket.socket, data: bytes = b"ping") -> bytes:
    sock.sendall(data)
    return sock.recv(4096)


def wait_open(proxy: FaultProxy, count: int) -> None:
    deadline = time.monotonic() + 5
    while proxy.open_connections() < count:
        assert time.monotonic() < deadline, "the proxy never saw the connection"
        time.sleep(0.01)


def test_it_forwards_both_ways(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert echo(sock) == b"ping"


def test_reset_all_is_an_rst_not_a_clean_close(proxy: FaultProxy) -> None:
    with connect(proxy) as first, connect(proxy) as second:
        assert echo(first) == echo(second) == b"ping"
        assert proxy.reset_all() == 2
        for sock in (first, second):
            # A clean close would read b"" (FIN); a reset raises.
            with pytest.raises(ConnectionResetError):
                echo(sock)
    with connect(proxy) as sock:
        assert echo(sock) == b"ping"


def test_reset_one_leaves_the_others(proxy: FaultProxy) -> None:
    with connect(proxy) as first, connect(proxy) as second:
        wait_open(proxy, 2)
        assert proxy.reset_one(seed=1)
        outcomes = []
        for sock in (first, second):
            try:
                outcomes.append(echo(sock))
            except ConnectionResetError:
                outcomes.append(None)
        assert sorted(outcomes, key=repr) == [None, b"ping"]


def test_refuse_resets_new_connections_and_keeps_open_ones(proxy: FaultProxy) -> None:
    with connect(proxy) as kept:
        wait_open(proxy, 1)
        proxy.refuse(0.6)
        # Accepted then reset: the reset may reach the client's connect() already.
        with pytest.raises(ConnectionResetError), connect(proxy) as refused:
            echo(refused)
        assert echo(kept) == b"ping"
        time.sleep(0.7)  # the refusal's length is the point
        with connect(proxy) as sock:
            assert echo(sock) == b"ping"
    assert proxy.connections_refused == 1


def test_refuse_can_reset_the_open_ones_too(proxy: FaultProxy) -> None:
    with connect(proxy) as kept:
        wait_open(proxy, 1)
        proxy.refuse(0.5, reset_existing=True)
        with pytest.raises(ConnectionResetError):
            echo(kept)


def test_stall_holds_traffic_then_lets_it_through(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        wait_open(proxy, 1)
        proxy.stall(0.5)
        started = time.monotonic()
        assert echo(sock) == b"ping"
        assert time.monotonic() - started >= 0.4


def test_cut_when_resets_the_connection_carrying_the_statement(proxy: FaultProxy) -> None:
    proxy.cut_when(b"UPDATE", b"runs", before=True)
    with connect(proxy) as other, connect(proxy) as victim:
        assert echo(victim, b"SELECT 1") == b"SELECT 1"
        victim.sendall(b"UPDATE runs SET x")
        with pytest.raises(ConnectionResetError):
            victim.recv(4096)
        assert echo(other, b"UPDATE runs again") == b"UPDATE runs again"  # once only
    assert [fault.kind for fault in proxy.faults] == ["cut"]


def test_chaos_is_bounded_and_says_what_it_did(proxy: FaultProxy) -> None:
    with connect(proxy):
        started = time.monotonic()
        proxy.chaos(4, seed=3)
        proxy.wait_chaos(10)
    assert proxy.faults
    assert all(started <= f.started <= f.ended <= started + 4.1 for f in proxy.faults)
    assert proxy.last_fault_end() == max(f.ended for f in proxy.faults)


def test_it_forwards_to_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("10.0.0.1", 5432)
