"""The rules of a progress post and its lease, and the relay's pacing, as pure
functions (issue 5; worker guide: "Streaming progress"; chat guide: "Streaming" and its
lease state diagram).

Every expected value comes from the specification: a lease is the pop's ttl
(150 s), each accepted post with new text extends it to 150 s after the post,
at most 600 s from pop for a trusted worker and 200 s for an untrusted one; a
job may post 1000 times and 16 bytes per max_length token, content and
reasoning together.
"""

from __future__ import annotations

import uuid

import pytest

from hordelite.contract.progress import Lease, ProgressPost, accept, parse_progress
from hordelite.errors import RC, HordeError
from hordelite.front._relay import Pacer

POPPED = 1_000_000.0
TTL = 150.0  # the pop's ttl (worker guide, "Streaming progress")
EXTENSION = 150.0  # an accepted post with new text: the lease ends this long after it
TRUSTED_CAP = 600.0  # at most this long after the pop, for a trusted worker
UNTRUSTED_CAP = 200.0  # and for an untrusted one
MAX_POSTS = 1000
BYTES_PER_TOKEN = 16


def lease(*, trusted: bool = True, max_length: int = 100) -> Lease:
    return Lease.at_pop(
        job_id=str(uuid.uuid4()),
        request_id=str(uuid.uuid4()),
        key_hash="owner-key-hash",
        worker_id=str(uuid.uuid4()),
        worker_name="w1",
        model="chat-model",
        gen=0,
        now=POPPED,
        ttl=TTL,
        trusted=trusted,
        max_length=max_length,
    )


def post(lease: Lease, seq: int, content: str = "", reasoning: str = "") -> ProgressPost:
    return ProgressPost(lease.job_id, seq, content, reasoning)


def refused(lease: Lease, p: ProgressPost, now: float) -> HordeError:
    with pytest.raises(HordeError) as caught:
        accept(lease, p, now)
    return caught.value


# 200: accepted ------------------------------------------------------------------


def test_a_post_with_the_next_seq_is_accepted_with_accepted_seq_and_cancelled_false() -> None:
    held = lease()
    first = accept(held, post(held, 1, "Blue"), POPPED + 1)
    second = accept(held, post(held, 2, " is", "thinking"), POPPED + 2)
    assert (first.accepted_seq, first.cancelled) == (1, False)
    assert (second.accepted_seq, second.cancelled) == (2, False)
    assert first.appended
    assert second.appended
    assert held.content == "Blue is"
    assert held.reasoning == "thinking"


def test_a_retried_post_with_the_same_seq_and_text_is_accepted_again_without_appending() -> None:
    held = lease()
    accept(held, post(held, 1, "Blue"), POPPED + 1)
    retry = accept(held, post(held, 1, "Blue"), POPPED + 2)
    assert (retry.accepted_seq, retry.cancelled) == (1, False)
    assert retry.appended is False
    assert held.content == "Blue"
    # The next post still follows the first.
    assert accept(held, post(held, 2, "!"), POPPED + 3).accepted_seq == 2


def test_a_retried_post_does_not_extend_the_lease() -> None:
    held = lease()
    accept(held, post(held, 1, "Blue"), POPPED + 10)
    assert held.expires == POPPED + 10 + EXTENSION
    accept(held, post(held, 1, "Blue"), POPPED + 100)
    assert held.expires == POPPED + 10 + EXTENSION


# 409: out of sequence -------------------------------------------------------------


@pytest.mark.parametrize(
    ("accepted", "seq", "expected"),
    [
        pytest.param(0, 2, 1, id="a first post that is not seq 1"),
        pytest.param(1, 3, 2, id="a gap"),
        pytest.param(2, 1, 3, id="an old seq"),
    ],
)
def test_a_post_out_of_sequence_is_refused_409_with_the_expected_seq(
    accepted: int, seq: int, expected: int
) -> None:
    held = lease()
    for n in range(1, accepted + 1):
        accept(held, post(held, n, f"part {n}"), POPPED + n)
    error = refused(held, post(held, seq, "late"), POPPED + 10)
    assert error.rc is RC.ChatProgressOutOfSequence
    assert error.status == 409
    assert error.extra["expected_seq"] == expected
    assert held.accepted_seq == accepted


@pytest.mark.parametrize(
    ("content", "reasoning"),
    [
        pytest.param("Red", "", id="changed content"),
        pytest.param("Blue", "a thought", id="added reasoning"),
    ],
)
def test_changed_text_under_the_accepted_seq_is_refused_409(content: str, reasoning: str) -> None:
    held = lease()
    accept(held, post(held, 1, "Blue"), POPPED + 1)
    error = refused(held, post(held, 1, content, reasoning), POPPED + 2)
    assert error.rc is RC.ChatProgressOutOfSequence
    assert error.status == 409
    assert error.extra["expected_seq"] == 2
    assert held.content == "Blue"
    assert held.reasoning == ""


# 413: caps ------------------------------------------------------------------------


def test_the_post_after_the_thousandth_is_refused_413() -> None:
    held = lease(max_length=1000)
    for seq in range(1, MAX_POSTS + 1):
        accept(held, post(held, seq, "a"), POPPED + 1)
    error = refused(held, post(held, MAX_POSTS + 1, "a"), POPPED + 1)
    assert error.rc is RC.ChatProgressCapReached
    assert error.status == 413
    assert held.content == "a" * MAX_POSTS


def test_progress_may_fill_exactly_16_bytes_per_max_length_token() -> None:
    held = lease(max_length=10)
    cap = BYTES_PER_TOKEN * 10
    content = "c" * (cap - 60)
    assert accept(held, post(held, 1, content, "r" * 60), POPPED + 1).appended
    error = refused(held, post(held, 2, "x"), POPPED + 2)
    assert error.rc is RC.ChatProgressCapReached
    assert error.status == 413


def test_content_and_reasoning_count_together_toward_the_byte_cap() -> None:
    held = lease(max_length=10)
    cap = BYTES_PER_TOKEN * 10
    accept(held, post(held, 1, "c" * (cap // 2)), POPPED + 1)
    # Each alone fits the cap; together they pass it.
    error = refused(held, post(held, 2, "", "r" * (cap // 2 + 1)), POPPED + 2)
    assert error.rc is RC.ChatProgressCapReached
    assert held.reasoning == ""


def test_the_byte_cap_counts_utf8_bytes_not_characters() -> None:
    held = lease(max_length=10)
    cap = BYTES_PER_TOKEN * 10
    two_byte = "é"
    # cap // 2 + 1 characters are fewer than cap characters, and over cap bytes.
    error = refused(held, post(held, 1, two_byte * (cap // 2 + 1)), POPPED + 1)
    assert error.rc is RC.ChatProgressCapReached
    assert accept(held, post(held, 1, two_byte * (cap // 2)), POPPED + 1).appended


# 404: past the lease --------------------------------------------------------------


def test_a_post_past_the_lease_is_refused_404_job_aborted() -> None:
    held = lease()
    error = refused(held, post(held, 1, "Blue"), POPPED + TTL + 0.5)
    assert error.rc is RC.ChatJobAborted
    assert error.status == 404
    assert held.content == ""


def test_a_post_past_an_extended_lease_is_refused_404_job_aborted() -> None:
    held = lease()
    accept(held, post(held, 1, "Blue"), POPPED + 100)
    assert accept(held, post(held, 2, " sky"), POPPED + 100 + EXTENSION - 1).appended
    error = refused(held, post(held, 3, "!"), POPPED + 100 + 2 * EXTENSION)
    assert error.rc is RC.ChatJobAborted


# Lease extension ------------------------------------------------------------------


def test_the_lease_is_the_ttl_until_a_post() -> None:
    held = lease()
    assert held.expires == POPPED + TTL


@pytest.mark.parametrize(
    ("content", "reasoning"),
    [pytest.param("Blue", "", id="content"), pytest.param("", "Hmm", id="reasoning")],
)
def test_a_post_with_new_text_extends_the_lease_to_150_s_after_the_post(
    content: str, reasoning: str
) -> None:
    held = lease()
    accept(held, post(held, 1, content, reasoning), POPPED + 100)
    assert held.expires == POPPED + 100 + EXTENSION


def test_an_empty_post_is_accepted_and_does_not_extend_the_lease() -> None:
    held = lease()
    answer = accept(held, post(held, 1), POPPED + 100)
    assert (answer.accepted_seq, answer.cancelled) == (1, False)
    assert held.expires == POPPED + TTL


def test_a_trusted_workers_lease_ends_at_most_600_s_after_the_pop() -> None:
    held = lease(trusted=True)
    for seq, at in enumerate((140, 280, 420, 560), start=1):
        accept(held, post(held, seq, "word "), POPPED + at)
    assert held.expires == POPPED + TRUSTED_CAP
    error = refused(held, post(held, 5, "more"), POPPED + TRUSTED_CAP + 1)
    assert error.rc is RC.ChatJobAborted


def test_an_untrusted_workers_lease_ends_at_most_200_s_after_the_pop() -> None:
    held = lease(trusted=False)
    accept(held, post(held, 1, "Blue"), POPPED + 20)
    assert held.expires == POPPED + 20 + EXTENSION
    accept(held, post(held, 2, " sky"), POPPED + 100)
    assert held.expires == POPPED + UNTRUSTED_CAP
    error = refused(held, post(held, 3, "!"), POPPED + UNTRUSTED_CAP + 1)
    assert error.rc is RC.ChatJobAborted


# Cancelled ------------------------------------------------------------------------


def test_a_cancelled_lease_answers_cancelled_true_without_appending() -> None:
    held = lease()
    accept(held, post(held, 1, "Blue"), POPPED + 1)
    held.cancelled = True
    answer = accept(held, post(held, 2, " sky"), POPPED + 2)
    assert (answer.accepted_seq, answer.cancelled) == (2, True)
    assert answer.appended is False
    assert held.content == "Blue"
    # A retry of the last post before the cancel hears it too.
    assert accept(held, post(held, 1, "Blue"), POPPED + 3).cancelled is True


# Parsing a post -------------------------------------------------------------------


def test_a_post_is_parsed_with_content_and_reasoning_defaulting_to_empty() -> None:
    job_id = str(uuid.uuid4())
    parsed = parse_progress({"id": job_id, "seq": 3, "delta": {"reasoning_content": "Hmm"}})
    assert parsed == ProgressPost(job_id, 3, "", "Hmm")


@pytest.mark.parametrize("seq", [0, -1, "1", True, None, 1.5])
def test_a_post_whose_seq_is_not_a_positive_integer_is_refused_400_naming_seq(seq: object) -> None:
    with pytest.raises(HordeError) as caught:
        parse_progress({"id": str(uuid.uuid4()), "seq": seq, "delta": {"content": "x"}})
    assert caught.value.rc is RC.BadRequest
    assert "seq" in caught.value.extra["errors"]


# The pacer ------------------------------------------------------------------------

TICK = 0.05  # a slice leaves at most this often (the relay's rhythm)


def drain(pacer: Pacer, start: float, until: float) -> list[tuple[float, str]]:
    """Take from the pacer every TICK from ``start`` to ``until``: the
    non-empty slices with their times."""
    slices = []
    steps = round((until - start) / TICK)
    for i in range(steps + 1):
        now = start + i * TICK
        text = pacer.take(now)
        if text:
            slices.append((now, text))
    return slices


def test_an_unpaced_pacer_sends_a_post_whole_at_once() -> None:
    pacer = Pacer(paced=False)
    pacer.add("Blue is the colour of the sky.", 0.0)
    assert pacer.take(0.0) == "Blue is the colour of the sky."
    assert pacer.take(0.05) == ""


def test_a_paced_post_leaves_in_several_even_slices_all_by_the_due_time() -> None:
    text = "Blue is the colour of a clear sky at noon, and of the deep sea in summer." * 2
    pacer = Pacer(paced=True)
    pacer.add(text, 0.0)
    interval = pacer.due  # the first post: the whole estimated interval lies ahead
    assert 0 < interval
    slices = drain(pacer, 0.0, interval)
    assert "".join(s for _, s in slices) == text
    assert len(slices) >= 3
    # Evenly: no slice carries a large part of the post.
    assert max(len(s) for _, s in slices) <= len(text) / 3
    # Spread over the interval, not sent at its start.
    assert slices[-1][0] >= interval / 2
    assert pacer.pending == ""


def test_paced_posts_every_two_seconds_flow_until_about_the_next_post() -> None:
    pacer = Pacer(paced=True)
    period = 2.0
    sent = ""
    for n in range(8):
        at = n * period
        part = f"part {n} of a steady reply. " * 3
        pacer.add(part, at)
        slices = drain(pacer, at, at + period - TICK)
        sent += "".join(s for _, s in slices)
        # Each post has fully left before the next one arrives ...
        assert pacer.pending == ""
    # ... and once the rhythm is learnt, a post still flows in its second half.
    assert slices[-1][0] >= at + period / 2
    assert sent.endswith(part)


def test_the_final_reply_extending_the_relayed_text_gives_the_remainder() -> None:
    pacer = Pacer(paced=True)
    pacer.add("Blue is", 0.0)
    first = pacer.take(0.5)  # part of it left; the rest is pending
    assert first
    assert first != "Blue is"
    rest = pacer.rest_of("Blue is the colour of the sky.")
    assert first + (rest or "") == "Blue is the colour of the sky."


def test_a_final_reply_equal_to_the_relayed_text_leaves_nothing_to_send() -> None:
    pacer = Pacer(paced=False)
    pacer.add("Blue.", 0.0)
    pacer.take(0.0)
    assert pacer.rest_of("Blue.") == ""


def test_a_final_reply_diverging_from_the_relayed_text_has_no_remainder() -> None:
    pacer = Pacer(paced=True)
    pacer.add("Blue is", 0.0)
    pacer.take(0.5)
    assert pacer.rest_of("Red is the colour of fire.") is None
    assert pacer.rest_of("Blue") is None  # shorter than what was relayed


def test_a_pacer_that_never_got_a_post_gives_the_whole_final_reply() -> None:
    assert Pacer(paced=True).rest_of("Blue.") == "Blue."
