"""One profile_list, KubeSpawner's shape, serves both spawners the same way.

The same list is given to WmlaLocalSpawner and to the real KubeSpawner under WmlaKubeSpawner
(offline: ``_mock=True``, a dummy kubeconfig, admission stubbed to record the job body). For
every pick both spawners send the wmla service the same notebook job (plan, GPUs, cpu,
memory); the local spawner's initialized list is KubeSpawner's own
``_get_initialized_profile_list``; its spawn page has the field names of KubeSpawner's form, and
the same form data make the same ``user_options`` through either.
"""

from __future__ import annotations

import copy
import re
import types

import pytest
from traitlets.config import Config

from spawner import profiles as shapes
from spawner.local import WmlaLocalSpawner
from spawner.mixin import AdmissionError

pytest.importorskip("kubespawner")

from kubespawner import KubeSpawner  # noqa: E402

from spawner.kube import WmlaKubeSpawner  # noqa: E402
from tests.spawner.test_kube import dummy_kubeconfig  # noqa: E402, F401 - the fixture

PROFILE_LIST = [
    {"display_name": "CPU only", "slug": "cpu", "description": "for notebooks"},
    {
        "display_name": "1 GPU",  # no slug: "1-gpu", made as KubeSpawner makes it
        "description": "stopped after 15 idle minutes",
        "kubespawner_override": {"gpus": 1, "cpu_guarantee": 2, "mem_guarantee": "8G"},
        "profile_options": {
            "team": {
                "display_name": "Team",
                "choices": {  # none marked default: the first is
                    "dev": {
                        "display_name": "dev team",
                        "kubespawner_override": {"wmla_plan": "/project1/dev-team"},
                    },
                    "qa": {
                        "display_name": "QA team",
                        "kubespawner_override": {"wmla_plan": "/project1/qa-team"},
                    },
                },
            },
            "size": {
                "display_name": "Memory",
                "choices": {
                    "small": {"display_name": "8 GB", "default": True},
                    "large": {
                        "display_name": "32 GB",
                        "kubespawner_override": {"mem_guarantee": "32G"},
                    },
                },
                "unlisted_choice": {
                    "enabled": True,
                    "display_name": "Memory (e.g. 12G)",
                    "validation_regex": "^[0-9]{1,3}G$",
                    "validation_message": "a number of G, at most 999G",
                    "kubespawner_override": {"mem_guarantee": "{value}"},
                },
            },
        },
    },
    {
        "display_name": "Research box",
        "slug": "research",
        "default": True,
        "kubespawner_override": {"wmla_plan": "/project2/research", "image": "research:1"},
    },
]

PICKS = [
    ({}, "/project2/research", 0, None),  # the default profile
    ({"profile": "cpu"}, "/sample-project/notebooks", 0, None),
    ({"profile": "1-gpu"}, "/project1/dev-team", 1, 8 * 2**30),
    ({"profile": "1-gpu", "team": "qa"}, "/project1/qa-team", 1, 8 * 2**30),
    ({"profile": "1-gpu", "team": "qa", "size": "large"}, "/project1/qa-team", 1, 32 * 2**30),
    (
        {"profile": "1-gpu", "size": "unlisted-choice", "size--unlisted-choice": "12G"},
        "/project1/dev-team",
        1,
        12 * 2**30,
    ),
]


def shared_config(profile_list=PROFILE_LIST) -> Config:
    """One profile_list for both spawners, as a jupyterhub_config.py would write it."""
    c = Config()
    c.WmlaLocalSpawner.profile_list = copy.deepcopy(profile_list)
    c.KubeSpawner.profile_list = copy.deepcopy(profile_list)  # WmlaKubeSpawner reads it
    for cls in ("WmlaLocalSpawner", "WmlaKubeSpawner"):
        c[cls].service_url = "http://hub:8081/services/wmla/"
        c[cls].notebook_cpu = ""
    return c


def user(name: str = "alice") -> types.SimpleNamespace:
    return types.SimpleNamespace(name=name, id=7, url=f"/user/{name}/", groups=[], settings={})


async def local_body(options: dict, config: Config | None = None) -> dict:
    spawner = WmlaLocalSpawner(config=config or shared_config())
    spawner.user = user()
    spawner.user_options = options
    await spawner.wmla_load_profile()  # what start() does before the admission
    return spawner.wmla_job_body(spawner.wmla_plan_path())


async def kube_spawner(options: dict, config: Config | None = None) -> WmlaKubeSpawner:
    spawner = WmlaKubeSpawner(config=config or shared_config(), _mock=True, user=user())
    spawner.user_options = options

    async def admit() -> str:  # the service's side is tests/spawner/test_local.py's
        plan = spawner.wmla_plan_path()
        spawner.sent = spawner.wmla_job_body(plan)
        spawner.wmla_leaf = f"{plan}/{spawner.user.name}"
        return plan

    spawner.wmla_admit = admit
    await spawner.load_user_options()  # KubeSpawner's overrides, then the wmla admission
    return spawner


@pytest.mark.parametrize(("options", "plan", "gpus", "memory"), PICKS)
async def test_both_spawners_ask_the_service_for_the_same_notebook(
    options, plan, gpus, memory
) -> None:
    local = await local_body(options)
    kube = (await kube_spawner(options)).sent
    assert local == kube
    assert local["plan"] == plan and local["resources"]["gpu"] == gpus
    if memory is None:
        assert "memory" not in local["resources"]
    else:
        assert local["resources"]["memory"] == memory
        assert local["resources"]["cpu"] == "2000m"  # cpu_guarantee 2


async def test_the_gpu_profile_also_shapes_the_pod() -> None:
    spawner = await kube_spawner({"profile": "1-gpu", "team": "qa"})
    pod = spawner.api.api_client.sanitize_for_serialization(await spawner.get_pod_manifest())
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "1"
    # held to its request: no limit was configured (spawner/kube.py _hold_to_grant)
    assert {k: resources["limits"][k] for k in ("cpu", "memory")} == resources["requests"]
    assert pod["metadata"]["annotations"]["wmla.jupyter.org/plan"] == "/project1/qa-team"
    box = await kube_spawner({"profile": "research"})
    assert box.image == "research:1"  # a KubeSpawner-only setting, applied by KubeSpawner


def test_the_initialized_list_is_kubespawners() -> None:
    ours = shapes.initialize(PROFILE_LIST)
    theirs = KubeSpawner._get_initialized_profile_list(None, PROFILE_LIST)
    assert ours == theirs
    assert [p["slug"] for p in ours] == ["cpu", "1-gpu", "research"]
    by_key = {"b": PROFILE_LIST[0], "a": PROFILE_LIST[2]}  # a dict: values sorted by key
    sorted_values = KubeSpawner._sorted_dict_values(None, by_key)
    assert shapes.initialize(by_key) == KubeSpawner._get_initialized_profile_list(
        None, sorted_values
    )


@pytest.mark.parametrize(
    "name", ["1 GPU", "CPU only", "Team Box_2!", "  spaced  out ", "Ünïcode Böx"]
)
def test_slugs_are_made_as_kubespawner_makes_them(name: str) -> None:
    from slugify import slugify  # kubespawner's dependency

    assert shapes.slugify(name) == slugify(name)


async def test_the_spawn_page_has_kubespawners_field_names_and_reads_the_same() -> None:
    kube = WmlaKubeSpawner(config=shared_config(), _mock=True, user=user())
    kube.user_options = {}
    theirs = kube._render_options_form(PROFILE_LIST)
    local = WmlaLocalSpawner(config=shared_config())
    local.user, local.user_options = user(), {}
    ours = local.wmla_options_form([], await local.wmla_profile_list())

    def fields(form: str) -> set[str]:
        return set(re.findall(r'\b(?:data-)?name="([^"]+)"', form))

    assert fields(ours) == fields(theirs)
    assert "profile-option-1-gpu--team" in fields(ours)

    def values(form: str, field: str) -> list[str]:
        select = re.search(rf'<select[^>]*name="{re.escape(field)}".*?</select>', form, re.S)
        return re.findall(r'<option value="([^"]+)"', select.group(0))

    for field in ("profile-option-1-gpu--team", "profile-option-1-gpu--size"):
        assert values(ours, field) == values(theirs, field)
    # the default profile is checked on both pages
    assert re.search(r'value="research"\s*checked', theirs)
    assert 'value="research" checked' in ours
    for formdata in (
        {"profile": ["1-gpu"], "profile-option-1-gpu--team": ["qa"]},
        {"profile": ["cpu"], "profile-option-1-gpu--team": ["qa"]},  # another profile's
        {
            "profile": ["1-gpu"],
            "profile-option-1-gpu--size": ["unlisted-choice"],
            "profile-option-1-gpu--size--unlisted-choice": ["12G"],
        },
    ):
        expected = KubeSpawner._options_from_form(kube, formdata)
        assert local.wmla_options_from_form(formdata) == expected
        assert local.wmla_options_from_form({**formdata, "plan": ["/p"]}) == {
            **expected,
            "plan": "/p",
        }


async def test_a_later_spawn_starts_from_the_configured_values() -> None:
    """One spawner object started again (JupyterHub keeps it after a failed spawn): what the
    previous profile changed is put back, so a CPU server after a GPU one asks for no GPU."""
    spawner = WmlaLocalSpawner(config=shared_config())
    spawner.user = user()
    spawner.user_options = {"profile": "1-gpu", "size": "large"}
    await spawner.wmla_load_profile()
    assert (spawner.gpus, spawner.mem_guarantee) == (1, 32 * 2**30)
    spawner.user_options = {"profile": "cpu"}
    await spawner.wmla_load_profile()
    assert (spawner.gpus, spawner.mem_guarantee, spawner.wmla_plan) == (0, None, "")
    assert spawner.wmla_job_body(spawner.wmla_plan_path())["resources"] == {"gpu": 0}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"profile": "nope"}, "there is no profile 'nope'; pick one of cpu, 1-gpu, research"),
        ({"profile": "1-gpu", "team": "ops"}, "has no choice 'ops'; pick one of dev, qa"),
        (
            {"profile": "1-gpu", "size": "unlisted-choice", "size--unlisted-choice": "1T"},
            "size '1T' is refused: a number of G, at most 999G",
        ),
        ({"profile": "cpu", "team--unlisted-choice": "x"}, None),  # not cpu's option: ignored
    ],
)
async def test_picks_outside_the_list_are_refused(options, message) -> None:
    if message is None:
        assert (await local_body(options))["plan"] == "/sample-project/notebooks"
        return
    with pytest.raises(AdmissionError, match=re.escape(message)):
        await local_body(options)
    with pytest.raises(AdmissionError, match=re.escape(message)):  # the same sentence
        await kube_spawner(options)


@pytest.mark.parametrize(
    ("profile_list", "message"),
    [
        ([{"slug": "x"}], "needs a display_name"),
        ([{"display_name": "x", "gpu": 1}], "go in kubespawner_override"),
        ([{"display_name": "A b"}, {"display_name": "a-b"}], "two profiles have the slug 'a-b'"),
        (
            [{"display_name": "x", "profile_options": {"o": {"display_name": "o"}}}],
            "option 'o' has no choices",
        ),
        (
            [
                {
                    "display_name": "x",
                    "profile_options": {
                        "plan": {
                            "unlisted_choice": {
                                "enabled": True,
                                "kubespawner_override": {"wmla_plan": "{value}"},
                            }
                        }
                    },
                }
            ],
            "an unlisted_choice may not set wmla_plan",
        ),
    ],
)
async def test_a_profile_list_that_cannot_work_is_refused_with_what_to_fix(
    profile_list, message
) -> None:
    with pytest.raises(AdmissionError, match=message):
        await local_body({}, shared_config(profile_list))


async def test_a_callable_profile_list_and_the_deprecated_shape() -> None:
    async def per_user(spawner) -> list[dict]:
        return [{"display_name": f"{spawner.user.name}'s box", "kubespawner_override": {"gpus": 2}}]

    c = shared_config()
    c.WmlaLocalSpawner.profile_list = per_user
    assert (await local_body({"profile": "alice-s-box"}, c))["resources"]["gpu"] == 2
    old = Config()
    old.WmlaLocalSpawner.profiles = [
        {"slug": "gpu", "display_name": "1 GPU", "gpu": 1, "plan": "/p/q", "memory": "2Gi"}
    ]
    old.WmlaLocalSpawner.service_url = "http://hub:8081/services/wmla/"
    body = await local_body({"profile": "gpu"}, old)
    assert body["plan"] == "/p/q" and body["resources"] == {"gpu": 1, "memory": "2Gi"}


async def test_the_hub_hands_the_pick_to_the_spawners_hook(caplog) -> None:
    """JupyterHub (5.3+) calls apply_user_options before pre_spawn_hook and start(): both
    spawners handle the options there (no "Received unhandled user_options" in the hub's log),
    and a pick outside the list is the request's 400 with the sentence, before the spawn."""
    from tornado import web

    local = WmlaLocalSpawner(config=shared_config())
    local.user = user()
    kube = WmlaKubeSpawner(config=shared_config(), _mock=True, user=user())
    for spawner in (local, kube):
        spawner.user_options = {"profile": "1-gpu", "team": "qa"}
        # what jupyterhub.user.User.spawn calls, with the options it stored on the spawner
        await spawner._run_apply_user_options(spawner.user_options)
        spawner.user_options = {"profile": "1-gpu", "team": "ops"}
        with pytest.raises(web.HTTPError) as refused:
            await spawner._run_apply_user_options(spawner.user_options)
        assert refused.value.status_code == 400
        assert "has no choice 'ops'; pick one of dev, qa" in refused.value.log_message
    assert "unhandled user_options" not in caplog.text
