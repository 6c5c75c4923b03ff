# The GPU lanes' image (sm90, sm80, sm89): selgate on an official CUDA + PyTorch image whose
# torch and triton match the GPU lane (torch 2.11, triton 3.6); the build fails otherwise.
# The devel flavour carries nvcc, which the on-demand CUDA decode kernel needs.
#
# Runs as the unprivileged user `selgate` (or the caller's --user). The sources and the venv
# belong to root and are read-only at run time; the only writable places are /cache (the
# Triton and extension caches), reports/out and the pytest cache, which belong to `selgate`,
# and HOME=/tmp. The wheels of .whl/ stay in the `deps` stage and never reach the image.
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-devel

# The sources without the wheel cache.
FROM ${BASE_IMAGE} AS source
COPY . /src
RUN rm -rf /src/.whl

# Dependencies from pyproject.toml (plus any wheels in .whl/) in a venv that sees the base
# image's torch and triton (--system-site-packages: the base's python is not itself a venv),
# so pip finds them installed and adds only what is missing; editing the sources reuses this
# stage.
FROM ${BASE_IMAGE} AS deps
ARG TORCH_VERSION=2.11.0
ARG TRITON_VERSION=3.6.0
# PIP_NO_INDEX=1: install from the wheels in .whl/ only (machines without a package index).
ARG PIP_NO_INDEX=0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml docker/requirements.py .whl* /tmp/wheels/
RUN python -m venv --system-site-packages /opt/venv \
 && /opt/venv/bin/python /tmp/wheels/requirements.py /tmp/wheels/pyproject.toml > /tmp/requirements.txt \
 && /opt/venv/bin/pip install --find-links /tmp/wheels -r /tmp/requirements.txt \
      "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}" "setuptools>=68"

FROM ${BASE_IMAGE}
ARG TORCH_VERSION=2.11.0
ARG TRITON_VERSION=3.6.0
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HYPOTHESIS_STORAGE_DIRECTORY=/tmp/hypothesis \
    TRITON_CACHE_DIR=/cache/triton
WORKDIR /opt/selgate
CMD ["python", "-m", "selgate.lanes", "run", "auto"]

COPY --from=deps /opt/venv /opt/venv
COPY --from=source /src /opt/selgate
RUN pip install --no-deps --no-build-isolation -e . \
 && python -c "import torch, triton, selgate; assert torch.__version__.split('+')[0] == '${TORCH_VERSION}', torch.__version__; assert triton.__version__ == '${TRITON_VERSION}', triton.__version__; assert torch.version.cuda, 'not a CUDA build of torch'" \
 && useradd --no-log-init --no-create-home --uid 10001 --user-group --shell /usr/sbin/nologin selgate \
 && mkdir -p /cache /opt/selgate/reports/out /opt/selgate/.pytest_cache \
 && chown selgate:selgate /cache /opt/selgate/reports/out /opt/selgate/.pytest_cache
USER 10001:10001
