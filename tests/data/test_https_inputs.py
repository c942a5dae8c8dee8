"""``https://`` inputs at submission: a HEAD (or, where the server answers
none, a one-byte ranged GET) says the file's size and version; a ``sha256``
pin is its identity. A real TLS server on localhost, trusted through
``SSL_CERT_FILE``, whose loopback network the tests' installation lists in
``TRAINYARD_DATA_PRIVATE_NETWORKS`` where a test reads from it; with none
listed, a URL whose host is not public is refused before any connection."""

from __future__ import annotations

import datetime
import hashlib
import http.server
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from backend.accounts.models import Workspace
from backend.core.errors import ApplicationError
from backend.data.services import identity_https, input_list

BODY = b"the vocabulary\n" * 100
PIN = hashlib.sha256(BODY).hexdigest()


class _Files(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        if self.path == "/no-head.txt":
            self.send_response(405)
            self.end_headers()
            return
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _redirect(self) -> bool:
        target = {"/to-metadata": "https://169.254.169.254/latest/meta-data/", "/to-vocab": "/vocab.txt"}
        if self.path not in target:
            return False
        self.send_response(302)
        self.send_header("Location", target[self.path])
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def _answer(self, *, head: bool) -> None:
        if self._redirect():
            return
        if self.path not in ("/vocab.txt", "/no-head.txt"):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        ranged = self.headers.get("Range") == "bytes=0-0"
        self.send_response(206 if ranged else 200)
        self.send_header("ETag", '"v1-abc"')
        if ranged:
            self.send_header("Content-Range", f"bytes 0-0/{len(BODY)}")
        self.send_header("Content-Length", "1" if ranged else str(len(BODY)))
        self.end_headers()
        if not head:
            self.wfile.write(BODY[:1] if ranged else BODY)


@pytest.fixture
def private(settings: Any) -> None:
    """The installation reads from its loopback network (where the test's server listens)."""
    settings.TRAINYARD = {**settings.TRAINYARD, "DATA_PRIVATE_NETWORKS": ["127.0.0.0/8", "::1/128"]}


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    try:
        yield f"https://localhost:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _later() -> float:
    return time.monotonic() + 30


def test_a_file_is_listed_by_its_size_and_etag_and_a_pin_is_its_identity(
    server: str, team: Workspace, private: None
) -> None:
    url = f"{server}/vocab.txt"

    plain = input_list(workspace_id=team.pk, uri=url, deadline=_later())
    pinned = input_list(workspace_id=team.pk, uri=url, sha256=PIN, deadline=_later())

    assert [(e.path, e.size, e.etag, e.sha256) for e in plain.entries] == [("", len(BODY), "v1-abc", "")]
    assert pinned.entries[0].sha256 == PIN
    assert plain.source == "https" and not plain.versioned
    assert pinned.digest != plain.digest
    expected = hashlib.sha256(f"{team.pk}|https|{url}|{PIN}|{len(BODY)}".encode()).hexdigest()
    assert identity_https(workspace_id=team.pk, url=url, entry=pinned.entries[0]) == expected


def test_a_server_without_head_is_asked_for_one_byte(server: str, team: Workspace, private: None) -> None:
    listing = input_list(workspace_id=team.pk, uri=f"{server}/no-head.txt", deadline=_later())

    assert [(e.size, e.etag) for e in listing.entries] == [(len(BODY), "v1-abc")]


def test_a_missing_file_is_named_with_the_servers_answer(server: str, team: Workspace, private: None) -> None:
    with pytest.raises(ApplicationError) as raised:
        input_list(workspace_id=team.pk, uri=f"{server}/gone.txt", deadline=_later())

    assert raised.value.message == f"input {server}/gone.txt: the server answered 404 Not Found"


def test_a_redirect_is_followed(server: str, team: Workspace, private: None) -> None:
    listing = input_list(workspace_id=team.pk, uri=f"{server}/to-vocab", deadline=_later())

    assert [(e.size, e.etag) for e in listing.entries] == [(len(BODY), "v1-abc")]


@pytest.mark.parametrize(
    ("host", "address", "kind"),
    [
        ("10.0.0.5", "10.0.0.5", "a private"),
        ("169.254.169.254", "169.254.169.254", "a link-local"),
        ("[fd12::1]", "fd12::1", "a private"),
        ("[::ffff:127.0.0.1]", "127.0.0.1", "a loopback"),
        ("0.0.0.0", "0.0.0.0", "an unspecified"),
        ("224.0.0.1", "224.0.0.1", "a multicast"),
        ("240.0.0.1", "240.0.0.1", "a reserved"),
    ],
)
def test_a_host_that_is_not_public_is_refused(team: Workspace, host: str, address: str, kind: str) -> None:
    url = f"https://{host}/data.bin"

    with pytest.raises(ApplicationError) as raised:
        input_list(workspace_id=team.pk, uri=url, deadline=_later())

    assert raised.value.message.startswith(
        f"input {url}: its host resolves to {address}, {kind} address; the server reads only public URLs"
    )


def test_a_name_that_resolves_to_loopback_is_refused_without_the_installations_consent(
    server: str, team: Workspace
) -> None:
    url = f"{server}/vocab.txt"

    with pytest.raises(ApplicationError) as raised:
        input_list(workspace_id=team.pk, uri=url, deadline=_later())

    assert "its host resolves to " in raised.value.message
    assert ", a loopback address; the server reads only public URLs" in raised.value.message
    assert "TRAINYARD_DATA_PRIVATE_NETWORKS" in raised.value.message


def test_each_redirect_is_checked_like_the_first_url(server: str, team: Workspace, private: None) -> None:
    url = f"{server}/to-metadata"

    with pytest.raises(ApplicationError) as raised:
        input_list(workspace_id=team.pk, uri=url, deadline=_later())

    assert raised.value.message.startswith(
        f"input {url}: its host resolves to 169.254.169.254, a link-local address; the server reads only public URLs"
    )
