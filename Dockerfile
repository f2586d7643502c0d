# Image for the web and worker services of docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
WORKDIR /app

# The CPU build of torch first, so requirements.txt does not pull a CUDA build.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY . .
RUN DJANGO_SECRET_KEY=build-only python manage.py collectstatic --noinput

EXPOSE 8001
CMD ["uvicorn", "config.asgi:application", "--host", "0.0.0.0", "--port", "8001", "--lifespan", "on"]
