# The CPU lane's image: selgate on the CPU build of torch, Triton kernels in interpreter mode.
# BASE_IMAGE: any Debian-like image with python3 >= 3.11 and its venv module (the default, or
# the registry-free base that .ci/docker_engine.sh makes with debootstrap).
#
# Runs as the unprivileged user `selgate` (or the caller's --user). The sources and the venv
# belong to root and are read-only at run time; the only writable places are /cache (the
# Triton and extension caches), reports/out and the pytest cache, which belong to `selgate`,
# and HOME=/tmp. The wheels of .whl/ stay in the `deps` stage and never reach the image.
ARG BASE_IMAGE=python:3.11-slim

# The sources without the wheel cache.
FROM ${BASE_IMAGE} AS source
COPY . /src
RUN rm -rf /src/.whl

# Dependencies from pyproject.toml (plus any wheels in .whl/) in a venv of their own, so
# editing the sources reuses this stage.
FROM ${BASE_IMAGE} AS deps
ARG TORCH_VERSION=2.13.0
ARG TRITON_VERSION=3.6.0
# PIP_NO_INDEX=1: install from the wheels in .whl/ only (machines without a package index).
# PIP_EXTRA_INDEX_URL: e.g. PyTorch's CPU wheel index, so that pip does not fetch a CUDA build.
ARG PIP_NO_INDEX=0
ARG PIP_EXTRA_INDEX_URL=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml docker/requirements.py .whl* /tmp/wheels/
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/python /tmp/wheels/requirements.py /tmp/wheels/pyproject.toml > /tmp/requirements.txt \
 && /opt/venv/bin/pip install --find-links /tmp/wheels -r /tmp/requirements.txt \
      "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}" "setuptools>=68" numpy

FROM ${BASE_IMAGE}
ARG TORCH_VERSION=2.13.0
ARG TRITON_VERSION=3.6.0
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HYPOTHESIS_STORAGE_DIRECTORY=/tmp/hypothesis \
    TRITON_INTERPRET=1 \
    TRITON_CACHE_DIR=/cache/triton
WORKDIR /opt/selgate
CMD ["python", "-m", "selgate.lanes", "run", "auto"]

COPY --from=deps /opt/venv /opt/venv
COPY --from=source /src /opt/selgate
RUN pip install --no-deps --no-build-isolation -e . \
 && python -c "import torch, triton, selgate; assert torch.__version__.split('+')[0] == '${TORCH_VERSION}', torch.__version__; assert triton.__version__ == '${TRITON_VERSION}', triton.__version__" \
 && useradd --no-log-init --no-create-home --uid 10001 --user-group --shell /usr/sbin/nologin selgate \
 && mkdir -p /cache /opt/selgate/reports/out /opt/selgate/.pytest_cache \
 && chown selgate:selgate /cache /opt/selgate/reports/out /opt/selgate/.pytest_cache
USER 10001:10001
