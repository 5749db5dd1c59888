"""TLS for stager: a private certificate authority, server certificates, SSL contexts.

``stager up --tls`` needs certificates nobody has to buy or paste: a private CA
(a key and a self-signed ``CA:TRUE`` certificate) made once under ``ROOT/tls/``,
and one server certificate it signs, valid for every name a client on this
machine may use (``127.0.0.1``, ``::1``, ``localhost``, the host name, and any
extra names asked for).  Clients trust the CA through ``ca_file``
(``--ca``, ``STAGER_CA_FILE``), with host names checked as usual; without one
they trust the system's store, as for any public certificate.

Keys are written 0600 with :func:`~stager.auth.keys.write_secret` (never
replaced); certificates are public, 0644.  Everything is reused on a restart,
so a client holding the CA keeps working.

Contexts, not sockets: :func:`server_context` for aiohttp's sites,
:func:`client_context` for every session or raw connection a client or a
server opens towards another server.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .keys import write_secret

CA_CERT, CA_KEY = "ca.pem", "ca.key"
SERVER_CERT, SERVER_KEY = "server.pem", "server.key"
CA_DAYS = 3650
SERVER_DAYS = 825            # the most browsers and macOS accept for a server certificate
LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class TlsFiles:
    """Where a cluster's TLS material lives (``ROOT/tls/``)."""

    ca_cert: Path
    ca_key: Path
    cert: Path
    key: Path

    @classmethod
    def under(cls, directory: Path | str) -> TlsFiles:
        d = Path(directory)
        return cls(d / CA_CERT, d / CA_KEY, d / SERVER_CERT, d / SERVER_KEY)


def ensure_cluster_tls(directory: Path | str, names: Iterable[str] = ()) -> TlsFiles:
    """A CA and a server certificate under ``directory``, made the first time and
    reused afterwards (a server certificate lacking one of ``names`` is made again,
    signed by the same CA, so clients keep trusting it)."""
    files = TlsFiles.under(directory)
    ca_key, ca_cert = _load_or_make_ca(files)
    wanted = server_names(names)
    if files.cert.exists() and files.key.exists():
        if set(wanted) <= set(_san_names(x509.load_pem_x509_certificate(
                files.cert.read_bytes()))):
            return files
        files.cert.unlink()
        files.key.unlink()
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign_server(key, ca_key, ca_cert, wanted)
    write_secret(files.key, _key_pem(key))
    _write_public(files.cert, cert.public_bytes(serialization.Encoding.PEM))
    return files


def server_names(extra: Iterable[str] = ()) -> list[str]:
    """The names a local server certificate is valid for: loopback, ``localhost``,
    this host's name, and ``extra`` (wildcard bind addresses left out)."""
    names = [*LOCAL_NAMES, socket.gethostname(), *extra]
    return list(dict.fromkeys(n for n in names if n and n not in ("0.0.0.0", "::")))


def server_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """The context a server serves HTTPS with (TLS 1.2 or newer)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def client_context(ca_file: str | Path | None = None) -> ssl.SSLContext:
    """The context for connections to stager servers: trusting ``ca_file`` (else the
    system's store), certificate and host name checked."""
    ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def client_ssl(ca_file: str | Path | None) -> ssl.SSLContext | bool:
    """What aiohttp's ``ssl=`` takes for a session towards stager servers:
    :func:`client_context` trusting ``ca_file``, or ``True`` (aiohttp's cached
    default context: loading the system's store anew costs ~35 ms)."""
    return client_context(ca_file) if ca_file else True


def tls_pair(cert: str, key: str) -> tuple[str, str] | None:
    """``(cert, key)`` when both are set, ``None`` when neither is; a clear
    :class:`ValueError` for only one (a server must not fall back to plain HTTP)."""
    if bool(cert) != bool(key):
        given, missing = ("tls_cert", "tls_key") if cert else ("tls_key", "tls_cert")
        raise ValueError(f"{given} is set but {missing} is not: TLS needs both "
                         f"(--tls-cert and --tls-key)")
    return (cert, key) if cert else None


# -- making certificates -------------------------------------------------------------------

def _load_or_make_ca(files: TlsFiles) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    if files.ca_cert.exists() and files.ca_key.exists():
        key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{files.ca_key} is not an EC private key")
        return key, x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stager private CA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "stager")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    files.ca_cert.unlink(missing_ok=True)       # a certificate without its key is useless
    write_secret(files.ca_key, _key_pem(key))
    _write_public(files.ca_cert, cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def _sign_server(key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey,
                 ca_cert: x509.Certificate, names: list[str]) -> x509.Certificate:
    now = _now()
    sans: list[x509.GeneralName] = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))


def _san_names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*san.get_values_for_type(x509.DNSName),
            *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))]


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    tmp.replace(path)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
