# One image for every floom node; docker-compose.yml gives each node its roles.
FROM python:3.11-slim-bookworm

# The local (bubblewrap) sandbox's tools: bwrap; setpriv and unshare to start a
# sandbox as an unprivileged uid; mount; slirp4netns and ip for workers with network: full.
# E2B executors and API nodes do not use them; one image keeps every node the same.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        bubblewrap util-linux mount slirp4netns iproute2 nodejs \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/floom
COPY pyproject.toml README.md ./
COPY floom ./floom
COPY web ./web
COPY workers ./workers
# Installed in place (-e): the UI templates (web/) and the example workers (workers/) are
# found next to the package, as in a source checkout.
RUN pip install --no-cache-dir -e .

# Per-node state only (caches, run work dirs); everything shared lives in PostgreSQL.
ENV FLOOM_DATA_DIR=/var/lib/floom \
    FLOOM_HOST=0.0.0.0 \
    FLOOM_PORT=8321
EXPOSE 8321
# floom runs as root in the container so that local sandboxes can run as the unprivileged
# uids of their own (FLOOM_SANDBOX_UID_BASE and _COUNT) and cgroups; scripts never run as root.
CMD ["floom", "serve"]
