# infercost agent image: a slim Python base, only the runtime dependencies (pinned with hashes in
# requirements.lock), the agent installed from this build context, run as a non-root user.
#
#   docker build -t infercost .
#   docker run --rm infercost --help
#
# requirements.lock is generated from pyproject.toml's runtime dependencies (no test extras):
#   pip-compile --generate-hashes --allow-unsafe --no-emit-index-url --no-emit-find-links \
#     --strip-extras -o requirements.lock pyproject.toml deploy/docker/build.in
# tests/test_dockerfile.py checks this file (hadolint, user, entrypoint, lock usage).

FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY requirements.lock ./
RUN python -m venv /opt/infercost \
    && /opt/infercost/bin/pip install --require-hashes --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
# the runtime alone: the simulator (infercost_sim, with the demo and its trace) and the benchmarks
# (infercost_bench) stay out of the image; `infercost demo` there says what to install instead
COPY agent ./agent
RUN /opt/infercost/bin/pip install --no-deps --no-build-isolation . \
    && /opt/infercost/bin/pip uninstall -y setuptools wheel

FROM python:3.11-slim-bookworm
# uid/gid 65532 as in the chart's non-root mode; the chart runs uid 0 only for the kubelet's
# pod-resources socket (see deploy/helm/infercost/values.yaml)
RUN groupadd --system --gid 65532 infercost \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin infercost
COPY --from=build /opt/infercost /opt/infercost
ENV PATH=/opt/infercost/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["infercost", "run"]
CMD ["--config", "/etc/infercost/node.yaml"]
