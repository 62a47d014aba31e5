# kvroute's container image: the router (kvroute, the entrypoint) and the simulated worker (kvroute-sim).
#
# Stage 1 builds with the project's own set-up (scripts/setup.sh: Debian 12 packages, CMake + Ninja), so the
# image is built exactly as CI builds. Stage 2 is Debian 12 slim with only the shared libraries the two binaries
# load (`scripts/image.sh check-libs` proves the list against ldd), running as an unprivileged user.
#
#   docker build -t kvroute:0.1.0 .          # or: scripts/image.sh (builds, then serves the demo and checks it)
#   docker run --rm -p 8080:8080 kvroute:0.1.0 --worker http://WORKER:8000 --admin-listen 0.0.0.0:9090
#
# The Helm chart (helm/kvroute) runs this image as kvroute:<appVersion> with the same user id (65532).

ARG DEBIAN_IMAGE=debian:12-slim

FROM ${DEBIAN_IMAGE} AS build
WORKDIR /src
COPY . .
# setup.sh installs the build packages, then configures and builds every target (tests included, as in CI).
RUN bash scripts/setup.sh build \
 && mkdir -p /out \
 && cp build/bin/kvroute build/bin/kvroute-sim /out/ \
 && strip --strip-unneeded /out/kvroute /out/kvroute-sim

FROM ${DEBIAN_IMAGE} AS runtime
# The libraries the binaries load (their other dependencies come with these packages). `scripts/image.sh
# check-libs` (ctest image_runtime_libs) fails when a binary needs a library none of them brings, or when one
# of them is not needed: add or remove packages here.
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libboost-json1.81.0 libhiredis0.14 libprotobuf32 libprometheus-cpp-core1.0 libssl3 libxxhash0 libyaml-cpp0.7 libzmq5 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 kvroute \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kvroute
COPY --from=build /out/kvroute /out/kvroute-sim /usr/local/bin/
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/kvroute"]
CMD ["--help"]
