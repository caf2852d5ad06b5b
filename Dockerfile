# The RL control server on the CPU: python:3.11-slim, the CPU build of torch, a non-root user.
#   docker build -t rl-control-server .
# Requests reach the container from Docker's bridge, not loopback, so choose one (docs/docker.md):
#   a local agent, no token, the port on the host's loopback only:
#     docker run -p 127.0.0.1:8080:8080 -e RLCS_INSECURE_NO_TOKEN=1 -v rlcs-var:/app/var rl-control-server
#   reachable from other machines, with a token:
#     docker run -p 8080:8080 -e RLCS_API_TOKEN=change-me -v rlcs-var:/app/var rl-control-server
# With neither, the server refuses to start (it binds 0.0.0.0). The install is uv.lock's, as
# `make install`'s (tests/install/test_install.py runs these steps in a fresh folder and serves
# /health).
FROM python:3.11-slim

# UV_COMPILE_BYTECODE: bytecode written at build time, as pip wrote it (with
# PYTHONDONTWRITEBYTECODE, nothing writes it later, and every start would compile again).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_NO_CACHE=1 \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1

WORKDIR /app

RUN pip install 'uv>=0.13,<0.14'
# The dependencies first (a layer that only a new lock rebuilds), torch as the CPU build uv.lock
# names, fetched from PyTorch's CPU index into wheels/, where uv looks for it; PyPI's own Linux
# torch would pull several GB of CUDA packages the CPU image never uses. Once installed, the
# wheel goes; the folder stays, empty (uv reads its find-links folder on every sync).
COPY pyproject.toml uv.lock README.md ./
COPY scripts/torch_wheel.py ./scripts/
RUN python scripts/torch_wheel.py --index-url https://download.pytorch.org/whl/cpu \
    && uv sync --locked --no-install-project --extra all --group models \
    && rm -r wheels && mkdir wheels

COPY core ./core
COPY server ./server
COPY environments ./environments
COPY runners ./runners
COPY cli ./cli
RUN uv sync --locked --no-editable --extra all --group models
ENV PATH=/app/.venv/bin:$PATH
# The interpreter Atropos environments run in (RLCS_ATROPOS_PYTHON defaults to this path),
# pinned by its own lock.
RUN python -m venv .venv-atropos \
    && uv pip sync --python .venv-atropos/bin/python runners/atropos/requirements.lock
# Converted once into the image (outside the var/ volume), not by the first request.
ENV RLCS_MODELS_DIR=/app/models
RUN python -m runners.models.prepare

# The server runs from /app (python -m puts it first on sys.path), so its data files and the
# runners it starts come from this tree; only var/ is written, and it is a volume.
RUN useradd --create-home --uid 10001 rlcs && mkdir -p /app/var && chown rlcs:rlcs /app/var
USER rlcs
ENV RLCS_HOST=0.0.0.0 \
    RLCS_PORT=8080 \
    RLCS_VAR_DIR=/app/var \
    HF_HOME=/app/var/huggingface
VOLUME /app/var
EXPOSE 8080

# No curl in the slim image: ask /health with the standard library.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('RLCS_PORT', '8080') + '/health', timeout=4)"

CMD ["python", "-m", "server"]
