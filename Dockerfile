# One Dockerfile, two images (no `# syntax=` line: building needs no image from Docker Hub beyond the bases):
#   docker build --target api        -t gpuest-api .         (FastAPI + the CLI; also runs the migrations)
#   docker build --target worker-gpu -t gpuest-worker-gpu .  (Celery worker on the CUDA 13 runtime + CuPy)
# docker-compose.yml builds both. Not built here (no Docker engine on the development machines).
# Both install with `-c constraints.txt`: the same versions as CI (CuPy and its CUDA wheels are not pinned).

# One Python in both images: 3.12, the python3 of the CUDA image's Ubuntu 24.04. The GPU image needs an NVIDIA
# driver of the CUDA 13.0 branch (>= 580) on the host; NVRTC's headers come from CuPy's [ctk] extra (the
# -runtime image lacks some, cupy#8466), checked by compiling every kernel at build time (worker.compile_check).
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
# A private package index and the CA bundle its certificate needs (a file in docker/certs/, see its README);
# empty: PyPI and pip's own CAs. Named GPUEST_* because pip itself would read an empty PIP_INDEX_URL as an index.
ARG GPUEST_PIP_INDEX_URL=""
ARG GPUEST_PIP_CA_BUNDLE=""

# -- source: only the files the package needs, shared by both images ------------------------------
FROM ${PYTHON_IMAGE} AS source
WORKDIR /app
COPY pyproject.toml README.md alembic.ini constraints.txt ./
COPY api/ api/
COPY cli/ cli/
COPY core/ core/
COPY kernels/ kernels/
COPY migrations/ migrations/
COPY plots/ plots/
COPY store/ store/
COPY worker/ worker/
COPY docker/certs/ docker/certs/

# -- base: the package installed on python-slim ---------------------------------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GPUEST_DATA_DIR=/data
WORKDIR /app
COPY --from=source /app /app
# Editable, so the Alembic scripts in /app/migrations (not a Python package) are found beside the code.
ARG GPUEST_PIP_INDEX_URL
ARG GPUEST_PIP_CA_BUNDLE
RUN pip install ${GPUEST_PIP_INDEX_URL:+--index-url "$GPUEST_PIP_INDEX_URL"} \
        ${GPUEST_PIP_CA_BUNDLE:+--cert "docker/certs/$GPUEST_PIP_CA_BUNDLE"} -c constraints.txt -e . \
    && useradd --create-home --uid 10001 gpuest \
    && mkdir -p /data && chown gpuest /data
USER gpuest
VOLUME ["/data"]

# -- api: uvicorn on port 8000 --------------------------------------------------------------------
FROM base AS api
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["uvicorn", "api.app:app", "--host", "0.0.0.0", "--port", "8000", "--no-access-log", "--http", "api.http_protocol:ProblemHttpToolsProtocol"]

# -- worker-gpu: one Celery worker per GPU on the CUDA runtime, CuPy for CUDA 13 -------------------
FROM ${CUDA_IMAGE} AS worker-gpu
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GPUEST_DATA_DIR=/data \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
WORKDIR /app
COPY --from=source /app /app
ARG GPUEST_PIP_INDEX_URL
ARG GPUEST_PIP_CA_BUNDLE
RUN pip install ${GPUEST_PIP_INDEX_URL:+--index-url "$GPUEST_PIP_INDEX_URL"} \
        ${GPUEST_PIP_CA_BUNDLE:+--cert "docker/certs/$GPUEST_PIP_CA_BUNDLE"} -c constraints.txt -e '.[gpu]' \
    && python -m worker.compile_check \
    && useradd --create-home --uid 10001 gpuest \
    && mkdir -p /data && chown gpuest /data
USER gpuest
VOLUME ["/data"]
CMD ["celery", "-A", "worker.tasks:celery_app", "worker", "-Q", "gpu", "--pool", "solo", "--concurrency", "1", \
     "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"]
