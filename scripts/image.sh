#!/usr/bin/env bash
# make image: build the container images of the commands, each FROM scratch
# with one static binary (deploy/idem.Containerfile,
# deploy/shop.Containerfile):
#
#   localhost/idem:VERSION        idem: the relays (idem relay, idem cdc),
#                                 idem migrate, status, failed, dashboard...
#   localhost/idem-shop:VERSION   shop, the reference application
#
# VERSION is `git describe --tags --always --dirty` ("v0.1.0" on the tag,
# "v0.1.0-3-gabc1234" after it), stamped into the binaries ("idem version",
# "shop version") and the images' org.opencontainers.image.version label.
# The binaries are built with CGO_ENABLED=0 (pure Go: SQLite is
# modernc.org/sqlite), -trimpath and -ldflags '-s -w'. Each image holds its
# binary, the build machine's CA bundle (/etc/ssl/certs/ca-certificates.crt,
# for TLS to databases and brokers), a /tmp, and for the shop a /data owned
# by the user the image runs as (65532, no name, not root). Nothing is
# pushed; the binaries and build contexts go to .bin/image/, which git
# ignores.
#
# Usage:
#   bash scripts/image.sh          # both images
#   bash scripts/image.sh idem     # some of them: idem, shop
#
# Prints the names of the images it built, one a line, on stdout.
#
# Environment:
#   IMAGE_REPO         prefix of the images' names (default localhost/)
#   IMAGE_TAG          their tag (default VERSION)
#   IMAGE_BUILD_DIR    where the binaries and build contexts go (default .bin/image)
#   IMAGE_BUILD_FLAGS  more flags for podman build (--label k=v ...), split on spaces
#   PODMAN             the container engine (default podman; buildah works too:
#                      PODMAN=buildah, whose "build" takes the same flags)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export PATH="/usr/local/go/bin${HOME:+:$HOME/go/bin}:$PATH"

log() { echo "image: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

REPO=${IMAGE_REPO-localhost/}
BUILD_DIR=${IMAGE_BUILD_DIR:-$ROOT/.bin/image}
PODMAN=${PODMAN:-podman}
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
read -r -a EXTRA <<<"${IMAGE_BUILD_FLAGS:-}"
[ $# -gt 0 ] || set -- idem shop
for name in "$@"; do
	case "$name" in
	idem | shop) ;;
	*) die "unknown image '$name' (known: idem shop)" ;;
	esac
done
command -v go >/dev/null || die "go not found (expected in /usr/local/go/bin)"
command -v "$PODMAN" >/dev/null || die "$PODMAN not found: apt-get install podman (or buildah, with PODMAN=buildah)"
[ -f "$CA_BUNDLE" ] || die "no CA bundle at $CA_BUNDLE: apt-get install ca-certificates"

VERSION=$(git describe --tags --always --dirty --match 'v[0-9]*' 2>/dev/null || true)
[ -n "$VERSION" ] || die "no version: git describe failed (build from a git clone of the repository)"
TAG=${IMAGE_TAG:-$VERSION}

for name in "$@"; do
	ctx=$BUILD_DIR/$name
	image=${REPO}idem
	[ "$name" = shop ] && image=${REPO}idem-shop
	rm -rf "$ctx"
	mkdir -p "$ctx/rootfs/tmp"
	chmod 1777 "$ctx/rootfs/tmp"
	# The shop's /data (its Containerfile gives it to the image's user).
	if [ "$name" = shop ]; then mkdir -m 0700 "$ctx/data"; fi
	cp "$CA_BUNDLE" "$ctx/ca-certificates.crt"

	log "building $name $VERSION (CGO_ENABLED=0, static) ..."
	CGO_ENABLED=0 go build -trimpath \
		-ldflags "-s -w -X github.com/idem-go/idem/internal/version.stamped=$VERSION" \
		-o "$ctx/$name" "./cmd/$name"

	log "building the image $image:$TAG ..."
	"$PODMAN" build --quiet -f "deploy/$name.Containerfile" --build-arg "VERSION=$VERSION" \
		"${EXTRA[@]}" -t "$image:$TAG" "$ctx" >/dev/null
	echo "$image:$TAG"
done
