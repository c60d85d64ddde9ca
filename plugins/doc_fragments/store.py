# Copyright: zerolayer.fleet maintainers
# Apache-2.0 (see LICENSE)
"""Documentation shared by the modules that talk to the rollout store (etcd).

ansible-test reads each fragment as one string literal, so the two forms spell their
common options out each.
"""


class ModuleDocFragment:
    # Modules that need the store.
    DOCUMENTATION = r"""
options:
  endpoints:
    description:
      - URLs of the rollout store's members (etcd's v3 JSON gateway on its client port), tried in
        order, such as V(https://10.0.0.5:2379).
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds to wait for each answer of the store.
    type: float
    default: 3.0
  store_timeout:
    description:
      - Seconds to wait for each answer of the store; set, it wins over O(timeout). Playbooks
        set it for the whole store group from the inventory's C(rollout_store_timeout).
    type: float
  ca_file:
    description: CA certificate that signed the store's server certificates.
    type: path
  cert_file:
    description:
      - Client certificate of this identity, from the store's CA; it admits the client to the TLS
        handshake, O(user) names it.
    type: path
  key_file:
    description: Private key of O(cert_file).
    type: path
  user:
    description:
      - The rollout store user this identity signs in as. etcd's JSON gateway does not pass the
        client certificate's name on, so the user signs in with a password and every request
        carries the token it gets.
    type: str
  password_file:
    description: File whose first line is O(user)'s password (mode 0600).
    type: path
  prefix:
    description: Key prefix of the rollout store.
    type: str
    default: /zerolayer/

requirements:
  - Python's standard library only (urllib over TLS); no etcd client library.
"""

    # Modules that use the store when one is given (the record, the fence) and work without.
    OPTIONAL = r"""
options:
  endpoints:
    description:
      - URLs of the rollout store's members (etcd's v3 JSON gateway), such as
        V(https://10.0.0.5:2379). Empty, no store is used.
    type: list
    elements: str
    default: []
  store_timeout:
    description:
      - Seconds to wait for each answer of the store; set, it wins over the 3 s default. Playbooks
        set it for the whole store group from the inventory's C(rollout_store_timeout).
    type: float
  ca_file:
    description: CA certificate that signed the store's server certificates.
    type: path
  cert_file:
    description:
      - Client certificate of this identity, from the store's CA; it admits the client to the TLS
        handshake, O(user) names it.
    type: path
  key_file:
    description: Private key of O(cert_file).
    type: path
  user:
    description:
      - The rollout store user this identity signs in as. etcd's JSON gateway does not pass the
        client certificate's name on, so the user signs in with a password and every request
        carries the token it gets.
    type: str
  password_file:
    description: File whose first line is O(user)'s password (mode 0600).
    type: path
  prefix:
    description: Key prefix of the rollout store.
    type: str
    default: /zerolayer/
"""
