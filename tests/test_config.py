"""Settings: defaults without any file, then TOML, environment and overrides in that order, every bad value named
with its key, and settings serialised for a worker coming back whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlergate.config import Settings, load_settings, parse_size
from crawlergate.errors import ConfigError


def test_config_defaults_work_without_any_file() -> None:
    settings = load_settings(None, environ={})
    assert settings == Settings()
    assert settings.l1.memcached == ()
    assert settings.cache_dir.parent.parent.name == "crawlergate" and settings.cache_dir.parent.name == "sites"


def test_config_toml_then_environment_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "crawlergate.toml"
    path.write_text('[server]\nport = 9000\nhost = "0.0.0.0"\n[l2]\nmax_bytes = "2GB"\n[admin]\ntoken = "file"\n')
    environ = {"CRAWLERGATE_SERVER_PORT": "9100", "CRAWLERGATE_ADMIN_TOKEN": "env", "HOME": "/x"}
    settings = load_settings(path, environ, {"server.port": 9200})
    assert settings.server.port == 9200
    assert settings.server.host == "0.0.0.0"
    assert settings.admin.token == "env"
    assert settings.l2.max_bytes == 2_000_000_000


def test_config_environment_lists_are_comma_separated() -> None:
    environ = {"CRAWLERGATE_L1_MEMCACHED": "127.0.0.1:11211, 127.0.0.1:11212"}
    assert load_settings(None, environ).l1.memcached == ("127.0.0.1:11211", "127.0.0.1:11212")


def test_config_blank_environment_numbers_and_choices_are_unset() -> None:
    """A compose file's "CRAWLERGATE_SERVER_WORKERS=" leaves the default; a blank text or list stays blank."""
    environ = {"CRAWLERGATE_SERVER_WORKERS": "", "CRAWLERGATE_CACHE_STORAGE_MODE": " ", "CRAWLERGATE_ADMIN_TOKEN": ""}
    settings = load_settings(None, environ)
    assert (settings.server.workers, settings.cache.storage_mode, settings.admin.token) == (1, "guest", "")


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        pytest.param({"CRAWLERGATE_L2_MAX_BYTES": "-1"}, "Setting 'l2.max_bytes' has value '-1'", id="negative-size"),
        pytest.param({"CRAWLERGATE_L2_MAX_BYTES": "100"}, "a number without a unit is bytes", id="unitless"),
        pytest.param({"CRAWLERGATE_SERVER_WORKERS": "100000"}, "4 per CPU here", id="workers"),
        pytest.param({"CRAWLERGATE_CACHE_TTL_SECONDS": "1e999"}, "not infinite", id="infinite-lifetime"),
        pytest.param({"CRAWLERGATE_SERVER_PORT": "http"}, "Setting 'server.port' has value 'http'", id="not-int"),
        pytest.param({"CRAWLERGATE_SERVER_PORT": "70000"}, "Must be a port number", id="port-range"),
        pytest.param({"CRAWLERGATE_SERVER_ORIGIN": "ftp://x"}, "Setting 'server.origin'", id="origin-scheme"),
        pytest.param({"CRAWLERGATE_SERVER_ORIGIN": "http://127.0.0.1:99999"}, "port must be", id="origin-port"),
        pytest.param({"CRAWLERGATE_SERVER_ORIGIN": "http://exa mple.com"}, "URL .no spaces.", id="origin-space"),
        pytest.param({"CRAWLERGATE_L1_MEMCACHED": "localhost"}, "HOST:PORT", id="memcached-format"),
        pytest.param({"CRAWLERGATE_ADMIN_PREFIX": "admin/"}, "Setting 'admin.prefix'", id="prefix"),
        pytest.param({"CRAWLERGATE_NOPE": "1"}, "names no setting", id="unknown-section"),
        pytest.param({"CRAWLERGATE_SERVER_NOPE": "1"}, "Unknown setting 'server.nope'", id="unknown-key"),
        pytest.param({"CRAWLERGATE_L1_TIMEOUT_MS": "0"}, "Setting 'l1.timeout_ms' has value '0", id="zero-timeout"),
    ],
)
def test_config_bad_value_names_key_and_value(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_settings(None, environ)


def test_config_bad_toml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server\nport = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(path, {})


def test_config_file_in_another_encoding_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[server]\norigin = "http://café.example"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="not text in UTF-8"):
        load_settings(path, {})


def test_config_wrong_type_in_toml(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[server]\nport = true\n")
    with pytest.raises(ConfigError, match="Setting 'server.port' has value 'True'. Must be an integer"):
        load_settings(path, {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4096", 4096), ("120MB", 120_000_000), ("1.5GiB", 1_610_612_736), ("64k", 64_000), ("2 mib", 2_097_152)],
)
def test_config_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_config_parse_size_rejects_words() -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


@pytest.mark.parametrize(
    ("environ", "public_url"),
    [
        pytest.param({"CRAWLERGATE_SERVER_PUBLIC_URL": "https://forum.example/"}, "https://forum.example", id="slash"),
        pytest.param({"CRAWLERGATE_SERVER_CANONICAL_HOST": "forum.example"}, "http://forum.example", id="alias"),
        pytest.param(
            {
                "CRAWLERGATE_SERVER_CANONICAL_HOST": "old.example",
                "CRAWLERGATE_SERVER_PUBLIC_URL": "https://new.example",
            },
            "https://new.example",
            id="public-url-wins",
        ),
        pytest.param({}, "", id="unset"),
    ],
)
def test_config_public_url_and_its_alias(environ: dict[str, str], public_url: str) -> None:
    assert load_settings(None, environ).server.public_url == public_url


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        pytest.param({"CRAWLERGATE_SERVER_PUBLIC_URL": "forum.example"}, "scheme and host only", id="no-scheme"),
        pytest.param({"CRAWLERGATE_SERVER_PUBLIC_URL": "https://f.example/app"}, "scheme and host", id="path"),
        pytest.param({"CRAWLERGATE_SERVER_FORWARD_HOST": "both"}, "one of 'client', 'origin'", id="forward-host"),
        pytest.param({"CRAWLERGATE_SERVER_FILL_CLIENT_ADDRESS": "me"}, "Must be an IP address", id="fill-client"),
        pytest.param({"CRAWLERGATE_CACHE_STORAGE_MODE": "shared"}, "one of 'guest', 'rfc9111'", id="mode"),
        pytest.param({"CRAWLERGATE_CACHE_STORED_HEADERS": "Set-Cookie"}, "never stored", id="stored-cookie"),
        pytest.param({"CRAWLERGATE_CACHE_SITES": "Trac!"}, "profile name", id="site-name"),
        pytest.param({"CRAWLERGATE_CLASSIFY_SESSION_COOKIE_RULE": "all"}, "one of 'any', 'named'", id="cookie-rule"),
    ],
)
def test_config_real_site_settings_are_checked(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(None, environ)


def test_config_l1_namespace_from_the_public_url_or_given() -> None:
    one = load_settings(None, {"CRAWLERGATE_SERVER_PUBLIC_URL": "https://forum.example"})
    other = load_settings(None, {"CRAWLERGATE_SERVER_PUBLIC_URL": "https://wiki.example"})
    assert one.l1_namespace and one.l1_namespace != other.l1_namespace
    assert load_settings(None, {"CRAWLERGATE_L1_NAMESPACE": "staging"}).l1_namespace == "staging"
    assert load_settings(None, {}).l1_namespace == ""
    with pytest.raises(ConfigError, match="l1.namespace"):
        load_settings(None, {"CRAWLERGATE_L1_NAMESPACE": "a b"})


def test_config_serialised_settings_come_back_whole(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[admin]\nprefix = "/_gate"\n[l2]\nmax_bytes = "2MB"\n'
        '[classify]\nignored_cookies = ["a,b", "consent"]\nsession_cookie_rule = "named"\n'
    )
    settings = load_settings(config, {}, {"server.origin": "http://127.0.0.1:9", "server.workers": 2})
    environ = settings.to_environ()
    assert list(environ) == ["CRAWLERGATE_SETTINGS_JSON"]
    assert load_settings(None, environ) == settings  # a comma inside a list item survives, unlike CRAWLERGATE_*
    # Variables and flags given to the other process still win over the serialised settings.
    again = load_settings(None, {**environ, "CRAWLERGATE_SERVER_PORT": "9100"}, {"admin.prefix": "/_x"})
    assert again.server.port == 9100 and again.admin.prefix == "/_x" and again.l2.max_bytes == 2_000_000


def test_config_serialised_settings_that_are_not_json_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="CRAWLERGATE_SETTINGS_JSON"):
        load_settings(None, {"CRAWLERGATE_SETTINGS_JSON": "{not json"})
