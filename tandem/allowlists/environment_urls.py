"""Which URLs a remote environment may live at: the allow-list, and what is refused without one.

A registered URL is fetched by workers inside the cluster, so a URL that points
at a cloud metadata service or another link-local address would hand that
service's answers (credentials, often) to whoever registered it. The platform
checks the URL as written when it is registered; the probe checks it again on
the worker, after resolving the host name there, since that is where the
connection is made.

The allow-list (``TANDEM_ENVIRONMENT_URL_ALLOWLIST``, comma separated) holds
host names (``envs.example.com``, or ``*.example.com`` for subdomains) and
networks (``10.0.0.0/8``, ``127.0.0.1``). Without one, every address is
allowed except link-local and cloud metadata ones. With one, a URL is allowed
only if its host name is listed or every address it resolves to is in a
listed network; a listed name that resolves into the refused ranges (or, where
they are refused, into private and loopback ones) is still refused unless a
listed network holds that address: a name on the list vouches for the name, not
for wherever its DNS points today. Refusals name the host as written and never
the addresses a name resolved to, so that a URL field is no probe of the
deployment's DNS.

Alert webhooks (``platform/alerts``) are URLs the platform itself posts to, chosen
by users: they go through the same checks under their own allow-list
(``TANDEM_WEBHOOK_ALLOWED_HOSTS``), which is always given, so that nothing is
reached that the operator did not list.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

REFUSED_NETWORKS = tuple(ipaddress.ip_network(network) for network in (
    "169.254.0.0/16",  # IPv4 link-local, and AWS/GCP/Azure/OpenStack metadata at 169.254.169.254
    "fe80::/10",  # IPv6 link-local
    "fd00:ec2::254/128",  # AWS metadata over IPv6
    "100.100.100.200/32",  # Alibaba Cloud metadata
    "168.63.129.16/32",  # Azure wire server
))
# Refused as well, unless listed, where the operator says so (TANDEM_ENVIRONMENT_URL_PRIVATE=refuse,
# as docker-compose.yml and the production settings do): the deployment's own network.
PRIVATE_NETWORKS = tuple(ipaddress.ip_network(network) for network in (
    "127.0.0.0/8", "::1/128",  # loopback
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",  # RFC 1918
    "100.64.0.0/10",  # carrier-grade NAT
    "fc00::/7",  # IPv6 unique local
    "0.0.0.0/8", "::/128",  # "this host"
))
PRIVATE_SETTING = "TANDEM_ENVIRONMENT_URL_PRIVATE"
REFUSED_HOST_NAMES = frozenset({"metadata.google.internal", "metadata", "instance-data"})


class EnvironmentURLRefused(ValueError):
    """The URL is malformed, or points where environments may not be."""


def _parse_allowlist(entries: Iterable[str]) -> tuple[list, list[str]]:
    networks, names = [], []
    for entry in entries:
        entry = entry.strip().lower()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            names.append(entry)
    return networks, names


def _name_listed(host: str, names: list[str]) -> bool:
    return any(host == name or (name.startswith("*.") and host.endswith(name[1:])) for name in names)


def _address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


# 64:ff9b::/96, the well-known NAT64 prefix: its last 32 bits are an IPv4 address.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# IPv4-compatible addresses (::a.b.c.d, deprecated but still routed by some stacks).
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def effective_address(address: Address) -> Address:
    """The IPv4 address an IPv6 one reaches, if it embeds one; else ``address`` itself.

    ``::ffff:169.254.169.254`` (mapped), ``::169.254.169.254`` (compatible),
    ``64:ff9b::a9fe:a9fe`` (NAT64), ``2002:a9fe:a9fe::`` (6to4) and Teredo
    addresses all lead to the IPv4 address inside them, so they are checked as it.
    """
    if address.version == 4:
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64 or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _numeric_host(host: str) -> bool:
    """Whether ``host`` is an IPv4 address in a form other than dotted quad: 2852039166,
    0xa9fea9fe, 0251.0376.0251.0376, 169.254.43518. Resolvers accept them; no host name looks so."""
    labels = host.split(".")
    return all(re.fullmatch(r"0x[0-9a-f]*|[0-9]+", label) for label in labels)


def resolve_host(host: str) -> list[Address]:
    """Every address ``host`` resolves to here."""
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return sorted({ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}, key=str)


def private_addresses_refused() -> bool:
    """Whether this process refuses private and loopback addresses not on the allow-list."""
    import os

    return os.environ.get(PRIVATE_SETTING, "allow").strip().lower() == "refuse"


ENVIRONMENT_URL_SCHEMES = frozenset({"http", "https", "ws", "wss"})
#: A streamable-HTTP MCP server's (environments/mcp_tools.py).
MCP_SERVER_URL_SCHEMES = frozenset({"http", "https"})


def check_environment_url(
    url: str,
    *,
    allowlist: Iterable[str] | None = None,
    resolve: Callable[[str], list[Address]] | None = None,
    refuse_private: bool | None = None,
    schemes: frozenset[str] = ENVIRONMENT_URL_SCHEMES,
    allowlist_setting: str | None = None,
) -> None:
    """Raise EnvironmentURLRefused unless ``url`` may be used.

    ``resolve``: look the host name up and check every address (the worker
    does); None checks the URL as written only (the platform, which may not
    see the same DNS as the workers). ``refuse_private``: refuse private and
    loopback addresses too unless listed; None: as ``TANDEM_ENVIRONMENT_URL_PRIVATE`` says.
    ``schemes``: the schemes the URL may have. ``allowlist_setting``: the operator setting
    that holds ``allowlist``, named in refusals (``TANDEM_ENVIRONMENT_URL_ALLOWLIST`` by default).
    """
    # CR and LF would split the request line a client writes from the URL; no URL needs a
    # control character or a space unencoded.
    if any(ord(character) <= 0x20 or ord(character) == 0x7F for character in url):
        raise EnvironmentURLRefused(f"{url!r} holds a space or a control character (CR, LF, tab, NUL ...)")
    parts = urlsplit(url)
    if parts.scheme not in schemes:
        written = ", ".join(f"{scheme}://" for scheme in sorted(schemes))
        raise EnvironmentURLRefused(f"{url!r} must start with one of {written}")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise EnvironmentURLRefused(f"{url!r} has no host")
    # Adapters append their own paths (/reset, /schema): a query or fragment would swallow them
    # and turn the URL into any GET on that host; credentials in a URL end up in logs.
    if parts.query or parts.fragment or url.rstrip("/").endswith(("?", "#")):
        raise EnvironmentURLRefused(f"{url!r} must not have a query or a fragment")
    if parts.username is not None or parts.password is not None:
        raise EnvironmentURLRefused(f"{url!r} must not carry credentials")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise EnvironmentURLRefused(f"{url!r} has no valid port: a port is a number from 1 to 65535")
    literal = _address(host)
    if literal is None and _numeric_host(host):
        raise EnvironmentURLRefused(
            f"{host} is a numeric host: write an IPv4 address as four decimal numbers (a.b.c.d)"
        )
    networks, names = _parse_allowlist(allowlist) if allowlist is not None else ([], [])
    if host in REFUSED_HOST_NAMES and not _name_listed(host, names):
        raise EnvironmentURLRefused(f"{host} is a cloud metadata service")

    if literal is not None:
        addresses = [literal]
    elif resolve is not None:
        try:
            addresses = resolve(host)
        except OSError as exc:
            raise EnvironmentURLRefused(f"cannot resolve {host}: {exc}") from exc
    else:
        addresses = []

    name_allowed = allowlist is None or _name_listed(host, names)
    if allowlist is not None and not name_allowed and literal is None and resolve is None:
        # A name not on the list may still resolve into a listed network: the worker decides.
        return
    check_addresses(host, addresses, networks=networks, name_allowed=name_allowed,
                    listed=allowlist is not None,
                    refuse_private=private_addresses_refused() if refuse_private is None else refuse_private,
                    allowlist_setting=allowlist_setting)


def check_addresses(host: str, addresses: Iterable[Address], *, networks: list, name_allowed: bool,
                    listed: bool, refuse_private: bool = False, allowlist_setting: str | None = None) -> None:
    """Raise EnvironmentURLRefused if any address ``host`` reaches is one environments may not use."""
    setting = allowlist_setting or URL_ALLOWLIST_VARIABLE
    # A literal address is named as written; a name's addresses never are (see the module's docstring).
    literal = _address(host) is not None
    refused = f"{host} is" if literal else f"{host} resolves to"
    list_it = f"list it in {setting} to allow it" if literal else f"list its network in {setting} to allow it"
    for address in addresses:
        # ::ffff:169.254.169.254 reaches the same service as 169.254.169.254, and so on.
        address = effective_address(address)
        if any(address in network for network in networks):
            continue
        if listed and not name_allowed:
            listed_in = "the environment URL allow-list" if allowlist_setting is None else setting
            raise EnvironmentURLRefused(f"{refused} an address not on {listed_in}")
        if any(address in network for network in REFUSED_NETWORKS):
            raise EnvironmentURLRefused(f"{refused} a link-local or cloud-metadata address; {list_it}")
        # Listed names too: the operator listed the name, not the private networks it may point into.
        if refuse_private and any(address in network for network in PRIVATE_NETWORKS):
            raise EnvironmentURLRefused(
                f"{refused} a private or loopback address, refused on this deployment; {list_it}")


#: The variable workers read the allow-list from, as the platform's settings do.
URL_ALLOWLIST_VARIABLE = "TANDEM_ENVIRONMENT_URL_ALLOWLIST"


def configured_allowlist() -> list[str] | None:
    """This process's allow-list (``TANDEM_ENVIRONMENT_URL_ALLOWLIST``, comma separated); None if unset."""
    import os

    entries = [entry.strip() for entry in os.environ.get(URL_ALLOWLIST_VARIABLE, "").split(",")]
    return [entry for entry in entries if entry] or None


def check_connect_addresses(host: str, addresses: Iterable[Address], *,
                            allowlist: Iterable[str] | None, allowlist_setting: str | None = None,
                            refuse_private: bool | None = None) -> None:
    """:func:`check_environment_url`'s address rules for the addresses a connection to ``host`` is about to use.

    Called by the HTTP adapter's resolver at connect time, so a name that
    resolved somewhere harmless when it was checked and elsewhere now (DNS
    rebinding) is refused where the connection is made. ``refuse_private``: as for
    :func:`check_environment_url`.
    """
    networks, names = _parse_allowlist(allowlist) if allowlist is not None else ([], [])
    host = host.lower().rstrip(".")
    check_addresses(host, addresses, networks=networks,
                    name_allowed=allowlist is None or _name_listed(host, names),
                    listed=allowlist is not None,
                    refuse_private=private_addresses_refused() if refuse_private is None else refuse_private,
                    allowlist_setting=allowlist_setting)
