# A plain single-stage Dockerfile for the benchmark stack, as a user would write it by hand:
# tensorflow-cpu 2.15.1 + Horovod 0.28.1 (MPI, Gloo) on Debian bookworm, Python 3.11.
# Build context: this file, wheelhouse/ (may be empty), and the benchmark's smoke-suite files.
#   DOCKER_BUILDKIT=1 docker build --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -f Dockerfile.tf .
FROM local/debian:bookworm-slim

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates cmake g++ make libopenmpi-dev openmpi-bin python3 python3-dev python3-venv \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH LC_ALL=C.UTF-8 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none
RUN python3 -m venv /opt/venv

# The CA bundle only for the network this builds on (a secret, not a layer).
RUN --mount=type=secret,id=ca --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    export PIP_FIND_LINKS=/wheelhouse; [ -s /run/secrets/ca ] && export PIP_CERT=/run/secrets/ca; \
    pip install --no-cache-dir tensorflow-cpu==2.15.1

RUN --mount=type=secret,id=ca \
    [ -s /run/secrets/ca ] && export PIP_CERT=/run/secrets/ca; \
    pip download --no-cache-dir --no-deps --no-binary :all: horovod==0.28.1 -d /tmp \
    && tar -xzf /tmp/horovod-0.28.1.tar.gz -C /tmp \
    && pip install --no-cache-dir cloudpickle psutil pyyaml packaging \
    && HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 \
       HOROVOD_WITHOUT_MXNET=1 pip install --no-cache-dir --no-build-isolation /tmp/horovod-0.28.1 \
    && rm -rf /tmp/horovod-0.28.1*

# Extra packages, last (the benchmark's rebuild changes this pin).
RUN --mount=type=secret,id=ca \
    [ -s /run/secrets/ca ] && export PIP_CERT=/run/secrets/ca; \
    pip install --no-cache-dir six==1.16.0

# Benchmark addition (not part of a user's Dockerfile): the smoke suite, as envbuilder ships it.
COPY manifest.json /opt/envbuilder/manifest.json
COPY envbuilder_smoke /opt/envbuilder/envbuilder_smoke
RUN echo /opt/envbuilder > /opt/venv/lib/python3.11/site-packages/envbuilder.pth
