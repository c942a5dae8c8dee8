"""Production settings pass Django's deployment checks, and the browser
hardening they turn on is what responses carry."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from django.test import Client

from tests.support.stack import REPO_ROOT

PUBLIC_URL = "https://trainyard.example.com"


def production_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TRAINYARD_"))}
    env.update(
        TRAINYARD_ENV="production",
        DJANGO_SETTINGS_MODULE="backend.config.settings",
        DJANGO_SECRET_KEY="x7!kq" + "Zp3v9Lr2Tn8Wc4Hy6Jb1Md5Fg0Sa" * 2,
        DJANGO_ALLOWED_HOSTS="trainyard.example.com",
        TRAINYARD_PUBLIC_URL=PUBLIC_URL,
        TRAINYARD_SECRET_KEYS=Fernet.generate_key().decode(),
    )
    return env | extra


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_production_settings_pass_check_deploy_without_a_warning() -> None:
    checked = manage("check", "--deploy", "--fail-level", "WARNING", env=production_env())

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "System check identified no issues (1 silenced)." in checked.stdout


def test_production_refuses_a_plain_http_public_url() -> None:
    checked = manage("check", env=production_env(TRAINYARD_PUBLIC_URL="http://trainyard.example.com"))

    assert checked.returncode != 0
    assert "TRAINYARD_PUBLIC_URL is http://trainyard.example.com, but the site is served over HTTPS" in checked.stderr


def test_production_responses_are_secure_only_and_strict_transport() -> None:
    code = (
        "import django; django.setup()\n"
        "from django.conf import settings as s\n"
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS,"
        " s.SECURE_HSTS_INCLUDE_SUBDOMAINS, s.SECURE_PROXY_SSL_HEADER)\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=production_env(), capture_output=True, text=True, timeout=60
    )

    assert shown.stdout.strip() == "True True True 31536000 True ('HTTP_X_FORWARDED_PROTO', 'https')", shown.stderr


@pytest.mark.django_db
def test_the_dashboard_and_the_api_carry_the_content_security_policy() -> None:
    browser = Client()
    page = browser.get("/w/acme/runs")
    api = browser.get("/api/v1/health/")
    admin = browser.get("/admin/login/")

    strict = page["Content-Security-Policy"]
    assert "script-src 'self';" in strict and "style-src 'self';" in strict
    # Style attributes only (the terminal's cell colours), never <style> elements.
    assert "style-src-attr 'unsafe-inline';" in strict and "style-src-elem" not in strict
    assert "frame-ancestors 'none'" in strict and "object-src 'none'" in strict
    assert api["Content-Security-Policy"] == strict
    # Django's admin pages carry inline styles, never inline scripts.
    assert "style-src 'self' 'unsafe-inline';" in admin["Content-Security-Policy"]
    assert "script-src 'self';" in admin["Content-Security-Policy"]


def test_production_refuses_the_local_backend_unless_declared_single_tenant() -> None:
    refused = manage("check", env=production_env(TRAINYARD_LOCAL_BACKEND="true"))
    single = manage("check", env=production_env(TRAINYARD_LOCAL_BACKEND="true", TRAINYARD_SINGLE_TENANT="true"))

    assert refused.returncode != 0
    assert "Traceback" not in refused.stderr
    assert "TRAINYARD_LOCAL_BACKEND is on in production" in refused.stderr
    assert "TRAINYARD_SINGLE_TENANT=true" in refused.stderr
    assert single.returncode == 0, single.stdout + single.stderr
