#!/usr/bin/env bash
# Builds the Debian bookworm base image locally, because no container registry is reachable here:
# debootstrap (minbase variant) from the Debian mirror this machine's apt uses, trimmed like the
# official "-slim" images, then `podman import`ed as localhost/debian:bookworm-slim.
#
#   deploy/make-base-image.sh [--force]
#
# Idempotent: does nothing when the image already exists, unless --force. Run as root.
# Environment overrides:
#   TESSERA_BASE_IMAGE       tag to create (default localhost/debian:bookworm-slim)
#   DEBIAN_MIRROR            e.g. http://deb.debian.org/debian (default: from /etc/apt/sources.list*)
#   DEBIAN_SECURITY_MIRROR   e.g. http://deb.debian.org/debian-security (default: likewise)
#   DEBIAN_SUITE             default bookworm
set -euo pipefail

IMAGE="${TESSERA_BASE_IMAGE:-localhost/debian:bookworm-slim}"
SUITE="${DEBIAN_SUITE:-bookworm}"
FORCE=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "make-base-image.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

log() { echo "make-base-image: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "run as root (debootstrap needs it)"; exit 1
fi
if ! command -v podman >/dev/null; then
  log "podman is not installed (apt-get install podman)"; exit 1
fi
if [ "$FORCE" -eq 0 ] && podman image exists "$IMAGE"; then
  log "$IMAGE already exists (use --force to rebuild)"
  exit 0
fi
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    debootstrap debian-archive-keyring >/dev/null
fi

# The first "deb" URI that serves $1 (a suite) in this machine's apt sources, deb822 (*.sources)
# or one-line (*.list) format; disabled entries and deb-src are skipped.
host_mirror() {
  local suite="$1" f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri="$(awk -v suite="$suite" '
      BEGIN { RS = ""; FS = "\n" }
      {
        uri = ""; types = ""; suites = ""; enabled = "yes"
        for (i = 1; i <= NF; i++) {
          line = $i
          if (line ~ /^[ \t]*#/) continue
          if (line ~ /^URIs:/)    { sub(/^URIs:[ \t]*/, "", line); split(line, u, /[ \t]+/); uri = u[1] }
          if (line ~ /^Types:/)   { types = " " line " " }
          if (line ~ /^Suites:/)  { suites = " " line " " }
          if (line ~ /^Enabled:/) { enabled = tolower(line) ~ /no/ ? "no" : "yes" }
        }
        gsub(/\t/, " ", types); gsub(/\t/, " ", suites)
        if (enabled == "yes" && types ~ / deb / && index(suites, " " suite " ") && uri != "") {
          print uri; exit
        }
      }' "$f")"
    if [ -n "$uri" ]; then echo "$uri"; return 0; fi
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri="$(awk -v suite="$suite" '
      $1 == "deb" {
        i = 2
        if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ }
        if ($(i + 1) == suite) { print $i; exit }
      }' "$f")"
    if [ -n "$uri" ]; then echo "$uri"; return 0; fi
  done
  return 1
}

MIRROR="${DEBIAN_MIRROR:-$(host_mirror "$SUITE" || echo http://deb.debian.org/debian)}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-$(host_mirror "$SUITE-security" \
  || echo http://deb.debian.org/debian-security)}"
MIRROR="${MIRROR%/}"
SECURITY_MIRROR="${SECURITY_MIRROR%/}"
ARCH="$(dpkg --print-architecture)"
log "suite $SUITE/$ARCH from $MIRROR (security: $SECURITY_MIRROR) → $IMAGE"

WORK="$(mktemp -d /var/tmp/tessera-base.XXXXXX)"
ROOTFS="$WORK/rootfs"
cleanup() {
  # Never delete the tree while something is still mounted inside it.
  for m in proc dev/pts dev sys; do
    mountpoint -q "$ROOTFS/$m" 2>/dev/null && umount -l "$ROOTFS/$m" || true
  done
  rm -rf --one-file-system "$WORK"
}
trap cleanup EXIT

start=$SECONDS
debootstrap --variant=minbase --arch="$ARCH" --components=main \
  --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
  "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
  tail -n 30 "$WORK/debootstrap.log" >&2
  log "debootstrap failed"; exit 1
}
log "debootstrap done in $((SECONDS - start))s"

# apt sources: the release, its updates and the security archive, as on this machine.
rm -f "$ROOTFS/etc/apt/sources.list"
cat >"$ROOTFS/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY_MIRROR
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF

# "slim": no documentation, man pages or translations from any later install (as the official
# debian:*-slim images do), apt keeps no package caches, no translated package lists.
cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/01-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat >"$ROOTFS/etc/apt/apt.conf.d/01-container" <<'EOF'
APT::Install-Suggests "false";
Acquire::Languages "none";
Acquire::GzipIndexes "true";
Acquire::CompressionTypes::Order:: "gz";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF

# Bring the base up to date with bookworm-updates and bookworm-security (debootstrap only knows
# the release itself). /proc is mounted for the maintainer scripts and unmounted right after.
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
mount -t proc proc "$ROOTFS/proc"
chroot "$ROOTFS" env DEBIAN_FRONTEND=noninteractive LC_ALL=C \
  sh -c 'apt-get update -qq && apt-get upgrade -y -qq && apt-get clean' >"$WORK/upgrade.log" 2>&1 || {
  tail -n 30 "$WORK/upgrade.log" >&2
  log "apt-get upgrade in the new root failed"; exit 1
}
umount "$ROOTFS/proc"

# Trim what the official slim images do not carry; the container runtime provides
# hostname, hosts and resolv.conf.
find "$ROOTFS/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
find "$ROOTFS/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/usr/share/groff/* \
  "$ROOTFS"/usr/share/lintian/* "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/* \
  "$ROOTFS"/var/cache/debconf/*-old "$ROOTFS"/var/lib/dpkg/*-old "$ROOTFS"/var/log/*.log \
  "$ROOTFS"/var/log/apt/* "$ROOTFS"/tmp/* "$ROOTFS"/var/tmp/*
find "$ROOTFS/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias \
  -exec rm -rf {} + 2>/dev/null || true
rm -f "$ROOTFS/etc/resolv.conf" "$ROOTFS/etc/hostname"
: >"$ROOTFS/etc/machine-id"

created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
if podman image exists "$IMAGE"; then podman rmi -f "$IMAGE" >/dev/null 2>&1 || true; fi
tar --numeric-owner --xattrs --acls -C "$ROOTFS" -c . | podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["bash"]' \
  --change "LABEL org.opencontainers.image.title=debian-$SUITE-slim" \
  --change "LABEL org.opencontainers.image.description=debootstrap --variant=minbase $SUITE from $MIRROR" \
  --change "LABEL org.opencontainers.image.created=$created" \
  --message "debootstrap --variant=minbase $SUITE $MIRROR" \
  --quiet - "$IMAGE" >/dev/null
log "imported $IMAGE ($(podman image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=iec)) in $((SECONDS - start))s"
