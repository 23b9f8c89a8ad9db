FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tandem ./tandem
COPY trainer ./trainer
COPY workers ./workers
RUN pip install --no-cache-dir -e .
COPY platform ./platform
COPY frontend ./frontend
ENV PYTHONPATH=/app:/app/platform PYTHONUNBUFFERED=1
