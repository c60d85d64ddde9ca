"""The GPU set of a model engine (gpu or gpus) and the preflight's checks of it."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.filter.gpu_sets import gpu_set, gpu_set_problems


def engine(name, instance=None, **profile):
    entry = {"name": name, "hardware_profile": {"memory": "1G", "cpu": "100%", **profile}}
    if instance is not None:
        entry["cuda_mps_instance"] = instance
    return entry


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ({"gpu": 3}, [3]),
        ({"gpu": 0}, [0]),
        ({"gpu": None}, []),
        ({"gpus": [1, 0]}, [1, 0]),
        ({"gpus": [2]}, [2]),
    ],
)
def test_gpu_and_gpus_give_one_set_in_the_order_given(profile, expected):
    assert gpu_set(profile) == expected


@pytest.mark.parametrize(
    "profile",
    [
        {},
        {"gpu": 0, "gpus": [0]},
        {"gpus": []},
        {"gpus": [0, 0]},
        {"gpus": [-1]},
        {"gpus": [True]},
        {"gpu": "0"},
        {"gpus": "0,1"},
        "gpu 0",
    ],
)
def test_malformed_profile_has_no_set(profile):
    assert gpu_set(profile) is None


def test_good_engines_on_their_own_gpus_have_no_problem():
    services = [
        engine("a", gpu=0),
        engine("b", gpus=[1, 2]),
        engine("c", gpu=None),
        engine("d", gpu=None),
    ]
    assert gpu_set_problems(services) == []


def test_overlapping_sets_name_both_engines_the_field_and_the_shared_gpus():
    services = [engine("a", gpus=[0, 1]), engine("b", gpus=[1, 2, 0])]
    assert gpu_set_problems(services) == [
        "model_engine_services[1] (b).hardware_profile.gpus [1, 2, 0] overlaps"
        " model_engine_services[0] (a).hardware_profile.gpus [0, 1] on GPU 1, 0: an engine's"
        " GPUs are its own, unless both engines join one CUDA MPS instance (cuda_mps_instance)"
    ]


def test_a_single_gpu_inside_another_engines_set_is_an_overlap():
    problems = gpu_set_problems([engine("a", gpus=[0, 1]), engine("b", gpu=1)])
    assert len(problems) == 1
    assert problems[0].startswith(
        "model_engine_services[1] (b).hardware_profile.gpu 1 overlaps"
        " model_engine_services[0] (a).hardware_profile.gpus [0, 1] on GPU 1"
    )


def test_engines_sharing_one_mps_instance_may_share_its_gpus():
    services = [engine("a", "pair", gpus=[0, 1]), engine("b", "pair", gpus=[0, 1])]
    assert gpu_set_problems(services) == []


def test_engines_in_different_mps_instances_may_not_share_a_gpu():
    services = [engine("a", "one", gpus=[0, 1]), engine("b", "two", gpus=[1])]
    assert len(gpu_set_problems(services)) == 1


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (
            {"gpu": 0, "gpus": [0]},
            "model_engine_services[0] (a).hardware_profile: give either gpu (one GPU index, or"
            " null for kind sim or vllm on the CPU) or gpus (a list of GPU indexes), not both;"
            " gpu: N is gpus: [N]",
        ),
        (
            {},
            "model_engine_services[0] (a).hardware_profile must have gpu (one GPU index, or null"
            " for kind sim or vllm on the CPU) or gpus (a list of GPU indexes)",
        ),
        (
            {"gpus": []},
            "model_engine_services[0] (a).hardware_profile.gpus must list at least one GPU index;"
            " an engine without a GPU sets gpu: null (kind sim only)",
        ),
        (
            {"gpus": [0, 1, 0, 1]},
            "model_engine_services[0] (a).hardware_profile.gpus lists GPU 0 more than once;"
            " name each GPU once",
        ),
        (
            {"gpus": [0, -1]},
            "model_engine_services[0] (a).hardware_profile.gpus must hold GPU indexes (0, 1, ...),"
            " got -1",
        ),
        (
            {"gpus": "0,1"},
            "model_engine_services[0] (a).hardware_profile.gpus must be a list of GPU indexes"
            " like [0, 1], got 0,1",
        ),
        (
            {"gpu": -2},
            "model_engine_services[0] (a).hardware_profile.gpu must be a GPU index (0, 1, ...) or"
            " null, got -2",
        ),
    ],
)
def test_each_bad_gpu_field_is_named_with_what_it_allows(profile, message):
    assert message in gpu_set_problems([engine("a", **profile)])


def test_a_bad_entry_is_left_out_of_the_overlap_check():
    # Its own problem is reported once; a second, overlap message would only repeat it.
    problems = gpu_set_problems([engine("a", gpus=[0, 0]), engine("b", gpu=0)])
    assert len(problems) == 1
    assert "lists GPU 0 more than once" in problems[0]


def test_entries_that_are_not_mappings_are_left_to_the_preflight_template():
    assert gpu_set_problems(["not an engine", {"name": "x"}]) == []
    assert gpu_set_problems("not a list") == []
