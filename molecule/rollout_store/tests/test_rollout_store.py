"""Verify the rollout_store role: a real etcd member with TLS, client certificates and RBAC.

The node is the member and a GPU node at once. Every check asks the running etcd, through
etcdctl (gRPC) and through its JSON gateway (what the nodes' standard-library client uses).
"""

import base64
import json
import os
import pathlib
import shlex

import pytest
import testinfra.utils.ansible_runner

RUNNER = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"])
testinfra_hosts = RUNNER.get_hosts("monitoring")

NODE = RUNNER.get_hosts("gpu_nodes")[0]
PKI = pathlib.Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "pki"
MEMBER_PKI = "/etc/etcd/zerolayer"
STORE = "/etc/zerolayer/store"
EXPORTER = "/etc/zerolayer/store-exporter"
# The controller's credentials are copied into the node for these checks only.
CONTROLLER = "/root/zl-verify-controller"
LOCAL = "https://127.0.0.1:2379"


def b64(text):
    return base64.b64encode(text.encode()).decode()


@pytest.fixture(scope="module")
def controller(host):
    host.check_output("install -d -m 0700 %s", CONTROLLER)
    for name in ("controller.pem", "controller-key.pem", "controller.password"):
        data = base64.b64encode((PKI / name).read_bytes()).decode()
        host.check_output(
            f"printf %s {data} | base64 -d > {CONTROLLER}/{name} && chmod 0600 {CONTROLLER}/{name}"
        )
    return {
        "cert": f"{CONTROLLER}/controller.pem",
        "key": f"{CONTROLLER}/controller-key.pem",
        "user": "zerolayer-controller",
        "password": (PKI / "controller.password").read_text().strip(),
    }


@pytest.fixture(scope="module")
def node(host):
    config = json.loads(host.file("/etc/zerolayer/store.json").content_string)
    config["password"] = host.file(config["password_file"]).content_string.strip()
    return config


def etcdctl(host, identity, *args, endpoint=LOCAL):
    command = [
        "env",
        "ETCDCTL_API=3",
        "ETCDCTL_DIAL_TIMEOUT=5s",
        "ETCDCTL_COMMAND_TIMEOUT=10s",
        "etcdctl",
        f"--endpoints={endpoint}",
        f"--cacert={MEMBER_PKI}/ca.pem",
    ]
    if identity:
        command += [f"--cert={identity['cert']}", f"--key={identity['key']}"]
        if identity.get("user"):
            command.insert(1, f"ETCDCTL_USER={identity['user']}:{identity['password']}")
    return host.run(shlex.join(command + list(args)))


def gateway(host, identity, path, body, token=None, endpoint=LOCAL):
    command = ["curl", "-sS", "--cacert", f"{MEMBER_PKI}/ca.pem", "-w", "\n%{http_code}"]
    if identity:
        command += ["--cert", identity["cert"], "--key", identity["key"]]
    if token:
        command += ["-H", f"Authorization: {token}"]
    command += ["-X", "POST", "-d", json.dumps(body), endpoint + path]
    result = host.run(shlex.join(command))
    body_text, _newline, status = result.stdout.rpartition("\n")
    return result.rc, status, body_text


def token_for(host, identity):
    rc, status, body = gateway(
        host,
        identity,
        "/v3/auth/authenticate",
        {"name": identity["user"], "password": identity["password"]},
    )
    assert rc == 0 and status == "200", body
    return json.loads(body)["token"]


def denied(result):
    return result.rc != 0 and "permission denied" in result.stderr


def test_service_enabled_and_running(host):
    service = host.service("etcd")
    assert service.is_running
    assert service.is_enabled


def test_listens_on_client_and_peer_ports(host, address):
    assert address != "127.0.0.1", "the member should listen on its own address too"
    for socket in (f"tcp://{address}:2379", "tcp://127.0.0.1:2379", f"tcp://{address}:2380"):
        assert host.socket(socket).is_listening, socket


def test_serves_tls_with_the_stores_certificate(host, address):
    result = host.run(
        f"openssl s_client -connect {address}:2379 -CAfile {MEMBER_PKI}/ca.pem "
        f"-verify_return_error -verify_ip {address} "
        f"-cert {STORE}/node.pem -key {STORE}/node-key.pem </dev/null"
    )
    assert result.rc == 0, result.stdout + result.stderr
    assert "Verify return code: 0 (ok)" in result.stdout
    plain = host.run("curl -sS -m 5 http://127.0.0.1:2379/health")
    assert plain.rc != 0 or "etcd" not in plain.stdout


def peer_get(host, address, cert, key, path="/members"):
    """GET on the peer port with the peers' CA and the given certificate."""
    return host.run(
        f"curl -sS -m 10 --http1.1 --cacert {MEMBER_PKI}/peer-ca.pem --cert {cert} --key {key} "
        f"https://{address}:2380{path}"
    )


def test_peer_port_serves_the_peers_certificate_not_the_stores(host, address):
    served = host.run(
        f"openssl s_client -connect {address}:2380 -CAfile {MEMBER_PKI}/peer-ca.pem "
        f"-verify_return_error -verify_ip {address} "
        f"-cert {MEMBER_PKI}/peer.pem -key {MEMBER_PKI}/peer-key.pem </dev/null"
    )
    assert served.rc == 0 and "Verify return code: 0 (ok)" in served.stdout, served.stderr
    # Two CAs: neither signs what the other port trusts.
    crossed = host.run(
        f"openssl verify -CAfile {MEMBER_PKI}/ca.pem {MEMBER_PKI}/peer.pem; "
        f"openssl verify -CAfile {MEMBER_PKI}/peer-ca.pem {STORE}/node.pem"
    )
    assert crossed.stdout.count(": OK") == 0, crossed.stdout
    settings = host.file("/etc/default/etcd").content_string
    assert f"ETCD_PEER_TRUSTED_CA_FILE={MEMBER_PKI}/peer-ca.pem" in settings.splitlines()


def test_a_nodes_client_certificate_is_no_peer(host, address):
    """Item 7 of issue #28: the peer port (raft, no RBAC) refuses the certificates of the
    store's clients in the TLS handshake; a member's peer certificate gets in."""
    peer = peer_get(host, address, f"{MEMBER_PKI}/peer.pem", f"{MEMBER_PKI}/peer-key.pem")
    assert peer.rc == 0 and '"peerURLs"' in peer.stdout, peer.stdout + peer.stderr
    for cert, key in (
        (f"{STORE}/node.pem", f"{STORE}/node-key.pem"),
        (f"{EXPORTER}/exporter.pem", f"{EXPORTER}/exporter-key.pem"),
        (f"{MEMBER_PKI}/member.pem", f"{MEMBER_PKI}/member-key.pem"),
        (f"{MEMBER_PKI}/root.pem", f"{MEMBER_PKI}/root-key.pem"),
    ):
        refused = peer_get(host, address, cert, key)
        assert refused.rc != 0, cert + ": " + refused.stdout
        assert '"peerURLs"' not in refused.stdout
    # And the other way round: a peer certificate is nobody on the client port.
    client = host.run(
        f"curl -sS -m 10 --cacert {MEMBER_PKI}/ca.pem --cert {MEMBER_PKI}/peer.pem "
        f"--key {MEMBER_PKI}/peer-key.pem https://{address}:2379/health"
    )
    assert client.rc != 0, client.stdout


def test_client_without_certificate_is_refused(host, endpoint):
    rc, _status, body = gateway(
        host, None, "/v3/kv/range", {"key": b64("/zerolayer/fence")}, endpoint=endpoint
    )
    assert rc != 0, body
    result = etcdctl(host, None, "get", "/zerolayer/fence", endpoint=endpoint)
    assert result.rc != 0


def test_endpoint_health_with_the_controllers_credentials(host, controller, endpoint):
    result = etcdctl(host, controller, "endpoint", "health", endpoint=endpoint)
    assert result.rc == 0, result.stderr
    assert "is healthy" in result.stdout + result.stderr


def test_controller_reads_and_writes_under_the_prefix(host, controller, endpoint):
    assert (
        etcdctl(host, controller, "put", "/zerolayer/rollouts/verify", "one", endpoint=endpoint).rc
        == 0
    )
    got = etcdctl(
        host,
        controller,
        "get",
        "/zerolayer/rollouts/verify",
        "--print-value-only",
        endpoint=endpoint,
    )
    assert got.stdout.strip() == "one", got.stderr
    assert etcdctl(host, controller, "put", "/zerolayer/fence", "7", endpoint=endpoint).rc == 0
    assert denied(etcdctl(host, controller, "put", "/elsewhere", "x", endpoint=endpoint))


def test_controller_through_the_json_gateway(host, controller, endpoint):
    token = token_for(host, controller)
    put = {"key": b64("/zerolayer/rollouts/gateway"), "value": b64("two")}
    rc, status, body = gateway(host, controller, "/v3/kv/put", put, token, endpoint)
    assert (rc, status) == (0, "200"), body
    rc, status, body = gateway(
        host,
        controller,
        "/v3/kv/range",
        {"key": b64("/zerolayer/rollouts/gateway")},
        token,
        endpoint,
    )
    assert (rc, status) == (0, "200"), body
    assert base64.b64decode(json.loads(body)["kvs"][0]["value"]) == b"two"


def test_auth_tokens_are_jwts_signed_with_the_stores_key(host, controller):
    """Item 9 of issue #28: no simple tokens; an ES256 JWT signed with the store's own key,
    which only etcd reads on the member."""
    settings = host.file("/etc/default/etcd").content_string.splitlines()
    (flag,) = [line for line in settings if line.startswith("ETCD_AUTH_TOKEN=")]
    assert flag == (
        f"ETCD_AUTH_TOKEN=jwt,pub-key={MEMBER_PKI}/token.pub.pem,"
        f"priv-key={MEMBER_PKI}/token-key.pem,sign-method=ES256,ttl=300s"
    )
    pid = host.check_output("systemctl show -p MainPID --value etcd")
    environ = host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ")
    assert flag in environ.splitlines()
    key = host.file(f"{MEMBER_PKI}/token-key.pem")
    assert (key.user, key.group, key.mode) == ("etcd", "etcd", 0o600)
    token = token_for(host, controller)
    parts = token.split(".")
    assert len(parts) == 3 and all(parts), token
    header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    assert header["alg"] == "ES256"
    assert claims["username"] == "zerolayer-controller"
    # Signed with the key the controller made: its public half checks the signature.
    public = (PKI / "token.pub.pem").read_bytes()
    assert host.file(f"{MEMBER_PKI}/token.pub.pem").content == public


def test_node_store_json(host, node, endpoint):
    assert node["endpoints"] == [endpoint]
    assert node["node"] == node["user"] == NODE
    assert (node["ca"], node["cert"], node["key"]) == (
        f"{STORE}/ca.pem",
        f"{STORE}/node.pem",
        f"{STORE}/node-key.pem",
    )
    for path in (node["key"], node["password_file"]):
        secret = host.file(path)
        assert (secret.user, secret.group, secret.mode) == ("root", "root", 0o600), path
    assert "O = zerolayer" in host.check_output(f"openssl x509 -in {node['cert']} -noout -subject")


def test_node_reads_the_fence_and_writes_only_its_acknowledgement(host, node, endpoint):
    got = etcdctl(host, node, "get", "/zerolayer/fence", "--print-value-only", endpoint=endpoint)
    assert got.rc == 0 and got.stdout.strip() == "7", got.stderr
    assert etcdctl(host, node, "put", f"/zerolayer/acks/{NODE}", "7", endpoint=endpoint).rc == 0
    assert (
        etcdctl(host, node, "put", f"/zerolayer/acks/{NODE}/epoch", "7", endpoint=endpoint).rc == 0
    )
    assert denied(etcdctl(host, node, "put", "/zerolayer/fence", "0", endpoint=endpoint))
    assert denied(etcdctl(host, node, "put", "/zerolayer/rollouts/x", "100", endpoint=endpoint))
    assert denied(etcdctl(host, node, "put", f"/zerolayer/acks/{NODE}0", "7", endpoint=endpoint))
    assert denied(etcdctl(host, node, "get", "/zerolayer/rollouts/verify", endpoint=endpoint))


def test_node_through_the_json_gateway(host, node, endpoint):
    token = token_for(host, node)
    rc, status, body = gateway(
        host, node, "/v3/kv/range", {"key": b64("/zerolayer/fence")}, token, endpoint
    )
    assert (rc, status) == (0, "200"), body
    assert base64.b64decode(json.loads(body)["kvs"][0]["value"]) == b"7"
    for key in ("/zerolayer/fence", "/zerolayer/rollouts/x"):
        rc, status, body = gateway(
            host, node, "/v3/kv/put", {"key": b64(key), "value": b64("0")}, token, endpoint
        )
        assert status == "403" and "permission denied" in body, (key, body)
    ack = {"key": b64(f"/zerolayer/acks/{NODE}"), "value": b64("8")}
    rc, status, body = gateway(host, node, "/v3/kv/put", ack, token, endpoint)
    assert (rc, status) == (0, "200"), body


def test_certificate_without_password_or_with_a_wrong_one_gets_nothing(host, node, endpoint):
    anonymous = {"cert": node["cert"], "key": node["key"]}
    assert etcdctl(host, anonymous, "get", "/zerolayer/fence", endpoint=endpoint).rc != 0
    _rc, status, body = gateway(
        host, anonymous, "/v3/kv/range", {"key": b64("/zerolayer/fence")}, None, endpoint
    )
    assert status != "200", body
    wrong = dict(node)
    wrong["password"] = "x" + node["password"]
    result = etcdctl(host, wrong, "get", "/zerolayer/fence", endpoint=endpoint)
    assert result.rc != 0 and "authentication failed" in result.stderr


def test_only_the_expected_users_exist(host):
    root = {"cert": f"{MEMBER_PKI}/root.pem", "key": f"{MEMBER_PKI}/root-key.pem"}
    users = json.loads(etcdctl(host, root, "user", "list", "-w", "json").stdout)["users"]
    assert sorted(users) == sorted(
        ["root", "zerolayer-controller", NODE, "zerolayer-store-exporter"]
    )
    roles = json.loads(etcdctl(host, root, "role", "list", "-w", "json").stdout)["roles"]
    # etcd's built-in root role is not listed.
    assert sorted(roles) == sorted(
        ["zerolayer-controller", f"zerolayer-node-{NODE}", "zerolayer-store-exporter"]
    )
