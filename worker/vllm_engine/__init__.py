"""vLLM as the worker's engine (``tokenq worker --engine vllm``).

``options`` and ``config`` read and check the engine arguments without importing vLLM;
``engine`` (and ``figures``) import it, only in a worker that asked for it.
"""
