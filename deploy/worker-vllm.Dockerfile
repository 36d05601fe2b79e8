# The tokenq worker with vLLM as its engine (`tokenq worker --engine vllm`), for models
# the built-in engine does not reach: quantized, speculative, tensor- and
# pipeline-parallel, across nodes through Ray. One image for every part of a group: the
# head runs `ray start --head` and then the tokenq worker; the other nodes run
# `ray start --address=...` (deploy/k8s/worker-vllm-multinode.yaml,
# docker-compose.vllm.yml).
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    TOKENQ_MODEL_CACHE_DIR=/models TOKENQ_WORKER_METRICS_PORT=9400 HF_HOME=/models/hf
# Triton (vLLM's kernels, torch.compile) builds a small C launcher at run time: it needs
# a C compiler and Python's headers.
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
        python3-dev gcc \
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/tokenq
ENV PATH=/opt/tokenq/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared shared
COPY producer producer
COPY worker worker
# The vllm extra brings vLLM's CUDA build (and the torch it pins); Ray's compiled
# graphs carry pipeline-parallel stages between nodes (vLLM's CUDA requirements list
# ray[cgraph]; naming it here keeps it if they stop doing so).
RUN pip install '.[vllm]' 'ray[cgraph]'
EXPOSE 9400 6379
STOPSIGNAL SIGTERM
ENTRYPOINT ["tokenq", "worker"]
