# The workload image: what every pod of an xrun JobSet runs.
# Build: docker build -t REGISTRY/xrun-workload:TAG .                       (TPU)
#        docker build --build-arg JAX_EXTRA=cuda12 -t REGISTRY/xrun-workload:TAG-gpu .  (GPU)
# No ENTRYPOINT: the JobSet's commands run as written. This image is also every pod's
# `xrun_image` (init container: python3 -m workload.sidecar install; log shipper: ... ship),
# whatever image the user's own container runs.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/xrun
COPY pyproject.toml README.md ./
COPY xrun_contract ./xrun_contract
COPY workload ./workload
COPY manifests ./manifests
COPY orchestrator ./orchestrator

# jax[tpu] pulls the matching libtpu from PyPI (jax[cuda12] the CUDA wheels); the version
# is pinned with the workload extra's jax.
ARG JAX_EXTRA=tpu
RUN pip install "jax[${JAX_EXTRA}]==0.10.2" && pip install ".[workload]"

RUN useradd --create-home --uid 1000 xrun
USER xrun
WORKDIR /home/xrun
