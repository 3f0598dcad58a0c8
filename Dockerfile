# The one image every service of docker-compose.yml runs (migrate, beats,
# workers, Flower, the panel): the package with the postgres, redis and metrics extras,
# Flower, and examples/production.py as the app.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir '.[postgres,mysql,redis,metrics,web]' flower \
    && useradd --create-home --uid 10001 routines

ENV PYTHONPATH=/app/examples
# Nothing here needs root: the store is PostgreSQL, the broker Redis, and
# beat keeps no schedule file. The home directory is the one writable place.
USER 10001
WORKDIR /home/routines
