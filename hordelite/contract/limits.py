"""Every limit and constant of the specification, in one place.

Values an operator may want to change are configuration keys
(hordelite.config); these are the wire contract's fixed bounds and the
queue's arithmetic.
"""

from typing import Final

# Request bounds of the AI Horde text API.
MIN_MAX_LENGTH: Final = 16
MAX_MAX_LENGTH: Final = 4096
DEFAULT_MAX_LENGTH: Final = 80
MIN_CONTEXT_LENGTH: Final = 80
MAX_CONTEXT_LENGTH: Final = 1_048_576
DEFAULT_MAX_CONTEXT_LENGTH: Final = 2048
MAX_REQUEST_N: Final = 20
MAX_WORKER_IDS: Final = 5
MAX_MODELS: Final = 100
MAX_NAME: Final = 255
MAX_STOP_SEQUENCES: Final = 128
MAX_STOP_SEQUENCE_CHARS: Final = 1000
MAX_POP_THREADS: Final = 50
# JSON bodies nest at most this deep: a chat request with a JSON schema in
# its response_format or tools needs about 20; past this a body is hostile.
MAX_JSON_DEPTH: Final = 64

# Chat request bounds.
MAX_CHAT_MESSAGES: Final = 4096
MAX_CHAT_STOP: Final = 4
MAX_CHAT_TOOLS: Final = 128
# The horde runs no tokenizer: a conversation is sized at 3 characters a token.
CHARS_PER_TOKEN_ESTIMATE: Final = 3
# Reply bounds a chat submit must keep (worker guide, "Submit refusals").
MAX_NATIVE_FINISH_REASON: Final = 32
MAX_REASONING_BYTES: Final = 1024 * 1024
MAX_REPORTED_TOKENS: Final = 10_000_000

# The anonymous key every AI Horde client knows.
ANONYMOUS_API_KEY: Final = "0000000000"

# Pricing (AI Horde text formula): tokens are estimated at 4 characters each,
# floored at 20, capped at max_length; a job is worth tokens x the model's
# size in billions of parameters / 21; the requester also pays 1 per job.
CHARS_PER_TOKEN_PRICING: Final = 4
MIN_BILLED_TOKENS: Final = 20
KUDOS_TOKENS_DIVISOR: Final = 21
HORDE_TAX_PER_JOB: Final = 1.0
# A model missing from the model reference is priced as a 1 billion
# parameter model, the smallest class the AI Horde knows.
UNKNOWN_MODEL_BILLIONS: Final = 1.0
# Requests with a larger max_length need their estimated cost up front.
UPFRONT_MAX_LENGTH: Final = 512

# Queue order: a waiting request gains 50 priority every 10 seconds.
AGING_PER_SECOND: Final = 50 / 10

# A worker with no measured speed is assumed to generate this many tokens a
# second when estimating wait times; a slower measured worker is "slow" and
# skipped by requests that set slow_workers: false.
ASSUMED_TOKENS_PER_SECOND: Final = 10.0
SLOW_WORKER_TOKENS_PER_SECOND: Final = 2.0

# A pop that finds nothing counts ``skipped`` over the best waiting requests
# as read at most this long ago: a burst of long-polls ending together (or
# many pops without wait) then reads and decodes them once, not once each.
SKIPPED_SAMPLE_SECONDS: Final = 1.0

# The window in which aborted jobs are counted towards maintenance.
ABORT_WINDOW_SECONDS: Final = 3600.0

# A worker whose pop long-polled and found nothing pops again as the wait
# ends: it counts as online until then plus its wait again, and at least
# this many seconds more (a short wait must survive a slow round trip).
MIN_LONG_POLL_MARGIN: Final = 10.0
