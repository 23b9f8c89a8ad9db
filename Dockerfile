FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tandem ./tandem
COPY policy ./policy
COPY environments ./environments
COPY trainer ./trainer
COPY workers ./workers
RUN pip install --no-cache-dir -e .
COPY platform ./platform
COPY frontend ./frontend
# An unprivileged user owns what the processes write: checkpoints, media, the XLA cache.
RUN useradd --create-home --uid 10001 tandem \
    && mkdir -p /app/var/checkpoints /app/var/media /app/var/models /var/cache/tandem/jax \
    && chown -R tandem:tandem /app/var /var/cache/tandem
USER tandem
ENV PYTHONPATH=/app:/app/platform PYTHONUNBUFFERED=1
