# The tokenq gateway: no torch, no model.
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY shared shared
COPY producer producer
COPY worker worker
RUN pip install '.[gateway]'
EXPOSE 8000
ENTRYPOINT ["tokenq", "gateway", "--host", "0.0.0.0", "--port", "8000"]
