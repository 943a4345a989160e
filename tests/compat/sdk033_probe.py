"""horde_sdk 0.33's request classes against a live horde, run by
tests/integration/test_horde_sdk_033.py under a Python 3.12 interpreter
with horde_sdk 0.33.3 installed (the SDK needs 3.12; the project runs 3.11).

Usage: python sdk033_probe.py '<json: url, alice, bob, admin, bob_name>'

Every request is prepared by the SDK's own path (what its clients call
before sending), sent with requests (an SDK dependency), and its answer
validated with the SDK's response model for the status, or, for a refusal
the case expects, with the SDK's error model and a return code it knows.
Prints one JSON object: the results by class name, and the SDK's classes
on the text side, served or not, so the test checks the table is whole.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from typing import Any

import horde_sdk.ai_horde_api.apimodels as m
import requests
from horde_sdk import RequestErrorResponse
from horde_sdk.ai_horde_api import AIHordeAPIManualClient
from horde_sdk.ai_horde_api.consts import GENERATION_STATE, MODEL_TYPE, RC
from horde_sdk.generic_api.apimodels import HordeRequest

MODEL = "fake-model"
WORKER = "sdk033-worker"
_SDK = AIHordeAPIManualClient()

# The SDK's classes this text horde does not serve, and why (also in
# docs/reference/native_api.md): the image and interrogation side, and the
# AI Horde's moderation, team, style and collection editing.
NOT_SERVED: dict[str, str] = {}
for _name in (
    "ImageGenerateAsyncRequest ImageGenerateCheckRequest ImageGenerateJobPopRequest "
    "ImageGenerateStatusRequest DeleteImageGenerateRequest ImageGenerationJobSubmitRequest "
    "ImageGenerateSubmittedRequest RateRequest ImageStatsModelsRequest "
    "ImageStatsModelsTotalRequest AlchemyAsyncRequest AlchemyPopRequest AlchemyStatusRequest "
    "AlchemyDeleteRequest AlchemyJobSubmitRequest AllStylesImageRequest "
    "CreateStyleImageRequest DeleteStyleImageRequest SingleStyleImageByIDRequest "
    "ModifyStyleImageRequest StyleImageExampleAddRequest StyleImageExampleDeleteRequest "
    "StyleImageExampleModifyRequest SingleStyleImageByNameRequest SamplerConstraintsRequest"
).split():
    NOT_SERVED[_name] = "images: this horde serves text"
for _name in ("KudosAwardRequest DeleteUserRequest").split():
    NOT_SERVED[_name] = "moderation: the operator's CLI does it"
for _name in (
    "CreateTeamRequest ModifyTeamRequest DeleteTeamRequest CreateStyleTextRequest "
    "ModifyStyleTextRequest DeleteStyleTextRequest SingleStyleTextByIDRequest "
    "SingleStyleTextByNameRequest StyleContractRequest AllCollectionsRequest "
    "CreateCollectionRequest DeleteCollectionRequest CollectionByIDRequest "
    "UpdateCollectionRequest CollectionByNameRequest"
).split():
    NOT_SERVED[_name] = "no teams, styles or collections kept (decision 0055)"


def every_class() -> set[str]:
    return {
        name
        for name, cls in inspect.getmembers(m, inspect.isclass)
        if issubclass(cls, HordeRequest) and not inspect.isabstract(cls)
    }


def missing_fields(model: Any, raw: Any) -> list[str]:
    """The fields of the SDK's model the answer left out (the SDK then
    fills in its default, 0 or false, as if the horde had said so); of a
    list's first item for a list answer."""
    fields = getattr(model, "model_fields", {})
    if "root" in fields:  # a list (or mapping) answer
        if not isinstance(raw, list) or not raw:
            return []
        inner = getattr(fields["root"].annotation, "__args__", [None])[0]
        return missing_fields(inner, raw[0]) if inner is not None else []
    if not isinstance(raw, dict):
        return []
    return sorted(
        (info.alias or name)
        for name, info in fields.items()
        if (info.alias or name) not in raw and name not in raw
    )


class Probe:
    def __init__(self, setup: dict[str, Any]) -> None:
        self.url = setup["url"]
        self.keys = setup
        self.results: dict[str, dict[str, Any]] = {}
        self.session = requests.Session()
        self.last: Any = None  # the last answer's JSON, for what a model leaves out

    def send(self, request: HordeRequest) -> requests.Response:
        # The SDK builds the URL from AI_HORDE_URL, which the test sets to this horde.
        prepared = _SDK._validate_and_prepare_request(request)
        assert prepared.endpoint_no_query.startswith(self.url)
        return self.session.request(
            request.get_http_method().value,
            prepared.endpoint_no_query,
            headers=prepared.request_headers,
            params=prepared.request_queries,
            json=prepared.request_body,
            timeout=30,
        )

    def run(self, request: HordeRequest, refused: tuple[int, str] | None = None) -> Any:
        """Send; record whether the answer is what the SDK expects."""
        name = type(request).__name__
        response = self.send(request)
        self.last = response.json()
        outcome: dict[str, Any] = {"status": response.status_code}
        parsed: Any = None
        try:
            if refused is None:
                pairs = {int(k): v for k, v in request.get_success_status_response_pairs().items()}
                model = pairs[response.status_code]
                parsed = model.model_validate(response.json())
                outcome["ok"] = True
                outcome["missing"] = missing_fields(model, response.json())
            else:
                error = RequestErrorResponse.model_validate(response.json())
                outcome["rc"] = error.rc
                outcome["ok"] = (
                    response.status_code,
                    error.rc,
                ) == refused and error.rc in RC.__members__
        except Exception as exc:  # the failure is the result: reported, not raised
            outcome["ok"] = False
            outcome["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            outcome["body"] = response.text[:2000]
        self.results[name] = outcome
        return parsed


def main(setup: dict[str, Any]) -> dict[str, Any]:
    p = Probe(setup)
    try:
        steps(p, setup)
    except Exception as exc:  # a step a later one needs failed: report what ran
        p.results["(probe stopped)"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"results": p.results, "classes": sorted(every_class()), "not_served": NOT_SERVED}


def steps(p: Probe, setup: dict[str, Any]) -> None:
    alice, bob, admin = setup["alice"], setup["bob"], setup["admin"]
    run: Callable[..., Any] = p.run
    run(m.AIHordeHeartbeatRequest())
    run(m.AIHordeGetTermsRequest())
    run(m.AIHordeGetPrivacyPolicyRequest())
    run(m.AIHordeGetSponsorsRequest())
    run(m.NewsRequest())
    run(m.HordePerformanceRequest())
    run(m.TextStatsModelsRequest())
    run(m.TextStatsModelsTotalRequest())
    run(m.AllTeamDetailsRequest())
    run(
        m.SingleTeamDetailsRequest(team_id="00000000-0000-0000-0000-000000000000"),
        (404, "TeamNotFound"),
    )
    run(m.AllStylesTextRequest())
    params = m.ModelGenerationInputKobold(max_length=64, max_context_length=1024)
    queued = run(
        m.TextGenerateAsyncRequest(apikey=alice, prompt="Once", params=params, models=[MODEL])
    )
    request_id = str(queued.id_)
    run(m.TextGenerateSubmittedRequest(apikey=alice, id=request_id))
    popped = run(
        m.TextGenerateJobPopRequest(
            apikey=bob,
            name=WORKER,
            models=[MODEL],
            max_length=512,
            max_context_length=2048,
            bridge_agent="sdk033-probe:1:https://example.invalid",
        )
    )
    run(
        m.TextGenerationJobSubmitRequest(
            apikey=bob, id=str(popped.id_), generation="Done.", state=GENERATION_STATE.ok
        )
    )
    run(m.TextGenerateStatusRequest(id=request_id))
    waiting = run(
        m.TextGenerateAsyncRequest(apikey=alice, prompt="Wait", params=params, models=[MODEL])
    )
    run(m.DeleteTextGenerateRequest(id=str(waiting.id_)))
    run(m.HordeStatusModelsAllRequest(type=MODEL_TYPE.text))
    run(m.HordeStatusModelsSingleRequest(model_name=MODEL))
    me = run(m.FindUserRequest(apikey=alice))
    run(m.ListUsersDetailsRequest(page=1, sort="kudos"))
    run(m.SingleUserDetailsRequest(user_id=str(me.id_)))
    run(m.ModifyUserRequest(apikey=admin, user_id=str(me.id_), concurrency=10))
    run(m.KudosTransferRequest(apikey=alice, username=setup["bob_name"], amount=1))
    run(m.AllWorkersDetailsRequest())
    worker = run(m.SingleWorkerNameDetailsRequest(worker_name=WORKER))
    worker_id = str(worker.id_)
    run(m.SingleWorkerDetailsRequest(worker_id=worker_id))
    run(m.ModifyWorkerRequest(apikey=bob, worker_id=worker_id, info="A probe worker"))
    run(m.CreateWorkerMessageRequest(apikey=admin, worker_id=worker_id, message="Hello", expiry=1))
    message_id = p.last["id"]  # the SDK's model of the answer leaves the id out
    run(m.AllWorkerMessagesRequest(apikey=bob, worker_id=worker_id))
    run(m.SingleWorkerMessageRequest(id=message_id))
    run(m.DeleteWorkerMessageRequest(apikey=admin, id=message_id))
    # Timeouts by address: the worker popped from this probe's own address,
    # so its block is lifted at once (the admin's routes are never refused).
    run(m.BlockWorkerIPAddressRequest(apikey=admin, worker_id=worker_id, days=1))
    run(m.DeleteWorkerIPAddressRequest(apikey=admin, worker_id=worker_id))
    run(m.BlockIPAddressRequest(apikey=admin, ipaddr="203.0.113.7", hours=2))
    run(m.AllIPTimeoutsRequest(apikey=admin))
    run(m.SingleIPTimeoutsRequest(apikey=admin))
    run(m.DeleteIPAddressRequest(apikey=admin, ipaddr="203.0.113.7"))
    made = run(
        m.PutNewFilterRequest(apikey=admin, regex="probe[0-9]+", filter_type=10, description="p")
    )
    filter_id = str(made.id_)
    # A prompt the filter refuses, for a prompt moderation event to read and
    # annotate (sent apart: the run of TextGenerateAsyncRequest is above).
    refused = p.send(
        m.TextGenerateAsyncRequest(apikey=alice, prompt="a probe42", params=params, models=[MODEL])
    )
    assert refused.status_code == 400, refused.text
    run(m.ModerationOverviewRequest(apikey=admin, sort="name", worker_type=["text"]))
    events = run(m.PromptModerationEventsRequest(apikey=admin, reason=["filter_rejection"]))
    event_id = events.events[0].id_
    run(m.PromptModerationNoteRequest(apikey=admin, event_id=event_id, note="seen"))
    run(m.WorkerSuspicionEventsRequest(apikey=admin, worker_id=worker_id))
    run(m.FiltersListRequest(apikey=admin, filter_type=10))
    run(m.SingleFilterRequest(apikey=admin, filter_id=filter_id))
    run(m.PatchExistingFilter(apikey=admin, filter_id=filter_id, description="q", filter_type=11))
    run(m.FilterRegexRequest(apikey=admin))
    run(m.FilterPromptSuspicionRequest(apikey=admin, prompt="a probe42", filter_type=11))
    run(m.DeleteFilterRequest(apikey=admin, filter_id=filter_id))
    key = run(
        m.SharedKeyCreateRequest(
            apikey=alice,
            kudos=100,
            name="friends",
            max_image_pixels=-1,
            max_image_steps=-1,
            max_text_tokens=256,
        )
    )
    key_id = str(key.sharedkey_id)
    run(m.SharedKeyDetailsRequest(id=key_id))
    run(
        m.SharedKeyModifyRequest(
            apikey=alice,
            id=key_id,
            kudos=50,
            name="friends",
            max_image_pixels=-1,
            max_image_steps=-1,
            max_text_tokens=128,
        )
    )
    run(m.SharedKeyDeleteRequest(apikey=alice, id=key_id))
    run(m.DeleteWorkerRequest(apikey=bob, worker_id=worker_id))


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
