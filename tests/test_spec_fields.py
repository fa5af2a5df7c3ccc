"""The run spec's fields on msgspec: each field's doc and constraint in its annotation, a
refusal in xrun's words naming the field, and flags merged over a run file by each field's rule."""

from __future__ import annotations

import msgspec
import pytest

from manifests.spec import FIELDS, RunSpec, build_spec
from xrun_contract.errors import XrunError, short_repr

BASE = {"name": "ok", "accelerator": "cpu-2", "image": "img", "storage": "/tmp/xrun-spec-fields"}


def test_every_field_has_a_one_line_doc():
    info = msgspec.inspect.type_info(RunSpec)
    assert isinstance(info, msgspec.inspect.DataclassType)
    assert [f.name for f in info.fields] == list(FIELDS)
    for f in info.fields:
        assert isinstance(f.type, msgspec.inspect.Metadata), f.name
        doc = (f.type.extra_json_schema or {}).get("description", "")
        assert doc and "\n" not in doc, f.name


@pytest.mark.parametrize("key,value,line", [
    ("max_restarts", 101, "max_restarts: must be 0..100, got 101"),
    ("max_restarts", True, "max_restarts: must be an integer, got True"),
    ("termination_grace_seconds", 0, "termination_grace_seconds: must be 1..3600, got 0"),
    ("coordinator_port", 70000, "coordinator_port: must be 1..65535, got 70000"),
    ("num_slices", 0, "num_slices: must be >= 1, got 0"),
    ("restartable_exit_codes", [42, 256], "restartable_exit_codes: must be a non-empty list of codes in 1..255, "
                                          "got [42, 256]"),
    ("restartable_exit_codes", [], "restartable_exit_codes: must be a non-empty list of codes in 1..255, got []"),
    ("backend", "slurm", "backend: must be local or kube, got 'slurm'"),
    ("code_sha256", "abc", "code_sha256: must be 64 lowercase hex digits, got 'abc'"),
    ("commit", "a\nb", "commit: must be one line of at most 200 characters, got 'a\\nb'"),
    ("branch", "b" * 201, "branch: must be one line of at most 200 characters, got " + short_repr("b" * 201)),
    ("queue", "Team A", "queue: must be a valid label value / DNS-1123 label (lowercase letters, digits, '-'; "
                        "at most 63), got 'Team A'"),
    ("service_account", "Bad_SA", "service_account: must be a Kubernetes object name (lowercase letters, digits, "
                                  "'-' and '.'), got 'Bad_SA'"),
    ("privileged", "yes", "privileged: must be true or false, got 'yes'"),
    ("tolerations", [1], "tolerations: must be a list of mappings, got [1]"),
    ("networks", [1], "networks: must be a list of names, got [1]"),
    ("image", ["x"], "image: must be a string, got ['x']"),
])
def test_a_constraint_refuses_in_one_line_naming_the_field(key, value, line):
    for file_values, flags in (({**BASE, key: value}, {}), (BASE, {key: value})):
        with pytest.raises(XrunError) as e:
            build_spec(file_values, flags)
        assert str(e.value) == line


def test_yaml_scalars_are_read_as_the_field_wants():
    spec = build_spec({**BASE, "commit": 1234567, "max_restarts": "7", "env": {"N": 8, "ON": True},
                       "image_pull_secrets": "regcred"}, {})
    assert (spec.commit, spec.max_restarts, spec.env, spec.image_pull_secrets) == (
        "1234567", 7, {"N": "8", "ON": "true"}, ["regcred"])


def test_flags_merge_maps_add_lists_and_replace_the_rest():
    file_values = {**BASE, "env": {"A": "1", "B": "1"}, "image_pull_secrets": ["a"], "max_restarts": 5,
                   "tolerations": [{"operator": "Exists"}], "restartable_exit_codes": [42, 143]}
    flags = {"env": {"B": "2"}, "image_pull_secrets": ["b"], "tolerations": [{"key": "k", "operator": "Exists"}],
             "restartable_exit_codes": [7], "max_restarts": 1, "pod_labels": None}
    spec = build_spec(file_values, flags)
    assert spec.env == {"A": "1", "B": "2"}
    assert spec.image_pull_secrets == ["a", "b"]
    assert spec.tolerations == [{"operator": "Exists"}, {"key": "k", "operator": "Exists"}]
    assert (spec.restartable_exit_codes, spec.max_restarts, spec.pod_labels) == ([7], 1, {})


def test_a_replaced_spec_is_checked_again():
    import dataclasses

    from manifests.spec import validate

    spec = build_spec(BASE, {})
    with pytest.raises(XrunError, match=r"^queue: must be a valid label value"):
        validate(dataclasses.replace(spec, queue="Not A Queue"))
