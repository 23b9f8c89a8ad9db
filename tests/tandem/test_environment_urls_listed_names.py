"""A host name on an allow-list is trusted as a name, not for where it resolves: where private and
loopback addresses are refused, a listed name resolving to one is refused unless a listed network
holds the address (issue 28, finding 13). Refusals never tell what a name resolved to."""

from __future__ import annotations

import ipaddress

import pytest

from tandem.allowlists.environment_urls import (
    EnvironmentURLRefused,
    check_connect_addresses,
    check_environment_url,
)

LOOPBACK = [ipaddress.ip_address("127.0.0.1")]


def _resolves_to_loopback(host: str):
    return LOOPBACK


def test_a_listed_name_resolving_to_loopback_is_refused_where_private_addresses_are():
    with pytest.raises(EnvironmentURLRefused, match="private or loopback") as refused:
        check_environment_url("http://envs.example.com:8765", allowlist=["envs.example.com"],
                              resolve=_resolves_to_loopback, refuse_private=True)
    assert "127.0.0.1" not in str(refused.value)


def test_a_listed_name_resolving_to_a_listed_network_or_where_private_addresses_are_allowed_passes():
    check_environment_url("http://envs.example.com:8765", allowlist=["envs.example.com", "127.0.0.0/8"],
                          resolve=_resolves_to_loopback, refuse_private=True)
    check_environment_url("http://envs.example.com:8765", allowlist=["envs.example.com"],
                          resolve=_resolves_to_loopback, refuse_private=False)


def test_the_connect_time_check_refuses_a_listed_name_resolving_to_loopback(monkeypatch):
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_PRIVATE", "refuse")
    with pytest.raises(EnvironmentURLRefused, match="private or loopback"):
        check_connect_addresses("envs.example.com", LOOPBACK, allowlist=["*.example.com"])
    check_connect_addresses("envs.example.com", LOOPBACK, allowlist=["*.example.com", "127.0.0.1"])


def test_a_name_off_the_list_is_refused_without_its_address():
    with pytest.raises(EnvironmentURLRefused, match="not on") as refused:
        check_environment_url("http://envs.example.com:8765", allowlist=["10.0.0.0/8"],
                              resolve=_resolves_to_loopback)
    assert "127.0.0.1" not in str(refused.value)


@pytest.mark.parametrize("url", ["http://envs.example.com:99999", "http://envs.example.com:8765/a\r\nb",
                                 "http://envs.example.com:8765/a\x00b", "http://envs.example.com:0"])
def test_a_url_with_an_impossible_port_or_control_characters_is_refused(url):
    with pytest.raises(EnvironmentURLRefused):
        check_environment_url(url)
