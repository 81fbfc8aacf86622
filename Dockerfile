# LayerLens dashboard, installed by the same step as `make run` (Makefile: .venv, requirements, constraints).
#   docker build -t layerlens . && docker run -p 8501:8501 -v layerlens-home:/data layerlens
# CPU torch by default; for the platform's default (CUDA) wheel: docker build --build-arg TORCH= -t layerlens:cuda .
# and run with --gpus all. /data holds LAYERLENS_HOME (jobs, caches, exports) and the Hugging Face cache (HF_HOME).
FROM python:3.11-slim

RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 layerlens && mkdir -p /data /app && chown layerlens /data /app
ARG TORCH=cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 UV_NO_CACHE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/data/hf LAYERLENS_HOME=/data/layerlens
USER layerlens
WORKDIR /app
COPY --chown=layerlens Makefile requirements.txt constraints.txt ./
RUN make install-deps TORCH=$TORCH
COPY --chown=layerlens . .
RUN make install TORCH=$TORCH
# the Token atlas's interactive map is an optional extra (README: Dependencies): --build-arg ATLAS=1 adds it
ARG ATLAS=
RUN if [ -n "$ATLAS" ]; then .venv/bin/uv pip install -q --python .venv/bin/python -c constraints.txt \
        -r requirements-atlas.txt; fi

EXPOSE 8501
VOLUME /data
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD .venv/bin/python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://localhost:8501/_stcore/health', timeout=4).status != 200)"
CMD [".venv/bin/python", "-m", "streamlit", "run", "app.py", "--server.address=0.0.0.0", "--server.port=8501", "--server.headless=true"]
