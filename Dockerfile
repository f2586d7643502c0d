# Image for the web and worker services of docker-compose.yml: the runtime only (the hashed lock of
# requirements.txt; no test tools, no PyTorch), run by an unprivileged user. Pinned base image: a
# rebuild gets the same Python and Debian release.
FROM python:3.11.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY requirements.txt .
# --no-deps: the lock is complete (pip check confirms); see the Makefile for why pip must not resolve.
RUN pip install --no-deps --require-hashes -r requirements.txt && pip check

COPY . .
RUN useradd --create-home --uid 10001 kb \
    && DJANGO_SECRET_KEY=build-only python manage.py collectstatic --noinput \
    && chown -R kb /app/var
USER kb

EXPOSE 8001
# Liveness: the process answers (readiness, with the database and broker, is /health).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8001/health/live', timeout=4).status != 200)"]
CMD ["uvicorn", "config.asgi:application", "--host", "0.0.0.0", "--port", "8001", "--lifespan", "on"]
