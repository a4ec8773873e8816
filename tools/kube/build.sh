#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager and kube-scheduler v1.20.2 from Debian bookworm's
# `kubernetes` source package with Debian's Go 1.19, and cache them outside the clone.
#
# Recipe: shared/notes/real-kube-apiserver.md. Idempotent: if the cached binaries (and etcd)
# exist, it exits at once; otherwise it builds only the binaries that are missing. Needs root
# (apt-get) and only the Debian package mirror.
#
#   WARMGATE_KUBE_CACHE  cache root (default /var/cache/warmgate-kube); binaries land in
#                        $WARMGATE_KUBE_CACHE/v1.20.2/{kube-apiserver,kube-controller-manager,
#                        kube-scheduler}
#   etcd comes from Debian's etcd-server package: /usr/bin/etcd
set -euo pipefail

KUBE_VERSION=v1.20.2
DEB_SRC_VERSION=1.20.5+really1.20.2-1.1+deb12u1
GO_PKG=golang-1.19-go
GO_BIN=/usr/lib/go-1.19/bin
ETCD=/usr/bin/etcd
CACHE_ROOT=${WARMGATE_KUBE_CACHE:-/var/cache/warmgate-kube}
DEST=$CACHE_ROOT/$KUBE_VERSION
BINS=(kube-apiserver kube-controller-manager kube-scheduler)
PKGS=("$GO_PKG" etcd-server rsync jq golang-github-modern-go-reflect2-dev)

missing_bins() {
    local b
    for b in "${BINS[@]}"; do [[ -x $DEST/$b ]] || echo "$b"; done
}

have_bins() {
    [[ -z $(missing_bins) ]]
}

if have_bins && [[ -x $ETCD ]]; then
    echo "kube binaries cached in $DEST (etcd: $ETCD)"
    exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo); fi

install_pkgs() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    export DEBIAN_FRONTEND=noninteractive
    if ! "${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"; then
        "${SUDO[@]}" apt-get update
        "${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
    fi
}

if have_bins; then
    # Binaries survived but etcd did not: only the runtime package is missing.
    install_pkgs etcd-server
    echo "kube binaries cached in $DEST (etcd: $ETCD)"
    exit 0
fi

start=$(date +%s)
mapfile -t BUILD < <(missing_bins)
install_pkgs "${PKGS[@]}"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/warmgate-kube-build.XXXXXX")
cleanup() { rm -rf "$WORK"; }
if [[ -z ${WARMGATE_KUBE_KEEP_BUILD:-} ]]; then trap cleanup EXIT; fi
echo "building ${BUILD[*]} $KUBE_VERSION in $WORK"

# 1. Source package via a private apt configuration (the system's apt config is untouched; the
#    mirror comes from the machine's own sources and is written only into $WORK).
uri=$(awk 'tolower($1) == "uris:" { print $2; exit }' \
    /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
if [[ -z $uri ]]; then
    uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
        /etc/apt/sources.list 2>/dev/null || true)
fi
[[ -n $uri ]] || { echo "no Debian mirror URI found in apt sources" >&2; exit 1; }
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/cache/archives/partial" "$WORK/src"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri bookworm main" \
    > "$WORK/apt/sources.list"
APT_OPTS=(
    -o "Dir::Etc::SourceList=$WORK/apt/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$WORK/apt/lists"
    -o "Dir::Cache=$WORK/apt/cache"
)
apt-get "${APT_OPTS[@]}" update
(cd "$WORK/src" && apt-get "${APT_OPTS[@]}" source --download-only "kubernetes=$DEB_SRC_VERSION")

# 2. Unpack the upstream tree (the main .orig tarball).
orig=$(ls "$WORK"/src/kubernetes_*.orig.tar.* | grep -v 'orig-' | head -n1)
mkdir "$WORK/tree"
tar -xf "$orig" -C "$WORK/tree"
cmddir=$(find "$WORK/tree" -maxdepth 3 -path '*/cmd/kube-apiserver' -type d | head -n1)
top=${cmddir%/cmd/kube-apiserver}
[[ -n $cmddir && -f $top/Makefile ]] || { echo "unexpected source layout in $orig" >&2; exit 1; }

# 3. Required: Debian's reflect2 1.0.2 (the vendored one crashes under Go 1.19 in json-iterator).
r2=$top/vendor/github.com/modern-go/reflect2
rm -f "$r2"/*.go "$r2"/*.s
cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go "$r2"/
cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.s "$r2"/ 2>/dev/null || true
rm -f "$r2"/*_test.go

# 4. Build only what is missing (make generates the OpenAPI code; plain `go build` does not).
what=()
for b in "${BUILD[@]}"; do what+=("cmd/$b"); done
(
    cd "$top"
    PATH=$GO_BIN:$PATH make WHAT="${what[*]}" KUBE_BUILD_PLATFORMS=linux/amd64
)

mkdir -p "$DEST"
for b in "${BUILD[@]}"; do
    install -m 0755 "$top/_output/local/bin/linux/amd64/$b" "$DEST/.$b.tmp"
    mv -f "$DEST/.$b.tmp" "$DEST/$b"
done
for b in "${BUILD[@]}"; do "$DEST/$b" --version; done
echo "built in $(( $(date +%s) - start ))s; binaries in $DEST (etcd: $ETCD)"
