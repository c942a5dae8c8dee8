"""TRAINYARD_APPS_URL: how it is read, which hosts are apps', each app's own
label, and the settings that would put an app next to the dashboard,
refused at start."""

from __future__ import annotations

import pytest
from django.test import override_settings

from backend.access.webapps.origin import AppsOrigin, app_label, apps_origin_check, apps_origin_parse
from backend.core.env import ConfigError
from backend.core.origins import websocket_origin_allowed
from tests.core.test_deploy_settings import manage, production_env

APPS = AppsOrigin(scheme="https", domain="apps.example.com", port="")


def test_the_url_names_a_scheme_a_domain_and_a_port_with_the_app_first() -> None:
    assert apps_origin_parse("https://{app}.apps.example.com") == APPS
    local = apps_origin_parse("http://{app}.apps.localhost:8000")
    assert local == AppsOrigin(scheme="http", domain="apps.localhost", port=":8000")
    assert local.origin("a" * 26) == f"http://{'a' * 26}.apps.localhost:8000"
    assert apps_origin_parse("") is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://apps.example.com", "must start with {app}."),
        ("https://x.{app}.example.com", "must start with {app}."),
        ("ftp://{app}.example.com", "scheme and a host"),
        ("https://{app}.example.com/lab", "scheme and a host"),
        ("https://{app}.exa mple.com", "is not a host name"),
    ],
)
def test_a_url_that_cannot_give_each_app_its_own_host_is_refused_saying_why(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=r"TRAINYARD_APPS_URL=.*" + says.replace(".", r"\.").replace("{", r"\{")):
        apps_origin_parse(url)


def test_hosts_on_the_apps_domain_are_the_apps_and_only_a_well_formed_label_names_one() -> None:
    label = app_label(secret="s", attempt_id="a1", port=8888)
    assert APPS.label_of(f"{label}.apps.example.com") == label
    assert APPS.label_of(f"{label.upper()}.apps.example.com:443") == label
    assert APPS.label_of("nope.apps.example.com") is None
    assert APPS.label_of(f"{label}.other.example.com") is None
    assert APPS.covers("anything.apps.example.com") and APPS.covers("apps.example.com")
    assert not APPS.covers("example.com") and not APPS.covers("evilapps.example.com")


def test_each_attempt_and_port_has_its_own_label_that_the_secret_decides() -> None:
    labels = {
        app_label(secret="s", attempt_id="a1", port=8888),
        app_label(secret="s", attempt_id="a1", port=6006),
        app_label(secret="s", attempt_id="a2", port=8888),
        app_label(secret="t", attempt_id="a1", port=8888),
    }
    assert len(labels) == 4
    assert all(len(label) == 26 and label.isalnum() and label == label.lower() for label in labels)
    assert app_label(secret="s", attempt_id="a1", port=8888) == app_label(secret="s", attempt_id="a1", port=8888)


@pytest.mark.parametrize(
    ("public_url", "https", "trusted", "says"),
    [
        ("https://x.apps.example.com", True, [], "holds the dashboard"),
        ("https://trainyard.example.com", True, ["https://*.example.com"], "covers the apps domain"),
        ("https://trainyard.example.com", True, ["https://*.apps.example.com"], "covers the apps domain"),
        ("https://trainyard.example.com", True, ["https://abc.apps.example.com"], "covers the apps domain"),
    ],
)
def test_settings_that_would_trust_an_app_are_refused(
    public_url: str, https: bool, trusted: list[str], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        apps_origin_check(APPS, public_url=public_url, https=https, trusted_origins=trusted)


def test_plain_http_apps_beside_an_https_dashboard_are_refused() -> None:
    plain = AppsOrigin(scheme="http", domain="apps.example.com", port="")
    with pytest.raises(ConfigError, match="must be https://"):
        apps_origin_check(plain, public_url="https://trainyard.example.com", https=True, trusted_origins=[])
    apps_origin_check(
        APPS, public_url="https://trainyard.example.com", https=True, trusted_origins=["https://ci.example.com"]
    )


def test_production_serves_no_apps_unless_set_and_refuses_a_bad_value_at_start() -> None:
    checked = manage("shell", "-c", "from django.conf import settings; print(settings.APPS)", env=production_env())
    assert checked.stdout.strip().splitlines()[-1] == "None", checked.stderr
    bad = manage("check", env=production_env(TRAINYARD_APPS_URL="https://apps.example.com"))
    assert bad.returncode != 0
    assert "TRAINYARD_APPS_URL='https://apps.example.com': the host must start with {app}." in bad.stderr


@override_settings(APPS=APPS, ALLOWED_HOSTS=[".example.com"], CSRF_TRUSTED_ORIGINS=[])
def test_the_dashboards_websockets_never_admit_a_page_of_an_app() -> None:
    app = f"https://{app_label(secret='s', attempt_id='a', port=1)}.apps.example.com"
    assert websocket_origin_allowed(origin="https://ci.example.com", host="trainyard.example.com")
    assert not websocket_origin_allowed(origin=app, host="trainyard.example.com")
