"""The native text bodies: parse_text_request, parse_pop_request, parse_job_submit.

Bounds and behaviours come from the AI Horde text API
(the AI Horde text API reference): every refusal carries its return
code, and a BadRequest names the dotted field path in its message and in its
``errors`` map.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from hordelite.contract.limits import MAX_STOP_SEQUENCE_CHARS
from hordelite.contract.text import parse_job_submit, parse_pop_request, parse_text_request
from hordelite.errors import RC, HordeError

MAX_POP_WAIT = 30.0
# budgets.models_per_worker's default.
MODELS_PER_WORKER = 10
JOB_ID = str(uuid.uuid4())


def request(**fields: Any) -> dict[str, Any]:
    return {"prompt": "Once upon a time", **fields}


def with_params(**params: Any) -> dict[str, Any]:
    return request(params=params)


def pop(**fields: Any) -> dict[str, Any]:
    return {"name": "worker", "models": ["m"], **fields}


def parse_pop(body: Any) -> Any:
    return parse_pop_request(body, MAX_POP_WAIT, MODELS_PER_WORKER)


def refusal(parse: Callable[[Any], Any], body: Any) -> HordeError:
    with pytest.raises(HordeError) as info:
        parse(body)
    return info.value


def assert_bad_request(error: HordeError, field: str) -> None:
    assert error.rc is RC.BadRequest, error
    assert error.status == 400
    assert field in error.message
    assert list(error.extra["errors"]) == [field]


# Requests: the prompt -------------------------------------------------------


@pytest.mark.parametrize(
    "body", [{}, {"prompt": ""}, {"prompt": None}], ids=["absent", "empty", "null"]
)
def test_a_request_without_a_prompt_is_refused_with_MissingPrompt(body: dict[str, Any]) -> None:
    error = refusal(parse_text_request, body)
    assert error.rc is RC.MissingPrompt
    assert error.status == 400


def test_a_prompt_that_is_not_a_string_is_refused_naming_prompt() -> None:
    assert_bad_request(refusal(parse_text_request, {"prompt": 42}), "prompt")


@pytest.mark.parametrize("body", [None, [], "prompt", 3], ids=["null", "array", "string", "number"])
def test_a_body_that_is_not_an_object_is_refused_naming_body(body: Any) -> None:
    assert_bad_request(refusal(parse_text_request, body), "body")


# Requests: wrong types ------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (request(params="fast"), "params"),
        (request(params=[1, 2]), "params"),
        (with_params(n="2"), "params.n"),
        (with_params(n=1.5), "params.n"),
        (with_params(n=True), "params.n"),
        (with_params(max_length="80"), "params.max_length"),
        (with_params(max_context_length=[2048]), "params.max_context_length"),
        (with_params(temperature="hot"), "params.temperature"),
        (with_params(temperature=True), "params.temperature"),
        (with_params(top_k=4.5), "params.top_k"),
        (with_params(rep_pen_range="all"), "params.rep_pen_range"),
        (with_params(singleline="yes"), "params.singleline"),
        (with_params(stop_sequence="###"), "params.stop_sequence"),
        (with_params(stop_sequence=["ok", 7]), "params.stop_sequence.1"),
        (with_params(sampler_order="0123456"), "params.sampler_order"),
        (with_params(sampler_order=[0, 1, 2, 3, 4, 5, "6"]), "params.sampler_order"),
        (request(models="m"), "models"),
        (request(models=["m", 1]), "models.1"),
        (request(workers=str(uuid.uuid4())), "workers"),
        (request(nsfw="yes"), "nsfw"),
        (request(trusted_workers=1), "trusted_workers"),
        (request(slow_workers="false"), "slow_workers"),
        (request(worker_blacklist=0), "worker_blacklist"),
        (request(dry_run="true"), "dry_run"),
        (request(allow_downgrade=1), "allow_downgrade"),
        (request(softprompt=3), "softprompt"),
        (request(proxied_account=["x"]), "proxied_account"),
        (request(webhook=True), "webhook"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_naming_its_path(
    body: dict[str, Any], field: str
) -> None:
    assert_bad_request(refusal(parse_text_request, body), field)


# Requests: bounds ------------------------------------------------------------

# (field, lowest accepted, highest accepted, just below, just above), as the
# AI Horde's text payload bounds them.
PARAM_BOUNDS: list[tuple[str, float, float, float, float]] = [
    ("n", 1, 20, 0, 21),
    ("max_length", 16, 4096, 15, 4097),
    ("max_context_length", 80, 1_048_576, 79, 1_048_577),
    ("temperature", 0, 5, -0.01, 5.01),
    ("top_p", 0.001, 1, 0.0009, 1.001),
    ("top_k", 0, 200, -1, 201),
    ("top_a", 0, 1, -0.01, 1.01),
    ("typical", 0, 1, -0.01, 1.01),
    ("tfs", 0, 1, -0.01, 1.01),
    ("min_p", 0, 1, -0.01, 1.01),
    ("rep_pen", 1, 3, 0.99, 3.01),
    ("rep_pen_range", 0, 4096, -1, 4097),
    ("rep_pen_slope", 0, 10, -0.01, 10.01),
    ("smoothing_factor", 0, 10, -0.01, 10.01),
    ("dynatemp_range", 0, 5, -0.01, 5.01),
    ("dynatemp_exponent", 0, 5, -0.01, 5.01),
]


def _fitting_params(key: str, value: float) -> dict[str, Any]:
    # Keep max_context_length >= max_length, so only the bound under test decides.
    params: dict[str, Any] = {key: value}
    if key == "max_length":
        params["max_context_length"] = 4096
    if key == "max_context_length":
        params["max_length"] = 16
    return params


@pytest.mark.parametrize(
    ("key", "value"),
    [(key, v) for key, lo, hi, _, _ in PARAM_BOUNDS for v in (lo, hi)],
)
def test_a_param_at_either_bound_is_accepted(key: str, value: float) -> None:
    req = parse_text_request(request(params=_fitting_params(key, value)))
    got = req.n if key == "n" else req.params[key]
    assert got == value


@pytest.mark.parametrize(
    ("key", "value"),
    [(key, v) for key, _, _, below, above in PARAM_BOUNDS for v in (below, above)],
)
def test_a_param_just_outside_either_bound_is_refused_naming_params_dot_key(
    key: str, value: float
) -> None:
    error = refusal(parse_text_request, request(params=_fitting_params(key, value)))
    assert_bad_request(error, f"params.{key}")


def test_a_max_context_length_below_max_length_is_refused_with_TokenOverflow() -> None:
    error = refusal(parse_text_request, with_params(max_length=512, max_context_length=511))
    assert error.rc is RC.TokenOverflow
    assert error.status == 400
    assert "params.max_context_length" in error.message
    assert "params.max_length" in error.message


def test_a_max_context_length_equal_to_max_length_is_accepted() -> None:
    req = parse_text_request(with_params(max_length=512, max_context_length=512))
    assert (req.max_length, req.max_context_length) == (512, 512)


def test_the_default_max_context_length_below_a_large_max_length_is_TokenOverflow() -> None:
    # max_context_length defaults to 2048: a max_length of 3000 alone cannot fit.
    assert refusal(parse_text_request, with_params(max_length=3000)).rc is RC.TokenOverflow


# Requests: stop sequences and sampler order --------------------------------


def test_128_stop_sequences_are_accepted_and_forwarded() -> None:
    stops = [f"stop{i}" for i in range(128)]
    assert parse_text_request(with_params(stop_sequence=stops)).params["stop_sequence"] == stops


def test_129_stop_sequences_are_refused_with_TooManyStopSequences() -> None:
    error = refusal(parse_text_request, with_params(stop_sequence=[f"s{i}" for i in range(129)]))
    assert error.rc is RC.TooManyStopSequences
    assert error.status == 400
    assert "params.stop_sequence" in error.message


def test_a_stop_sequence_at_the_length_limit_is_accepted() -> None:
    stop = "x" * MAX_STOP_SEQUENCE_CHARS
    assert parse_text_request(with_params(stop_sequence=[stop])).params["stop_sequence"] == [stop]


def test_an_over_long_stop_sequence_is_refused_with_ExcessiveStopSequence_naming_its_index() -> (
    None
):
    stops = ["\n", "x" * (MAX_STOP_SEQUENCE_CHARS + 1)]
    error = refusal(parse_text_request, with_params(stop_sequence=stops))
    assert error.rc is RC.ExcessiveStopSequence
    assert error.status == 400
    assert "params.stop_sequence.1" in error.message


@pytest.mark.parametrize(
    "order",
    [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 5], [6, 6, 6, 6, 6, 6, 6], []],
    ids=["six-values", "seven-entries-six-distinct", "one-value-repeated", "empty"],
)
def test_a_sampler_order_with_fewer_than_7_distinct_values_is_refused(order: list[int]) -> None:
    assert_bad_request(
        refusal(parse_text_request, with_params(sampler_order=order)), "params.sampler_order"
    )


def test_a_sampler_order_with_7_distinct_values_is_forwarded_in_its_order() -> None:
    order = [6, 0, 1, 3, 4, 2, 5]
    assert parse_text_request(with_params(sampler_order=order)).params["sampler_order"] == order


# Requests: workers and webhook ---------------------------------------------


def test_a_worker_id_that_is_not_a_uuid_is_refused_naming_its_index() -> None:
    body = request(workers=[str(uuid.uuid4()), "not-a-uuid"])
    assert_bad_request(refusal(parse_text_request, body), "workers.1")


def test_more_than_five_workers_are_refused_naming_workers() -> None:
    body = request(workers=[str(uuid.uuid4()) for _ in range(6)])
    assert_bad_request(refusal(parse_text_request, body), "workers")


def test_worker_ids_are_kept_in_canonical_uuid_form() -> None:
    worker = uuid.uuid4()
    req = parse_text_request(request(workers=[str(worker).upper()], worker_blacklist=True))
    assert req.workers == (str(worker),)
    assert req.worker_blacklist is True


@pytest.mark.parametrize(
    "webhook", ["http://example.com/hook", "ftp://example.com/hook", "example.com/hook"]
)
def test_a_webhook_that_is_not_https_is_refused_naming_webhook(webhook: str) -> None:
    assert_bad_request(refusal(parse_text_request, request(webhook=webhook)), "webhook")


def test_an_https_webhook_is_accepted() -> None:
    url = "https://example.com/hook"
    assert parse_text_request(request(webhook=url)).webhook == url


# Requests: defaults, unknown keys, forwarding ------------------------------


def test_a_bare_prompt_gets_the_ai_horde_defaults() -> None:
    req = parse_text_request({"prompt": "Hello"})
    assert req.prompt == "Hello"
    assert req.n == 1
    assert req.max_length == 80
    assert req.max_context_length == 2048
    assert req.models == ()
    assert req.workers == ()
    assert req.worker_blacklist is False
    assert req.trusted_workers is False
    assert req.slow_workers is True
    assert req.dry_run is False
    assert req.webhook is None


def test_unknown_keys_are_ignored_and_only_known_sampling_params_are_forwarded() -> None:
    body = {
        "prompt": "Hello",
        "some_future_field": {"x": 1},
        "disable_batching": True,
        "params": {
            "n": 2,
            "max_length": 100,
            "temperature": 0.7,
            "top_k": 40,
            "singleline": True,
            "not_a_sampler": 9,
            "grammar": "root ::= x",
        },
    }
    req = parse_text_request(body)
    assert req.n == 2
    # What reaches the worker's payload: the lengths and the known samplers,
    # never n (each job is one generation) nor unknown keys.
    assert req.params == {
        "max_length": 100,
        "max_context_length": 2048,
        "temperature": 0.7,
        "top_k": 40,
        "singleline": True,
    }


def test_null_sampling_params_are_treated_as_absent() -> None:
    req = parse_text_request(with_params(temperature=None, top_k=None, max_length=None))
    assert req.params == {"max_length": 80, "max_context_length": 2048}


def test_an_integral_float_is_accepted_for_an_integer_param() -> None:
    # JSON has one number type: 120.0 is the integer 120.
    assert parse_text_request(with_params(max_length=120.0)).max_length == 120


def test_duplicate_models_are_kept_once_in_order() -> None:
    assert parse_text_request(request(models=["b", "a", "b"])).models == ("b", "a")


# Pops --------------------------------------------------------------------


def test_koboldcpps_exact_pop_body_parses() -> None:
    body = {
        "name": "w",
        "models": ["koboldcpp/m"],
        "max_length": 512,
        "max_context_length": 4096,
        "priority_usernames": [],
        "softprompts": [],
        "bridge_agent": "KoboldCppEmbedWorker:2:https://github.com/LostRuins/koboldcpp",
    }
    worker = parse_pop(body)
    assert worker.name == "w"
    assert worker.models == ("koboldcpp/m",)
    assert worker.max_length == 512
    assert worker.max_context_length == 4096
    assert worker.priority_usernames == ()
    assert worker.bridge_agent == "KoboldCppEmbedWorker:2:https://github.com/LostRuins/koboldcpp"
    assert worker.wait == 0


def test_a_pop_gets_the_ai_horde_defaults() -> None:
    worker = parse_pop(pop())
    assert worker.nsfw is True
    assert worker.threads == 1
    assert worker.amount == 1
    assert worker.extra_slow_worker is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "worker"}, "models"),
        (pop(models=[]), "models"),
        (pop(models="m"), "models"),
        (pop(models=[3]), "models.0"),
        ({"models": ["m"]}, "name"),
        (pop(name=""), "name"),
        (pop(name="   "), "name"),
        (pop(name=7), "name"),
        (pop(max_length="512"), "max_length"),
        (pop(nsfw="yes"), "nsfw"),
        (pop(threads=0), "threads"),
        (pop(threads=51), "threads"),
        (pop(amount=0), "amount"),
        (pop(amount=21), "amount"),
        (pop(wait=MAX_POP_WAIT + 1), "wait"),
        (pop(wait=-1), "wait"),
        (pop(priority_usernames="alice"), "priority_usernames"),
    ],
)
def test_a_bad_pop_is_refused_naming_the_field(body: dict[str, Any], field: str) -> None:
    assert_bad_request(refusal(parse_pop, body), field)


@pytest.mark.parametrize(
    ("key", "value"), [("threads", 1), ("threads", 50), ("amount", 1), ("amount", 20)]
)
def test_pop_threads_and_amount_are_accepted_at_their_bounds(key: str, value: int) -> None:
    assert getattr(parse_pop(pop(**{key: value})), key) == value


def test_a_pop_may_long_poll_up_to_the_configured_wait() -> None:
    assert parse_pop(pop(wait=MAX_POP_WAIT)).wait == MAX_POP_WAIT


def test_a_pop_ignores_unknown_keys() -> None:
    worker = parse_pop(pop(require_upfront_kudos=False, softprompts=["x"], blacklist=[]))
    assert worker.models == ("m",)


# Submits -----------------------------------------------------------------


def test_a_submit_with_a_non_uuid_id_is_refused_with_InvalidJobID() -> None:
    error = refusal(parse_job_submit, {"id": "12345", "generation": "text", "state": "ok"})
    assert error.rc is RC.InvalidJobID
    assert error.status == 404
    assert "id" in error.message


def test_a_submit_without_an_id_is_refused_naming_id() -> None:
    assert_bad_request(refusal(parse_job_submit, {"generation": "text", "state": "ok"}), "id")


@pytest.mark.parametrize("state", ["good", "done", "partial", "OK", ""])
def test_a_submit_state_outside_the_four_states_is_refused_naming_state(state: str) -> None:
    body = {"id": JOB_ID, "generation": "text", "state": state}
    assert_bad_request(refusal(parse_job_submit, body), "state")


@pytest.mark.parametrize("state", ["ok", "censored", "csam", "faulted"])
def test_each_of_the_four_submit_states_is_accepted(state: str) -> None:
    assert parse_job_submit({"id": JOB_ID, "generation": "text", "state": state}).state == state


def test_a_submit_without_state_from_the_old_koboldai_bridge_means_ok() -> None:
    submit = parse_job_submit({"id": JOB_ID, "generation": "It was a dark night."})
    assert submit.state == "ok"
    assert submit.generation == "It was a dark night."


def test_a_faulted_submit_without_a_generation_is_accepted() -> None:
    submit = parse_job_submit({"id": JOB_ID, "state": "faulted"})
    assert submit.state == "faulted"
    assert submit.generation == ""


def test_an_ok_submit_without_a_generation_is_refused_naming_generation() -> None:
    assert_bad_request(refusal(parse_job_submit, {"id": JOB_ID, "state": "ok"}), "generation")


def test_a_submit_id_is_kept_in_canonical_uuid_form() -> None:
    submit = parse_job_submit({"id": JOB_ID.upper(), "generation": "x"})
    assert submit.id == JOB_ID


def test_a_submit_seed_may_be_a_number_or_a_numeric_string() -> None:
    assert parse_job_submit({"id": JOB_ID, "generation": "x", "seed": 42}).seed == 42
    assert parse_job_submit({"id": JOB_ID, "generation": "x", "seed": "42"}).seed == 42


def test_a_non_numeric_seed_is_refused_naming_seed() -> None:
    body = {"id": JOB_ID, "generation": "x", "seed": "lucky"}
    assert_bad_request(refusal(parse_job_submit, body), "seed")


@pytest.mark.parametrize("seed", [math.inf, -math.inf, math.nan, 1e300])
def test_a_seed_with_no_integer_in_range_is_refused_naming_seed(seed: float) -> None:
    # The body gate refuses non-finite JSON numbers first; the contract names
    # the field for any caller all the same (an infinite float raised
    # OverflowError here, a 500).
    body = {"id": JOB_ID, "generation": "x", "seed": seed}
    assert_bad_request(refusal(parse_job_submit, body), "seed")


def test_gen_metadata_entries_are_validated_by_path() -> None:
    body = {"id": JOB_ID, "generation": "x", "gen_metadata": [{"type": "censorship", "value": 3}]}
    assert_bad_request(refusal(parse_job_submit, body), "gen_metadata.0.value")


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**63 - 1, "-1"])
def test_a_submit_seed_is_any_signed_64_bit_integer_as_the_ai_horde_takes_it(
    seed: int | str,
) -> None:
    assert parse_job_submit({"id": JOB_ID, "generation": "x", "seed": seed}).seed == int(seed)


@pytest.mark.parametrize("seed", [-(2**63) - 1, 2**63])
def test_a_seed_outside_64_bits_is_refused_naming_seed(seed: int) -> None:
    assert_bad_request(
        refusal(parse_job_submit, {"id": JOB_ID, "generation": "x", "seed": seed}), "seed"
    )
