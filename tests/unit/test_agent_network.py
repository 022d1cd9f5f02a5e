"""How a node is reached by its peers: its address, and the rendezvous port node 0 picks."""

from __future__ import annotations

import socket

from node_agent.network import default_address, free_port


def test_the_default_address_is_the_interface_that_routes_to_the_control_plane() -> None:
    assert default_address("http://127.0.0.1:8000") == "127.0.0.1"
    assert default_address("http://localhost:8000/") == "127.0.0.1"


def test_a_control_plane_whose_host_does_not_resolve_leaves_the_loopback_address() -> None:
    assert default_address("http://no-such-host.invalid:8000") == "127.0.0.1"
    assert default_address("not a url") == "127.0.0.1"


def test_a_free_port_can_be_listened_on_at_once() -> None:
    port = free_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_a_free_port_for_an_address_that_is_not_this_hosts_is_free_on_every_interface() -> None:
    assert 0 < free_port("192.0.2.1") < 65536  # TEST-NET-1: never a local address
