"""Hosts of a test's own, made of Linux network namespaces joined by veth pairs on one bridge.

Each host is a network namespace with one interface (``eth0``, an address of a
private /24 picked for this network) cabled to a bridge in a "switch"
namespace. The machine the test runs on is cabled to the same switch, as the
"outside" from which users reach the platform. Processes are started on a host
with :meth:`Host.command`: in its namespace, under its own host name (a UTS
namespace), and optionally in a mount namespace of their own, where some
directories are hidden behind an empty tmpfs (storage that host does not share).

Every host resolves every host's name to its address (``/etc/netns/<namespace>/hosts``, which
``ip netns exec`` mounts over ``/etc/hosts``), as a network's DNS would: programs that look up
their own host name (Gloo, for JAX's collectives between processes) find their address.

Pulling a host's cable (:meth:`Network.unplug`) sets the switch's end of its
pair down: the host keeps its address and routes, and its packets are dropped,
as on a real partition. Everything is removed on exit, cable ends included
(deleting a namespace deletes its interfaces). Needs root and ``ip``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# Files here are mounted over /etc's by ``ip netns exec <namespace>``.
NETNS_CONFIG_ROOT = Path("/etc/netns")


class NetworkSetupError(RuntimeError):
    pass


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NetworkSetupError(f"ip {' '.join(args)}: {result.stderr.strip()}")


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str
    # The switch's end of this host's cable (in the switch namespace).
    switch_port: str
    hidden: tuple[Path, ...] = field(default=())

    def command(self, argv: Sequence[str], *, hidden: Sequence[Path] = ()) -> list[str]:
        """``argv`` run on this host: its network, its host name, and ``hidden`` behind an empty tmpfs."""
        setup = [f"hostname {shlex.quote(self.name)}"]
        setup += [f"mkdir -p {shlex.quote(str(path))} && mount -t tmpfs tandem-host-private {shlex.quote(str(path))}"
                  for path in (*self.hidden, *hidden)]
        script = " && ".join(setup) + ' && exec "$@"'
        # ip netns exec already makes a mount namespace; --propagation private keeps our mounts in it.
        return ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", script, "sh", *argv]

    def url(self, port: int, scheme: str = "http") -> str:
        return f"{scheme}://{self.address}:{port}"


@dataclass
class Network:
    prefix: str
    subnet: ipaddress.IPv4Network
    switch: str
    outside_address: str
    hosts: dict[str, Host] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def unplug(self, host: Host) -> None:
        """Pull ``host``'s cable: its packets are dropped until :meth:`plug`."""
        _ip("-n", self.switch, "link", "set", host.switch_port, "down")

    def plug(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.switch_port, "up")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 10.0.0.0/8 that no interface of this machine uses (two tests may run at once)."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    # Namespaces' addresses are not listed from here; the random pick avoids their likely clash.
    for _ in range(100):
        candidate = ipaddress.ip_network(f"10.{200 + int.from_bytes(os.urandom(1)) % 50}."
                                         f"{int.from_bytes(os.urandom(1))}.0/24")
        if str(candidate.network_address)[:-1] not in used:
            return candidate
    raise NetworkSetupError("no free /24 in 10.200.0.0/13")


@contextlib.contextmanager
def network(host_names: Sequence[str]) -> Iterator[Network]:
    """Hosts ``host_names`` (up to 200) on one switch, with this machine cabled to it as well.

    Fails the test, naming why, where namespaces cannot be made (not root, no ``ip``).
    """
    if os.geteuid() != 0:
        pytest.fail("multi-host tests build network namespaces and need root")
    tag = uuid.uuid4().hex[:6]
    prefix = f"tdm{tag}"
    subnet = _free_subnet()
    addresses = list(subnet.hosts())
    switch = f"{prefix}-switch"
    outside_here, outside_there = f"{prefix}o", f"{prefix}p"
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        _ip("-n", switch, "link", "set", "lo", "up")
        # The outside: this machine's end stays here; the other goes to the switch.
        _ip("link", "add", outside_here, "type", "veth", "peer", "name", outside_there)
        _ip("link", "set", outside_there, "netns", switch)
        _ip("-n", switch, "link", "set", outside_there, "master", "br0", "up")
        outside_address = str(addresses[-1])
        _ip("addr", "add", f"{outside_address}/{subnet.prefixlen}", "dev", outside_here)
        _ip("link", "set", outside_here, "up")
        result = Network(prefix=prefix, subnet=subnet, switch=switch, outside_address=outside_address)
        for index, name in enumerate(host_names):
            namespace = f"{prefix}-{name}"
            _ip("netns", "add", namespace)
            made.append(namespace)
            port = f"h{index}"
            _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            address = str(addresses[index])
            _ip("-n", namespace, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            result.hosts[name] = Host(name=name, namespace=namespace, address=address, switch_port=port)
        names = "".join(f"{host.address} {host.name}\n" for host in result.hosts.values())
        for host in result.hosts.values():
            config_dir = NETNS_CONFIG_ROOT / host.namespace
            config_dir.mkdir(parents=True, exist_ok=True)
            (config_dir / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        yield result
    except NetworkSetupError as exc:
        pytest.fail(f"could not build the test's network: {exc}")
    finally:
        for namespace in reversed(made):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
            shutil.rmtree(NETNS_CONFIG_ROOT / namespace, ignore_errors=True)
        # Gone with the switch's namespace, unless that was never made.
        subprocess.run(["ip", "link", "del", outside_here], capture_output=True, timeout=30)
