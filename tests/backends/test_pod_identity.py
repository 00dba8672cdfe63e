"""Who a user's pods run as (manifests/identity.py, the backend's ``run_as_uid_base``): one uid
per user name, the same the spawner's notebook pod gets, never root; the service owns the
user's folder with it (``account_for``)."""

from __future__ import annotations

import pytest

from extension.backends import manifests as m
from extension.backends.kubernetes import KubernetesBackend
from extension.backends.kubernetes.options import resolve
from hub_config.kubernetes import UID_BASE, user_uid

try:
    from tests.backends.test_kubernetes import Recorder, spec
except ImportError:  # tests/backends is not a package: pytest put its folder on sys.path
    from test_kubernetes import Recorder, spec


def test_a_user_has_one_stable_uid_above_the_base() -> None:
    uids = {user: m.pod_uid(user, 200000) for user in ("alice", "bob", "carol", "a" * 63)}
    assert uids == {user: m.pod_uid(user, 200000) for user in uids}  # stable
    assert len(set(uids.values())) == len(uids)
    assert all(200000 <= uid <= m.MAX_UID for uid in uids.values())
    assert m.pod_uid("alice", 200000) != m.pod_uid("alice", 300000)


@pytest.mark.parametrize("base", [0, -5, m.MAX_UID, "many"])
def test_a_bad_base_is_refused_naming_the_option(base, monkeypatch) -> None:
    monkeypatch.setenv("WMLA_K8S_RUN_AS_UID_BASE", str(base))
    with pytest.raises(ValueError, match="run_as_uid_base .* must be a whole number"):
        resolve(namespace="wmla")


def test_worker_pods_run_as_the_users_uid_with_no_privileges() -> None:
    backend = KubernetesBackend(Recorder(), namespace="wmla", run_as_uid_base=200000)
    job = backend.build_job(spec(user="alice", workers=(2, 2)), 2)
    uid = m.pod_uid("alice", 200000)
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        (container,) = replica["template"]["spec"]["containers"]
        assert container["securityContext"] == {
            "runAsUser": uid,
            "runAsGroup": uid,
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["HOME"] == "/gpfs/myresultfs/alice"
        assert env["USER"] == env["LOGNAME"] == "alice"  # getpass.getuser(): no passwd entry
        # the job's folder made first, by the user (the runtime would make it as root)
        (init,) = replica["template"]["spec"]["initContainers"]
        assert init["securityContext"] == container["securityContext"]
        assert init["command"][-1] == container["workingDir"] == "/gpfs/myresultfs/alice/jobs/job-1"
        assert init["volumeMounts"] == container["volumeMounts"]
    account = backend.account_for("alice", home="/x")
    assert (account.uid, account.gid, account.home) == (uid, uid, "/x")
    assert account.name == "k8s:alice"  # no local name: no local user's groups come with it


def test_without_a_base_pods_run_as_their_image_user() -> None:
    backend = KubernetesBackend(Recorder(), namespace="wmla")
    job = backend.build_job(spec(user="alice"), 1)
    (replica,) = job["spec"]["pytorchReplicaSpecs"].values()
    (container,) = replica["template"]["spec"]["containers"]
    assert "securityContext" not in container
    assert "initContainers" not in replica["template"]["spec"]
    assert backend.account_for("alice") is None


def test_the_notebook_pod_gets_the_uid_its_jobs_get() -> None:
    class Spawner:
        user = type("U", (), {"name": "alice"})()

    assert user_uid(Spawner()) == m.pod_uid("alice", UID_BASE)
