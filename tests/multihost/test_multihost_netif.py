"""Interface selection for Gloo: the interface the kernel routes the master address through."""

from __future__ import annotations

import pytest

from distdoctor import netif


def test_loopback_master_uses_loopback():
    for target in ("127.0.0.1", "localhost"):
        choice = netif.iface_for(target)
        assert choice is not None and choice.name == "lo" and choice.address.startswith("127.")
        assert "route to" in choice.describe()


def test_unresolvable_master_names_the_host():
    with pytest.raises(ValueError, match="no-such-host.invalid"):
        netif.iface_for("no-such-host.invalid")


def test_given_interface_is_checked():
    assert netif.check_iface("lo").address == "127.0.0.1"
    with pytest.raises(ValueError, match=r"no interface 'nope0'.*have: .*lo"):
        netif.check_iface("nope0")


def test_every_listed_interface_is_a_real_one():
    import socket

    names = {n for _, n in socket.if_nameindex()}
    assert set(netif.interface_addresses()) >= {"lo"}
    assert set(netif.interface_addresses()) <= names
    assert "127.0.0.1" in netif.interface_addresses()["lo"]
