"""A runtime's image reference: the forms skopeo pulls (``docker://HOST[:PORT]/PATH`` with a
tag or a digest), a bare ``HOST/PATH`` taken as ``docker://``, and every other form refused
with the form to give; a spec with a runtime written and read back the same."""

from __future__ import annotations

import pytest

from common.contract import Refusal, check_image_ref, check_runtime_name
from common.job_spec import JobSpec
from domain.specs import check_spec
from domain.values import InvalidValue

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(("given", "kept"), [
    ("docker://nvcr.io/nvidia/pytorch:25.06-py3", "docker://nvcr.io/nvidia/pytorch:25.06-py3"),
    ("nvcr.io/nvidia/pytorch:25.06-py3", "docker://nvcr.io/nvidia/pytorch:25.06-py3"),
    (f"registry.example.com:5000/team/train@{DIGEST}",
     f"docker://registry.example.com:5000/team/train@{DIGEST}"),
    ("docker://localhost:5000/train", "docker://localhost:5000/train"),
    (f"docker://docker.io/library/ubuntu:24.04@{DIGEST}",
     f"docker://docker.io/library/ubuntu:24.04@{DIGEST}"),
])  # fmt: skip
def test_an_image_in_a_registry_is_kept_with_docker_written_out(given: str, kept: str) -> None:
    assert check_image_ref(given) == kept


@pytest.mark.parametrize(("given", "said"), [
    ("ubuntu:24.04", "the registry's host is needed"),
    ("docker://nvcr.io", "is not an image reference"),
    ("docker://nvcr.io/Nvidia/pytorch", "is not an image reference"),
    ("docker://nvcr.io/nvidia/pytorch:", "is not an image reference"),
    ("docker://nvcr.io/nvidia/pytorch@sha256:abc", "is not an image reference"),
    ("oci:///var/images/pytorch", "another transport"),
    ("docker://nvcr.io/nvidia/pytorch:25.06 --src-creds=x", "is not an image reference"),
    ("docker://-nvcr.io/x", "is not an image reference"),
    ("docker://nvcr.io/" + "x" * 600, "is not an image reference"),
])  # fmt: skip
def test_what_is_no_image_reference_is_refused_with_the_form_to_give(given: str, said: str) -> None:
    with pytest.raises(Refusal, match=said) as refused:
        check_image_ref(given)
    assert "docker://HOST[:PORT]/PATH" in str(refused.value)


def test_a_runtime_name_follows_the_contracts_rule() -> None:
    assert check_runtime_name("nvidia-25.06") == "nvidia-25.06"
    with pytest.raises(Refusal, match="letters, digits"):
        check_runtime_name("nvidia 25.06")


def test_a_spec_without_a_runtime_writes_none_of_its_fields() -> None:
    written = JobSpec(repository_url="/r", entry_point=("t.py",)).to_dict()
    assert not {"runtime", "runtime_image", "registry_secret", "registry_secret_owner"} & set(
        written
    )
    assert JobSpec.from_dict(written).runtime_image is None


def test_a_spec_pinned_to_a_runtime_is_read_back_as_written_and_checked() -> None:
    spec = JobSpec(repository_url="https://github.com/a/b", entry_point=("t.py",),
                   runtime="nvidia-25.06", runtime_image="docker://nvcr.io/nvidia/pytorch:25.06-py3",
                   registry_secret="ngc", registry_secret_owner="admin")  # fmt: skip
    written = spec.to_dict()
    assert written["runtime_image"] == "docker://nvcr.io/nvidia/pytorch:25.06-py3"
    assert (written["registry_secret"], written["registry_secret_owner"]) == ("ngc", "admin")
    assert JobSpec.from_dict(written) == spec
    check_spec(written)


def test_a_spec_whose_pinned_image_is_no_reference_is_refused_by_the_domain() -> None:
    spec = {"repository_url": "https://github.com/a/b", "entry_point": ["t.py"],
            "accels": 1, "nodes": 1, "runtime": "x", "runtime_image": "ubuntu"}  # fmt: skip
    with pytest.raises(InvalidValue, match="not an image reference") as refused:
        check_spec(spec)
    assert refused.value.field == "runtime_image"
