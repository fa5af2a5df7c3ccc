#!/usr/bin/env bash
# Build the test control plane from upstream Go modules into a cache keyed by versions, and
# print the folder holding the binaries. A warm cache answers in well under a second.
#
#   bash tests/cluster/build.sh            # -> ~/.cache/xrun-cluster/<key>/bin
#
# Binaries: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, jobset (the JobSet
# controller), kueue, kwok, fake-gcs-server. Each comes from its own module under tools/
# (go.mod + go.sum only, no copied source); see tools/update.sh for how those are made.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v go >/dev/null 2>&1; then
  echo "xrun tests: Go >= 1.26 is required to build the test control plane and fake-gcs-server (install it from go.dev/dl or your distribution, then put 'go' on PATH)" >&2
  exit 1
fi
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0
. "$here/versions.env"
# What the binaries depend on: Go's version, the module versions and sums, and how they are
# built (bump RECIPE when a flag below changes). Edits elsewhere in this file reuse the cache.
RECIPE="trimpath,cgo0,-s -w,version ldflags,kube tags selinux+notest:1"
key=$( { go env GOVERSION; echo "$RECIPE"; cat "$here/versions.env" "$here"/tools/*/go.mod "$here"/tools/*/go.sum; } | sha256sum | cut -c1-16)
cache=${XRUN_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/xrun-cluster}
out=$cache/$key/bin
bins=(etcd kube-apiserver kube-controller-manager kube-scheduler jobset kueue kwok fake-gcs-server)
missing=()
for b in "${bins[@]}"; do [ -x "$out/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$out"; exit 0; fi

mkdir -p "$out"
exec 9>"$cache/$key.lock"   # two test sessions building at once: the second waits
flock 9
started=$(date +%s)
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
kv() { printf -- "-X %s.%s=%s " "$@"; }
kube_ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ld+=" $(kv $p gitVersion "$KUBE_VERSION") $(kv $p gitMajor 1) $(kv $p gitMinor "$minor")"
  kube_ld+=" $(kv $p gitTreeState clean) $(kv $p buildDate "$now")"
done

build() {  # build MODULE NAME PACKAGE LDFLAGS [TAGS]
  local mod=$1 name=$2 pkg=$3 ld=$4 tags=${5:-}
  [ -x "$out/$name" ] && return 0
  echo "xrun cluster: building $name ($pkg)" >&2
  (cd "$here/tools/$mod" && go build -trimpath ${tags:+-tags "$tags"} -ldflags "$ld" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
}
build etcd etcd go.etcd.io/etcd/server/v3 "-s -w $(kv go.etcd.io/etcd/api/v3/version GitSHA "$ETCD_VERSION")"
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  build kube "$c" "k8s.io/kubernetes/cmd/$c" "$kube_ld" selinux,notest
done
build jobset jobset sigs.k8s.io/jobset "-s -w $(kv sigs.k8s.io/jobset/pkg/version GitVersion "$JOBSET_VERSION")"
build kueue kueue sigs.k8s.io/kueue/cmd/kueue \
  "-s -w $(kv sigs.k8s.io/kueue/pkg/version GitVersion "$KUEUE_VERSION") $(kv sigs.k8s.io/kueue/pkg/version BuildDate "$now")"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w $(kv sigs.k8s.io/kwok/pkg/consts Version "$KWOK_VERSION")"
build fakegcs fake-gcs-server github.com/fsouza/fake-gcs-server "-s -w"
echo "xrun cluster: built ${missing[*]} in $(( $(date +%s) - started )) s" >&2
echo "$out"
