"""The reference worker: ``hordelite worker`` turns an OpenAI-compatible
backend (llama.cpp's server, koboldcpp, Ollama, vLLM) into a horde worker
serving chat and text jobs.

    worker = Worker(config.worker)          # a validated WorkerConfig
    async with anyio.create_task_group() as tg:
        declaration = await tg.start(worker.serve)
        ...
        worker.stop()                       # stop popping, finish the jobs in hand

The declaration comes from what the backend proves at start (its model, its
context, and whether its fit check backs ``prompt_overflow_refused``);
``worker.statistics()`` tells what the worker has done.
"""

from hordelite.worker._backoff import Backoff
from hordelite.worker._declare import PROBE_MESSAGES, Declaration, WorkerError
from hordelite.worker._reply import finish_reason, split_reasoning
from hordelite.worker._worker import Worker, WorkerStatistics

__all__ = [
    "PROBE_MESSAGES",
    "Backoff",
    "Declaration",
    "Worker",
    "WorkerError",
    "WorkerStatistics",
    "finish_reason",
    "split_reasoning",
]
