# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The GPU set of a model engine: one normalisation of hardware_profile.gpu/gpus, and its checks."""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_sets
short_description: The GPU set of a model engine, and the problems in the engines' GPU fields
version_added: 0.1.0
description:
  - >-
    C(gpu_set) turns an engine's I(hardware_profile) into the list of its GPU indexes, in the
    order given: C(gpus) as it is, C(gpu: N) as C([N]), C(gpu: null) as C([]). It returns
    null when the profile's GPU fields are malformed; C(gpu_set_problems) says why.
  - C(gpu_set_problems) checks the GPU fields of every entry of I(model_engine_services) and
    that no two engines share a GPU, unless both join one CUDA MPS instance (the one way
    engines share a GPU here). Each problem names the entry, the field and what is allowed.
positional: _input
options:
  _input:
    description:
      - For C(gpu_set), an engine's I(hardware_profile).
      - For C(gpu_set_problems), the list I(model_engine_services).
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Give vLLM the engine's GPUs
  ansible.builtin.set_fact:
    visible_devices: "{{ engine.hardware_profile | zerolayer.fleet.gpu_set | join(',') }}"

- name: Refuse engines that share a GPU outside MPS
  vars:
    problems: "{{ model_engine_services | zerolayer.fleet.gpu_set_problems }}"
  ansible.builtin.assert:
    that: problems | length == 0
    fail_msg: "{{ problems | join('; ') }}"
"""

RETURN = r"""
_value:
  description:
    - C(gpu_set) returns a list of GPU indexes (integers), or null for a malformed profile.
    - C(gpu_set_problems) returns a list of messages, empty when every GPU field is good.
  type: raw
"""

FIELD = "model_engine_services[%d]%s.hardware_profile"


def _is_index(value):
    # YAML's true/false are ints to Python; a GPU index never is one.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def gpu_set(hardware_profile):
    """The engine's GPU indexes in the order given, [] for none, None when malformed."""
    if not isinstance(hardware_profile, dict):
        return None
    has_gpu, has_gpus = "gpu" in hardware_profile, "gpus" in hardware_profile
    if has_gpu == has_gpus:
        return None
    if has_gpu:
        gpu = hardware_profile["gpu"]
        if gpu is None:
            return []
        return [gpu] if _is_index(gpu) else None
    gpus = hardware_profile["gpus"]
    if not isinstance(gpus, (list, tuple)) or not gpus:
        return None
    if not all(_is_index(gpu) for gpu in gpus) or len(set(gpus)) != len(gpus):
        return None
    return list(gpus)


def _where(service):
    name = service.get("name") if isinstance(service, dict) else None
    return " (%s)" % name if isinstance(name, str) else ""


def _profile_problems(field, profile):
    has_gpu, has_gpus = "gpu" in profile, "gpus" in profile
    if has_gpu and has_gpus:
        return [
            "%s: give either gpu (one GPU index, or null for kind sim or vllm on the CPU) or gpus"
            " (a list of GPU indexes), not both; gpu: N is gpus: [N]" % field
        ]
    if not has_gpu and not has_gpus:
        return [
            "%s must have gpu (one GPU index, or null for kind sim or vllm on the CPU) or gpus"
            " (a list of GPU indexes)" % field
        ]
    if has_gpu:
        gpu = profile["gpu"]
        if gpu is None or _is_index(gpu):
            return []
        return ["%s.gpu must be a GPU index (0, 1, ...) or null, got %s" % (field, gpu)]
    gpus = profile["gpus"]
    if not isinstance(gpus, (list, tuple)):
        return ["%s.gpus must be a list of GPU indexes like [0, 1], got %s" % (field, gpus)]
    if not gpus:
        return [
            "%s.gpus must list at least one GPU index; an engine without a GPU sets gpu: null"
            " (kind sim only)" % field
        ]
    problems = [
        "%s.gpus must hold GPU indexes (0, 1, ...), got %s" % (field, gpu)
        for gpu in gpus
        if not _is_index(gpu)
    ]
    twice = sorted({gpu for gpu in gpus if _is_index(gpu) and gpus.count(gpu) > 1})
    problems += [
        "%s.gpus lists GPU %d more than once; name each GPU once" % (field, gpu) for gpu in twice
    ]
    return problems


def _field_in_use(profile):
    return "gpus" if "gpus" in profile else "gpu"


def gpu_set_problems(services):
    """Problems in the engines' GPU fields, and GPUs two engines would share outside MPS."""
    if not isinstance(services, (list, tuple)):
        return []
    problems = []
    placed = []  # (index, where, field name, GPU set, MPS instance) of each good entry
    for index, service in enumerate(services):
        if not isinstance(service, dict) or not isinstance(service.get("hardware_profile"), dict):
            continue  # the preflight template reports the missing mapping itself
        profile = service["hardware_profile"]
        field = FIELD % (index, _where(service))
        own = _profile_problems(field, profile)
        problems += own
        gpus = gpu_set(profile)
        if own or not gpus:
            continue
        instance = service.get("cuda_mps_instance")
        for other_index, other_field, other_gpus, other_instance in placed:
            shared = [gpu for gpu in gpus if gpu in other_gpus]
            if not shared or (instance is not None and instance == other_instance):
                continue
            problems.append(
                "%s.%s %s overlaps %s.%s %s on GPU %s: an engine's GPUs are its own, unless"
                " both engines join one CUDA MPS instance (cuda_mps_instance)"
                % (
                    field,
                    _field_in_use(profile),
                    _as_list(profile),
                    other_field,
                    _field_in_use(services[other_index]["hardware_profile"]),
                    _as_list(services[other_index]["hardware_profile"]),
                    ", ".join(str(gpu) for gpu in shared),
                )
            )
        placed.append((index, field, gpus, instance))
    return problems


def _as_list(profile):
    value = profile[_field_in_use(profile)]
    return "[%s]" % ", ".join(str(gpu) for gpu in value) if isinstance(value, list) else value


class FilterModule:
    """GPU set filters for the model_engine role."""

    def filters(self):
        return {"gpu_set": gpu_set, "gpu_set_problems": gpu_set_problems}
