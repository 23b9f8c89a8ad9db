"""Where remote environments may live (tandem/allowlists/environment_urls.py), as registration and the probe check it."""

import ipaddress

import pytest

from tandem.allowlists.environment_urls import EnvironmentURLRefused, check_environment_url


def _resolving_to(*addresses):
    return lambda host: [ipaddress.ip_address(address) for address in addresses]


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8765", "https://envs.example.com/api", "http://10.1.2.3", "ws://[::1]:8000"],
)
def test_without_an_allow_list_ordinary_addresses_pass(url):
    check_environment_url(url)


@pytest.mark.parametrize(
    "url",
    ["http://169.254.169.254/", "http://169.254.10.1:80", "http://[fe80::1%25eth0]/",
     "http://[fd00:ec2::254]/", "http://[::ffff:a9fe:a9fe]/", "http://metadata.google.internal/",
     "http://METADATA.google.internal./"],
)
def test_without_an_allow_list_link_local_and_metadata_are_refused(url):
    with pytest.raises(EnvironmentURLRefused):
        check_environment_url(url)


def test_a_name_that_resolves_to_metadata_is_refused_once_resolved():
    check_environment_url("http://rebind.example.com/")  # as written, at registration

    with pytest.raises(EnvironmentURLRefused, match="link-local or cloud-metadata"):
        check_environment_url("http://rebind.example.com/", resolve=_resolving_to("169.254.169.254"))


def test_every_resolved_address_must_pass():
    with pytest.raises(EnvironmentURLRefused):
        check_environment_url("http://mixed.example.com/",
                              resolve=_resolving_to("93.184.216.34", "169.254.169.254"))


def test_an_allow_list_admits_listed_names_suffixes_and_networks_only():
    allowlist = ["10.0.0.0/8", "envs.example.com", "*.corp.example"]

    check_environment_url("http://10.9.8.7:80", allowlist=allowlist)
    check_environment_url("https://envs.example.com", allowlist=allowlist,
                          resolve=_resolving_to("93.184.216.34"))
    check_environment_url("http://a.b.corp.example", allowlist=allowlist,
                          resolve=_resolving_to("93.184.216.35"))
    check_environment_url("http://internal.example.org", allowlist=allowlist,
                          resolve=_resolving_to("10.0.0.5"))
    for url in ("http://192.168.1.1", "http://corp.example.org"):
        with pytest.raises(EnvironmentURLRefused, match="allow-list"):
            check_environment_url(url, allowlist=allowlist, resolve=_resolving_to("192.168.1.1"))


def test_a_listed_name_still_may_not_resolve_to_metadata_unless_that_network_is_listed():
    with pytest.raises(EnvironmentURLRefused, match="cloud-metadata"):
        check_environment_url("http://envs.example.com", allowlist=["envs.example.com"],
                              resolve=_resolving_to("169.254.169.254"))

    check_environment_url("http://169.254.7.7", allowlist=["169.254.7.0/24"])


@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://x", "http://", "not a url"])
def test_only_http_and_websocket_urls_with_a_host(url):
    with pytest.raises(EnvironmentURLRefused):
        check_environment_url(url)


def test_a_name_that_does_not_resolve_is_refused_on_the_worker():
    def fail(host):
        raise OSError("Name or service not known")

    with pytest.raises(EnvironmentURLRefused, match="cannot resolve nowhere.invalid"):
        check_environment_url("http://nowhere.invalid", resolve=fail)
