"""TLS between the console and a cluster's controller (its agent, and slurmrestd behind the agent's relay).

Each cluster gets its own certificate authority when it is made. The CA signs one certificate, the
controller's, and its private key is thrown away at once: nothing else can ever carry a certificate that
chains to it. The controller keeps its key and certificate (with the CA's certificate after it) in one
PEM bundle, 0600 and root's (local: the cluster's secrets folder; gce: a Secret Manager secret only the
cluster's own nodes may read). The console trusts that one CA for that one cluster and no other: a
connection whose certificate does not chain to it fails its handshake before a request (with its bearer
key or JWT) is sent. So a process that takes over the agent's port while the agent is down, or an address
that answers in the controller's place, learns nothing.

Rotation (clusters/services/certificates.py): the certificates last VALID_DAYS, and a cluster's are
replaced RENEW_DAYS before they end (a daily task), or at once on request (`manage.py rotate_tls`, after
a suspected leak of the controller's key). A rotation makes a new CA and certificate; the console
pins the old and new CAs together while the agent switches (a bundle may carry several CA certificates
after the controller's: `ca_of`), then the new one alone.

The name on the certificate is not checked (`check_hostname` off): the controller's address is known
only after its VM exists, and a CA that signs exactly one certificate already says which server it is.

slurmrestd 22.05 has no TLS of its own: it listens on a Unix socket in its own account's 0700 folder, and the agent
relays TLS connections to it (clusters/agent/server.py, --slurmrestd-relay).
"""

import datetime
import functools
import ipaddress
import re
import ssl

# How long a controller's certificate (and its CA) is valid, and how long before its end it is replaced:
# half a year, renewed with two months left, so a console that was down for weeks still finds every
# cluster's certificate valid and rotates it (the agent must be reached over the current one to switch).
VALID_DAYS = 180
RENEW_DAYS = 60
PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z ]+)-----\r?\n.*?-----END \1-----\r?\n?", re.S)


def controller_bundle(name, addresses=("127.0.0.1",)):
    """A new CA for the cluster `name` and the controller's certificate it signs: the controller's PEM
    bundle (its private key, its certificate, the CA's certificate). The CA's key is not kept."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name[:40]} cluster CA")])

    def certificate(subject, public_key, *extensions):
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(ca_key, hashes.SHA256())

    ca = certificate(
        ca_name,
        ca_key.public_key(),
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (x509.KeyUsage(False, False, False, False, False, True, True, False, False), True),  # certs and CRLs
        (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False),
    )
    sans = [x509.DNSName(f"{name[:50]}-controller")] + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    server = certificate(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name[:40]} controller")]),
        key.public_key(),
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.KeyUsage(True, False, False, False, False, False, False, False, False), True),  # signatures
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (x509.SubjectAlternativeName(sans), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
    )
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return private + server.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM)


def certificates_of(bundle):
    """The PEM certificates of a bundle (bytes each), in order: the controller's, then its CA's (and, while a
    rotation switches, the next CA's)."""
    certificates = [m.group(0) for m in PEM_BLOCK.finditer(bundle) if m.group(1) == b"CERTIFICATE"]
    if len(certificates) < 2:
        raise ValueError("not a controller bundle: it needs the controller's certificate and its CA's")
    return certificates


def ca_of(bundle):
    """The CA certificates (PEM text) a controller's bundle says to trust: every certificate after the
    controller's (one, or two while a rotation switches)."""
    return "".join(c.decode() for c in certificates_of(bundle)[1:])


def trusting(bundle, other):
    """`bundle` with the CA certificates of the bundle `other` after its own (those it lacks): the console
    pins both while the controller switches from one to the other."""
    kept = certificates_of(bundle)
    extra = [c for c in certificates_of(other)[1:] if c not in kept]
    return bundle.rstrip(b"\n") + b"\n" + b"".join(extra)


def controller_certificate(bundle):
    from cryptography import x509

    return x509.load_pem_x509_certificate(certificates_of(bundle)[0])


def not_after(bundle):
    """When the controller's certificate in `bundle` ends (an aware datetime)."""
    return controller_certificate(bundle).not_valid_after_utc


def renewed(bundle):
    """A new bundle (new CA, new key) for the controller of `bundle`: the same name and addresses."""
    from cryptography import x509

    names = controller_certificate(bundle).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = names.get_values_for_type(x509.DNSName)
    name = dns[0].removesuffix("-controller") if dns else "cluster"
    return controller_bundle(name, [str(a) for a in names.get_values_for_type(x509.IPAddress)])


@functools.lru_cache(maxsize=512)
def client_context(ca):
    """An SSL context that trusts the one CA (PEM text) and nothing else, TLS 1.2 or later."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False  # the CA signs one certificate (see above)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=ca)
    return context


def unreachable(what, exc):
    """Why `what` did not answer, for an error message: a certificate the cluster's CA did not sign says so."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ssl.SSLCertVerificationError):
        why = reason.verify_message
        return f"{what} presented a certificate the cluster's CA did not sign ({why}); nothing was sent to it"
    return f"{what} is not answering: {exc}"


def context_for(endpoint):
    """The SSL context for an endpoint (url, ca): pinned to its CA. An https URL without a CA is refused (the
    machine's public CAs never vouch for a controller); plain http only for a test's own server."""
    if endpoint.url.startswith("https:"):
        if not endpoint.ca:
            raise ValueError(f"{endpoint.url}: no CA to check the controller's certificate against")
        return client_context(endpoint.ca)
    return None
