"""Spawn-page profiles in KubeSpawner's ``profile_list`` shape, for the local spawner too.

One configuration serves both spawners: ``c.KubeSpawner.profile_list`` (read by
``WmlaKubeSpawner`` through KubeSpawner itself) and ``c.WmlaLocalSpawner.profile_list`` take the
same list (or dict, or callable) with the same names:

.. code-block:: python

    profile_list = [
        {
            "display_name": "CPU only",
            "slug": "cpu",  # optional: made from display_name as KubeSpawner does
            "description": "for notebooks",
            "default": True,
        },
        {
            "display_name": "1 GPU",
            "kubespawner_override": {"gpus": 1, "cpu_guarantee": 2, "mem_guarantee": "8G"},
            "profile_options": {
                "plan": {
                    "display_name": "Plan",
                    "choices": {
                        "dev": {
                            "display_name": "dev team",
                            "kubespawner_override": {"wmla_plan": "/project1/dev-team"},
                        },
                        "qa": {
                            "display_name": "QA team",
                            "default": True,
                            "kubespawner_override": {"wmla_plan": "/project1/qa-team"},
                        },
                    },
                },
            },
        },
    ]

The user's pick arrives as KubeSpawner's ``user_options``: ``{"profile": slug, <option>:
<choice key>}`` (``<option>--unlisted-choice``: a free-form value); the form's fields are named
as KubeSpawner's (``profile``, ``profile-option-<slug>--<option>``). Overrides are applied in
KubeSpawner's order: the profile's ``kubespawner_override``, then each option's chosen (or
default) choice's, in the options' order; a dict value is merged into the trait's, ``None``
removing a key; a callable value is called with the spawner. Everything here is pure: the
spawners apply what ``select`` returns.
"""

from __future__ import annotations

import copy
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

PROFILE_KEYS = frozenset(
    {"display_name", "slug", "description", "default", "kubespawner_override", "profile_options"}
)
OPTION_KEYS = frozenset({"display_name", "choices", "unlisted_choice"})
CHOICE_KEYS = frozenset({"display_name", "default", "kubespawner_override"})
UNLISTED_KEYS = frozenset(
    {"enabled", "display_name", "display_name_in_choices", "validation_regex",
     "validation_message", "kubespawner_override"}
)  # fmt: skip
UNLISTED = "unlisted-choice"  # the select's value for "Other..." (KubeSpawner's form)
# the old shape of c.WmlaLocalSpawner.profiles: key -> the trait it now overrides
LEGACY_KEYS = {
    "plan": "wmla_plan",
    "gpu": "gpus",
    "cpu": "notebook_cpu",
    "memory": "notebook_memory",
}


class ProfileError(ValueError):
    """A profile_list that cannot be used, or a pick that is not in it; says what to fix."""


def slugify(text: str) -> str:
    """KubeSpawner's slug for a profile without one (python-slugify's default for ASCII text):
    "1 GPU" -> "1-gpu", "CPU only" -> "cpu-only"."""
    ascii_text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")


def from_legacy(profiles: Iterable[Mapping[str, Any]]) -> list[dict]:
    """``c.WmlaLocalSpawner.profiles`` of the old shape (``plan``, ``gpu``, ``cpu``,
    ``memory`` beside the profile's names) as a profile_list."""
    converted = []
    for p in profiles:
        entry = {k: v for k, v in p.items() if k not in LEGACY_KEYS}
        override = {LEGACY_KEYS[k]: v for k, v in p.items() if k in LEGACY_KEYS}
        if override:
            entry["kubespawner_override"] = {**override, **entry.get("kubespawner_override", {})}
        entry.setdefault("display_name", p.get("slug", ""))
        converted.append(entry)
    return converted


def as_list(profile_list: Any) -> list[dict]:
    """A list as is; a dict's values sorted by key, as KubeSpawner's ``_sorted_dict_values``."""
    if isinstance(profile_list, Mapping):
        return [profile_list[key] for key in sorted(profile_list)]
    return list(profile_list or [])


def validate(profile_list: list[dict], where: str = "profile_list") -> None:
    """Refuse what KubeSpawner would trip on later, or silently ignore, with what to fix."""
    slugs = set()
    for p in profile_list:
        if not isinstance(p, Mapping) or not p.get("display_name"):
            raise ProfileError(f"profile {p!r} is misconfigured: it needs a display_name ({where})")
        unknown = sorted(set(p) - PROFILE_KEYS)
        if unknown:
            hint = ""
            if set(unknown) & set(LEGACY_KEYS):
                hint = (
                    "; notebook settings go in kubespawner_override, e.g. "
                    '{"wmla_plan": "/project1/dev-team", "gpus": 1, "cpu_guarantee": 2}'
                )
            raise ProfileError(
                f"profile {p['display_name']!r} is misconfigured: unknown {', '.join(unknown)}; "
                f"a profile may have only {', '.join(sorted(PROFILE_KEYS))} ({where}){hint}"
            )
        slug = p.get("slug") or slugify(p["display_name"])
        if slug in slugs:
            raise ProfileError(f"two profiles have the slug {slug!r} ({where})")
        slugs.add(slug)
        _check_override(p.get("kubespawner_override"), f"profile {slug!r}", where)
        options = p.get("profile_options") or {}
        if not isinstance(options, Mapping):
            raise ProfileError(f"profile {slug!r}: profile_options must be a dict ({where})")
        for name, option in options.items():
            _check_option(slug, name, option, where)


def _check_option(slug: str, name: str, option: Any, where: str) -> None:
    what = f"profile {slug!r} option {name!r}"
    if not isinstance(option, Mapping):
        raise ProfileError(f"{what} must be a dict ({where})")
    unknown = sorted(set(option) - OPTION_KEYS)
    if unknown:
        raise ProfileError(
            f"{what} is misconfigured: unknown {', '.join(unknown)}; an option may have only "
            f"{', '.join(sorted(OPTION_KEYS))} ({where})"
        )
    choices = option.get("choices") or {}
    unlisted = option.get("unlisted_choice") or {}
    if not choices and not unlisted.get("enabled"):
        raise ProfileError(f"{what} has no choices ({where})")
    for key, choice in choices.items():
        if not isinstance(choice, Mapping) or set(choice) - CHOICE_KEYS:
            raise ProfileError(
                f"{what} choice {key!r} is misconfigured: a choice may have only "
                f"{', '.join(sorted(CHOICE_KEYS))} ({where})"
            )
        _check_override(choice.get("kubespawner_override"), f"{what} choice {key!r}", where)
    if set(unlisted) - UNLISTED_KEYS:
        raise ProfileError(
            f"{what} unlisted_choice may have only {', '.join(sorted(UNLISTED_KEYS))} ({where})"
        )
    if "wmla_plan" in (unlisted.get("kubespawner_override") or {}):
        # the spawner submits as a plan admin: a plan the user types would bypass membership
        raise ProfileError(
            f"{what}: an unlisted_choice may not set wmla_plan (a plan typed by the user is "
            "never checked against the plans they may use); list the plans as choices, or "
            f"leave the pick to the spawn page's plan choice ({where})"
        )


def _check_override(override: Any, what: str, where: str) -> None:
    if override is not None and not isinstance(override, Mapping):
        raise ProfileError(f"{what}: kubespawner_override must be a dict ({where})")


def initialize(profile_list: Any, where: str = "profile_list", check: bool = True) -> list[dict]:
    """KubeSpawner's ``_get_initialized_profile_list``, checked (``check``): a copy with every
    slug (made from display_name where missing), a default choice for each option with choices
    (the first, when none says so), an ``unlisted_choice`` dict, and one default profile."""
    profiles = copy.deepcopy(as_list(profile_list))
    if check:
        validate(profiles, where)
    for p in profiles:
        p.setdefault("slug", slugify(p["display_name"]))
        for option in (p.get("profile_options") or {}).values():
            choices = option.get("choices") or {}
            if choices and not any(c.get("default") for c in choices.values()):
                next(iter(choices.values()))["default"] = True
            unlisted = option.setdefault("unlisted_choice", {})
            unlisted.setdefault("enabled", False)
            if unlisted["enabled"]:
                unlisted.setdefault("display_name_in_choices", "Other...")
    if profiles and not any(p.get("default") for p in profiles):
        profiles[0]["default"] = True
    return profiles


def select(profiles: list[dict], user_options: Mapping[str, Any] | None) -> tuple[dict, list]:
    """(the picked profile, its overrides in the order to apply them) for an initialized list.

    The pick is ``user_options["profile"]`` (else the default profile) and, for each of its
    options, ``user_options[<option>]`` (a choice key) or ``<option>--unlisted-choice`` (a
    value put for ``{value}`` in the unlisted choice's override strings), else the default
    choice. Anything not in the list is refused, as KubeSpawner's validation does.
    """
    options = dict(user_options or {})
    slug = options.get("profile")
    if slug:
        profile = next((p for p in profiles if p["slug"] == slug), None)
        if profile is None:
            raise ProfileError(
                f"there is no profile {slug!r}; pick one of "
                f"{', '.join(p['slug'] for p in profiles)}"
            )
    else:
        profile = next(p for p in profiles if p.get("default"))
    overrides = [dict(profile.get("kubespawner_override") or {})]
    for name, option in (profile.get("profile_options") or {}).items():
        unlisted = option.get("unlisted_choice") or {}
        typed = options.get(f"{name}--unlisted-choice")
        choice = options.get(name)
        if typed:
            if not unlisted.get("enabled"):
                raise ProfileError(
                    f"profile {profile['slug']!r} option {name!r} takes no value of your own"
                )
            regex = unlisted.get("validation_regex")
            if regex and not re.match(regex, str(typed)):
                message = unlisted.get("validation_message") or f"it must match {regex}"
                raise ProfileError(f"{name} {typed!r} is refused: {message}")
            overrides.append(_format(unlisted.get("kubespawner_override") or {}, str(typed)))
            continue
        choices = option.get("choices") or {}
        if choice and choice != UNLISTED:
            if choice not in choices:
                raise ProfileError(
                    f"profile {profile['slug']!r} option {name!r} has no choice {choice!r}; "
                    f"pick one of {', '.join(choices)}"
                )
            overrides.append(dict(choices[choice].get("kubespawner_override") or {}))
            continue
        default = next((c for c in choices.values() if c.get("default")), None)
        if default is None:
            raise ProfileError(f"profile {profile['slug']!r} option {name!r} needs a value")
        overrides.append(dict(default.get("kubespawner_override") or {}))
    return profile, overrides


def _format(value: Any, typed: str) -> Any:
    """KubeSpawner's recursive_format: ``{value}`` in every string becomes what was typed."""
    if isinstance(value, str):
        return value.format(value=typed)
    if isinstance(value, list):
        return [_format(v, typed) for v in value]
    if isinstance(value, dict):
        return {k: _format(v, typed) for k, v in value.items()}
    return value


def plan_of(overrides: Iterable[Mapping[str, Any]]) -> str:
    """The plan the picked profile forces (its last ``wmla_plan`` override), or ""."""
    plan = ""
    for override in overrides:
        if "wmla_plan" in override and not callable(override["wmla_plan"]):
            plan = override["wmla_plan"] or ""
    return plan


def merge(current: Any, update: Mapping[str, Any]) -> dict:
    """KubeSpawner's recursive_update on a copy: nested dicts merged, ``None`` removes a key."""
    merged = copy.deepcopy(dict(current or {}))
    for key, value in update.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def options_from_form(formdata: Mapping[str, list], extra: Iterable[str] = ()) -> dict:
    """KubeSpawner's ``_options_from_form``: ``profile`` and the picked profile's
    ``profile-option-<slug>--<option>`` fields (an "Other..." pick keeps only its typed
    value), plus the ``extra`` fields (the spawn page's ``plan``)."""
    options: dict[str, Any] = {}
    slug = (formdata.get("profile") or [None])[0]
    if slug:
        options["profile"] = slug
        prefix = f"profile-option-{slug}--"
        for key, values in formdata.items():
            if key.startswith(prefix) and values and values[0] != "":
                options[key[len(prefix) :]] = values[0]
        for key in [k for k in options if k.endswith("--unlisted-choice")]:
            if options.get(key[: -len("--unlisted-choice")]) != UNLISTED:
                del options[key]  # typed, then another choice picked
    for key in extra:
        picked = formdata.get(key) or []
        if picked:
            options[key] = picked[0]
    return options


def form_html(profiles: list[dict], user_options: Mapping[str, Any] | None) -> str:
    """Radio buttons named ``profile`` (the picked or default one checked) and, in each
    profile, a select per option named as KubeSpawner's form names it."""
    import html

    def esc(value: Any) -> str:
        return html.escape(str(value), quote=True)

    options = dict(user_options or {})
    chosen = options.get("profile") or next((p["slug"] for p in profiles if p.get("default")), "")
    rows = []
    for p in profiles:
        slug = p["slug"]
        checked = " checked" if slug == chosen else ""
        row = (
            f'<label class="form-check" for="profile-item-{esc(slug)}"><input '
            f'class="form-check-input" type="radio" name="profile" id="profile-item-{esc(slug)}" '
            f'value="{esc(slug)}"{checked}> {esc(p["display_name"])}'
        )
        if p.get("description"):
            row += f' <span class="text-muted">{esc(p["description"])}</span>'
        row += "</label>"
        for name, option in (p.get("profile_options") or {}).items():
            field = f"profile-option-{slug}--{name}"
            picked = options.get(name) if slug == chosen else None
            items = []
            for key, choice in (option.get("choices") or {}).items():
                selected = key == picked or (picked is None and choice.get("default"))
                items.append(
                    f'<option value="{esc(key)}"{" selected" if selected else ""}>'
                    f"{esc(choice.get('display_name') or key)}</option>"
                )
            unlisted = option.get("unlisted_choice") or {}
            if unlisted.get("enabled"):
                items.append(
                    f'<option value="{UNLISTED}"{" selected" if picked == UNLISTED else ""}>'
                    f"{esc(unlisted.get('display_name_in_choices') or 'Other...')}</option>"
                )
            row += (
                f'<div class="form-group"><label for="{esc(field)}">'
                f"{esc(option.get('display_name') or name)}</label> "
                f'<select class="form-control" name="{esc(field)}" id="{esc(field)}">'
                + "".join(items)
                + "</select>"
            )
            if unlisted.get("enabled"):
                pattern = unlisted.get("validation_regex")
                row += (
                    f'<input class="form-control" name="{esc(field)}--unlisted-choice" '
                    f'placeholder="{esc(unlisted.get("display_name") or "")}"'
                    + (f' pattern="{esc(pattern)}"' if pattern else "")
                    + f' title="{esc(unlisted.get("validation_message") or "")}">'
                )
            row += "</div>"
        rows.append(row)
    return "<fieldset><legend>Profile</legend>" + "\n".join(rows) + "</fieldset>" if rows else ""
