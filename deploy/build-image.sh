#!/usr/bin/env bash
# Builds the Tessera container image with podman, on a Debian base image made locally (no
# container registry needs to be reachable; only the Debian mirror).
#
#   deploy/build-image.sh [--no-cache] [--force-base]
#
# 1. installs podman and debootstrap from Debian's packages if they are missing (apt-get);
# 2. makes localhost/debian:bookworm-slim with deploy/make-base-image.sh (skipped if it exists;
#    --force-base rebuilds it);
# 3. podman build --format docker (keeps the HEALTHCHECK) of the repository's Dockerfile with
#    BASE_IMAGE=localhost/debian:bookworm-slim, tagged localhost/tessera:latest.
#
# Rootful (run as root). Environment:
#   TESSERA_IMAGE        tag to build (default localhost/tessera:latest)
#   TESSERA_BASE_IMAGE   base image tag (default localhost/debian:bookworm-slim)
#   BUILD_JOBS           compile parallelism inside the build (default: Ninja's)
#   BUILD_ISOLATION      podman build --isolation (default chroot: RUN steps need no OCI runtime,
#                        no cgroups and use the host's network, so apt reaches the mirror)
#   PODMAN_BUILD_OPTS    extra podman build options (word-split)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${TESSERA_IMAGE:-localhost/tessera:latest}"
BASE_IMAGE="${TESSERA_BASE_IMAGE:-localhost/debian:bookworm-slim}"
ISOLATION="${BUILD_ISOLATION:-chroot}"
NO_CACHE=()
FORCE_BASE=()
for arg in "$@"; do
  case "$arg" in
    --no-cache) NO_CACHE=(--no-cache) ;;
    --force-base) FORCE_BASE=(--force) ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "build-image.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

log() { echo "build-image: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "run as root (rootful podman and debootstrap)"; exit 1
fi

missing=()
command -v podman >/dev/null || missing+=(podman)
command -v debootstrap >/dev/null || missing+=(debootstrap debian-archive-keyring)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

start=$SECONDS
TESSERA_BASE_IMAGE="$BASE_IMAGE" "$ROOT/deploy/make-base-image.sh" "${FORCE_BASE[@]}"
base_seconds=$((SECONDS - start))

start=$SECONDS
build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
if [ -n "${BUILD_JOBS:-}" ]; then build_args+=(--build-arg "BUILD_JOBS=$BUILD_JOBS"); fi
log "building $IMAGE from $ROOT/Dockerfile (base $BASE_IMAGE, isolation $ISOLATION)"
# --network host: the RUN steps' apt-get reaches the mirror without container networking.
# --pull=never: the base is local; nothing is fetched from a registry.
# shellcheck disable=SC2086
podman build \
  --format docker \
  --isolation "$ISOLATION" \
  --network host \
  --pull=never \
  --layers \
  "${NO_CACHE[@]}" \
  "${build_args[@]}" \
  ${PODMAN_BUILD_OPTS:-} \
  --file "$ROOT/Dockerfile" \
  --tag "$IMAGE" \
  "$ROOT"
build_seconds=$((SECONDS - start))

size="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
log "built $IMAGE: $(numfmt --to=iec --suffix=B "$size") ($size bytes);" \
    "base image ${base_seconds}s, image build ${build_seconds}s"
