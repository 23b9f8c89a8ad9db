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
ENV PYTHONPATH=/app:/app/platform PYTHONUNBUFFERED=1
