"""One definition each (issue 17): the decision dispatch, user names, the final job states."""

from __future__ import annotations

import pytest

from extension.scheduler import (
    FINAL_STATES,
    KINDS,
    Grow,
    JobState,
    PlanError,
    Preempt,
    Reject,
    Shrink,
    Start,
    dispatch,
    is_user_name,
    leaf_path,
    user_name_problem,
)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, kind: str):
        if kind not in KINDS:
            raise AttributeError(kind)
        return lambda decision, *args: self.calls.append((kind, decision, args)) or kind


DECISIONS = [
    pytest.param(Start("j", ("n1",)), "start", id="start"),
    pytest.param(Grow("j", ("n1",), 2), "grow", id="grow"),
    pytest.param(Shrink("j", ("n1",), 1, 30.0, "why"), "shrink", id="shrink"),
    pytest.param(Preempt("j", 30.0, "why", "k"), "preempt", id="preempt"),
    pytest.param(Reject("j", "why"), "reject", id="reject"),
]


@pytest.mark.parametrize("decision, kind", DECISIONS)
def test_dispatch_calls_the_handler_method_of_the_decision_kind(decision, kind):
    handler = Recorder()
    assert dispatch(decision, handler, 12.5) == kind
    assert handler.calls == [(kind, decision, (12.5,))]


def test_every_kind_a_cycle_returns_has_a_name_in_kinds():
    assert sorted(KINDS) == sorted(d.values[0].kind for d in DECISIONS)


def test_a_handler_without_a_kind_fails_loudly():
    class StartsOnly:
        def start(self, decision):
            return "started"

    assert dispatch(Start("j", ()), StartsOnly()) == "started"
    with pytest.raises(AttributeError, match="reject"):
        dispatch(Reject("j", "no"), StartsOnly())


USER_NAMES = [
    pytest.param("user1", None, id="plain"),
    pytest.param("a.b_c-d", None, id="dots-underscores-dashes"),
    pytest.param("x" * 255, None, id="255-characters"),
    pytest.param("x" * 256, "at most 255", id="256-characters"),
    pytest.param("", "is not allowed", id="empty"),
    pytest.param(".", "is not allowed", id="dot"),
    pytest.param("..", "is not allowed", id="dot-dot"),
    pytest.param("a/b", "is not allowed", id="slash"),
    pytest.param("bob@example.com", None, id="an-e-mail-login"),
    pytest.param("a b", "is not allowed", id="space"),
    pytest.param(7, "is not allowed", id="not-a-string"),
]


@pytest.mark.parametrize("name, problem", USER_NAMES)
def test_user_names(name, problem):
    found = user_name_problem(name)
    assert (found is None) == (problem is None) == is_user_name(name)
    if problem:
        assert problem in found
        with pytest.raises(PlanError, match=problem):
            leaf_path("/p", name)
    else:
        assert leaf_path("/p", name) == f"/p/{name}"


@pytest.mark.parametrize(
    "state, final",
    [
        ("PENDING", False),
        ("RUNNING", False),
        ("FINISHED", True),
        ("FAILED", True),
        ("REJECTED", True),
        ("CANCELLED", True),
        ("TIMEOUT", True),  # ended by the service at its runtime limit
    ],
)
def test_final_states(state, final):
    assert JobState(state).final is final
    assert (state in FINAL_STATES) is final  # the plain string too
