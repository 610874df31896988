"""The fake API server's Secrets without an engine: admission as kube-apiserver decodes and
validates a Secret, the pod's references to one admitted, and a secret volume as the kubelet
writes it (payload, layout, modes, fsGroup) — in shared memory."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from reactor_fabric.runtime.kubernetes_manifests import pod_manifest, secret_manifest
from tests.kube_fake.api import ApiError
from tests.kube_fake.secret_store import admit_secret
from tests.kube_fake.secret_volumes import (
    FileProjection,
    SecretVolumes,
    VolumeSetupError,
    payload,
)
from tests.kube_fake.validation import admit_pod
from tests.unit.runtime.test_secrets_delivery import FILE_VALUE, VALUE, k8s_spec


def secret(data: dict[str, object]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": data}


def test_a_secrets_data_is_decoded_as_go_decodes_base64_and_stored_canonically() -> None:
    # Go's StdEncoding skips line breaks, and wants its padding.
    admitted = admit_secret(secret({"K": "dG9r\nZW4="}), namespace="default")
    assert admitted["data"] == {"K": "dG9rZW4="}
    assert admitted["type"] == "Opaque"
    for wrong, byte in (("YQ", 0), ("a b=", 1), ("YQ==YQ==", 4)):
        with pytest.raises(ApiError) as refused:
            admit_secret(secret({"K": wrong}), namespace="default")
        assert refused.value.code == 400
        assert refused.value.message.endswith(f"illegal base64 data at input byte {byte}")
    with pytest.raises(ApiError) as refused:
        admit_secret(secret({"K": 1}), namespace="default")
    assert "cannot unmarshal number into Go struct field Secret.data" in refused.value.message


def test_the_products_secret_and_its_pod_are_admitted_as_the_api_server_admits_them() -> None:
    spec = k8s_spec()
    stored = admit_secret(secret_manifest(spec, namespace="default"), namespace="default")
    decoded = {key: base64.b64decode(value).decode() for key, value in stored["data"].items()}
    assert decoded["GITHUB_TOKEN"] == VALUE
    assert decoded["DB_PASSWORD"] == FILE_VALUE
    pod = admit_pod(pod_manifest(spec, namespace="default"), namespace="default")
    [volume] = [v for v in pod["spec"]["volumes"] if "secret" in v]
    assert volume["secret"]["defaultMode"] == 0o440  # as given, not the default 0644
    assert pod["spec"]["securityContext"]["fsGroup"] == 65534


def test_a_secret_volumes_payload_is_its_items_with_their_modes_unless_optional() -> None:
    data = {"A": b"a", "B": b"b"}
    source: dict[str, object] = {"secretName": "s", "defaultMode": 0o400}
    assert payload(source, data) == [
        FileProjection("A", b"a", 0o400),
        FileProjection("B", b"b", 0o400),
    ]
    source["items"] = [{"key": "B", "path": "dir/b", "mode": 0o600}, {"key": "C", "path": "c"}]
    with pytest.raises(VolumeSetupError, match="references non-existent secret key: C"):
        payload(source, data)
    with pytest.raises(VolumeSetupError, match='secret "s" not found'):
        payload(source, None)
    source["optional"] = True
    assert payload(source, data) == [FileProjection("dir/b", b"b", 0o600)]
    assert payload(source, None) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the kubelet writes as root: so must the fake")
def test_a_secret_volume_is_written_in_memory_as_the_atomic_writer_lays_it_out() -> None:
    volumes = SecretVolumes()
    try:
        files = [FileProjection("TOKEN", b"t", 0o400), FileProjection("dir/key", b"k", 0o600)]
        directory = volumes.set_up("pod-uid", "secrets", files, fs_group=65534)
        assert str(directory).startswith("/dev/shm/")
        # NAME -> ..data/NAME, ..data -> ..<timestamp>/, the files there.
        assert os.readlink(directory / "TOKEN") == "..data/TOKEN"
        assert os.readlink(directory / "dir") == "..data/dir"
        data = directory / os.readlink(directory / "..data")
        assert data.name.startswith("..")
        assert (directory / "TOKEN").read_bytes() == b"t"
        # fsGroup on a read-only volume: the group, read for it, set-group-ID directories.
        token = (data / "TOKEN").stat()
        assert (token.st_uid, token.st_gid, stat.S_IMODE(token.st_mode)) == (0, 65534, 0o440)
        assert stat.S_IMODE((data / "dir" / "key").stat().st_mode) == 0o640
        root = directory.stat()
        assert (root.st_gid, stat.S_IMODE(root.st_mode)) == (65534, 0o3777)
        assert stat.S_IMODE(data.stat().st_mode) == 0o2755

        plain = volumes.set_up("other-pod", "secrets", files[:1], fs_group=None)
        token = (plain / "TOKEN").stat()
        assert (token.st_gid, stat.S_IMODE(token.st_mode)) == (0, 0o400)
        volumes.tear_down("pod-uid")
        assert not directory.exists()
        assert plain.exists()
    finally:
        root_dir = Path(directory).parents[3]
        volumes.close()
    assert not root_dir.exists()
