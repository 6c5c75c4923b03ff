# The GPU lanes' image (sm90, sm80, sm89): selgate on an official CUDA + PyTorch image whose
# torch and triton match the GPU lane (torch 2.11, triton 3.6); the build fails otherwise.
# The devel flavour carries nvcc, which the on-demand CUDA decode kernel needs.
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-devel

# The sources without the wheel cache, so the final image holds the wheels at most once.
FROM ${BASE_IMAGE} AS source
COPY . /src
RUN rm -rf /src/.whl

FROM ${BASE_IMAGE}
ARG TORCH_VERSION=2.11.0
ARG TRITON_VERSION=3.6.0
# PIP_NO_INDEX=1: install from the wheels in .whl/ only (machines without a package index).
ARG PIP_NO_INDEX=0
ENV HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRITON_CACHE_DIR=/cache/triton
WORKDIR /opt/selgate
CMD ["python", "-m", "selgate.lanes", "run", "auto"]

# Dependencies come from pyproject.toml (plus any wheels in .whl/); torch is the base image's.
COPY pyproject.toml docker/requirements.py .whl* /tmp/wheels/
RUN python /tmp/wheels/requirements.py /tmp/wheels/pyproject.toml > /tmp/requirements.txt \
 && pip install --find-links /tmp/wheels -r /tmp/requirements.txt \
      "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}" "setuptools>=68" \
 && rm -rf /tmp/wheels /tmp/requirements.txt

COPY --from=source /src /opt/selgate
RUN pip install --no-deps --no-build-isolation -e . \
 && python -c "import torch, triton, selgate; assert torch.__version__.split('+')[0] == '${TORCH_VERSION}', torch.__version__; assert triton.__version__ == '${TRITON_VERSION}', triton.__version__; assert torch.version.cuda, 'not a CUDA build of torch'" \
 && chmod -R a+rwX /opt/selgate
