import pytest

from extension.scheduler import PlanError, PlanTree, Resources
from extension.scheduler.resources import UNLIMITED


def gpu_limit(n):
    return Resources(n, UNLIMITED, UNLIMITED)


def base_tree() -> PlanTree:
    t = PlanTree()
    t.add("/project1", 1, gpu_limit(8))
    t.add("/project1/dev-team", 4, gpu_limit(4))
    return t


@pytest.mark.parametrize(
    "path, share, limit, message",
    [
        ("/nope/child", 1, None, "parent plan /nope does not exist"),
        ("/project1/dev-team", 1, None, "already exists"),
        ("/project1/qa", 0, None, "share must be a number above 0"),
        ("/project1/qa", -2, None, "share must be a number above 0"),
        ("/project1/qa", 1, Resources(-1, 0, 0), "gpu limit must not be negative"),
        ("/project1/qa", 1, gpu_limit(9), "above the limit 8 gpu of its parent /project1"),
        ("/project1/q a", 1, None, "use letters, digits"),
        ("/project1/..", 1, None, "not allowed"),
        ("project1", 1, None, "must start with '/'"),
        ("/project1/", 1, None, "empty segment"),
        ("/", 1, None, "must start with '/' and name a plan"),
    ],
    ids=[
        "unknown-parent",
        "duplicate",
        "zero-share",
        "negative-share",
        "negative-limit",
        "child-limit-above-parent",
        "bad-name",
        "dot-dot",
        "relative-path",
        "trailing-slash",
        "root",
    ],
)
def test_plan_validation_refuses_with_a_clear_message(path, share, limit, message):
    t = base_tree()
    before = [p.to_dict() for p in t]
    with pytest.raises(PlanError, match=message):
        t.add(path, share, limit or Resources(UNLIMITED, UNLIMITED, UNLIMITED))
    assert [p.to_dict() for p in t] == before  # a refused change writes nothing


def test_update_refuses_a_parent_limit_below_a_child_and_changes_nothing():
    t = base_tree()
    with pytest.raises(PlanError, match="dev-team: gpu limit 4 gpu is above the limit 2 gpu"):
        t.update("/project1", limit=gpu_limit(2))
    assert t.get("/project1").limit.gpu == 8
    t.update("/project1/dev-team", share=2)
    assert t.get("/project1/dev-team").share == 2


def test_remove_refuses_a_plan_with_children():
    t = base_tree()
    with pytest.raises(PlanError, match="has child plans"):
        t.remove("/project1")
    t.remove("/project1/dev-team")
    assert [p.path for p in t] == ["/project1"]


def test_user_leaf_is_created_on_first_use_with_share_one():
    t = base_tree()
    leaf = t.ensure_user_leaf("/project1/dev-team", "user1")
    assert (leaf.path, leaf.share, leaf.user_leaf) == ("/project1/dev-team/user1", 1.0, True)
    assert t.ensure_user_leaf("/project1/dev-team", "user1") is leaf
    with pytest.raises(PlanError, match="is the user leaf of user1"):
        t.ensure_user_leaf("/project1/dev-team/user1", "user2")
    with pytest.raises(PlanError, match="user name 'bad/name'"):
        t.ensure_user_leaf("/project1/dev-team", "bad/name")
    with pytest.raises(PlanError, match="has no children"):
        t.add("/project1/dev-team/user1/x")


def test_child_without_limit_may_sit_under_a_limited_parent():
    t = base_tree()
    t.add("/project1/support")
    assert t.get("/project1/support").limit.gpu == UNLIMITED
    assert [p.path for p in t.ancestors("/project1/support")] == ["/project1", "/project1/support"]


def test_from_dict_takes_parents_in_any_order():
    t = PlanTree.from_dict({"/a/b": {"share": 2, "limit": {"gpu": 2}}, "/a": {}})
    assert t.get("/a/b").share == 2.0 and t.get("/a/b").limit.gpu == 2
    assert [c.path for c in t.children("/a")] == ["/a/b"]


def test_paths_and_user_names_fit_the_store():
    """The store keeps paths in 512 characters (PostgreSQL refuses longer ones): a plan path is
    at most 256 characters and a user name 255, so every user leaf fits."""
    t = PlanTree()
    top = "/" + "p" * 255
    t.add(top)  # 256: the longest
    with pytest.raises(PlanError, match="is 257 characters long; at most 256"):
        t.add(top + "x")
    with pytest.raises(PlanError, match="at most 256"):
        t.add(top + "/child")
    leaf = t.ensure_user_leaf(top, "u" * 255)
    assert leaf.user_leaf and len(leaf.path) == 512
    with pytest.raises(PlanError, match="user name is 256 characters long; at most 255"):
        t.ensure_user_leaf(top, "u" * 256)
