# The fedweigh app image: Flower's official SuperExec image at the Flower
# version this project pins, plus the app's dependencies, installed here at
# build time (a SuperExec never installs anything at run time).
#
# The app's own code is not copied in: every `flwr run` ships it to the
# SuperLink and SuperNodes as a FAB, so a code change needs no rebuild; a
# change of dependencies in pyproject.toml does. Only the dependency list
# reaches the install step (the first stage extracts it), so a change to
# pyproject.toml elsewhere (the app's run-config defaults, say) leaves the
# installed layer to Docker's build cache.
#
#   docker build -t fedweigh-superexec:1.41.0 .                        # CPU wheels
#   docker build -t fedweigh-superexec:1.41.0-cuda \
#       --build-arg TORCH_INDEX_URL= --build-arg FLWR_EXTRAS=simulation .  # CUDA wheels, Ray
#
# docker-compose*.yml build it for you. Where Flower's images cannot be pulled,
# deploy/build-images.sh builds stand-ins and this image (docs/deployment.md).

ARG FLWR_VERSION=1.41.0

# Every [project] dependency except flwr itself, which the base image already
# has at the pinned version (reinstalling it could change it).
FROM flwr/superexec:${FLWR_VERSION} AS requirements
WORKDIR /app
COPY pyproject.toml ./
RUN python -c "import re, tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d for d in deps if not re.match(r'flwr\s*[\[<>=~!]', d)))" > requirements.txt

FROM flwr/superexec:${FLWR_VERSION}
ARG FLWR_VERSION

# Where PyTorch comes from: the CPU-only index by default (a much smaller
# image); empty means PyPI's default Linux wheels, which carry CUDA.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# Flower extras to add at the same version, e.g. "simulation" for Ray.
ARG FLWR_EXTRAS=

# MALLOC_ARENA_MAX=1: every thread allocates from glibc's main heap, which keeps
# its freed memory for the next batch (fedweigh/allocator.py explains).
ENV PYTHONUNBUFFERED=1 \
    HF_HOME=/app/.cache/huggingface \
    MALLOC_ARENA_MAX=1

WORKDIR /app
COPY --chown=app:app --from=requirements /app/requirements.txt ./

RUN if [ -n "$TORCH_INDEX_URL" ]; then \
         python -m pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" $(grep -E '^(torch|torchvision)[=<>~ ]' requirements.txt); \
       fi \
    && if [ -n "$FLWR_EXTRAS" ]; then \
         python -m pip install --no-cache-dir "flwr[${FLWR_EXTRAS}]==${FLWR_VERSION}"; \
       fi \
    && python -m pip install --no-cache-dir -r requirements.txt \
    && python -c "import flwr, torch; assert flwr.__version__ == '${FLWR_VERSION}', flwr.__version__; print('flwr', flwr.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda)" \
    && mkdir -p /app/outputs /app/data "$HF_HOME"

# fedweigh-superexec and fedweigh-supernode from fedweigh/flower/ (the package of
# fedweigh's changes to Flower; these two modules import only Flower): the
# SuperExec that keeps one ClientApp process per site, and the SuperNode that
# asks for its next message without Flower's 3 s wait (docker-compose.resident.yml).
COPY --chown=app:app fedweigh/flower/__init__.py fedweigh/flower/objects.py fedweigh/flower/resident.py fedweigh/flower/supernode.py /app/bin/fedweigh_flower/
RUN printf '#!/bin/sh\nexport PYTHONPATH=/app/bin\nexec python -m fedweigh_flower.resident "$@"\n' > /app/bin/fedweigh-superexec \
    && printf '#!/bin/sh\nexport PYTHONPATH=/app/bin\nexec python -m fedweigh_flower.supernode "$@"\n' > /app/bin/fedweigh-supernode \
    && chmod +x /app/bin/fedweigh-superexec /app/bin/fedweigh-supernode

ENTRYPOINT ["flower-superexec"]
