# LayerLens dashboard. CPU by default:
#   docker build -t layerlens . && docker run -p 8501:8501 layerlens
# CUDA: build with a CUDA wheel index, run with --gpus all:
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 -t layerlens:cuda .
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/data/hf LAYERLENS_HOME=/data/layerlens

WORKDIR /app
COPY requirements.txt .
RUN pip install --index-url "$TORCH_INDEX" torch && pip install -r requirements.txt

RUN useradd --create-home --uid 1000 layerlens && mkdir -p /data && chown layerlens /data
COPY --chown=layerlens . .
USER layerlens

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://localhost:8501/_stcore/health', timeout=4).status != 200)"
CMD ["streamlit", "run", "app.py", "--server.address=0.0.0.0", "--server.port=8501", "--server.headless=true"]
