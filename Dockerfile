# The workload image: what every pod of an xrun JobSet runs. Two targets:
#   docker build -t REGISTRY/xrun-workload:TAG .                        (TPU: jax[tpu] + libtpu)
#   docker build --target gpu -t REGISTRY/xrun-workload:TAG-gpu .       (GPU: jax[cuda12] wheels)
# No ENTRYPOINT: the JobSet's commands run as written. This image is also every pod's
# `xrun_image` when set (init container: python3 -m workload.sidecar install; log shipper: ... ship;
# unset, they run the public python image with xrun's pod code from storage, manifests/podcode.py),
# whatever image the user's own container runs.
FROM python:3.11-slim AS base

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/xrun
COPY pyproject.toml README.md ./
COPY xrun_contract ./xrun_contract
COPY workload ./workload
COPY manifests ./manifests
COPY orchestrator ./orchestrator
RUN useradd --create-home --uid 1000 xrun

# GPU: the CUDA 12 wheels (cuDNN, cuBLAS, NCCL, ptxas) come from PyPI with jax[cuda12]; only
# the driver (libcuda.so) comes from the node, which GKE's device plugin mounts at
# /usr/local/nvidia. The manifest also sets LD_LIBRARY_PATH (plus the NCCL plugin's folder
# for the family's networking stack) and JAX_PLATFORMS=cuda; these are the image defaults
# for running it by hand on a GKE GPU node.
FROM base AS gpu
RUN pip install "jax[cuda12]==0.10.2" && pip install ".[workload]"
ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64 \
    PATH=/usr/local/nvidia/bin:${PATH}
USER xrun
WORKDIR /home/xrun

# TPU (the default, last stage): jax[tpu] pulls the matching libtpu from PyPI; the version
# is pinned with the workload extra's jax.
FROM base AS tpu
RUN pip install "jax[tpu]==0.10.2" && pip install ".[workload]"
USER xrun
WORKDIR /home/xrun
