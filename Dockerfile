# jaxnet on NVIDIA's JAX container (docs/multihost.md, "Containers"). From the repository root:
#   docker build -t jaxnet .
#   docker run --gpus all --shm-size=16g -v /data:/data -v /runs:/runs -v jaxnet-cache:/cache \
#       jaxnet --config=configs/resnet50.py --workdir=/runs/r50
# The tag is pinned so that a rebuild gets the same jax, CUDA and NCCL; it must carry jax >= 0.10.2
# (pip would otherwise replace the container's CUDA build of jax with a CPU one from PyPI).
ARG BASE=nvcr.io/nvidia/jax:26.10-py3
FROM ${BASE}

# gcc and the libjpeg-turbo headers build jaxnet's JPEG region decoder (~25% cheaper ImageNet
# input); the base image's Ubuntu decides the versions, hence no pins.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends gcc libjpeg-turbo8-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/jaxnet
COPY . /opt/jaxnet
# The container's jax is NVIDIA's CUDA build, so no jax extra here; DALI is jaxnet's GPU input
# extra (config.data.loader=dali). On a plain CUDA runtime image use the README's other line.
# jaxnet is this checkout; its dependencies' bounds are pyproject.toml's.
# hadolint ignore=DL3013
RUN python -m pip install --no-cache-dir '.[dali]'

# Compiled steps and runs live on volumes: a restarted container (a requeued job) loads its
# compiled step and resumes from the workdir's newest checkpoint.
ENV JAXNET_COMPILATION_CACHE=/cache/xla
VOLUME ["/cache", "/runs"]

# Exec form: python is PID 1 and gets the SIGTERM of `docker stop` or a pod's termination
# itself, so the run saves a checkpoint before it is killed.
ENTRYPOINT ["python", "-m", "jaxnet.main"]
