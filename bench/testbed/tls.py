"""A throwaway certificate authority, a loopback server certificate and a client certificate, made at test time.

Kafka reads PEM directly, so no keytool step is needed: the broker gets one PEM file holding its key and chain, the
clients get the CA file, and a client of an mTLS listener its own certificate and key.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TlsFiles:
    ca_pem: Path  # what clients trust
    server_pem: Path  # the broker's private key followed by its certificate chain
    client_cert_pem: Path  # what an mTLS client presents (CN=mirror), signed by the CA
    client_key_pem: Path  # its private key


def make_loopback_tls(folder: Path) -> TlsFiles:
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    validity = (now - dt.timedelta(hours=1), now + dt.timedelta(days=2))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mirrorkit test-bed CA")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    server_cert = (
        _builder(server_name, ca_name, server_key.public_key(), validity)
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = (
        _builder(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mirror")]), ca_name, client_key.public_key(), validity
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    files = TlsFiles(
        ca_pem=folder / "ca.pem", server_pem=folder / "server.pem", client_cert_pem=folder / "client.pem",
        client_key_pem=folder / "client-key.pem",
    )  # fmt: skip
    files.ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    chain = server_cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(serialization.Encoding.PEM)
    files.server_pem.write_bytes(_key_pem(server_key) + chain)
    files.client_cert_pem.write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
    files.client_key_pem.write_bytes(_key_pem(client_key))
    for secret in (files.server_pem, files.client_key_pem):
        secret.chmod(0o600)
    return files


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _builder(subject: x509.Name, issuer: x509.Name, public_key, validity) -> x509.CertificateBuilder:
    not_before, not_after = validity
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
