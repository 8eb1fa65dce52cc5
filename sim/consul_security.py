"""Consul security material for a virtual inventory: gossip key, ACL tokens, a CA and a server certificate.

A virtual cluster runs with everything a production inventory must turn on (ACLs with default deny, gossip
encryption, TLS), so the roles' secure paths are the ones exercised. The values are throwaway, made fresh by
``clusterctl virtual create`` for machines that only ever listen on loopback; a real inventory keeps its
own in a vault. Per-node tokens (the node agent's and the eas-agent's) are derived from one seed (``to_uuid``),
so one file serves any number of hosts. The certificate is for ``server.<dc>.consul`` (what ``verify_server_hostname`` checks) and
localhost, signed by a CA made here with ``cryptography`` (an ansible-core dependency).
"""

from __future__ import annotations

import base64
import datetime
import os
import uuid

from consul_io import layout
from eas_wire.signing import generate_key_pair


def _pem_pair(datacenter: str) -> tuple[str, str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "clusterctl virtual Consul CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=3650))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    host = f"server.{datacenter}.consul"
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host), x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return ca.public_bytes(pem).decode(), cert.public_bytes(pem).decode(), key_pem


def _block(text: str) -> str:
    return "|\n" + "".join(f"  {line}\n" for line in text.strip().splitlines())


def render(datacenter: str = layout.DEFAULT_DATACENTER) -> str:
    ca, cert, key = _pem_pair(datacenter)
    seed = uuid.uuid4()
    private, public = generate_key_pair()
    return (
        "# Consul security for this virtual cluster (`clusterctl virtual create`): throwaway values for machines\n"
        "# that listen on loopback only. A real inventory keeps these in a vault (see roles/consul_agent).\n"
        f"consul_agent_gossip_key: {base64.b64encode(os.urandom(32)).decode()}\n"
        f"consul_agent_acl_management_token: {uuid.uuid4()}\n"
        f"consul_virtual_token_seed: {seed}\n"
        "consul_agent_acl_agent_token: \"{{ ('consul-agent:' ~ inventory_hostname ~ ':' ~ consul_virtual_token_seed)"
        " | to_uuid }}\"\n"
        "consul_agent_acl_registration_token: \"{{ ('consul-registration:' ~ inventory_hostname ~ ':' ~"
        " consul_virtual_token_seed) | to_uuid }}\"\n"
        "eas_agent_consul_token: \"{{ ('eas-agent:' ~ inventory_hostname ~ ':' ~ consul_virtual_token_seed)"
        " | to_uuid }}\"\n"
        f"consul_token: {uuid.uuid4()}\n"
        f"consul_edge_token: {uuid.uuid4()}\n"
        "# The announce channel: the edge's Ed25519 private key (its announce.key_file; a vault value on a real site)\n"
        "# and every edge's public key, which the eas_agent role gives each agent (they verify, never sign).\n"
        f"eas_edge_announce_private_key: {private}\n"
        "eas_edge_public_keys:\n"
        f"  - {{name: edge, key: \"{public}\"}}\n"
        "# vLLM's API key (role inference_unit: VLLM_API_KEY): the IUs refuse /v1 requests without it; the edges\n"
        "# hold it (upstream_api_key_file).\n"
        f"inference_unit_api_key: {os.urandom(32).hex()}\n"
        f"consul_agent_tls_ca_pem: {_block(ca)}"
        f"consul_agent_tls_server_cert_pem: {_block(cert)}"
        f"consul_agent_tls_server_key_pem: {_block(key)}"
    )
