"""The backend protocol as declared (extension/backends/base.py): typed events with one fold
each in the service, and the optional hooks as capabilities each backend declares."""

from __future__ import annotations

import pytest

from extension.backends import base
from extension.backends.base import BackendEvent, EventKind
from extension.backends.kubernetes import KubernetesBackend
from extension.backends.local import LocalBackend
from extension.service.scheduling import FOLDS, Backend


def test_every_event_kind_has_exactly_one_fold_in_the_service() -> None:
    assert set(FOLDS) == set(EventKind)


def test_events_take_strings_of_the_protocol_and_refuse_others() -> None:
    event = BackendEvent("j1", "running", 0.0)
    assert event.kind is EventKind.RUNNING and event.kind == "running"
    with pytest.raises(ValueError, match="'started' is not one of running, resized"):
        BackendEvent("j1", "started", 0.0)


@pytest.mark.parametrize(
    ("backend", "has", "lacks"),
    [
        (
            LocalBackend,
            {base.LocalAccounts, base.WorkerPids},
            {base.Opens, base.HasQuota, base.SyncsQueues, base.ChecksAdmission},
        ),
        (
            KubernetesBackend,
            # its accounts: the uid of each user's pods (run_as_uid_base), None when unset
            {base.Opens, base.HasQuota, base.SyncsQueues, base.ChecksAdmission, base.LocalAccounts},
            {base.WorkerPids},
        ),
    ],
    ids=["local", "kubernetes"],
)
def test_each_backend_declares_its_capabilities(backend, has, lacks) -> None:
    assert issubclass(backend, Backend)
    assert all(issubclass(backend, c) for c in has)
    assert not any(issubclass(backend, c) for c in lacks)


def test_a_refusal_for_now_is_the_protocols_admission_refused() -> None:
    from extension.backends.kubernetes import AdmissionRefused

    err = AdmissionRefused("exceeded quota", permanent=False)
    assert isinstance(err, base.AdmissionRefused) and not err.permanent
