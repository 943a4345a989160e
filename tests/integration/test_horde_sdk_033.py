"""horde_sdk 0.33.3 against a live horde, client and worker side.

horde_sdk 0.33 needs Python 3.12, the project runs on 3.11: the SDK runs in
a venv of its own (``HORDELITE_TEST_PYTHON312`` names the interpreter; .ci/run
sets it when one is installed), made once under ~/.cache/hordelite and
reused, and drives tests/compat/sdk033_probe.py against a horde served here.
Without such an interpreter the test is skipped, saying so.

Every one of the SDK's request classes is either run (and must succeed, or
get the AI Horde's own refusal, each answer validated with the SDK's models)
or listed by the probe as not served, with the reason; the test fails on a
class in neither.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest

from tests.compat import sdk033_venv
from tests.integration._env import open_env

pytestmark = pytest.mark.anyio

PROBE = Path(__file__).parent.parent / "compat" / "sdk033_probe.py"


def sdk_python() -> Path:
    """The venv's interpreter with horde_sdk 0.33.3 (made when missing; .ci/run
    makes it before the tests, outside this test's time limit)."""
    interpreter = os.environ.get("HORDELITE_TEST_PYTHON312", "")
    if not interpreter or not Path(interpreter).exists():
        pytest.skip(
            "no Python 3.12 interpreter (HORDELITE_TEST_PYTHON312): horde_sdk 0.33 needs one"
        )
    return sdk033_venv.sdk_python(interpreter)


# Fields of the SDK's response models a horde answer leaves out by design
# (the SDK then shows its default); any other field left out fails the test.
_USER_NOT_KEPT = {
    "active_generations",
    "admin_comment",
    "contact",
    "customizer",
    "deleted",
    "education",
    "flagged",
    "monthly_kudos",
    "records",
    "service",
    "sharedkey_ids",
    "special",
    "styles",
    "vpn",
}
_WORKER_NOT_KEPT = {
    # image workers' fields
    "annotation_types",
    "controlnet",
    "extended_controlnet",
    "forms",
    "img2img",
    "lora",
    "max_pixels",
    "megapixelsteps_generated",
    "painting",
    "post_processing",
    "sdxl_controlnet",
    # moderation, teams and messages are not part of a worker's details here
    "contact",
    "ipaddr",
    "messages",
    "suspicious",
    "team",
}
ABSENT_BY_DESIGN: dict[str, set[str]] = {
    # One document answers the format asked for (html by default).
    "AIHordeGetTermsRequest": {"markdown"},
    "AIHordeGetPrivacyPolicyRequest": {"markdown"},
    "AIHordeGetSponsorsRequest": {"markdown"},
    # Sent when there is something to say.
    "TextGenerateAsyncRequest": {"message", "warnings", "resolved"},
    # Request options of 0.33's AI Horde that hordelite does not take.
    "TextGenerateSubmittedRequest": {
        "context_fit",
        "disable_batching",
        "extra_slow_workers",
        "extra_source_images",
        "template_fields",
        "validated_backends",
    },
    "FindUserRequest": _USER_NOT_KEPT,
    # Another user's view hides its workers' ids, as on the AI Horde.
    "ListUsersDetailsRequest": _USER_NOT_KEPT | {"worker_ids"},
    "SingleUserDetailsRequest": _USER_NOT_KEPT | {"worker_ids"},
    "AllWorkersDetailsRequest": _WORKER_NOT_KEPT,
    "SingleWorkerNameDetailsRequest": _WORKER_NOT_KEPT,
    "SingleWorkerDetailsRequest": _WORKER_NOT_KEPT,
}
# Answers that hold only what the call changed, as the AI Horde's do.
CHANGES_ONLY = {"ModifyUserRequest", "ModifyWorkerRequest"}


@pytest.mark.parametrize("anyio_backend", ["trio"])  # the SDK runs in its own process
async def test_every_request_class_of_horde_sdk_0_33_succeeds_or_is_not_served_by_design() -> None:
    python = await anyio.to_thread.run_sync(sdk_python)
    async with open_env(requester_kudos=1000) as env:
        admin = await env.horde.create_key("root", admin=True)
        bob_user = await env.horde.horde.directory.find_user(env.owner)
        setup = {
            "url": env.horde.url,
            "alice": env.requester,
            "bob": env.owner,
            "admin": admin,
            "bob_name": f"{bob_user.username}#{bob_user.id}",
        }
        done = await anyio.run_process(
            [str(python), str(PROBE), json.dumps(setup)],
            check=False,
            env={
                **os.environ,
                "HORDE_SDK_DISABLE_CUSTOM_SINKS": "1",
                "AI_HORDE_URL": env.horde.url + "/api/",
            },
        )
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    results, not_served = report["results"], report["not_served"]
    failed = {name: r for name, r in results.items() if not r["ok"]}
    assert not failed, json.dumps(failed, indent=1)
    unaccounted = set(report["classes"]) - set(results) - set(not_served) - {"(probe stopped)"}
    assert not unaccounted, f"request classes neither run nor listed as not served: {unaccounted}"
    assert not set(results) & set(not_served)
    left_out = {
        name: sorted(set(r.get("missing", [])) - ABSENT_BY_DESIGN.get(name, set()))
        for name, r in results.items()
        if name not in CHANGES_ONLY
    }
    assert not {n: f for n, f in left_out.items() if f}, "fields the SDK would fill with defaults"
