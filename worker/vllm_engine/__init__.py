"""vLLM as the worker's engine (``tokenq worker --engine vllm``).

``options`` and ``config`` read and check the engine arguments without importing vLLM;
``engine`` (and ``stat_logger``) import it, only in a worker that asked for it;
``figures``, vLLM's figures and the claims made from them, is plain Python.
"""
